"""Ctrl+C on ``tunedeck serve RUN`` while its server starts: the wait ends, the detached server goes on, and
the command says so with how to stop it. The real CLI and the real server of the tiny LoRA run, the server
held before its imports (a gate file) so the CLI is known to be still waiting; CPU only, no GPU assumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# The CLI as `python -m core` runs it, its server held (before it imports anything) until GATE exists.
HELD_CLI = """
import sys
from core.lifecycle import serve
gate, real = sys.argv[1], serve._backend_command
wait = ("import os, runpy, sys, time\\nwhile not os.path.exists(%r): time.sleep(0.05)\\n"
        "sys.argv = ['server'] + sys.argv[1:]; "
        "runpy.run_module('core.lifecycle.server', run_name='__main__', alter_sys=True)") % gate
serve._backend_command = lambda *args, **kwargs: [sys.executable, "-c", wait, *real(*args, **kwargs)[3:]]
from core.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_ctrl_c_while_the_server_starts_says_it_goes_on_and_how_to_stop_it(lora_run, tmp_path):
    """Ctrl+C ended `serve` with exit 130 and not a word, while the server it had launched went on loading the
    model (onto the GPU) in its own session: the user believed it cancelled. Now the command says the server
    goes on starting in the background, and the --status and --stop that reach it."""
    from core.lifecycle import serve

    home, run = lora_run
    gate = tmp_path / "gate"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", HELD_CLI, str(gate), "serve", run.id], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TUNEDECK_HOME": str(home)})
    try:
        deadline = time.monotonic() + 120  # a generous bound for the launch to come, not a speed
        while serve.server_state(run.id) is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server was never launched"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert f"tunedeck serve {run.id} --stop" in err and "goes on starting" in err, err
        assert serve.server_state(run.id) is not None  # it did go on, as said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        serve.stop_server(run.id)
    assert serve.server_state(run.id) is None
