"""``tunedeck watch DIR``: the dashboard on a run directory or another trainer's output dir."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from core.i18n import t

    parser = subparsers.add_parser("watch", help=t("watch.help"), description=t("watch.help"))
    parser.add_argument("dir", metavar="DIR", help=t("watch.dir_help"))
    parser.add_argument("--json", action="store_true", help=t("watch.json_help"))
    parser.set_defaults(handler=cmd_watch)


def _find(ref: str) -> Any:
    """A watch source from a directory, or from a tunedeck run id / prefix."""
    from pathlib import Path

    from core.errors import CliError
    from core.watch.source import open_watch_source

    path = Path(ref).expanduser()
    if not path.is_dir():
        if "/" in ref or ref.startswith("."):
            from core.i18n import t

            raise CliError(t("watch.not_a_dir", path=ref), 2)
        from core.runs import resolve_run

        path = resolve_run(ref).path  # RunNotFound: exit 2
    return open_watch_source(path)  # SourceNotFound: exit 2


def _state(source: Any) -> dict[str, Any]:
    """What the dashboard's header says: a tunedeck run's status, or running / idle / finished with the
    last write of another trainer's folder (``core.watch.activity``, from the same feed)."""
    if not source.read_only:
        from core.runs import RunDirectory, effective_status

        return {"status": effective_status(RunDirectory(source.path)).status}
    from core.watch.activity import writer_state
    from core.watch.feed import open_metrics_feed

    feed = open_metrics_feed(source)
    feed.read_tail()
    return writer_state(source, feed.activity).to_json()


def cmd_watch(args: argparse.Namespace) -> Any:
    source = _find(args.dir)
    if args.json:
        import json

        print(json.dumps({"kind": source.kind, "dir": str(source.path), "metrics": str(source.metrics_path),
                          "log": None if source.log_path is None else str(source.log_path),
                          "read_only": source.read_only, "facts": source.facts, "state": _state(source)}))
        return 0
    from core.cli import OpenApp, require_app
    from core.i18n import t
    from core.settings import load_settings

    require_app(args, t("watch.no_terminal", dir=args.dir), t("watch.needs_app", dir=args.dir))
    return OpenApp(load_settings(), open_run=str(source.path))
