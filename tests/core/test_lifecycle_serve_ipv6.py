"""Our OpenAI-compatible server on IPv6: ``--host ::1``, ``--host ::`` (dual-stack: IPv4 clients too) and
``[::1]`` as a URL writes it, bound with the address family the host needs; and ``check_listen_address``,
the look before a server is spawned, answering as the server's bind will (the same ``listen_address``).

The server is the real one (``ChatServer`` with the real handler) over loopback; only the loaded model is a
stand-in, as /health and /v1/models never touch it."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from contextlib import contextmanager

import pytest

from core.lifecycle.serve import check_listen_address
from core.lifecycle.server import ChatBackend, ChatServer, listen_address, make_handler
from core.lifecycle.source import LifecycleError
from tests.network import ipv6_loopback

pytestmark = pytest.mark.skipif(not ipv6_loopback(),
                                reason="this box has no IPv6 loopback (::1 cannot be bound): nothing to listen on")


class _Loaded:
    has_adapter = True


@contextmanager
def _serving(host: str):
    server = ChatServer(host, 0, make_handler(ChatBackend(_Loaded(), "run-1")))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.status, json.loads(response.read())


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_the_server_listens_and_answers_on_ipv6_loopback(host):
    with _serving(host) as port:
        assert _get(f"http://[::1]:{port}/health") == (200, {"status": "ok", "model": "run-1"})
        status, body = _get(f"http://[::1]:{port}/v1/models")
        assert status == 200 and [m["id"] for m in body["data"]] == ["run-1", "run-1-base"]


def test_the_ipv6_wildcard_takes_ipv4_clients_too():
    with _serving("::") as port:
        assert _get(f"http://[::1]:{port}/health")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/health")[0] == 200  # dual-stack


def test_ipv4_hosts_and_names_keep_ipv4():
    assert listen_address("127.0.0.1", 80) == (socket.AF_INET, ("127.0.0.1", 80))
    assert listen_address("", 80) == (socket.AF_INET, ("", 80))
    assert listen_address("localhost", 80)[0] == socket.AF_INET  # as before: 127.0.0.1, not ::1
    family, address = listen_address("[::1]", 80)
    assert family == socket.AF_INET6 and address[:2] == ("::1", 80)


def test_the_look_before_spawning_agrees_with_the_bind():
    check_listen_address("::1", 0)
    check_listen_address("[::1]", 0)
    check_listen_address("::", 0)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
        taken.bind(("::1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        with pytest.raises(LifecycleError) as caught:
            check_listen_address("::1", busy)
        assert f"cannot listen on ::1 port {busy}" in str(caught.value)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        with pytest.raises(LifecycleError):  # the dual-stack wildcard would take the IPv4 port too
            check_listen_address("::", busy)
    with pytest.raises(LifecycleError) as caught:
        check_listen_address("no-such-host.invalid", 0)
    assert "cannot listen on no-such-host.invalid" in str(caught.value)
