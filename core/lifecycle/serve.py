"""Start, find and stop a run's (or a model folder's) detached OpenAI-compatible server.

A server is filed under its id: a run's under the run id, a ``--model-dir`` folder's under the folder's
name, which is also the model id it serves (``model_dir_id``). State lives in ``data_root()/serve/<id>/``
(0700): ``state.json`` (pid, host, port, url, backend,
status; every writer changes it through ``serve_record.update_state``, under ``state.lock``), ``lock``
(flock'ed by our own server for its whole life), ``start.lock`` (flock'ed by a start from its last look for a
server until its server is launched: one start at a time) and ``server.log``. The server runs in
its own session, so it survives the SSH session and the app that started it. Backends: vLLM or LMDeploy
when installed (they serve the merged model), otherwise ``core.lifecycle.server``.
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.i18n import Message
from core.lifecycle.source import LifecycleError
from core.listen import bare_host, bind_and_close, free_port
from core.runs.run_dir import RunDirectory

BACKENDS = ("auto", "transformers", "vllm", "lmdeploy")


class ServeWaitCancelled(LifecycleError):
    """The caller stopped waiting for a server that is still starting (it goes on, detached)."""


class ServeStopped(LifecycleError):
    """The server was stopped (``serve --stop``, the app's k) before it was ready: not a failed start."""


@dataclass(frozen=True)
class ServerState:
    run_id: str
    pid: int
    url: str
    host: str
    port: int
    backend: str
    status: str
    log_path: Path
    auth: bool = False  # clients must send the API key
    model_dir: str | None = None  # a --model-dir server's folder (``run_id`` is then the folder's id)
    step: int | None = None  # the run's checkpoint it serves (None: a --model-dir server, or not known)

    def to_dict(self) -> dict[str, Any]:
        value = {"run_id": self.run_id, "pid": self.pid, "url": self.url, "host": self.host, "port": self.port,
                 "backend": self.backend, "status": self.status, "log": str(self.log_path), "auth": self.auth}
        if self.step is not None:
            value["step"] = self.step
        return value if self.model_dir is None else {**value, "model_dir": self.model_dir}


def serve_dir(run_id: str) -> Path:
    """The server's state folder, made (0700) if need be: for writing. Lookups use ``_state_dir``."""
    from core.paths import data_root, ensure_private_dir

    return ensure_private_dir(ensure_private_dir(data_root() / "serve") / run_id)


def _state_dir(run_id: str) -> Path:
    """The server's state folder, not made: a look for a server leaves nothing behind."""
    from core.paths import data_root

    return data_root() / "serve" / run_id


def model_dir_id(model_dir: Path) -> str:
    """The id a ``--model-dir`` server is filed under and serves its model as: the folder's name, but for
    a merge's own ``checkpoint-N`` (a name that says nothing of the model, and every run's merge of step N
    has it): ``<run id>-checkpoint-N``, from its ``tunedeck_merge.json``."""
    import re

    path = Path(os.path.abspath(model_dir))
    if re.fullmatch(r"checkpoint-\d+", path.name):
        from core.lifecycle.merge import PROVENANCE_FILE

        try:
            run_id = json.loads((path / PROVENANCE_FILE).read_text(encoding="utf-8")).get("run_id")
        except (OSError, ValueError, AttributeError):
            run_id = None
        if isinstance(run_id, str) and run_id and "/" not in run_id and run_id not in (".", ".."):
            return f"{run_id}-{path.name}"
    return path.name


def recorded_server_id(ref: str) -> str | None:
    """``ref`` when a server was recorded under exactly that id (a run's, the run since deleted included,
    or a --model-dir folder's); None otherwise. Looks only: creates no folder."""
    from core.paths import data_root

    if not ref or ref in (".", "..") or "/" in ref or "\0" in ref:
        return None
    return ref if (data_root() / "serve" / ref / "state.json").is_file() else None


def _read_state(directory: Path) -> dict[str, Any]:
    from core.lifecycle.serve_record import read_state

    return read_state(directory)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is dead for our purposes
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _lock_held(directory: Path) -> bool:
    try:
        fd = os.open(directory / "lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def read_server_record(run_id: str) -> dict[str, Any]:
    """The run's ``state.json`` as last written (status, url, port, pid …), alive or not; {} if none."""
    return _read_state(_state_dir(run_id))


def ended_unstopped(run_id: str) -> int | None:
    """The pid of the server filed under ``run_id`` when it is gone without having been stopped (killed, out
    of memory, a crash, a failed start): its record still says starting, loading or ready. None otherwise."""
    raw = read_server_record(run_id)
    if not raw or raw.get("status") in (None, "stopped") or server_state(run_id) is not None:
        return None
    return int(raw.get("pid") or 0) or None


def server_log_path(run_id: str) -> Path:
    """The server's log (its own output, and the backend's): where a server that ended tells why."""
    return _state_dir(run_id) / "server.log"


def server_state(run_id: str) -> ServerState | None:
    """The run's server if one is alive (its process exists), else None."""
    directory = _state_dir(run_id)
    raw = _read_state(directory)
    pid = int(raw.get("pid") or 0)
    if not raw or not _pid_alive(pid) or raw.get("status") == "stopped":
        return None
    if raw.get("backend") == "transformers" and not _lock_held(directory) and not _starting(raw):
        return None
    step = raw.get("step")
    return ServerState(run_id, pid, str(raw.get("url", "")), str(raw.get("host", "")), int(raw.get("port") or 0),
                       str(raw.get("backend", "")), str(raw.get("status", "")), directory / "server.log",
                       bool(raw.get("auth")), str(raw["model_dir"]) if raw.get("model_dir") else None,
                       step if isinstance(step, int) and not isinstance(step, bool) else None)


def _starting(raw: dict[str, Any]) -> bool:
    """Our server between its start and its lock (Python starting, its imports: a second or more), by the
    pid and start time ``start_server`` recorded (never a recycled pid). Without it a server that was
    starting was "not running": its stop said so and did nothing, and the server went on to serve."""
    from core.runs.liveness import same_process_alive

    started = raw.get("pid_start")
    return (raw.get("status") == "starting" and isinstance(started, (int, float)) and not isinstance(started, bool)
            and same_process_alive(int(raw.get("pid") or 0), float(started)))


def health(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``url`` (…/v1) answers ``/v1/models``.

    A 401 counts as an answer: a server that asks for its API key is up (the key is not ours to know)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout) as response:
            return response.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError, ValueError):
        return False


def warn_if_public(host: str, api_key: str | None) -> str | None:
    """The warning for a server that listens beyond this machine, or None on a loopback address."""
    from core.i18n import t
    from core.lifecycle.server import is_loopback

    if is_loopback(host):
        return None
    return t("lifecycle.serve_public_host", host=host,
             auth=t("lifecycle.serve_auth_on" if api_key else "lifecycle.serve_auth_off"))


def check_listen_address(host: str, port: int) -> None:
    """Refuse, before any process starts, a port outside 0-65535 (0: any free one) or an address and port
    that cannot be listened on now (in use, not an address of this machine); ``LifecycleError`` says which.

    The server binds only once its model is loaded; without this a bad --port ended in its log's
    traceback. The bind here is a look, closed at once, with SO_REUSEADDR as the servers bind (http.server's
    ``allow_reuse_address``, uvicorn's own): a port left in TIME_WAIT by a server just stopped is one they
    can listen on again, so the look must not refuse it."""
    from core.i18n import t

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise LifecycleError(t("lifecycle.serve_bad_port", port=port), exit_code=2)
    try:
        bind_and_close(host, port, reuse_address=True)
    except OSError as exc:  # gaierror (an unknown host name) included
        error = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            # the address is the problem, not the port: "choose another --port" (and "port 0") misled
            raise LifecycleError(t("lifecycle.serve_host_unusable", host=host, error=error), exit_code=2) from None
        raise LifecycleError(t("lifecycle.serve_port_unusable", host=host, port=port, error=error)) from None


def check_backend_name(requested: str) -> None:
    """Refuse (exit 2) a --backend that is none of ``BACKENDS``, naming the ones there are."""
    from core.i18n import t

    if requested not in BACKENDS:
        raise LifecycleError(t("lifecycle.serve_bad_backend", backend=requested, choices=", ".join(BACKENDS)),
                             exit_code=2)


def choose_backend(requested: str) -> str:
    """``auto``: vLLM, then LMDeploy when installed with a GPU; else our own transformers server."""
    from core.i18n import t

    check_backend_name(requested)
    if requested == "transformers":
        return requested
    modules = {"vllm": "vllm", "lmdeploy": "lmdeploy"}
    if requested != "auto":
        if importlib.util.find_spec(modules[requested]) is None:
            raise LifecycleError(t("lifecycle.serve_unknown_backend", backend=requested))
        return requested
    import torch

    if torch.cuda.is_available():
        for name in ("vllm", "lmdeploy"):
            if importlib.util.find_spec(modules[name]) is not None:
                return name
    return "transformers"


# vLLM's serve took a server-wide default for the chat template's variables from this release on
# (--default-chat-template-kwargs, vllm-project/vllm#31343, in v0.14.0); before it, only each request's own
# chat_template_kwargs could set enable_thinking
VLLM_TEMPLATE_KWARGS_SINCE = (0, 14)


def _installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` as its metadata says (None: no metadata). Reads the
    package's metadata only: nothing of the backend (torch, CUDA) is imported."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def check_backend_template(backend: str, template_kwargs: dict[str, Any] | None, what: str) -> None:
    """Refuse (``LifecycleError``) a foreign backend that cannot render prompts with the run's chat-template
    variables (its ``thinking``): served anyway, it would answer in the template's default mode, not the one
    the run trained in. vLLM takes them from 0.14 on (--default-chat-template-kwargs); LMDeploy's api_server
    has no server-wide default at all (only a request's own chat_template_kwargs). ``what``: the run or the
    folder, for the message. Nothing to check for our own server (it renders them itself) or without them."""
    from core.i18n import t

    if backend == "transformers" or not template_kwargs:
        return
    value = str(template_kwargs.get("enable_thinking")).lower()
    if backend == "lmdeploy":
        raise LifecycleError(t("lifecycle.serve_thinking_lmdeploy", what=what, value=value))
    installed = _installed_version("vllm")
    release: tuple[int, ...] = ()
    if installed is not None:
        from packaging.version import InvalidVersion, Version

        try:
            release = Version(installed).release
        except InvalidVersion:
            release = ()
    if release[:2] < VLLM_TEMPLATE_KWARGS_SINCE:
        since = ".".join(str(part) for part in VLLM_TEMPLATE_KWARGS_SINCE)
        raise LifecycleError(t("lifecycle.serve_thinking_vllm_old", what=what, value=value,
                               version=installed or "?", since=since))


def _backend_command(backend: str, run: RunDirectory | None, served: str, state: Path, host: str, port: int,
                     checkpoint: int | None, model_dir: Path | None, api_key: str | None = None,
                     max_body_bytes: int | None = None, start_id: str | None = None,
                     template_kwargs: dict[str, Any] | None = None) -> list[str]:
    """The server's command line. ``template_kwargs``: the chat-template variables the run trained with (its
    ``thinking``), handed to vLLM as its default (our own server reads them from the run or the merge record
    itself); a backend that cannot take them is refused (``check_backend_template``)."""
    if backend == "transformers":
        cmd = [sys.executable, "-m", "core.lifecycle.server", "--state", str(state), "--host", host,
               "--port", str(port)]
        if start_id is not None:
            cmd += ["--start-id", start_id]
        if max_body_bytes is not None:
            cmd += ["--max-body-bytes", str(max_body_bytes)]
        if model_dir is not None:
            return cmd + ["--model-dir", str(model_dir)]
        assert run is not None
        return cmd + ["--run", str(run.path)] + ([] if checkpoint is None else ["--checkpoint", str(checkpoint)])
    assert model_dir is not None  # foreign servers serve the merged folder
    check_backend_template(backend, template_kwargs, run.id if run is not None else str(model_dir))
    if backend == "vllm":
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", served, "--host", host, "--port", str(port)]
        if template_kwargs:  # request-level chat_template_kwargs still win over it, as in vLLM
            cmd += ["--default-chat-template-kwargs", json.dumps(template_kwargs, sort_keys=True)]
        return cmd
    # vLLM reads its key from VLLM_API_KEY (set by start_server); LMDeploy only takes it as an argument.
    return [sys.executable, "-m", "lmdeploy", "serve", "api_server", str(model_dir), "--model-name", served,
            "--server-name", host, "--server-port", str(port)] + (["--api-keys", api_key] if api_key else [])


def _merged_for_serving(run: RunDirectory, source: Any, checkpoint: int | None, backend: str,
                        cancelled: Callable[[], bool] | None) -> tuple[Path, int]:
    """The merged folder a vLLM or LMDeploy server loads: the run's whole merge of the checkpoint (the
    test ``merge`` and ``export`` reuse it by, ``complete_merge``), merged now when the folder is not there.
    A folder there that is no whole merge (cut short, another checkpoint's, older than the checkpoint) is
    refused with the command that merges it again: served, it ends in the backend's own puzzling error. A
    folder there that is no merge of tunedeck's at all (no tunedeck_merge.json) is refused as the merge
    refuses it (``OutputNotReplaceable``): --force would not replace it, so that is not the advice.
    Returns the folder and the step merged into it: a merge made now of the newest checkpoint (``checkpoint``
    None) takes the newest as it is then, which a live run may have saved since ``source`` was chosen (the
    folder of ``source``'s step was served then, and did not exist)."""
    from core.i18n import t
    from core.lifecycle.merge import (
        MergeCancelled,
        complete_merge,
        default_merge_dir,
        is_replaceable,
        merge_run,
        refuse_unless_replaceable,
    )

    done = complete_merge(run, source)
    if done is not None:
        return done, source.step
    out = default_merge_dir(run, source.step)
    if os.path.lexists(out):
        if not is_replaceable(out):  # no merge of tunedeck's at all: --force would not replace it either
            refuse_unless_replaceable(out, force=True)
        raise LifecycleError(Message("lifecycle.serve_merge_incomplete", path=str(out), step=source.step,
                                     backend=backend, run=run.id))
    if cancelled is not None and cancelled():
        raise ServeWaitCancelled(t("lifecycle.serve_wait_cancelled", run=run.id))
    try:
        merged = merge_run(run, checkpoint, cancelled=cancelled)
    except MergeCancelled as exc:
        raise ServeWaitCancelled(str(exc)) from exc
    return merged.out, merged.step


def start_server(run: RunDirectory | None, host: str = "127.0.0.1", port: int = 0, backend: str = "auto",
                 checkpoint: int | None = None, model_dir: Path | None = None,
                 timeout: float = 600.0, cancelled: Callable[[], bool] | None = None,
                 api_key: str | None = None, max_body_bytes: int | None = None,
                 warn: Callable[[str], None] | None = None,
                 note: Callable[[str], None] | None = None,
                 waiting: Callable[[bool], None] | None = None) -> ServerState:
    """Start the server of ``run``, or of the folder ``model_dir`` (one of the two), detached (own session)
    and wait until it answers; returns its state. A run's server is filed under the run id and serves that
    id; a folder's is filed under, and serves, ``model_dir_id`` (the folder's name), not under any run.

    ``cancelled`` (checked while waiting): when it turns true the wait ends with ``ServeWaitCancelled``
    and the server, detached, goes on starting (an app that quits must not wait for a model to load).
    ``api_key``: clients must send ``Authorization: Bearer KEY`` on /v1 (handed to the server through its
    environment, not its command line). ``max_body_bytes``: our server's request size limit (413 past it).
    A host that is not a loopback address is warned about in the server's log, and to ``warn`` (the CLI's
    stderr) once every refusal has been looked for: a host refused (not this machine's, its port taken) or a
    run that cannot be served is said alone, not after a warning about a server that never starts.
    ``note``: told once when the start waits for the previous server of the same id, being stopped, to end, and
    when ``auto`` passes over an installed vLLM/LMDeploy that cannot render prompts with the run's ``thinking``;
    ``waiting``: told True as that wait begins and False once it is over (an app shows the wait as it lasts)."""
    from core.i18n import t
    from core.lifecycle.serve_record import update_state, write_fresh_state

    api_key = os.environ.get("TUNEDECK_API_KEY") if api_key is None else api_key  # "" = no key
    api_key = api_key or None
    check_backend_name(backend)  # a misspelt name is said first, before any look at the run or the port
    if (run is None) == (model_dir is None):
        raise LifecycleError(t("lifecycle.serve_run_or_model_dir"), exit_code=2)
    key = run.id if run is not None else model_dir_id(model_dir)
    host = bare_host(host)  # "[::1]" as a URL writes it: the address alone for the servers' --host
    existing = server_state(key)
    if existing is not None and run is None and existing.model_dir != os.path.abspath(model_dir):
        raise LifecycleError(t("lifecycle.serve_name_taken", id=key, other=existing.model_dir or existing.run_id,
                               url=existing.url))
    if existing is not None:
        raise LifecycleError(_already_serving(existing, run, checkpoint))
    # A server being stopped (its record says so) still holds its lock until its process ends: the new one
    # would fail on it ("another server holds …"). Waited for, within the stop's own grace; refused at once
    # when the lock's holder is no server being stopped.
    _wait_while_stopping(key, cancelled, note, waiting)
    # Every mistake that can be seen from here is said here, in one line, not in the server's log.
    check_listen_address(host, port)
    source = None
    if run is not None:
        from core.lifecycle.source import resolve_model_source

        source = resolve_model_source(run, checkpoint)  # no run, no complete checkpoint (N)
    else:
        from core.lifecycle.source import check_model_dir

        # The server runs in the repository's folder: a relative --model-dir is the caller's, made whole.
        model_dir = Path(os.path.abspath(model_dir))
        check_model_dir(model_dir)  # no config.json, a download not finished, no weights
    chosen = choose_backend(backend)
    if source is not None:
        template_kwargs = dict(source.template_kwargs)
    else:
        from core.lifecycle.source import merged_template_kwargs

        template_kwargs = merged_template_kwargs(model_dir)
    # A backend that would serve in the template's default mode, not the run's thinking, is refused before
    # any merge or process; auto falls back to our own server instead (it renders them as training did).
    try:
        check_backend_template(chosen, template_kwargs, run.id if run is not None else str(model_dir))
    except LifecycleError as refused:
        if backend != "auto":
            raise
        if note is not None:
            note(t("lifecycle.serve_auto_thinking", backend=chosen, reason=str(refused)))
        chosen = "transformers"
    what = {"model_dir": str(model_dir)} if run is None else {"run": str(run.path)}
    served = source.step if source is not None else None  # the step served (a merge made now: its own)
    if chosen != "transformers" and run is not None and source is not None:
        model_dir, served = _merged_for_serving(run, source, checkpoint, chosen, cancelled)
    directory = serve_dir(key)
    if chosen != "transformers" and port == 0:
        port = free_port(host)
    step = {} if served is None else {"step": served}  # our server writes the step it loads itself
    # this start's own id: our server, and this starter, write only to the record that carries it (a server
    # of an earlier start, still exiting, must not write its "stopped" over this one)
    start_id = secrets.token_hex(8)
    ours = {"start_id": start_id}
    warning = warn_if_public(host, api_key)
    # One start at a time per id, from the last look for a server through its fresh record and its process
    # with its pid: two starts that both waited for the same server being stopped (the app's panel and a
    # script's `serve`) each wrote a fresh record once its lock was let go, and the second's server met the
    # first's lock (a failed start) or the first's record was replaced under it. The one that comes second
    # now finds the first's server, starting, and is refused as a second start is. Held for moments (the
    # server is launched, not waited for); the wait for it to be ready comes after.
    with _start_lock(directory, key, cancelled):
        existing = server_state(key)
        if existing is not None:
            raise LifecycleError(_already_serving(existing, run, checkpoint))
        _wait_while_stopping(key, cancelled, note, waiting)  # stopped again meanwhile (its server still exiting)
        write_fresh_state(directory, {"status": "starting", "backend": chosen, "host": host, "port": port,
                                      **what, **step, "started": time.time(), **ours})
        log_path = directory / "server.log"
        cmd = _backend_command(chosen, run, key, directory, host, port, checkpoint, model_dir, api_key,
                               max_body_bytes, start_id=start_id, template_kwargs=template_kwargs)
        env = {k: v for k, v in os.environ.items() if k not in ("TUNEDECK_API_KEY", "VLLM_API_KEY")}
        if api_key:
            env["VLLM_API_KEY" if chosen == "vllm" else "TUNEDECK_API_KEY"] = api_key
        if warning and warn is not None:
            warn(warning)
        with open(log_path, "ab") as log_file:
            os.chmod(log_path, 0o600)
            if warning and chosen != "transformers":  # ours logs it itself
                log_file.write(f"WARNING {warning}\n".encode())
                log_file.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]),
                                    close_fds=True, env=env)
        if chosen == "transformers":  # found alive while it starts, before it takes its lock (_starting)
            from core.runs.liveness import process_start_time

            update_state(directory, where=ours, pid=proc.pid, pid_start=process_start_time(proc.pid))
        else:
            scheme_host = f"[{host}]" if ":" in host else host
            update_state(directory, where=ours, pid=proc.pid, url=f"http://{scheme_host}:{port}/v1",
                         status="loading", auth=bool(api_key))
    state = _await_ready(key, timeout, cancelled, proc)
    if state is not None and run is not None:
        run.record_event("serve_started", url=state.url, pid=state.pid, backend=chosen, auth=bool(api_key),
                         public=warning is not None)
    if state is not None:
        return state
    if proc.poll() is None:
        _terminate(proc.pid)
    tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:].strip()
    raise LifecycleError(t("lifecycle.serve_failed", log=str(log_path), tail=tail))


STOP_GRACE_S = 15.0  # a stop's SIGTERM, then SIGKILL after this long (_terminate)
STOPPING_WAIT_S = STOP_GRACE_S + 10.0  # how long a new start waits for a server being stopped to let go its lock


def _lock_holder(directory: Path) -> int | None:
    """The pid holding ``directory/lock`` as /proc/locks tells it (None when it cannot tell: no /proc, another
    pid namespace's holder shown as 0)."""
    try:
        info = os.stat(directory / "lock")
        with open("/proc/locks", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and "FLOCK" in fields and wanted in fields:
            pid = fields[fields.index(wanted) - 1]
            if pid.isdigit() and int(pid) > 0:
                return int(pid)
    return None


def _wait_while_stopping(key: str, cancelled: Callable[[], bool] | None, note: Callable[[str], None] | None,
                         waiting: Callable[[bool], None] | None = None) -> None:
    """Return once no process holds the lock of the server filed under ``key``. The holder being a server
    that was stopped (its record says "stopped": its stop's grace is running, it finishes a reply, it lets
    go of the GPU) is waited for, up to ``STOPPING_WAIT_S``, ``note`` told once why the start waits; any
    other holder is refused at once, as is one still there once the wait is over (with its pid and what to
    do). Before, the new server met the lock and the start failed for what is a passing state. ``waiting``
    is told True as the wait begins and False as it ends, however it ends."""
    from core.i18n import t

    directory = _state_dir(key)
    if not _lock_held(directory):
        return
    lock = str(directory / "lock")
    raw = _read_state(directory)
    pid = _lock_holder(directory) or int(raw.get("pid") or 0) or "?"
    if raw.get("status") != "stopped":
        raise LifecycleError(t("lifecycle.serve_lock_held", run=key, lock=lock, pid=pid))
    if note is not None:
        note(t("lifecycle.serve_waiting_for_stop", run=key, pid=pid))
    if waiting is not None:
        waiting(True)
    try:
        deadline = time.monotonic() + STOPPING_WAIT_S
        while _lock_held(directory):
            if cancelled is not None and cancelled():
                raise ServeWaitCancelled(t("lifecycle.serve_stop_wait_cancelled", run=key))
            if time.monotonic() >= deadline:
                raise LifecycleError(t("lifecycle.serve_still_stopping", run=key, pid=pid, lock=lock,
                                       seconds=round(STOPPING_WAIT_S)))
            time.sleep(0.1)
    finally:
        if waiting is not None:
            waiting(False)


@contextmanager
def _start_lock(directory: Path, key: str, cancelled: Callable[[], bool] | None) -> Iterator[None]:
    """Hold ``directory/start.lock`` (flock), another start of the same id letting go of it first: it holds it
    only while it writes its record and launches its server (and, rarely, while a server stopped meanwhile
    ends, bounded by ``STOPPING_WAIT_S``). Polled, so that ``cancelled`` ends the wait."""
    from core.i18n import t

    fd = os.open(directory / "start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancelled is not None and cancelled():
                    raise ServeWaitCancelled(t("lifecycle.serve_start_wait_cancelled", run=key)) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _already_serving(existing: ServerState, run: RunDirectory | None, checkpoint: int | None) -> str:
    """Why a second server of the same id is refused; for a run, with the checkpoint the running one serves
    when it is not the one asked for (``checkpoint``, or the newest): a server started while the run was
    training goes on serving the checkpoint of then."""
    from core.i18n import t

    wanted = None
    if run is not None and existing.step is not None:
        from core.lifecycle.source import resolve_model_source

        try:
            wanted = resolve_model_source(run, checkpoint).step
        except LifecycleError:  # no such checkpoint (now): the running server is all there is to say
            wanted = None
    if wanted is not None and wanted != existing.step:
        return t("lifecycle.serve_already_other_step", run=existing.run_id, url=existing.url, pid=existing.pid,
                 served=existing.step, wanted=wanted)
    if not existing.url:  # our server still starting (its address comes with its lock): "at –" said nothing
        return t("lifecycle.serve_already_starting", run=existing.run_id, pid=existing.pid)
    return t("lifecycle.serve_already", run=existing.run_id, url=existing.url, pid=existing.pid)


def _await_ready(run_id: str, timeout: float, cancelled: Callable[[], bool] | None,
                 proc: subprocess.Popen | None = None) -> ServerState | None:
    """Poll until the run's server answers, then mark it "ready"; None when ``proc`` ended or time ran out.

    Our transformers server writes "ready" itself once its model is loaded (its /v1/models may answer
    before); a vLLM/LMDeploy server cannot, so for those an answer to /v1/models is what ready means, and
    whoever sees it first (the starter, or an app that found the server later) records it."""
    from core.i18n import t
    from core.lifecycle.serve_record import update_state

    directory = serve_dir(run_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cancelled is not None and cancelled():
            raise ServeWaitCancelled(t("lifecycle.serve_wait_cancelled", run=run_id))
        if proc is not None and proc.poll() is not None:
            if _read_state(directory).get("status") == "stopped":
                raise ServeStopped(t("lifecycle.serve_stopped_while_starting", run=run_id))
            return None
        state = server_state(run_id)
        if state is None and proc is None:
            if _read_state(directory).get("status") == "stopped":
                raise ServeStopped(t("lifecycle.serve_stopped_while_starting", run=run_id))
            raise LifecycleError(t("lifecycle.serve_not_running", run=run_id))
        if (state is not None and state.url and (state.status == "ready" or state.backend != "transformers")
                and health(state.url)):
            if state.status != "ready":
                # under the state lock, and never over a stop said meanwhile: a server stopped as it came up
                # is stopped, not started; and only on the record of the server that answered (a new start may
                # have replaced it since it was read): another's record is looked at again
                written = update_state(directory, where={"pid": state.pid}, status="ready")
                if written.get("status") == "stopped":
                    raise ServeStopped(t("lifecycle.serve_stopped_while_starting", run=run_id))
                if written.get("pid") != state.pid:
                    time.sleep(0.25)
                    continue
                state = replace(state, status="ready")
            return state
        time.sleep(0.25)
    return None


def wait_until_ready(run_id: str, timeout: float = 600.0,
                     cancelled: Callable[[], bool] | None = None) -> ServerState:
    """The run's running server once it answers (it may still be loading its model when found)."""
    from core.i18n import t

    state = _await_ready(run_id, timeout, cancelled)
    if state is not None:
        return state
    directory = serve_dir(run_id)
    tail = (directory / "server.log").read_text(encoding="utf-8", errors="replace")[-2000:].strip()
    raise LifecycleError(t("lifecycle.serve_failed", log=str(directory / "server.log"), tail=tail))


def _terminate(pid: int, grace: float = STOP_GRACE_S) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _pid_alive(pid):
        try:  # reap it when it is our child (the CLI that started it may still be alive in tests)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    if _pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_server(run_id: str) -> bool:
    """Stop the server filed under ``run_id`` (SIGTERM to its session, SIGKILL after 15 s); False if none was
    running. When the run it served is gone (deleted), its state folder goes too: nothing is left to keep."""
    return stop_server_state(run_id) is not None


def stop_server_state(run_id: str) -> ServerState | None:
    """``stop_server``, returning the server it stopped as it was (its url, pid), None if none was running:
    for a caller that says which server it stopped, without a second look before the stop."""
    from core.lifecycle.serve_record import update_state

    state = server_state(run_id)
    if state is not None:
        # said before the signal, under the state lock and for good (a "ready" the server writes after it is
        # no longer applied): whoever waits for it to be ready (start_server) then knows it was stopped, not
        # that it failed to start
        update_state(serve_dir(run_id), where={"pid": state.pid}, status="stopped")  # that server's record only
        _terminate(state.pid)
    run_path = read_server_record(run_id).get("run")
    if run_path and not Path(str(run_path)).exists():
        _remove_state_dir(run_id)  # not forget_server, which stops through here
    return state


def forget_server(run_id: str) -> bool:
    """Stop the server filed under ``run_id`` if one runs, then remove its state folder (state.json, lock,
    log): for a run being deleted. True when a server was stopped. One look for the server, the stop's."""
    stopped = stop_server_state(run_id) is not None
    _remove_state_dir(run_id)
    return stopped


def _remove_state_dir(run_id: str) -> None:
    import shutil

    shutil.rmtree(_state_dir(run_id), ignore_errors=True)


def client_api_key() -> str | None:
    """The API key this process can send to a server started with one: ``TUNEDECK_API_KEY``, if set."""
    return os.environ.get("TUNEDECK_API_KEY") or None


def _error_words(exc: Any) -> str:
    """What an HTTP error response says: its OpenAI error's message when its body is one, else its reason."""
    try:
        body = json.loads(exc.read() or b"null")
        message = body["error"]["message"]
    except (OSError, ValueError, KeyError, TypeError):
        message = None
    return str(message) if message else str(exc.reason or exc.code)


def probe_request(url: str, model: str, prompt: str = "Hello!", max_tokens: int = 16,
                 timeout: float = 120.0, api_key: str | None = None) -> tuple[str, float]:
    """One real chat completion against ``url``; (reply, seconds). Raises ``LifecycleError`` on failure.

    ``api_key`` defaults to ``TUNEDECK_API_KEY`` from the environment (a server started with a key)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    api_key = api_key if api_key is not None else client_api_key()
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url.rstrip("/") + "/chat/completions", data=body, headers=headers)
    from core.i18n import t

    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:  # the server wants its key: say so, and where the key comes from
            raise LifecycleError(t("lifecycle.probe_key_refused" if api_key else "lifecycle.probe_needs_key",
                                   url=url)) from exc
        # the server's own words (an OpenAI error's message: "the model … does not exist", "maximum context
        # length …"), not urllib's "HTTP Error 404: Not Found", in a line of the interface's language
        raise LifecycleError(t("lifecycle.probe_refused", url=url, code=exc.code,
                               error=_error_words(exc))) from exc
    except ValueError as exc:  # it answered, but not in JSON
        raise LifecycleError(t("lifecycle.probe_bad_reply", url=url, error=str(exc))) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise LifecycleError(t("lifecycle.probe_unreachable", url=url,
                               error=str(getattr(reason, "strerror", None) or reason))) from exc
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise LifecycleError(t("lifecycle.probe_bad_reply", url=url, error=repr(exc))) from exc
    return str(content), time.monotonic() - started
