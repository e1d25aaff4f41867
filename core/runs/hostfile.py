"""Multi-node settings from a hostfile (DeepSpeed/MPI style: one ``host [slots=N]`` per line).

The first host is node 0 (the rendezvous master); this machine's node rank is its position in the file,
found by matching its host names and IP addresses.
"""

from __future__ import annotations

import socket
from pathlib import Path

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t

DEFAULT_MASTER_PORT = 29500


class HostfileError(TunedeckError, ValueError):
    """A hostfile that cannot be used; the message names the file and line."""

    exit_code = EXIT_USAGE


def read_hostfile(path: Path) -> list[str]:
    """Host names/addresses in file order; blank lines and ``#`` comments are skipped."""
    hosts: list[str] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise HostfileError(t("runs.hostfile_unreadable", path=path, reason=exc.strerror or exc)) from exc
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host = line.split()[0]
        if host in hosts:
            raise HostfileError(t("runs.hostfile_duplicate", path=path, line=number, host=host))
        hosts.append(host)
    if not hosts:
        raise HostfileError(t("runs.hostfile_empty", path=path))
    return hosts


def local_names() -> set[str]:
    """Names and addresses by which this machine may appear in a hostfile."""
    import psutil

    names = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
    names.add(socket.gethostname().split(".")[0])
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                names.add(address.address.split("%")[0])
    return names


def node_rank_of(hosts: list[str], names: set[str] | None = None) -> int | None:
    """This machine's position in ``hosts`` (None if it is not listed)."""
    names = local_names() if names is None else names
    for index, host in enumerate(hosts):
        if host in names or host.split(".")[0] in names:
            return index
    return None
