"""``tunedeck merge / chat / evaluate / export / serve``: a finished run's result from the shell."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.lifecycle.library_noise import quiet_libraries
from core.stop_signals import StopSignal, stop_signals_raise


def register(subparsers: Any) -> None:
    from core.config.checks import cli_number
    from core.i18n import t

    def run_arg(p: argparse.ArgumentParser, optional: bool = False) -> None:
        p.add_argument("run", metavar="RUN", nargs="?" if optional else None, help=t("lifecycle.run_arg_help"))

    p = subparsers.add_parser("merge", help=t("lifecycle.merge_help"), description=t("lifecycle.merge_help"))
    run_arg(p)
    p.add_argument("--checkpoint", type=int, default=None, help=t("lifecycle.checkpoint_help"))
    p.add_argument("--out", default=None, help=t("lifecycle.out_help"))
    p.add_argument("--base", default=None, metavar="MODEL", help=t("lifecycle.merge_base_help"))
    p.add_argument("--force", action="store_true", help=t("lifecycle.force_help"))
    p.add_argument("--json", action="store_true", help=t("lifecycle.json_help"))
    p.set_defaults(handler=cmd_merge)

    p = subparsers.add_parser("chat", help=t("lifecycle.chat_help"), description=t("lifecycle.chat_help"))
    run_arg(p, optional=True)
    p.add_argument("--model-dir", type=_home_expanded, default=None, help=t("lifecycle.model_dir_help"))
    p.add_argument("--checkpoint", type=int, default=None, help=t("lifecycle.checkpoint_help"))
    p.add_argument("--system", default="", help=t("lifecycle.system_help"))
    # Bounded as argparse refuses: a temperature below 0 or a reply of 0 (or -4) tokens was taken, and
    # generation made one token of it anyway (a lone "�").
    p.add_argument("--temperature", type=cli_number(float, minimum=0), default=0.7,
                   help=t("lifecycle.temperature_help"))
    p.add_argument("--max-tokens", type=cli_number(int, minimum=1), default=256, help=t("lifecycle.max_tokens_help"))
    p.add_argument("--base", action="store_true", help=t("lifecycle.base_help"))
    p.set_defaults(handler=cmd_chat)

    p = subparsers.add_parser("evaluate", help=t("lifecycle.evaluate_help"),
                              description=t("lifecycle.evaluate_help"))
    run_arg(p)
    p.add_argument("--checkpoint", type=int, default=None, help=t("lifecycle.checkpoint_help"))
    p.add_argument("--benchmarks", default="", help=t("lifecycle.benchmarks_help"))
    p.add_argument("--json", action="store_true", help=t("lifecycle.json_help"))
    p.set_defaults(handler=cmd_evaluate)

    p = subparsers.add_parser("export", help=t("lifecycle.export_help"), description=t("lifecycle.export_help"))
    run_arg(p)
    p.add_argument("--format", default="merged", choices=["merged", "bnb-4bit", "bnb-8bit"],
                   help=t("lifecycle.format_help"))
    p.add_argument("--checkpoint", type=int, default=None, help=t("lifecycle.checkpoint_help"))
    p.add_argument("--out", default=None, help=t("lifecycle.export_out_help"))
    p.add_argument("--force", action="store_true", help=t("lifecycle.force_help"))
    p.add_argument("--json", action="store_true", help=t("lifecycle.json_help"))
    p.set_defaults(handler=cmd_export)

    p = subparsers.add_parser("serve", help=t("lifecycle.serve_help"), description=t("lifecycle.serve_help"))
    p.add_argument("run", metavar="RUN", nargs="?", help=t("lifecycle.serve_run_arg_help"))
    p.add_argument("--port", type=int, default=0, help=t("lifecycle.port_help"))
    p.add_argument("--host", default="127.0.0.1", help=t("lifecycle.host_help"))
    p.add_argument("--backend", default="auto", help=t("lifecycle.backend_help"))
    p.add_argument("--checkpoint", type=int, default=None, help=t("lifecycle.checkpoint_help"))
    p.add_argument("--model-dir", metavar="DIR", type=_home_expanded, default=None,
                   help=t("lifecycle.serve_model_dir_help"))
    p.add_argument("--api-key", metavar="KEY", default=None, help=t("lifecycle.api_key_help"))
    p.add_argument("--max-body-bytes", metavar="N", type=int, default=None, help=t("lifecycle.max_body_help"))
    action = p.add_mutually_exclusive_group()
    action.add_argument("--stop", action="store_true", help=t("lifecycle.stop_help"))
    action.add_argument("--status", action="store_true", help=t("lifecycle.serve_status_help"))
    p.add_argument("--json", action="store_true", help=t("lifecycle.json_help"))
    p.set_defaults(handler=cmd_serve)


def _home_expanded(value: str) -> str:
    """A folder argument with a leading ~ as the home folder: ``--model-dir=~/models/x`` reaches us as it is
    (the shell expands no ~ after "="), and was refused as "not a folder (it does not exist)"."""
    return os.path.expanduser(value)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _resolve(ref: str) -> Any:
    from core.runs.listing import resolve_run

    return resolve_run(ref)  # RunNotFound: exit 2


def _library_output_to_stderr() -> Any:
    """DeepSpeed (imported by peft) logs to stdout; keep stdout for our JSON and replies only."""
    import contextlib

    return contextlib.redirect_stdout(sys.stderr)


@contextmanager
def _said_if_interrupted(key: str, params: dict[str, object] | None = None) -> Iterator[None]:
    """Ctrl+C, SIGTERM (``kill``, a job's time limit) or SIGHUP (the SSH connection lost) under way: the
    message ``key`` (what was left as it was, ``why`` naming the interruption) on stderr, then main's exit
    130 for Ctrl+C, ``core.stop_signals.StopSignal`` for the caller to exit 128 + the signal's number as a process killed by it.

    A merge or export writes into a private folder renamed into place at its end, and removes it when it is
    interrupted, so it leaves its target as it found it. SIGTERM and SIGHUP killed the process where it was:
    ``OUT.tmp`` (the model's size: tens of GB on a rented box's disk) and the staging copy stayed. A signal
    ignored when the command started (``nohup``) stays ignored; a second one ends the process at once."""
    from core.i18n import t

    try:
        with stop_signals_raise():
            yield
    except KeyboardInterrupt as exc:
        why = exc.name if isinstance(exc, StopSignal) else "Ctrl+C"
        try:
            _err(t(key, why=why, **(params or {})))  # read now: the caller may have filled it in meanwhile
        except OSError:  # the terminal is gone (SIGHUP): there is no one to tell, the exit code says it
            pass
        raise


def _size(n: int) -> str:
    """A merge's or export's size: ``core.units.format_disk``, as the app says it."""
    from core.units import format_disk

    return format_disk(n)


def cmd_merge(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.lifecycle.merge import default_merge_dir, merge_run, merge_words
    from core.lifecycle.source import default_device, resolve_model_source

    run = _resolve(args.run)
    quiet_libraries()
    # torch is imported (seconds) before the checkpoint is chosen, not between the choice and its pin: a
    # live run's rotation removed the one chosen meanwhile, and the merge failed on a checkpoint "no longer
    # there" that the user never asked for.
    device = default_device()
    source = resolve_model_source(run, args.checkpoint)
    if args.base:  # refused here (a full fine-tune, other shapes) before "merging …" is said
        from core.lifecycle.source import with_base

        source = with_base(source, args.base)
    # --out=~/models/x: the shell leaves a ~ after "=" as it is; it is the home folder, not a folder named "~"
    out = Path(args.out).expanduser() if args.out else default_merge_dir(run, source.step)

    where: dict[str, object] = {"step": source.step, "out": str(out)}

    def chose(held: Any, target: Path) -> None:  # the newest again where a live run's rotation took this one
        where.update(step=held.step, out=str(target))

    def said(stage: str) -> None:  # once the merge really starts: not before a refusal or a reuse
        if stage == "load":
            _err(t("lifecycle.merging", run=run.id, step=where["step"], out=where["out"]))

    try:
        with _said_if_interrupted("lifecycle.merge_interrupted", where), _library_output_to_stderr():
            # reuse: rerun on its default folder, a whole merge of the same checkpoint there is the result as it
            # is (as the TUI's M and export do), not "exists already"; --out and --force are never reused.
            # The checkpoint is the one asked for, or none: one chosen here and passed on read as asked for,
            # and a rotation that took it meanwhile failed the merge ("checkpoint 30 … rotation") the user
            # never asked for, where the newest is merged
            result = merge_run(run, args.checkpoint, out if args.out else None, force=args.force,
                               device=device, reuse=True, progress=said, base=args.base, chosen=chose)
    except StopSignal as exc:
        return 128 + exc.signum
    if args.json:
        _print_json(result.to_dict())
    else:
        _err(merge_words(result))
        print(result.out)
    note = result.qlora_note()  # on stderr with --json too: stdout stays the JSON alone
    if note:
        _err(note)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import threading

    from core.errors import CliError
    from core.i18n import t
    from core.lifecycle.chat import (
        ChatTemplateFailed,
        ChatTemplateRefused,
        GenerationSettings,
        build_messages,
        chat_prompt,
        refuse_base_without_adapter,
        stream_prompt,
    )
    from core.lifecycle.source import (
        check_model_dir,
        held,
        load_finetuned,
        load_model_dir,
        resolve_model_source,
    )

    if not args.run and not args.model_dir:
        raise CliError(t("lifecycle.chat_needs_model"), 2)
    if args.base and args.model_dir:  # a model folder is loaded whole: there is no adapter to switch off
        raise CliError(t("lifecycle.chat_base_model_dir", path=args.model_dir), 2)
    if args.model_dir:
        check_model_dir(Path(args.model_dir))  # before "loading …": a folder that is no model says so alone
    quiet_libraries()
    out = sys.stdout  # replies only; everything the libraries print goes to stderr
    with _library_output_to_stderr():
        if args.model_dir:
            _err(t("lifecycle.loading", what=args.model_dir))
            loaded = load_model_dir(Path(args.model_dir), checked=True)  # checked above, once
        else:
            run = _resolve(args.run)
            source = resolve_model_source(run, args.checkpoint)
            if args.base:  # a full fine-tune: refused before minutes of loading, not answered by the tuned model
                refuse_base_without_adapter(source)
            # held from choice to load: a live run's rotation removes no checkpoint chosen meanwhile (``held``)
            with held(run, source, args.checkpoint) as source:
                _err(t("lifecycle.loading", what=f"{run.id} checkpoint-{source.step}"))
                loaded = load_finetuned(source)
    settings = GenerationSettings(temperature=args.temperature, max_tokens=args.max_tokens)
    variant = "base" if args.base else "tuned"
    history: list[dict[str, str]] = []
    # At a terminal an empty line ends the session; piped, the messages are a file's lines, some blank between
    # them: ending at the first blank line dropped the rest unsaid (exit 0). Piped, blank lines are skipped.
    interactive = sys.stdin.isatty()
    _err(t("lifecycle.chat_ready" if interactive else "lifecycle.chat_ready_piped"))
    for line in sys.stdin:  # Ctrl+C here (no reply under way) ends the session: main's exit 130
        text = line.rstrip("\r\n")  # a file of Windows lines: no \r sent at the end of each message
        if not text.strip():
            if interactive:
                break
            continue
        asked = {"role": "user", "content": text}
        # A message the template refuses or that does not fit is said in one line and left out of the
        # conversation; the session goes on.
        try:
            prompt = chat_prompt(loaded, build_messages(history + [asked], args.system), settings.max_tokens)
        except (ChatTemplateRefused, ChatTemplateFailed) as exc:
            _err(str(exc))
            continue
        over = prompt.overflow
        if over is not None:
            _err(t("lifecycle.chat_too_long", prompt=over.prompt, max_tokens=over.completion, total=over.total,
                   limit=over.limit))
            continue
        stop = threading.Event()
        reply: list[str] = []
        with _interrupt_sets(stop):
            for piece in stream_prompt(loaded, prompt.ids, settings, variant, stop=stop):
                reply.append(piece)
                out.write(piece)
                out.flush()
        out.write("\n")
        out.flush()
        if stop.is_set() and not reply:  # nothing answered: as if never sent
            _err(t("lifecycle.chat_stopped_empty"))
            continue
        if stop.is_set():
            _err(t("lifecycle.chat_stopped"))
        history += [asked, {"role": "assistant", "content": "".join(reply)}]
    return 0


class _interrupt_sets:  # noqa: N801 - used as a context manager, named as one
    """While a reply is generated, Ctrl+C (SIGINT) sets ``stop``: the reply ends at the next token and the
    session goes on. A second Ctrl+C before it ends raises KeyboardInterrupt as usual (a generation that
    does not come back). Off the main thread (no signal handler there) it changes nothing."""

    def __init__(self, stop: Any) -> None:
        self.stop = stop
        self.previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()

    def __enter__(self) -> None:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from core.errors import CliError
    from core.i18n import t
    from core.lifecycle.evaluate import evaluate_run, evaluation_summary, start_benchmarks
    from core.text_width import cell_len, pad

    run = _resolve(args.run)
    if args.benchmarks:
        from core.lifecycle.evaluate import benchmark_tool

        if benchmark_tool() is None:  # say so before spending minutes on the loss
            raise CliError(t("lifecycle.no_benchmark_tool"), 1)
    quiet_libraries()
    with _library_output_to_stderr():
        result = evaluate_run(run, args.checkpoint)
        bench = None
        if args.benchmarks:
            bench = start_benchmarks(run, [b.strip() for b in args.benchmarks.split(",") if b.strip()],
                                     args.checkpoint)
    if args.json:
        _print_json({**result, "benchmarks": bench})
    else:
        _err(evaluation_summary(result))
        # The labels in the interface's language (they were English under zh), padded to one width in cells
        labels = {"base": t("lifecycle.eval_label_base"), "tuned": t("lifecycle.eval_label_tuned")}
        width = max(cell_len(label) for label in labels.values()) + 1
        for prompt in result["prompts"]:
            lines = [f"> {prompt['prompt']}"]
            for variant in ("base", "tuned"):
                if prompt[variant] is not None:  # base: None for a full fine-tune, which has no base to answer
                    lines.append("  " + pad(labels[variant], width) + _under_label(prompt[variant], width + 2))
            _err("\n".join(lines))
        if bench:
            _err(t("lifecycle.benchmark_started", pid=bench["pid"], log=bench["log"]))
    return 0


def _under_label(reply: str, indent: int) -> str:
    """A reply of several lines with each line after the first under its first (``indent`` cells, past
    "  tuned: "): at the left margin they read as the next prompt's, or as output of their own."""
    return reply.replace("\n", "\n" + " " * indent)


def cmd_export(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.lifecycle.export import export_note, export_run

    run = _resolve(args.run)
    quiet_libraries()
    try:
        with _said_if_interrupted("lifecycle.export_interrupted"), _library_output_to_stderr():
            result = export_run(run, args.format, args.checkpoint, Path(args.out) if args.out else None,
                                args.force)
    except StopSignal as exc:
        return 128 + exc.signum
    if args.json:
        _print_json(result)
    else:
        if result.get("reused"):
            _err(t("lifecycle.export_reused", out=result["out"], size=_size(result["bytes"]), step=result["step"]))
        else:
            _err(t("lifecycle.exported", format=args.format, out=result["out"], size=_size(result["bytes"])))
        print(result["out"])
    note = export_note(result)  # as a merge says it: on stderr with --json too, stdout stays the JSON alone
    if note:
        _err(note)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from core.errors import CliError
    from core.i18n import t
    from core.lifecycle.serve import (
        ended_unstopped,
        health,
        model_dir_id,
        recorded_server_id,
        server_log_path,
        server_state,
        start_server,
        stop_server,
    )

    if bool(args.run) == bool(args.model_dir):
        raise CliError(t("lifecycle.serve_run_or_model_dir"), 2)
    if args.stop or args.status:
        # The server's id: a --model-dir folder's, one recorded under exactly this id, else the run's.
        if args.model_dir:
            key = model_dir_id(Path(args.model_dir))
        else:
            key = recorded_server_id(args.run) or _resolve(args.run).id
    if args.stop or args.status:
        # A server gone without a stop (killed, out of memory): said with its log, not as "no server".
        died = ended_unstopped(key)
        log_path = str(server_log_path(key))

        def not_running() -> None:
            if died is not None:
                _err(t("lifecycle.serve_ended_unstopped", run=key, pid=died, log=log_path))
            else:
                _err(t("lifecycle.serve_not_running", run=key))
    if args.stop:
        stopped = stop_server(key)
        if args.json:
            _print_json({"run_id": key, "stopped": stopped, **({"ended_unstopped": True, "log": log_path}
                                                              if died is not None and not stopped else {})})
        elif stopped:
            _err(t("lifecycle.serve_stopped", run=key))
        else:
            not_running()
        # No server to stop is no failure (none runs after it, as asked: `stop` of an ended run and `models
        # download --cancel` with none running exit 0 too); one that ended without a stop is news to act on.
        return 0 if stopped or died is None else 1
    if args.status:
        state = server_state(key)
        if state is None:
            if args.json:
                _print_json({"run_id": key, "running": False, **({"ended_unstopped": True, "log": log_path}
                                                                 if died is not None else {})})
            else:
                not_running()
            return 1
        healthy = health(state.url)
        if args.json:
            _print_json({**state.to_dict(), "running": True, "healthy": healthy})
        else:
            # Our server has no URL until its model is loaded: it is starting or loading, not "not answering"
            # at an empty address.
            said = (t("lifecycle.health_ok" if healthy else "lifecycle.health_down") if state.url
                    else t("lifecycle.phase." + (state.status if state.status in ("starting", "loading")
                                                 else "starting")))
            _err(t("lifecycle.serve_status" if state.step is None else "lifecycle.serve_status_step", run=key,
                   step=state.step, url=state.url or "–", pid=state.pid, backend=state.backend, health=said))
        return 0
    from core.lifecycle.serve import check_backend_name
    from core.lifecycle.server import API_KEY_ENV

    check_backend_name(args.backend)  # before the warnings: an unknown name is the one thing said

    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        raise CliError(t("lifecycle.bad_max_body", value=args.max_body_bytes), 2)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV, "")
    run = _resolve(args.run) if args.run else None
    key = run.id if run is not None else model_dir_id(Path(args.model_dir))
    # The public-host warning comes once start_server has looked for every refusal (a host not this
    # machine's, a run it cannot serve): a refused start is said alone, never after a warning.
    try:
        state = start_server(run, args.host, args.port, args.backend, args.checkpoint,
                             Path(args.model_dir) if args.model_dir else None, api_key=api_key,
                             max_body_bytes=args.max_body_bytes,
                             warn=lambda warning: _err(t("lifecycle.warning", text=warning)), note=_err)
    except KeyboardInterrupt:
        # Ctrl+C ends the wait, not the server (detached, its own session): said, with how to stop it,
        # rather than a silent exit 130 that left a server loading the model onto the GPU unbeknown.
        if server_state(key) is not None:
            _err(t("lifecycle.serve_interrupted", run=key))
        raise
    if args.json:
        _print_json({**state.to_dict(), "running": True, "healthy": True})
    else:
        _err(t("lifecycle.serve_started", run=state.run_id, url=state.url, pid=state.pid, backend=state.backend))
        print(state.url)
    return 0
