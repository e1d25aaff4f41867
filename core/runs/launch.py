"""Creating a run directory and starting its detached supervisor (``tunedeck train`` / ``resume``).

The supervisor is started in its own session (``start_new_session=True``) with stdin from /dev/null and
its output in ``supervisor.log``: closing the terminal, a SIGHUP to the shell's process group, or the
app exiting never reaches it.
"""

from __future__ import annotations

import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core import __version__
from core.paths import ensure_private_dir, runs_dir
from core.runs.run_dir import QUEUED, RunDirectory, utc_now_iso
from core.secrets import scrub_argv, scrub_env

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
# run.json's ``command`` for a run the wizard's probe starts to measure a plan (``RunSummary.probe``); its
# ``argv`` is still the ``tunedeck train`` that does the same.
PROBE_COMMAND = "probe"
# Environment variables worth recording in run.json (values of secret-looking ones are scrubbed).
_RECORDED_ENV_PREFIXES = ("CUDA_", "NCCL_", "TUNEDECK_", "HF_", "MODELSCOPE_", "TORCH", "OMP_", "PYTORCH_")


@dataclass
class DistributedSettings:
    """Multi-node rendezvous; one node: the defaults. Every node runs ``tunedeck train`` with the same
    config, its own ``node_rank`` and the same ``master_addr``/``master_port``."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0 = pick a free port (single node only)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"nnodes": self.nnodes, "node_rank": self.node_rank, "master_addr": self.master_addr,
                "master_port": self.master_port, **self.extra}


def _slug(text: str, limit: int = 24) -> str:
    """``text`` as the readable part of a run id: letters and digits of any script (a run named 中文任务 keeps
    its name, where ASCII alone made every Chinese name 'run'), the rest one dash; at most ``limit`` cells."""
    from core.text_width import cell_len

    slug = re.sub(r"[\W_]+", "-", text.lower()).strip("-")
    while cell_len(slug) > limit:
        slug = slug[:-1]
    return slug.strip("-") or "run"


def new_run_id(name: str, now: datetime | None = None) -> str:
    """``20261129-2301-qwen-lora-ab12``: sortable by time, readable, unique by its random tail."""
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%d-%H%M')}-{_slug(name)}-{secrets.token_hex(2)}"


def default_run_name(config: dict[str, Any]) -> str:
    model = str(config.get("model") or "model").rstrip("/")
    base = model.split("/")[-1]
    return f"{base}-{config.get('method', 'lora')}"


def recorded_env(env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    kept = {k: v for k, v in env.items() if k.startswith(_RECORDED_ENV_PREFIXES)}
    return dict(sorted(scrub_env(kept).items()))


def create_run(
    config: Any,
    argv: list[str],
    command: str = "train",
    gpus: list[int] | None = None,
    distributed: DistributedSettings | None = None,
    root: Path | None = None,
) -> RunDirectory:
    """Make ``runs_dir()/<id>`` (0700) with config.yaml, run.json and status.json (queued), all 0600.

    ``config`` is a ``RunConfig`` (anything with ``to_dict()`` and ``save(path)``). If any of it cannot be
    written (a full or read-only disk) the directory is removed again and the ``OSError`` raised: no
    half-made run is left behind.
    """
    values = config.to_dict()
    name = values.get("name") or default_run_name(values)
    root = ensure_private_dir(root or runs_dir())
    for _ in range(20):
        run_id = new_run_id(name)
        path = root / run_id
        try:
            path.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 20 collisions of a random tail within one minute
        raise RuntimeError(f"could not create a unique run directory under {root}")
    try:
        return _fill_run_dir(path, run_id, name, values, config, argv, command, gpus, distributed)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def config_summary(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``config_summary``: what the runs list, ``status`` and the app show of a run's config
    without reading its config.yaml. Written at creation, and again by a resume that changes keys."""
    return {"name": name, "model": values.get("model"), "method": values.get("method"),
            "dataset": values.get("dataset")}


def _fill_run_dir(path: Path, run_id: str, name: str, values: dict[str, Any], config: Any, argv: list[str],
                  command: str, gpus: list[int] | None, distributed: DistributedSettings | None) -> RunDirectory:
    os.chmod(path, 0o700)
    run = RunDirectory(path)
    config.save(run.config_path)
    os.chmod(run.config_path, 0o600)
    record = {
        "id": run_id,
        "created": utc_now_iso(),
        "command": command,
        "argv": scrub_argv(argv),
        "cwd": os.getcwd(),
        "gpus": list(gpus or []),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "tunedeck_version": __version__,
        "config_summary": config_summary(name, values),
        "distributed": (distributed or DistributedSettings()).to_dict(),
        "env": recorded_env(),
        "attempts": [],
    }
    run.update_record(**record)
    run.write_status(QUEUED, "")
    return run


def supervisor_command(run: RunDirectory, resume_from: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "core.runs.supervisor", str(run.path)]
    if resume_from is not None:
        cmd += ["--resume", str(resume_from)]
    return cmd


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the supervisor and trainer: ours, with tunedeck importable."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def start_supervisor(run: RunDirectory, resume_from: Path | None = None) -> subprocess.Popen:
    """Start ``python -m core.runs.supervisor RUN_DIR`` detached from this terminal and return at once.

    Under the ``CUDA_VISIBLE_DEVICES`` run.json recorded at launch (unset if it was): run.json's GPU indices
    count within it, so a resume from another shell trains on the GPUs the run was given, the ones the GPU
    check of a later launch compares with (``live_runs_sharing``)."""
    from core.runs.gpus import VISIBLE_ENV, recorded_visible

    env = child_env()
    known, visible = recorded_visible(run.read_record()[0])
    if known:
        env.pop(VISIBLE_ENV, None)
        if visible is not None:
            env[VISIBLE_ENV] = visible
    log_fd = os.open(run.supervisor_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        proc = subprocess.Popen(
            supervisor_command(run, resume_from),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=str(run.path),
            env=env,
        )
    finally:
        os.close(log_fd)
    return proc


def wait_until_started(run: RunDirectory, proc: subprocess.Popen, timeout_s: float = 10.0) -> bool:
    """Wait until the supervisor holds the lock (True) or has exited early (False)."""
    from core.runs.liveness import supervisor_alive

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # run.json read as the supervisor may find it (permissions, bad JSON: it refuses to start then)
        # run.json names this supervisor once it has started the run; a resumed run's names the last attempt's
        # until then, also while this one holds the lock only to find the run stopped, and exits
        gone = proc.poll() is not None  # (asked first: one that recorded itself and ended since is read so)
        sup = run.read_record()[0].get("supervisor")
        ours = isinstance(sup, dict) and sup.get("pid") == proc.pid
        if gone:  # fine if it got to run (a very short attempt)
            return ours
        if supervisor_alive(run) and ours:
            return True
        time.sleep(0.05)
    return proc.poll() is None
