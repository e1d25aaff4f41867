"""What the box's network stack offers, for tests that need it (``from tests.network import ...``)."""

from __future__ import annotations

import socket


def ipv6_loopback() -> bool:
    """Whether ::1 can be bound here (some containers have no IPv6 at all)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False
