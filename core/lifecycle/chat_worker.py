"""The chat screen's model process: loads base + adapter once, answers JSON-line requests with tokens.

``python -m core.lifecycle.chat_worker (--run RUN_DIR [--checkpoint N] | --model-dir DIR)``

stdin, one JSON object a line::

    {"id": 1, "variant": "tuned" | "base", "messages": [...], "temperature": 0.7, "max_tokens": 256}

stdout, one JSON object a line (nothing else is ever written there)::

    {"event": "ready", "has_adapter": true, "label": "..."}
    {"event": "token", "id": 1, "variant": "tuned", "text": "..."}
    {"event": "done", "id": 1, "variant": "tuned", "seconds": 0.8}
    {"event": "error", "id": 1, "message": "..."}        (id null: loading failed; the process exits)

The app keeps the model out of its own process: a crash or an out-of-memory here never takes the
interface down, and closing the screen frees the memory by ending the process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO


def _emit(out: TextIO, **record: Any) -> None:
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lifecycle.chat_worker")
    parser.add_argument("--run", default=None)
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--model-dir", default=None)
    args = parser.parse_args(argv)
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries that print (DeepSpeed's logger) must not corrupt the protocol
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        from core.lifecycle.chat import GenerationSettings, stream_chat
        from core.lifecycle.source import load_finetuned, load_model_dir, resolve_model_source
        from core.runs.run_dir import RunDirectory

        if args.model_dir:
            loaded = load_model_dir(Path(args.model_dir))
            label = Path(args.model_dir).name
        else:
            source = resolve_model_source(RunDirectory(Path(args.run)), args.checkpoint)
            loaded = load_finetuned(source)
            label = f"{source.run_id} checkpoint-{source.step}"
    except Exception as exc:
        stored = getattr(exc, "stored_message", None)  # its key and parameters: the app words it its own way
        _emit(out, event="error", id=None, message=str(exc),
              **({"message_record": stored.to_record()} if stored is not None else {}))
        return 1
    _emit(out, event="ready", has_adapter=loaded.has_adapter, label=label, device=loaded.device)
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        rid = request.get("id")
        variant = str(request.get("variant") or "tuned")
        settings = GenerationSettings(temperature=float(request.get("temperature", 0.7)),
                                      max_tokens=int(request.get("max_tokens", 256)))
        started = time.monotonic()
        try:
            for piece in stream_chat(loaded, list(request.get("messages") or []), settings, variant):
                _emit(out, event="token", id=rid, variant=variant, text=piece)
        except Exception as exc:  # one failed reply; the model stays loaded for the next
            _emit(out, event="error", id=rid, variant=variant, message=str(exc))
            continue
        _emit(out, event="done", id=rid, variant=variant, seconds=round(time.monotonic() - started, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
