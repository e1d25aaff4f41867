"""Time from launch to first frame of the full-screen app, as a user sees it.

Starts ``tunedeck`` (the installed entry point of this checkout's venv) in a pseudo-terminal of
80×24, reads what it writes, and stops the clock when the first frame is complete: the footer's key
hints have been drawn. Median of several runs; also checks that torch/transformers/deepspeed were not
imported on the way (``python -X importtime`` in a separate run).

    .venv/bin/python bench/startup.py [--runs 7] [--out bench/results/startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pty
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = b"Quit"  # footer text, written as part of the first full frame
HEAVY = ("torch", "transformers", "deepspeed", "peft", "bitsandbytes", "datasets", "modelscope")


def first_frame_seconds(command: list[str], env: dict[str, str], timeout: float = 20.0) -> float:
    start = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execvpe(command[0], command, env)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    seen = b""
    try:
        while time.perf_counter() - start < timeout:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            seen += chunk
            if MARKER in seen:
                return time.perf_counter() - start
        raise RuntimeError(f"no first frame within {timeout}s; output tail: {seen[-400:]!r}")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)


def heavy_imports(python: str, env: dict[str, str]) -> list[str]:
    """Modules of the ML stack imported when the app module and its first screen are loaded."""
    code = "import sys, tui.app, tui.screens.gpus; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(out.stdout.split())
    return sorted(name for name in HEAVY if name in loaded)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = parser.parse_args()
    exe = ROOT / ".venv" / "bin" / "tunedeck"
    python = str(ROOT / ".venv" / "bin" / "python")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "TUNEDECK_HOME": home, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
        env.pop("TUNEDECK_FAKE_GPUS", None)
        first_frame_seconds([str(exe)], env)  # warm the page cache, as a second launch would be
        times = [first_frame_seconds([str(exe)], env) for _ in range(args.runs)]
        heavy = heavy_imports(python, env)
    result = {
        "what": "launch of `tunedeck` to first complete frame (footer drawn), pty 80x24, no GPU (NVML absent)",
        "runs": args.runs,
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
        "all_s": [round(x, 3) for x in times],
        "target_s": 1.0,
        "meets_target": statistics.median(times) < 1.0,
        "heavy_modules_imported": heavy,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "command": f"python bench/startup.py --runs {args.runs}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["meets_target"] and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
