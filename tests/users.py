"""Other users, for tests that need one (``from tests.users import as_nobody``): root's tests drop to ``nobody``.

Where root cannot become ``nobody`` (a rootless container, a user namespace that maps no uid 65534, a root
without CAP_SETUID/CAP_SETGID), those tests are skipped saying so (``as_nobody``, ``skip_unless_root_can_drop``);
as root on an ordinary box they run."""

from __future__ import annotations

import functools
import json
import os
import traceback
from collections.abc import Callable

NOBODY = 65534


def _drop() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _cannot_drop_reason(error: str) -> str:
    return (f"root cannot become uid {NOBODY} here ({error}): a rootless container or user namespace without "
            "that uid, or a root without CAP_SETUID/CAP_SETGID")


def as_nobody(job: Callable[[], dict]) -> dict:
    """``job()``'s result (a JSON-able dict), run in a forked child that dropped root for ``nobody`` (uid 65534);
    ``{"error": traceback}`` where it raised. The child runs no pytest machinery, only ``os._exit``: import
    what ``job`` needs before calling (``nobody`` may not read the interpreter's folders under /root).
    Where the child cannot drop root (``setgid``/``setuid`` refused), the calling test is skipped, saying why."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            try:
                _drop()
            except OSError as exc:  # EPERM (no CAP_SETUID) or EINVAL (uid 65534 not mapped in this namespace)
                result = {"cannot_drop": f"{exc.strerror or exc}"}
            else:
                result = job()
        except BaseException:  # noqa: BLE001 - reported to the parent
            result = {"error": traceback.format_exc()}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    result = json.loads(data)
    if set(result) == {"cannot_drop"}:
        import pytest

        pytest.skip(_cannot_drop_reason(result["cannot_drop"]))
    return result


@functools.cache
def _can_drop() -> str | None:
    """None where a child of this process (root) can become ``nobody``; else the error that refused it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            _drop()
            said = b""
        except OSError as exc:
            said = (exc.strerror or str(exc)).encode()
        os.write(write, said)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        said = handle.read()
    os.waitpid(pid, 0)
    return said.decode() or None


def skip_unless_root_can_drop() -> None:
    """Skip the calling test where root cannot become ``nobody`` (for tests that start processes that do so
    themselves: ``subprocess`` with ``os.setuid(65534)``)."""
    error = _can_drop()
    if error is not None:
        import pytest

        pytest.skip(_cannot_drop_reason(error))
