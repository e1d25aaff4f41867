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


def _find(ref: str, wait: bool = False) -> Any:
    """A watch source from a directory (or a file in it), or from a tunedeck run id / prefix. ``wait``: a folder
    there with nothing to read yet (a training starting) is waited for, a line on stderr saying so."""
    from pathlib import Path

    from core.errors import CliError
    from core.watch.source import open_llamafactory, open_watch_source, wait_for_source

    path = Path(ref).expanduser()
    if path.is_file():  # the metric file itself (logging.jsonl, trainer_log.jsonl …): the folder it is in
        path = path.parent
    elif path.name == "trainer_log.jsonl" and not path.exists() and path.parent.is_dir():
        # LLaMA-Factory's, removed as a run started again with overwrite_output_dir begins (its first line minutes
        # away): "no such directory" of the file named a moment ago. That run is watched, the file read once it comes
        return open_llamafactory(path.parent)
    if not path.is_dir():
        if "/" in ref or ref.startswith("."):
            from core.i18n import t

            raise CliError(t("watch.not_a_dir", path=ref), 2)
        from core.runs import resolve_run

        path = resolve_run(ref).path  # RunNotFound: exit 2
    if wait:
        return wait_for_source(path, _say_waiting)  # SourceNotFound other than "nothing yet": exit 2
    return open_watch_source(path)  # SourceNotFound: exit 2


def _say_waiting(error: Any) -> None:
    import sys

    from core.i18n import t

    print(f"tunedeck: {t('watch.waiting', reason=error.message)}", file=sys.stderr, flush=True)


# the figures of the newest train record ``--json`` gives (``latest``): the dashboard's stats line, as numbers
# (a tunedeck run's tokens/s over its steady steps, as the header, the runs list and status say it);
# ms-swift's and LLaMA-Factory's GPU memory and ms-swift's step rate among them where they log them; the ETA
# only where the header shows one (running)
LATEST_FIGURES = ("step", "total_steps", "epoch", "loss", "tokens_per_s", "steps_per_s", "memory_gib",
                  "elapsed_s", "eta_s")


def _state(source: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the dashboard's header says: a tunedeck run's status, or running / idle / finished with the
    last write of another trainer's folder (``core.watch.activity``, from the same feed); and the figures
    (``LATEST_FIGURES``) of the newest train record of the feed's tail."""
    from core.watch.feed import open_metrics_feed

    feed = open_metrics_feed(source)
    records = feed.read_tail()
    if hasattr(feed, "place_tail"):
        feed.place_tail()  # a restart before the tail: the elapsed time goes on from the earlier attempt's
    train = next((r for r in reversed(records) if r.get("kind") == "train"), {})
    latest = {key: train[key] for key in LATEST_FIGURES if train.get(key) is not None}
    if not source.read_only:
        from core.runs import RunDirectory, RunState, effective_status
        from core.runs.listing import steady_rate

        run = RunDirectory(source.path)
        status = effective_status(run).status
        if "tokens_per_s" in latest:
            # the header's figure: over the steady steps so far (the last interval's swings), none while stalled
            rate = steady_rate(run, train) if status != RunState.STALLED else None
            if rate is None:
                del latest["tokens_per_s"]
            else:
                latest["tokens_per_s"] = rate
        return {"status": status}, _without_stale_eta(latest, status)
    from core.watch.activity import writer_state

    state = writer_state(source, feed.activity).to_json()
    return state, _without_stale_eta(latest, state["status"])


def _without_stale_eta(latest: dict[str, Any], status: str) -> dict[str, Any]:
    """``latest`` without its ETA where the header shows none (``shows_eta``): a writer gone idle, a run
    stalled, stopping or ended; the record's remaining time is no longer true of it."""
    from core.runs.states import shows_eta

    return latest if shows_eta(status) else {k: v for k, v in latest.items() if k != "eta_s"}


def cmd_watch(args: argparse.Namespace) -> Any:
    from core.watch.source import SourceNotYet

    try:
        source = _find(args.dir)
    except SourceNotYet:
        if args.json:  # what is there now: a folder with nothing to read yet is said at once (exit 2)
            raise
        source = None
    if args.json:
        import json

        state, latest = _state(source)
        print(json.dumps({"kind": source.kind, "dir": str(source.path), "metrics": str(source.metrics_path),
                          "root": None if source.root is None else str(source.root),
                          "log": None if source.log_path is None else str(source.log_path),
                          "read_only": source.read_only, "facts": source.facts, "state": state,
                          "latest": latest}))
        return 0
    from core.cli import OpenApp, require_app
    from core.i18n import t
    from core.settings import load_settings

    require_app(args, t("watch.no_terminal", dir=args.dir), t("watch.needs_app", dir=args.dir))
    if source is None:  # an output folder a starting training has not written into yet: waited for (tail -F)
        source = _find(args.dir, wait=True)
    # the folder named, not its newest run: the dashboard follows a run started there later (newer_run)
    return OpenApp(load_settings(), open_run=str(source.root or source.path))
