"""The chat screen's model process: loads base + adapter once, answers JSON-line requests with tokens.

``python -m core.lifecycle.chat_worker (--run RUN_DIR [--checkpoint N] | --model-dir DIR)``

stdin, one JSON object a line::

    {"id": 1, "variant": "tuned" | "base", "messages": [...], "temperature": 0.7, "max_tokens": 256}
    {"replies": [{"id": 1, "variant": "base", ...}, {"id": 2, "variant": "tuned", ...}]}
                          the replies to one message side by side: each is checked against the context
                          before any is generated, and if one goes past it, none is (too_long for each)
    {"stop": [1, 2]}      the replies of these ids end now (at the next token; one not begun is not begun)

stdout, one JSON object a line (nothing else is ever written there)::

    {"event": "ready", "has_adapter": true, "label": "...", "step": 40}   (step null: a model folder)
    {"event": "token", "id": 1, "variant": "tuned", "text": "..."}
    {"event": "done", "id": 1, "variant": "tuned", "seconds": 0.8, "stopped": false}
    {"event": "too_long", "id": 1, "variant": "tuned", "prompt": 2000, "max_tokens": 256, "limit": 2048,
     "over": true}        (the conversation and max_tokens go past the model's context: nothing generated;
                          over false: this one fits, but another reply of its group does not)
    {"event": "error", "id": 1, "message": "..."}        (id null: loading failed; the process exits)
    {"event": "warning", "message": "UserWarning: ... (modeling.py:12)"}
                          a Python warning of ours, of the user's or of a model's own code (remote code);
                          the machine-learning libraries' are kept quiet (``quiet_libraries``), as the server's

The app keeps the model out of its own process: a crash or an out-of-memory here never takes the
interface down, and closing the screen frees the memory by ending the process.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

_EMIT_LOCK = threading.Lock()  # a warning may come from the generating thread, mid-line of another record


def _emit(out: TextIO, **record: Any) -> None:
    with _EMIT_LOCK:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()


def _warnings_to(out: TextIO) -> None:
    """Python warnings that pass the filters become ``warning`` records (the app shows them): stderr goes
    nowhere here, and a warning ignored wholesale hid real problems along with the libraries' chatter."""
    import warnings

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        _emit(out, event="warning", message=f"{category.__name__}: {message} ({Path(filename).name}:{lineno})")

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lifecycle.chat_worker")
    parser.add_argument("--run", default=None)
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--model-dir", default=None)
    args = parser.parse_args(argv)
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries that print (DeepSpeed's logger) must not corrupt the protocol
    from core.lifecycle.library_noise import quiet_libraries

    quiet_libraries()  # the libraries' warnings and notes, not ours nor the user's, which the app shows
    _warnings_to(out)
    try:
        from core.lifecycle.chat import GenerationSettings, chat_prompt, stream_prompt
        from core.lifecycle.source import held, load_finetuned, load_model_dir, resolve_model_source
        from core.runs.run_dir import RunDirectory

        if args.model_dir:
            loaded = load_model_dir(Path(args.model_dir))
            label, step = Path(args.model_dir).name, None
        else:
            run = RunDirectory(Path(args.run))
            # held from choice to load: a live run's rotation removes no checkpoint chosen meanwhile (``held``)
            with held(run, resolve_model_source(run, args.checkpoint), args.checkpoint) as source:
                loaded = load_finetuned(source)
            label, step = f"{source.run_id} checkpoint-{source.step}", source.step
    except Exception as exc:
        stored = getattr(exc, "stored_message", None)  # its key and parameters: the app words it its own way
        _emit(out, event="error", id=None, message=str(exc),
              **({"message_record": stored.to_record()} if stored is not None else {}))
        return 1
    _emit(out, event="ready", has_adapter=loaded.has_adapter, label=label, step=step,
          device=loaded.device)
    requests = _Requests(sys.stdin)
    while (line := requests.next()) is not None:
        group = line["replies"] if isinstance(line.get("replies"), list) else [line]
        prepared = []  # (id, variant, settings, ChatPrompt)
        for request in (r for r in group if isinstance(r, dict)):
            rid = request.get("id")
            variant = str(request.get("variant") or "tuned")
            settings = GenerationSettings(temperature=float(request.get("temperature", 0.7)),
                                          max_tokens=int(request.get("max_tokens", 256)))
            try:
                prompt = chat_prompt(loaded, list(request.get("messages") or []), settings.max_tokens)
            except Exception as exc:  # this reply fails; the others of the group go on
                _emit(out, event="error", id=rid, variant=variant, message=str(exc))
                continue
            prepared.append((rid, variant, settings, prompt))
        if any(prompt.overflow is not None for *_, prompt in prepared):
            # said before generating, not a failure inside generate; side by side, one side past the context
            # refuses the message for both, or the two conversations would go out of step
            for rid, variant, settings, prompt in prepared:
                _emit(out, event="too_long", id=rid, variant=variant, prompt=prompt.tokens,
                      max_tokens=settings.max_tokens, limit=prompt.limit, over=prompt.overflow is not None)
            continue
        for rid, variant, settings, prompt in prepared:
            started = time.monotonic()
            stop = requests.begin(rid)
            try:
                if not stop.is_set():  # asked to stop before it began (the base's reply was stopped, side by side)
                    for piece in stream_prompt(loaded, prompt.ids, settings, variant, stop=stop):
                        _emit(out, event="token", id=rid, variant=variant, text=piece)
            except Exception as exc:  # one failed reply; the model stays loaded for the next
                _emit(out, event="error", id=rid, variant=variant, message=str(exc))
                continue
            _emit(out, event="done", id=rid, variant=variant, seconds=round(time.monotonic() - started, 3),
                  stopped=stop.is_set())
    return 0


class _Requests:
    """stdin read in a thread, so that a stop line reaches the reply being generated: requests queue up,
    stops end the reply under way (its ``stream_prompt`` stop event) or mark a queued one not to begin."""

    def __init__(self, stdin: TextIO) -> None:
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.lock = threading.Lock()
        self.stopped: set[Any] = set()
        self.current: tuple[Any, threading.Event] | None = None
        threading.Thread(target=self._read, args=(stdin,), daemon=True, name="tunedeck-chat-requests").start()

    def _read(self, stdin: TextIO) -> None:
        for line in stdin:
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if not isinstance(request, dict):
                continue
            if "stop" in request:
                ids = request["stop"] if isinstance(request["stop"], list) else [request["stop"]]
                with self.lock:
                    self.stopped.update(i for i in ids if isinstance(i, (int, str)))
                    if self.current is not None and self.current[0] in self.stopped:
                        self.current[1].set()
                continue
            self.queue.put(request)
        self.queue.put(None)  # stdin closed: the app is done with the model

    def next(self) -> dict[str, Any] | None:
        return self.queue.get()

    def begin(self, rid: Any) -> threading.Event:
        """The stop event of the reply ``rid`` about to be generated (set already if it was stopped)."""
        stop = threading.Event()
        with self.lock:
            self.current = (rid, stop)
            if rid in self.stopped:
                stop.set()
        return stop


if __name__ == "__main__":
    sys.exit(main())
