"""Where a training process's host (CPU) time goes, without the torch profiler's overhead (issue #19).

Put this folder first on ``PYTHONPATH`` with ``TUNEDECK_HOSTPROBE=DIR`` set: every Python process started
then loads it (``sitecustomize``), and in the engine's trainer (``python -m core.train.worker``) it

- samples every thread's Python stack every 5 ms (``sys._current_frames``) and, for the samples taken
  while the main thread is inside the Trainer's step loop, counts each thread's innermost frame (where
  the time is spent) and every function on its stack (what it is spent under);
- times every garbage collection (``gc.callbacks``): count, total and longest pause per generation, and
  the pauses over 5 ms;
- with ``TUNEDECK_HOSTPROBE_GC=freeze``, calls ``gc.freeze()`` when the step loop begins (the objects of
  the setup — model, data, tokenizer — then no longer take part in collections), for an A/B run.

At exit it writes ``DIR/probe-PID.txt``. Other processes (the CLI, the supervisor) are left alone. A
bench tool for the GPU machine: nothing in the product imports it. The sampling takes the interpreter's
lock from the trainer's threads: on the H200 box it slowed Python-bound steps by a fifth to a third
(``bench/results/estimate_matrix/profile-3*``), so a probed run's shares say where the time goes, and its
rate is not a measurement of the engine.
"""

from __future__ import annotations

import os
import sys

_DIR = os.environ.get("TUNEDECK_HOSTPROBE", "")
if _DIR and "core.train.worker" in getattr(sys, "orig_argv", []):
    import atexit
    import gc
    import threading
    import time
    from collections import Counter
    from pathlib import Path

    _INTERVAL_S = 0.005
    _LOOP = "_inner_training_loop"
    _state = {"in_loop": 0, "samples": 0, "loop_started": None, "frozen": None}
    _self: Counter = Counter()
    _under: Counter = Counter()
    _threads: Counter = Counter()
    _gc = {g: [0, 0.0, 0.0] for g in range(3)}  # generation -> [count, total s, longest s]
    _gc_long: list[tuple[float, int, float]] = []  # (s since the loop began, generation, pause s)
    _gc_began = [0.0]

    _names: dict = {}

    def _name(code) -> str:
        name = _names.get(code)
        if name is None:
            path = Path(code.co_filename)
            name = _names[code] = f"{path.parent.name}/{path.name}:{code.co_name}"
        return name

    def _stack(frame) -> list[str]:
        names = []
        while frame is not None:
            names.append(_name(frame.f_code))
            frame = frame.f_back
        return names  # innermost first

    def _on_gc(phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            _gc_began[0] = now
            return
        pause = now - _gc_began[0]
        entry = _gc[info.get("generation", 2)]
        entry[0] += 1
        entry[1] += pause
        entry[2] = max(entry[2], pause)
        if pause > 0.005 and _state["loop_started"] is not None:
            _gc_long.append((now - _state["loop_started"], info.get("generation", 2), pause))

    def _sample() -> None:
        me = threading.get_ident()
        main = threading.main_thread().ident
        names = {t.ident: t.name for t in threading.enumerate()}
        while True:
            time.sleep(_INTERVAL_S)
            frames = sys._current_frames()
            main_stack = _stack(frames.get(main))
            _state["samples"] += 1
            if not any(n.endswith(":" + _LOOP) for n in main_stack):
                continue
            if _state["loop_started"] is None:
                _state["loop_started"] = time.perf_counter()
                if os.environ.get("TUNEDECK_HOSTPROBE_GC") == "freeze":
                    gc.collect()
                    gc.freeze()
                    _state["frozen"] = gc.get_freeze_count()
            _state["in_loop"] += 1
            for ident, frame in frames.items():
                if ident == me:
                    continue
                if ident not in names:
                    names = {t.ident: t.name for t in threading.enumerate()}
                thread = "main" if ident == main else names.get(ident, f"thread-{ident}")
                stack = main_stack if ident == main else _stack(frame)
                if not stack:
                    continue
                _threads[thread] += 1
                _self[(thread, stack[0])] += 1
                for name in set(stack):
                    _under[(thread, name)] += 1

    def _write() -> None:
        n = max(1, _state["in_loop"])
        frozen = "" if _state["frozen"] is None else f" (froze {_state['frozen']} objects)"
        lines = [f"# host probe of pid {os.getpid()}: {' '.join(sys.orig_argv[-2:])}",
                 f"gc mode: {os.environ.get('TUNEDECK_HOSTPROBE_GC') or 'default'}{frozen}",
                 f"samples every {_INTERVAL_S * 1e3:.0f} ms: {_state['samples']}, in the step loop: {_state['in_loop']} "
                 f"(~{_state['in_loop'] * _INTERVAL_S:.1f} s)",
                 f"tracked objects at exit: {len(gc.get_objects())}", "", "## garbage collections", ""]
        for gen, (count, total, longest) in _gc.items():
            lines.append(f"gen{gen}: {count} collections, {total * 1e3:.1f} ms in all, longest {longest * 1e3:.1f} ms")
        loop_s = (time.perf_counter() - _state["loop_started"]) if _state["loop_started"] else 0.0
        lines.append(f"pauses > 5 ms after the step loop began ({loop_s:.1f} s ago at exit): {len(_gc_long)}, "
                     f"{sum(p for _, _, p in _gc_long) * 1e3:.0f} ms in all")
        lines += [f"  at {at:7.2f} s gen{gen} {pause * 1e3:7.1f} ms" for at, gen, pause in _gc_long[:40]]
        lines += ["", "## samples by thread (in the step loop)", ""]
        lines += [f"{count:7d} {100 * count / n:5.1f}%  {thread}" for thread, count in _threads.most_common()]
        lines += ["", "## innermost frame (self), % of step-loop samples", ""]
        lines += [f"{100 * c / n:5.1f}%  [{t}] {name}" for (t, name), c in _self.most_common(45)]
        lines += ["", "## on the stack (inclusive), % of step-loop samples", ""]
        lines += [f"{100 * c / n:5.1f}%  [{t}] {name}" for (t, name), c in _under.most_common(70)]
        Path(_DIR).mkdir(parents=True, exist_ok=True)
        (Path(_DIR) / f"probe-{os.getpid()}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")

    gc.callbacks.append(_on_gc)
    threading.Thread(target=_sample, name="tunedeck-hostprobe", daemon=True).start()
    atexit.register(_write)
