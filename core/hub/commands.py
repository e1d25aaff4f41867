"""``tunedeck models search|info|download|list|rm``: the model browser's headless twin."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from core.i18n import t
from core.units import format_duration, format_magnitude, plural_key


def register(subparsers: Any) -> None:
    """Add the ``models`` command and its subcommands."""
    from core.hub.records import HUBS, SIZE_CLASSES, SORTS

    parser = subparsers.add_parser("models", help=t("hub.help"), description=t("hub.help"))
    sub = parser.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--hub", choices=HUBS, default="modelscope", help=t("hub.help.hub"))
        p.add_argument("--json", action="store_true", help=t("hub.help.json"))

    search = sub.add_parser("search", help=t("hub.help.search"), description=t("hub.help.search"))
    search.add_argument("query", nargs="?", default="", help=t("hub.help.query"))
    search.add_argument("--owner", default="", help=t("hub.help.owner"))
    search.add_argument("--task", default="text-generation", help=t("hub.help.task"))
    search.add_argument("--size", choices=SIZE_CLASSES, default="any", help=t("hub.help.size"))
    search.add_argument("--sort", choices=SORTS, default="downloads", help=t("hub.help.sort"))
    search.add_argument("--page", type=_page_number, default=1, help=t("hub.help.page"))
    common(search)
    search.set_defaults(handler=run_search)

    info = sub.add_parser("info", help=t("hub.help.info"), description=t("hub.help.info"))
    info.add_argument("model_id", metavar="ID|PATH", help=t("hub.help.info_target"))
    common(info)
    info.set_defaults(handler=run_info)

    download = sub.add_parser("download", help=t("hub.help.download"), description=t("hub.help.download"))
    download.add_argument("model_id", metavar="ID", help=t("hub.help.id"))
    download.add_argument("--include", action="append", default=None, metavar="PATTERN", help=t("hub.help.include"))
    download.add_argument("--detach", action="store_true", help=t("hub.help.detach"))
    download.add_argument("--cancel", action="store_true", help=t("hub.help.cancel"))
    common(download)
    download.set_defaults(handler=run_download)

    listing = sub.add_parser("list", help=t("hub.help.list"), description=t("hub.help.list"))
    listing.add_argument("--hub", choices=HUBS, default=None, help=t("hub.help.list_hub"))
    listing.add_argument("--json", action="store_true", help=t("hub.help.json"))
    listing.set_defaults(handler=run_list)

    remove = sub.add_parser("rm", help=t("hub.help.rm"), description=t("hub.help.rm"))
    remove.add_argument("target", metavar="ID|PATH", help=t("hub.help.rm_target"))
    remove.add_argument("--hub", choices=HUBS, default=None, help=t("hub.help.rm_hub"))
    remove.add_argument("--yes", "-y", action="store_true", help=t("hub.help.yes"))
    remove.add_argument("--json", action="store_true", help=t("hub.help.json"))
    remove.set_defaults(handler=run_rm)


def _page_number(text: str) -> int:
    """``--page``: a whole number from 1 (0 or -1 used to give page 1 without a word): a usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(t("hub.cli.page_invalid", value=text))
    return value


CLEAR_TO_LINE_END = "\x1b[K"  # ANSI: erase from the cursor to the end of the line (no text of its own)
QUERY_ECHO_CELLS = 60  # a query said back in a message is cut to this many cells


def _fail(exc: BaseException, hub: str, endpoint: str = "", code: int = 3) -> Any:
    """A failed hub call as a CLI error: what failed and what to do (as the app says it), the way on
    offline, and the raw detail last."""
    from core.errors import CliError
    from core.hub.problems import describe_error

    problem = describe_error(exc, hub, endpoint)
    lines = problem.lines()
    if problem.offline:
        lines.append(t("hub.cli.offline_hint"))
    if problem.detail:
        lines.append(t("hub.cli.detail", detail=problem.detail))
    return CliError("\n".join(lines), code)


def _source(args: argparse.Namespace) -> Any:
    from core.hub.errors import HubError
    from core.hub.source import open_hub

    try:
        return open_hub(args.hub)
    except HubError as exc:
        raise _fail(exc, args.hub) from exc


def _other_hub(hub: str) -> str:
    from core.hub.records import HUBS

    return next(h for h in HUBS if h != hub)


def _search_filters(args: argparse.Namespace) -> str:
    """The filters of a search as the flags that set them (what to drop to widen it)."""
    flags = []
    if args.owner:
        flags.append(f"--owner {args.owner}")
    if args.task not in ("", "any"):
        flags.append(f"--task {args.task}")
    if args.size != "any":
        flags.append(f"--size {args.size}")
    return " ".join(flags)


def _date(value: str | None) -> str:
    return value[:10] if value else t("hub.cli.na")


def _count(value: int | None) -> str:
    return format_magnitude(value, unknown="?")  # the hub's tables mark an unknown count "?"


def run_search(args: argparse.Namespace) -> int:
    from core.hub.records import SearchQuery
    from core.text_width import pad, truncate

    source = _source(args)
    task = "" if args.task in ("", "any") else args.task
    query = SearchQuery(text=args.query, owner=args.owner, task=task, size_class=args.size, sort=args.sort,
                        page=args.page)
    try:
        page = source.search(query)
    except Exception as exc:  # an SDK surprise too: a message, not a traceback
        raise _fail(exc, args.hub, getattr(source, "endpoint", "")) from exc
    if args.json:
        print(json.dumps({"hub": args.hub, "total": page.total, "page": page.page, "page_size": page.page_size,
                          "has_more": page.has_more, "unusable": page.unusable,
                          "models": [m.to_json() for m in page.items]}, indent=2))
        return 0
    if not page.items:
        from core.hub.problems import HUB_NAMES

        name = HUB_NAMES[args.hub]
        if page.total and (page.page - 1) * page.page_size >= page.total:
            # the search found models, the page asked for starts after them: no filter to drop, no word to change
            pages = -(-page.total // page.page_size)
            print(t(plural_key("hub.cli.page_past_end", pages), page=page.page, pages=pages, total=page.total,
                    hub=name, size=page.page_size), file=sys.stderr)
            return 0
        if page.has_more and args.size != "any":  # the scan for the size class stopped, more pages remain
            from core.hub.records import SIZE_SCAN_PAGES

            print(t("hub.search.size_not_yet", size=t(f"modelsscreen.size.{args.size}"), first=args.page,
                    last=page.page, total=page.total, hub=name, pages=SIZE_SCAN_PAGES), file=sys.stderr)
            print(t("hub.cli.size_more", page=page.page + 1), file=sys.stderr)
            return 0
        print(t("hub.search.none", query=truncate(args.query.strip(), QUERY_ECHO_CELLS), hub=name)
              if args.query.strip()
              else t("hub.search.none_filters", hub=name), file=sys.stderr)
        filters = _search_filters(args)
        if filters:
            print(t("hub.cli.no_results_filters", filters=filters), file=sys.stderr)
        print(t("hub.cli.no_results_hint", other=_other_hub(args.hub)), file=sys.stderr)
        return 0
    if args.size == "any" and len(page.items) == page.total:  # all the hub found: "1 model", not "1 of 1 models"
        print(t(plural_key("hub.cli.results_header_all", page.total), count=page.total, hub=args.hub), file=sys.stderr)
    elif args.size == "any":
        print(t("hub.cli.results_header", shown=len(page.items), total=page.total, hub=args.hub, page=page.page),
              file=sys.stderr)
    else:  # the hub's total counts every size: the count is out of the pages whose sizes were read
        print(t("hub.cli.results_header_size", shown=len(page.items), size=t(f"modelsscreen.size.{args.size}"),
                start=(args.page - 1) * page.page_size + 1, end=page.listed_through(), total=page.total,
                hub=args.hub), file=sys.stderr)
    if page.unusable:  # why the count falls short of what the hub listed
        from core.hub.problems import HUB_NAMES

        print(t(plural_key("hub.cli.results_unusable", page.unusable), count=page.unusable, hub=HUB_NAMES[args.hub]),
              file=sys.stderr)
    for model in page.items:
        print(f"{pad(truncate(model.model_id, 48), 48)} {_count(model.params):>7} {_count(model.downloads):>7} "
              f"{_date(model.updated)}  {model.license or ''}")
    if page.has_more:
        print(t("hub.cli.more", page=page.page + 1), file=sys.stderr)
    return 0


def _fact_value(value: object) -> str:
    if value is None:
        return t("hub.cli.na")
    if isinstance(value, bool):
        return t("hub.cli.yes") if value else t("hub.cli.no")
    return str(value)


def _check_id(model_id: str) -> None:
    """Refuse, before any request, what cannot name a model on a hub (exit 2): a bundled name says it
    needs no hub, anything else what an id looks like."""
    from core.errors import CliError
    from core.hub.local import find_bundled
    from core.hub.records import is_hub_id

    if is_hub_id(model_id):
        return
    bundled = find_bundled(model_id)
    if bundled is not None:
        raise CliError(t("hub.cli.bundled_no_download", name=bundled.name), 2)
    raise CliError(t("hub.cli.not_an_id", id=model_id), 2)


def _print_facts(facts: Any, fits: Any) -> None:
    from core.hub.facts import DEFAULT_BATCH, DEFAULT_SEQ_LEN, REFERENCE_GPU

    if facts is not None:
        print(t("hub.cli.facts_header"))
        from core.text_width import cell_len, pad

        # Labels from the catalogue (the JSON keys stay the data names); padded in cells for CJK labels.
        rows = [(t(f"hub.cli.fact.{key}"), _count(value) if key == "params" else _fact_value(value))
                for key, value in facts.to_json().items()]  # a count as search shows it: 7.6B
        width = max(cell_len(label) for label, _ in rows) + 1
        for label, value in rows:
            print(f"  {pad(label, width)} {value}")
    if fits:
        header = ("hub.cli.fit_header_reference" if fits[0].reference else "hub.cli.fit_header")
        gpu = REFERENCE_GPU if fits[0].reference else fits[0].gpu
        print(t(header, gpu=gpu, batch=DEFAULT_BATCH, seq=DEFAULT_SEQ_LEN))
        for row in fits:
            print(f"  {row.method:<6} {row.peak_gib:7.1f} / {row.capacity_gib:.0f} GiB  "
                  f"{t('hub.cli.verdict.' + row.verdict, free=row.free_gib or 0.0, usable=row.usable_gib or 0.0)}")


def _config_info(args: argparse.Namespace, name: str, config: dict[str, Any], model: dict[str, Any],
                 title: str, notes: list[str] | None = None) -> int:
    """``models info`` from a config.json on this box (no hub asked): its facts and fit, ``model`` as the
    JSON's ``model``, ``title`` the text's first line, ``notes`` said after the facts (on stderr)."""
    from core.estimate import ArchitectureError
    from core.hub.facts import fit_on_box, model_facts

    facts = fits = None
    notes = list(notes or [])
    try:
        facts = model_facts(config, name=name)
        fits = fit_on_box(config, _box(), name=name)
    except ArchitectureError as exc:
        notes.append(str(exc))
    if args.json:
        print(json.dumps({
            "model": model, "config": config, "facts": facts.to_json() if facts else None,
            "fit": [row.to_json() for row in fits] if fits else None, "notes": notes,
        }, indent=2))
        return 0
    print(title)
    _print_facts(facts, fits)
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def _bundled_info(args: argparse.Namespace, bundled: Any) -> int:
    """``models info tiny``: a bundled model's facts from its own config.json, no hub asked."""
    from core.hub.local import bundled_config

    return _config_info(args, bundled.name, bundled_config(bundled),
                        {"id": bundled.name, "bundled": bundled.kind, "path": str(bundled.path)},
                        f"{bundled.name}  ({t('hub.cli.bundled_label')}: {t('hub.cli.bundled.' + bundled.kind)})")


def _local_info(args: argparse.Namespace, exc: BaseException, endpoint: str) -> int | None:
    """``models info ID`` with the hub out of reach and ID on this box: the facts of the copy on disk (as the
    app's Local tab shows them), the hub's failure said first on stderr; None when there is no such copy
    or its config.json cannot be read (the hub's failure is then the answer)."""
    from core.estimate.model_source import cached_config, read_config_json
    from core.hub.problems import describe_error

    problem = describe_error(exc, args.hub, endpoint)
    path = cached_config(args.model_id) if problem.offline else None
    config = read_config_json(path) if path is not None else None
    if path is None or config is None:
        return None
    print(problem.summary, file=sys.stderr)
    print(t("hub.cli.info_from_disk", path=str(path.parent)), file=sys.stderr)
    return _config_info(args, args.model_id, config, {"id": args.model_id, "hub": args.hub,
                                                       "path": str(path.parent), "offline": True},
                        f"{args.model_id}  ({t('hub.cli.on_disk_label')})")


def _folder_info(args: argparse.Namespace, folder: Any, config_path: Any = None) -> int:
    """``models info /some/folder``: the facts and fit of its config.json, as the app's Local tab shows them,
    the model as the Local tab names it (a hub cache's by its id), and what it lacks to be trained, if
    anything; no config.json there, or one that cannot be read: a usage error (exit 2) saying so."""
    from core.errors import CliError
    from core.hub.download import human_bytes, list_downloads
    from core.hub.local import config_json_of, download_of, folder_model, local_model_at, user_model_dirs
    from core.settings import load_settings

    model = local_model_at(folder, user_model_dirs(load_settings()))
    listed = model is not None
    if model is None:  # a folder the Local tab does not list: its own config.json only (not a folder of models)
        model = folder_model(folder)
        path = config_path or (folder / "config.json" if (folder / "config.json").is_file() else None)
    else:
        path = config_path or config_json_of(model, folder)
    if path is None:
        raise CliError(t("hub.cli.folder_no_config", path=str(folder)), 2)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(t("hub.cli.folder_config_unreadable", path=str(path), error=str(exc)), 2) from exc
    if not isinstance(config, dict):
        raise CliError(t("hub.cli.folder_config_unreadable", path=str(path), error=type(config).__name__), 2)
    notes = [] if model.complete else [_incomplete_reason(model, download_of(model, list_downloads()), listed)]

    label = t("hub.cli.folder_label", path=str(model.path), size=human_bytes(model.size_bytes))
    return _config_info(args, model.model_id, config, {**model.to_json(), "config_path": str(path)},
                        f"{model.model_id}  ({label})", notes)


def run_info(args: argparse.Namespace) -> int:
    from core.estimate import ArchitectureError
    from core.hub.download import human_bytes
    from core.hub.errors import HubError
    from core.hub.facts import fit_on_box, model_facts
    from core.hub.local import find_bundled

    bundled = find_bundled(args.model_id)
    if bundled is not None:
        return _bundled_info(args, bundled)
    from pathlib import Path

    path = Path(args.model_id).expanduser()
    if path.exists():  # a folder (or its config.json) on disk, as plan and estimate take it: no hub asked
        return _folder_info(args, path.parent if path.is_file() else path, path if path.is_file() else None)
    _check_id(args.model_id)
    source = _source(args)
    try:
        details = source.details(args.model_id)
    except HubError as exc:
        shown = _local_info(args, exc, source.endpoint)
        if shown is not None:
            return shown
        raise _fail(exc, args.hub, source.endpoint) from exc
    facts = fits = None
    notes = list(details.notes)
    if details.config is not None:
        try:
            facts = model_facts(details.config, name=args.model_id)
            fits = fit_on_box(details.config, _box(), name=args.model_id)
        except ArchitectureError as exc:
            notes.append(str(exc))
    if args.json:
        print(json.dumps({
            # the count of config.json where there is one, as the app's row shows it once the card is read
            # (the search's is read off the name: "7B" for Qwen2.5-7B's 7.6 billion)
            "model": {**details.summary.to_json(), **({"params": facts.params} if facts else {})},
            "revision": details.revision,
            "files": [f.to_json() for f in details.files], "total_size": details.total_size,
            "config": details.config, "facts": facts.to_json() if facts else None,
            "fit": [row.to_json() for row in fits] if fits else None, "readme": details.readme, "notes": notes,
        }, indent=2))
        return 0
    summary = details.summary
    print(f"{summary.model_id}  ({args.hub})")
    print(t("hub.cli.info_stats", downloads=_count(summary.downloads), likes=_count(summary.likes),
            updated=_date(summary.updated), license=summary.license or t("hub.cli.na")))
    _print_facts(facts, fits)
    print(t("hub.cli.files_header", count=len(details.files), size=human_bytes(details.total_size)))
    for item in details.files:
        print(f"  {human_bytes(item.size):>10}  {item.path}")
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def _box() -> Any:
    """This box's GPUs and the memory other processes hold on them (``core.plan.HardwareTarget``); None when
    NVML is unavailable."""
    try:
        from core.hardware.monitor import open_monitor
        from core.plan.hardware import target_from_snapshot

        with open_monitor() as monitor:
            return target_from_snapshot(monitor.poll())
    except Exception:  # no driver, no NVML binding: the estimate falls back to a reference GPU
        return None


class ProgressPrinter:
    """The download's progress on ``stream``. On a terminal: one line rewritten in place, cut to the
    terminal's width (a longer one wraps, and ``\\r`` rewinds only its last row) and cleared to its end.
    Elsewhere (a log, a pipe): a plain line at once, then at every tenth of the download, at each retry, when
    the bytes stop coming, and at least every ``PLAIN_EVERY_S`` seconds, so that a log never looks hung (its
    first line came only at a tenth or after half a minute, and a stall was silent until the retry).

    No byte for ``core.hub.download.STALL_AFTER_S`` seconds (the hub holds the transfer; the downloader tries again only after
    its read timeout): the line says so and since when, not the speed and ETA of before the stall."""

    PLAIN_EVERY_S = 30.0
    PLAIN_STEP = 10  # percent

    def __init__(self, stream: Any, clock: Any = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        try:
            self.tty = bool(stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.last_line = ""
        self.last_plain = clock()
        self.next_step = self.PLAIN_STEP
        self.rewritten = False
        self.last_retry: int | None = None  # a log gets a line for each new retry, not only every tenth
        self.said_plain = False
        self.moved: tuple[int, str | None, float] | None = None  # (bytes, file) last seen to change, and when
        self.said_stall = False

    def width(self) -> int:
        """Columns of the terminal ``stream`` is on (the environment's COLUMNS, else 80, when unknown)."""
        import os
        import shutil

        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return shutil.get_terminal_size().columns

    def stalled_for(self, status: Any) -> float | None:
        """Seconds without a new byte (or a new file), as this watcher saw it; None while bytes come (or none is
        due: the file's checksum is being checked), and while the download is still queued: its downloader is
        starting, or waiting for the lock of the job's last one (no transfer yet that a hub could hold)."""
        now = self.clock()
        if status.status != "running":
            self.moved = None  # counted from when it runs
            return None
        mark = (status.bytes_done, f"{status.current_file} {status.verifying}")
        if self.moved is None or self.moved[:2] != mark:
            self.moved = (*mark, now)
            return None
        waited = now - self.moved[2]
        from core.hub.download import STALL_AFTER_S

        return waited if waited >= STALL_AFTER_S else None

    def line(self, status: Any, stalled_s: float | None = None) -> str:
        from core.hub.download import human_bytes

        if status.verifying:  # the file is whole: no byte comes while its checksum is read, and none is missing
            return t("hub.cli.download_verifying", done=human_bytes(status.bytes_done),
                     total=human_bytes(status.bytes_total), file=status.current_file or "").rstrip()
        if stalled_s is not None and not status.retrying:  # the speed and ETA of before the stall are not live
            from core.hub.http import READ_TIMEOUT_S

            return t("hub.cli.download_stalled", done=human_bytes(status.bytes_done),
                     total=human_bytes(status.bytes_total), seconds=int(stalled_s), timeout=int(READ_TIMEOUT_S),
                     file=status.current_file or "").rstrip()
        if status.retrying:  # the link dropped: no rate or ETA until bytes come again
            return t("hub.cli.download_retrying", done=human_bytes(status.bytes_done),
                     total=human_bytes(status.bytes_total), attempt=status.retry_attempt,
                     reason=status.retry_reason or "", file=status.current_file or "").rstrip()
        return t("hub.cli.download_progress", done=human_bytes(status.bytes_done),
                 total=human_bytes(status.bytes_total), rate=human_bytes(status.rate_bps),
                 eta=format_duration(status.eta_s), file=status.current_file or "").rstrip()

    def show(self, status: Any) -> None:
        stalled_s = self.stalled_for(status)
        line = self.line(status, stalled_s)
        if self.tty:
            if line != self.last_line:
                from core.text_width import truncate

                # one cell short of the width: a line that fills the last column wraps on some terminals
                self.stream.write("\r" + truncate(line, max(10, self.width() - 1)) + CLEAR_TO_LINE_END)
                self.stream.flush()
                self.rewritten = True
            self.last_line = line
            return
        now = self.clock()
        percent = int(status.bytes_done * 100 // status.bytes_total) if status.bytes_total else 0
        retry_now = status.retry_attempt if status.retrying else None
        retry_news, self.last_retry = retry_now is not None and retry_now != self.last_retry, retry_now
        stall_news = stalled_s is not None and not status.retrying and not status.verifying and not self.said_stall
        self.said_stall = stalled_s is not None and (self.said_stall or stall_news)
        if (not self.said_plain or percent >= self.next_step or now - self.last_plain >= self.PLAIN_EVERY_S
                or retry_news or stall_news):
            self.stream.write(t("hub.cli.download_progress_plain", percent=percent, line=line) + "\n")
            self.stream.flush()
            self.last_plain = now
            self.said_plain = True
            while self.next_step <= percent:
                self.next_step += self.PLAIN_STEP

    def end(self) -> None:
        """Leave the rewritten line behind (the next message starts on a line of its own)."""
        if self.rewritten:
            self.stream.write("\n")
            self.stream.flush()
            self.rewritten = False


def run_download(args: argparse.Namespace) -> int:
    from core.hub.download import (
        cancel_download,
        check_disk,
        download_running,
        download_state_label,
        human_bytes,
        job_dir_for,
        plan_download,
        read_status,
        recorded_files,
        start_or_join_download,
    )
    from core.hub.errors import HubError
    from core.hub.tokens import hub_token

    _check_id(args.model_id)
    job_dir = job_dir_for(args.hub, args.model_id)  # this model's download record, under way or not
    if args.cancel:
        sent = cancel_download(job_dir)
        if args.json:
            print(json.dumps({"cancelled": sent, "job_dir": str(job_dir)}))
        else:
            print(t("hub.cli.cancel_sent" if sent else "hub.cli.cancel_none", model=args.model_id), file=sys.stderr)
        return 0  # nothing running is no failure: none runs after it, as wanted (``stop`` of an ended run says 0 too)
    if download_running(job_dir):  # its downloader runs, or is still starting
        if args.include is not None:
            # start_download leaves a running downloader alone: the files chosen here would not be the ones fetched.
            raise _running_include_error(args, job_dir)
        # Another terminal (or the app) runs this download: follow it. Planning it afresh would count the free
        # space the running download has already taken and could refuse it ("Not enough disk").
        running = read_status(job_dir)
        if running is not None:
            if args.detach:
                if args.json:
                    print(json.dumps({"job_dir": str(job_dir), "target_dir": running.target_dir, "status": "running"}))
                else:
                    print(t("hub.cli.download_running", path=job_dir), file=sys.stderr)
                return 0
            if not args.json:
                print(t("hub.cli.download_following", path=job_dir), file=sys.stderr)
            return _follow_download(args, job_dir, running.model_id, running.target_dir)
    source = _source(args)
    # An unfinished download (under way, failed, cancelled, interrupted) goes on with the files it was started
    # with (--include '*' or one format), as the app's Local `d` does; --include chooses afresh.
    earlier = read_status(job_dir) if args.include is None else None
    resumed = recorded_files(earlier.job_dir) if earlier is not None and earlier.status != "done" else []
    try:
        details = source.details(args.model_id)
        plan = plan_download(source, details, args.include, paths=resumed or None)
        if plan.complete() and (earlier is None or earlier.status == "done"):
            # Run again on a finished model it said "Downloading 2 files (8.4 MB)" and fetched nothing.
            if args.json:
                print(json.dumps({"job_dir": str(job_dir), "target_dir": str(plan.target_dir), "status": "done",
                                  "already_downloaded": True}))
            else:
                print(t(plural_key("hub.cli.download_already", len(plan.files)), count=len(plan.files),
                        size=human_bytes(plan.total_bytes), model=plan.model_id, path=plan.target_dir),
                      file=sys.stderr)
            return 0
        check_disk(plan)
    except HubError as exc:
        raise _fail(exc, args.hub, source.endpoint, code=exc.exit_code) from exc
    if not args.json:
        print(t(plural_key("hub.cli.download_plan", len(plan.files)), count=len(plan.files),
                size=human_bytes(plan.total_bytes), model=plan.model_id, path=plan.target_dir), file=sys.stderr)
        if resumed:
            print(t("hub.cli.download_resumed_choice", status=download_state_label(earlier.status)), file=sys.stderr)
        if plan.skipped:  # why each is left out: --include, the earlier download's choice, or its format
            why = "hub.cli.download_skipped" + ("_include" if args.include else "_resumed" if resumed else "")
            print(t(plural_key(why, len(plan.skipped)), count=len(plan.skipped),
                    size=human_bytes(sum(f.size for f in plan.skipped)),
                    names=", ".join(f.path for f in plan.skipped[:5])), file=sys.stderr)
    # The look and the start are one step (a lock): of two starts at the same instant one starts the download,
    # the other finds it running, and leaves its job (its files) as they are.
    job_dir, started = start_or_join_download(plan, hub_token(args.hub))
    running = not started
    if running and args.include is not None:
        raise _running_include_error(args, job_dir)
    if args.detach:
        if args.json:
            print(json.dumps({"job_dir": str(job_dir), "target_dir": str(plan.target_dir),
                              "status": "running" if running else "started"}))
        else:
            print(t("hub.cli.download_running" if running else "hub.cli.download_started", path=job_dir),
                  file=sys.stderr)
        return 0
    return _follow_download(args, job_dir, plan.model_id, str(plan.target_dir))


def _running_include_error(args: argparse.Namespace, job_dir: Any) -> Exception:
    """--include asked while a download of the model runs: refused, saying which files that download fetches."""
    from core.errors import CliError
    from core.hub.download import recorded_files
    from core.hub.local import download_command

    files = recorded_files(job_dir)
    names = ", ".join(files[:5]) + (", …" if len(files) > 5 else "")
    return CliError(t("hub.cli.download_running_include", model=args.model_id, files=names or "-",
                      command=download_command(args.model_id, args.hub)), 2)


def _follow_download(args: argparse.Namespace, job_dir: Any, model_id: str, target_dir: str) -> int:
    """Show the progress of the download in ``job_dir`` until it ends; its exit code (0 done, 4 cancelled)."""
    from core.hub.download import read_status
    from core.stop_signals import StopSignal, exit_code, stop_signals_raise

    # SIGTERM (kill, a job's time limit) and SIGHUP (the SSH connection lost) ended the watcher at once: exit 143,
    # not a word of what became of the download. The downloader runs in its own session and goes on: say so.
    status = None
    progress = ProgressPrinter(sys.stderr)
    try:
        with stop_signals_raise():  # left (the handlers of before back) before it is said: a second signal ends it
            while True:
                status = read_status(job_dir)
                if status is not None and not status.active:
                    break
                if status is not None and not args.json:
                    progress.show(status)
                time.sleep(0.2)
    except KeyboardInterrupt as exc:
        try:
            progress.end()
            if isinstance(exc, StopSignal):
                from core.hub.local import download_command

                print(t("hub.cli.download_detached_signal", why=exc.name, path=job_dir,
                        command=download_command(model_id, args.hub)), file=sys.stderr)
            else:
                print(t("hub.cli.download_detached"), file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # the terminal is gone (SIGHUP): no one to tell, the exit code says it
            pass
        return exit_code(exc)
    progress.end()
    assert status is not None
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    if status.status == "done":
        if not args.json:
            print(t("hub.cli.download_done", model=model_id, path=target_dir), file=sys.stderr)
        return 0
    if status.status == "cancelled":
        if not args.json:
            print(t("hub.cli.download_cancelled", model=model_id), file=sys.stderr)
        return 4
    from core.errors import CliError

    if status.status == "interrupted":
        # The downloader's process ended unfinished (killed: OOM, a reboot): "failed: interrupted", in English
        # under any language, and no word that the same command resumes it.
        from core.hub.download import human_bytes
        from core.hub.local import download_command

        raise CliError(t("hub.cli.download_interrupted", model=model_id, done=human_bytes(status.bytes_done),
                         total=human_bytes(status.bytes_total), command=download_command(model_id, args.hub)), 3)
    raise CliError(t("hub.cli.download_failed", model=model_id, error=status.error or status.status), 3)


def _incomplete_reason(model: Any, download: Any, listed: bool = True) -> str:
    """Why a model on disk cannot be trained as it is, and what to do: the command that resumes its
    download (a hub's model), or what the folder lacks (one of the user's). ``download`` is tunedeck's
    record of the download that filled the folder, if any: its hub and id are known, whatever the folder holds;
    ``listed`` False for a folder ``models list`` does not show (``models info PATH``): no setting to undo."""
    from core.hub.download import download_state_label
    from core.hub.local import download_command, partial_files

    hub, model_id = _incomplete_id(model, download)
    # without a config.json or a record the folder's name may be no model's id (a stray folder): no id is made up
    resume = download_command(model_id or t("hub.cli.owner_name"), hub) if hub else ""
    if download is not None and download.active:
        # Still being downloaded: "resumes it, or delete the folder" was no way out (rm refuses a folder a
        # download writes into), and the raw status word stayed English under zh.
        return t("hub.cli.incomplete.running", command=resume)
    stopped = download_state_label(download.status) if download is not None and download.status != "done" else ""
    if model.weights == "partial":
        count = len(partial_files(model.path))
        key = plural_key("hub.cli.incomplete.partial", count)
    elif not model.has_config:
        key, count = "hub.cli.incomplete.no_config", 0
    else:
        key, count = "hub.cli.incomplete.no_weights", 0
    text = t(key, count=count)
    if stopped:
        text = t("hub.cli.incomplete.download", status=stopped) + " " + text
    return text + " " + (t("hub.cli.incomplete.resume", command=resume) if resume
                         else t("hub.cli.incomplete.folder") if listed else t("hub.cli.incomplete.unlisted"))


def _incomplete_id(model: Any, download: Any) -> tuple[str, str]:
    """(hub, id) of an incomplete model as ``models list`` names it: tunedeck's download record says both
    (a failed download may leave no config.json); else the cache's folder name, trusted only beside a
    config.json (a stray folder is named by its path alone: id ""); a folder of the user's has no hub."""
    if download is not None:
        return download.hub, download.model_id
    hub = "" if model.source == "folder" else model.source
    return hub, model.model_id if model.has_config else ""


def run_list(args: argparse.Namespace) -> int:
    from core.hub.download import human_bytes, list_downloads
    from core.hub.hf_source import hf_hub_cache
    from core.hub.local import bundled_models, download_of, list_local_models, user_model_dirs
    from core.hub.modelscope_source import modelscope_cache_root
    from core.settings import load_settings
    from core.text_width import pad

    models = list_local_models(user_model_dirs(load_settings()))
    downloads = list_downloads()
    if args.hub:  # one hub's models and downloads; the user's own folders belong to none
        models = [m for m in models if m.source == args.hub]
        downloads = [d for d in downloads if d.hub == args.hub]
    bundled = bundled_models()
    if args.json:
        print(json.dumps({"models": [{**m.to_json(), "download": getattr(download_of(m, downloads), "status", None)}
                                     for m in models],
                          "downloads": [d.to_json() for d in downloads],
                          "bundled": [b.to_json() for b in bundled]}, indent=2))
        return 0
    complete = [m for m in models if m.complete]
    # a download that failed, was stopped or is still going: not a model to train yet
    incomplete = [m for m in models if not m.complete]
    if not complete:
        print(t("hub.cli.local_none", ms=modelscope_cache_root(), hf=hf_hub_cache()), file=sys.stderr)
    else:
        print(t("hub.cli.local_header"), file=sys.stderr)
        for model in complete:
            used = time.strftime("%Y-%m-%d", time.localtime(model.last_used)) if model.last_used else "-"
            print(f"{model.source:<10} {model.model_id:<48} {human_bytes(model.size_bytes):>10}  {used}  {model.path}")
    if incomplete:
        print(t("hub.cli.incomplete_header"), file=sys.stderr)
        for model in incomplete:
            record = download_of(model, downloads)
            _, name = _incomplete_id(model, record)  # a stray folder is named by its path only
            print(f"{model.source:<10} {name:<48} {human_bytes(model.size_bytes):>10}  {model.path}")
            print(f"{'':<10} {_incomplete_reason(model, record)}")
    print(t("hub.cli.bundled_header"), file=sys.stderr)
    for item in bundled:
        print(f"{item.name:<20} {t('hub.cli.bundled.' + item.kind)}")
    if downloads:
        print(t("hub.cli.downloads_header"), file=sys.stderr)
        for item in downloads:
            # a finished one whose folder was deleted by hand since said "done" of a model that is not there
            state = _download_state(item)
            print(f"{item.hub:<10} {item.model_id:<48} {pad(state, 11)} "
                  f"{human_bytes(item.bytes_done)} / {human_bytes(item.bytes_total)}")
            if item.status == "unreadable":  # which file and key, and the way out
                print(f"{'':<10} {item.error}")
    return 0


def _download_state(item: Any) -> str:
    """A download record's state as ``models list`` says it: "deleted" for a finished one whose folder is gone."""
    from core.hub.download import download_state_label

    return t("hub.cli.download_folder_gone") if item.target_gone else download_state_label(item.status)


def _models_with_id(target: str, hub: str | None, models: list[Any]) -> list[Any]:
    """The models on disk whose hub id is ``target`` as ``models list`` shows it (case aside; ``hub``'s only)."""
    return [m for m in models if m.model_id.lower() == target.strip().lower() and (hub is None or m.source == hub)]


def _local_model_named(target: str, hub: str | None, models: list[Any]) -> Any:
    """The model on disk ``models rm`` means: a path (its folder, or a hub cache's ``snapshots/<rev>`` in it;
    any other path inside a model is refused, naming the model's folder to pass), else an
    id as ``models list`` shows it (one hub's with ``--hub``). None found, or an id two folders share: a
    usage error (exit 2) saying what to name instead."""
    from pathlib import Path

    from core.errors import CliError
    from core.hub.local import find_bundled

    path = Path(target).expanduser()
    if path.exists():
        resolved = path.resolve()
        found = [m for m in models if resolved == m.path.resolve()
                 or (resolved.parent.name == "snapshots" and resolved.parent.parent == m.path.resolve())]
        if found:
            return max(found, key=lambda m: len(m.path.resolve().parts))  # the innermost: a folder of the user's
        holders = [m for m in models if m.path.resolve() in resolved.parents]
        if holders:  # a checkpoint or a file in a model: never the whole model by that name
            holder = max(holders, key=lambda m: len(m.path.resolve().parts))
            raise CliError(t("hub.cli.rm_inside_model", path=str(path), model=holder.model_id,
                             folder=str(holder.path)), 2)
        raise CliError(t("hub.local.delete_refused", path=str(path)) + " " + t("hub.cli.rm_list_hint"), 2)
    found = _models_with_id(target, hub, models)
    if len(found) == 1:
        return found[0]
    if found:
        raise CliError(t("hub.cli.rm_ambiguous", id=target, paths="\n".join(
            f"  {m.source:<10} {m.path}" for m in found)), 2)
    if find_bundled(target) is not None:
        raise CliError(t("hub.cli.rm_bundled", name=target), 2)
    raise CliError(t("hub.cli.rm_not_found", id=target) + " " + t("hub.cli.rm_list_hint"), 2)


def _confirm_delete(model: Any) -> bool:
    """Ask on the terminal whether to delete ``model`` (y deletes; anything else, Enter and end of input keep
    it), as the app's dialog does; with no terminal to ask on, a usage error: ``--yes`` is the way."""
    from core.errors import CliError
    from core.hub.download import human_bytes

    try:
        interactive = sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        interactive = False
    if not interactive:
        raise CliError(t("hub.cli.rm_needs_yes", model=model.model_id), 2)
    print(t("hub.cli.rm_confirm", model=model.model_id, path=str(model.path), size=human_bytes(model.size_bytes)),
          end=" ", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def _forget_stale_records(args: argparse.Namespace) -> int | None:
    """``models rm ID`` of no model on disk whose download record ``models list`` still lists (ended, its folder
    gone: "deleted" when it had finished): the record is removed (it holds no file of the model), as the delete of
    its model would have; it stayed listed for good, no command removing it. None when there is no such record."""
    from core.hub.local import forget_download_records, stale_download_records

    removed = forget_download_records(stale_download_records(args.target, args.hub))
    if not removed:
        return None
    if args.json:
        print(json.dumps({"deleted": False, "model": None, "freed_bytes": 0,
                          "forgotten_downloads": [job.to_json() for job in removed]}, indent=2))
        return 0
    for job in removed:
        print(t("hub.cli.rm_forgot", model=job.model_id, status=_download_state(job), path=job.target_dir or "-"),
              file=sys.stderr)
    return 0


def run_rm(args: argparse.Namespace) -> int:
    """``models rm ID|PATH``: the Local tab's ``x``. Refused as the app refuses (exit 2, nothing deleted):
    a download still running into it, a live run training on it. Asks first unless ``--yes``; no at the
    question exits 4 (as a cancelled download does), nothing deleted."""
    from pathlib import Path

    from core.errors import EXIT_CANCELLED
    from core.hub.download import human_bytes
    from core.hub.local import delete_blocker, delete_local_model, list_local_models, user_model_dirs
    from core.settings import load_settings

    dirs = user_model_dirs(load_settings())
    models = list_local_models(dirs)
    if not _models_with_id(args.target, args.hub, models) and not Path(args.target).expanduser().exists():
        forgotten = _forget_stale_records(args)
        if forgotten is not None:
            return forgotten
    model = _local_model_named(args.target, args.hub, models)
    blocker = delete_blocker(model, dirs)  # said before the question, not after a y
    if blocker is not None:
        raise blocker
    if not args.yes and not _confirm_delete(model):
        if args.json:
            print(json.dumps({"deleted": False, "model": model.to_json(), "freed_bytes": 0}, indent=2))
        print(t("hub.cli.rm_kept", model=model.model_id), file=sys.stderr)
        return EXIT_CANCELLED
    freed = delete_local_model(model, dirs)
    if args.json:
        print(json.dumps({"deleted": True, "model": model.to_json(), "freed_bytes": freed}, indent=2))
    else:
        print(t("hub.cli.rm_done", model=model.model_id, path=str(model.path), size=human_bytes(freed)),
              file=sys.stderr)
    return 0
