"""Keep secrets out of what tunedeck records: hub tokens must never land in run dirs or logs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL)", re.IGNORECASE)
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``modelscope_api_token``, ``AWS_SECRET_ACCESS_KEY``."""
    return bool(_SECRET_NAME.search(name))


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the value of every secret-looking variable replaced."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def scrub_argv(argv: Iterable[str]) -> list[str]:
    """A copy of a command line with ``key=value`` / ``--key=value`` / ``--key value`` secrets replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, sep, _value = arg.partition("=")
        if sep and is_secret_name(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("--") and not sep and is_secret_name(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(arg)
    return out
