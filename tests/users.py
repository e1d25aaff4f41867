"""Other users, for tests that need one (``from tests.users import as_nobody``): root's tests drop to ``nobody``."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable

NOBODY = 65534


def as_nobody(job: Callable[[], dict]) -> dict:
    """``job()``'s result (a JSON-able dict), run in a forked child that dropped root for ``nobody`` (uid 65534);
    ``{"error": traceback}`` where it raised. The child runs no pytest machinery, only ``os._exit``: import
    what ``job`` needs before calling (``nobody`` may not read the interpreter's folders under /root)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = job()
        except BaseException:  # noqa: BLE001 - reported to the parent
            result = {"error": traceback.format_exc()}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    return json.loads(data)
