"""Keep secrets out of everything tunedeck shows or records: hub tokens and API keys must never land in
run directories, logs, GPU recordings or on screen. One set of rules for environments and command lines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|CREDENTIAL)", re.IGNORECASE)
# Token values recognisable by their shape, wherever they appear (Hugging Face, ModelScope).
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|ms-[A-Za-z0-9-]{20,})\b")
# NAME=value inside a longer argument (e.g. an inline shell snippet).
_SECRET_ASSIGNMENT = re.compile(r"\b([A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY)[A-Za-z0-9_]*=)\S+", re.IGNORECASE)
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """True for names such as ``HF_TOKEN``, ``modelscope_api_token``, ``--api-key``."""
    return bool(_SECRET_NAME.search(name))


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the value of every secret-looking variable replaced."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def scrub_argv(argv: Iterable[str]) -> list[str]:
    """A copy of a command line with ``key=value`` / ``--key=value`` / ``--key value`` secrets, inline
    ``NAME=value`` assignments and token-shaped values replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, sep, value = arg.partition("=")
        if sep and is_secret_name(name) and not any(c.isspace() for c in name + value):
            out.append(f"{name}={REDACTED}")
        elif not sep and arg.startswith("-") and is_secret_name(arg):
            out.append(arg)
            hide_next = True
        else:
            arg = _SECRET_ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, arg)
            out.append(_SECRET_VALUE.sub(REDACTED, arg))
    return out
