"""Listening on a host and port: the address to bind for a host (IPv4 or IPv6), and a bind closed at once
for a look (can a server listen there now?) or a pick (a port no socket holds). Standard library only, so
that the run supervisor (``core.runs``) and the model server (``core.lifecycle``) share one way to bind."""

from __future__ import annotations

import socket
from typing import Any


def bare_host(host: str) -> str:
    """``host`` without the brackets a URL puts around an IPv6 address (``[::1]`` is ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def listen_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    """The address family and socket address to listen on ``host`` with: IPv6 for an IPv6 address (``::``,
    ``::1``, ``fe80::1%eth0``, bracketed or not), IPv4 for an IPv4 one and for ``""`` (every IPv4 address, as
    http.server does); a name is looked up and listened on at its IPv4 address if it has one (``localhost``
    stays 127.0.0.1), else its IPv6 one. Raises ``OSError`` (``gaierror``) for a name that does not resolve.
    The one answer for the server's bind and for ``serve.check_listen_address``'s look before it."""
    name = bare_host(host)
    if not name:
        return socket.AF_INET, ("", port)
    found = socket.getaddrinfo(name, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    for family in (socket.AF_INET, socket.AF_INET6):
        for candidate, _, _, _, address in found:
            if candidate == family:
                return family, address
    raise socket.gaierror(socket.EAI_FAMILY, f"{name}: no IPv4 or IPv6 address")


def prepare_listen_socket(sock: socket.socket, address: tuple[Any, ...]) -> None:
    """Before ``bind``: an IPv6 wildcard (``::``) takes IPv4 clients too where the system allows it
    (dual-stack; Linux's default, but not every system's or container's)."""
    if sock.family == socket.AF_INET6 and address[0] == "::" and hasattr(socket, "IPV6_V6ONLY"):
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        except OSError:  # an IPv6-only stack: the IPv6 addresses alone
            pass


def bind_and_close(host: str, port: int, reuse_address: bool) -> int:
    """Bind a TCP socket on ``host``:``port`` as the server will (``listen_address``'s family and address,
    ``prepare_listen_socket``), close it and give the port it got (the kernel's pick for port 0). The one
    bind of ``serve.check_listen_address`` (a look, which reuses as the servers do) and ``free_port`` (a
    pick); ``reuse_address``: SO_REUSEADDR. Raises ``OSError`` when the bind fails."""
    family, address = listen_address(host, port)  # the server's own choice of family and address
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        prepare_listen_socket(sock, address)
        sock.bind(address)
        return int(sock.getsockname()[1])


def free_port(host: str) -> int:
    """A port nobody holds on ``host``, for a process that must be told one (vLLM, LMDeploy, torchrun's
    rendezvous): the kernel's pick for port 0, without SO_REUSEADDR, so that it is a port no other socket is
    bound to (with it, a system may hand out a port other reusing sockets hold, or one still in TIME_WAIT).
    Raises ``OSError`` when ``host`` cannot be bound."""
    return bind_and_close(host, 0, reuse_address=False)
