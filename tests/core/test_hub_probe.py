"""The hub probe of the model check (``model_problem(..., probe=True)``, what ``train`` and ``plan`` run for a
hub id that is not in the local cache): the same answer as before where the hub is there, and a certain
"cannot be reached" where it is not, however the network fails: a port nobody listens on, a host that does
not resolve, a resolver that does not answer (getaddrinfo has no timeout of its own).

The hub is the local fake (``tests.hubserver``), reached through ``HF_ENDPOINT`` / ``MODELSCOPE_ENDPOINT``
as the SDKs reach it. Results are asserted, never the time taken.
"""

from __future__ import annotations

import socket
import threading

import pytest

from core.config.issues import ERROR, WARNING
from core.config.model_checks import model_problem
from tests.hubserver import FakeHubServer, closed_port_url, standard_hub

MODEL = "Org/Not-Downloaded-Model"


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT",
                 "MODELSCOPE_ENDPOINT", "MODELSCOPE_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("hub", "variable"), [("huggingface", "HF_ENDPOINT"), ("modelscope", "MODELSCOPE_ENDPOINT")])
def test_a_hub_that_answers_gives_the_download_warning(monkeypatch, hub, variable):
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv(variable, server.url)
        assert model_problem(MODEL, hub, probe=True) == (
            WARNING, f"model '{MODEL}' is not in the local hub cache: the run downloads it from 127.0.0.1 when it starts")
        # by name too: localhost resolves to the loopback address(es), the first that accepts answers
        monkeypatch.setenv(variable, server.url.replace("127.0.0.1", "localhost"))
        assert model_problem(MODEL, hub, probe=True)[0] == WARNING


def test_a_port_nobody_listens_on_is_unreachable(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    severity, message = model_problem(MODEL, "huggingface", probe=True)
    assert severity == ERROR
    assert "127.0.0.1 cannot be reached (no network?)" in message and f"tunedeck models download {MODEL}" in message


def test_a_host_that_does_not_resolve_is_unreachable(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.does-not-resolve.invalid")  # .invalid never resolves (RFC 6761)
    severity, message = model_problem(MODEL, "huggingface", probe=True)
    assert severity == ERROR and "hub.does-not-resolve.invalid cannot be reached" in message


def test_a_resolver_that_does_not_answer_is_unreachable(monkeypatch):
    """A box whose DNS server is gone: the lookup hangs. The probe gives up on it rather than waiting for
    the resolver, which here would at last answer with the live local hub (so a probe that waited for it
    would say the hub is there)."""
    with FakeHubServer(standard_hub()) as server:
        port = int(server.url.rsplit(":", 1)[1])
        monkeypatch.setenv("HF_ENDPOINT", f"http://hub.example:{port}")
        released = threading.Event()
        real_getaddrinfo = socket.getaddrinfo

        def silent_resolver(host, *args, **kwargs):
            if host != "hub.example":
                return real_getaddrinfo(host, *args, **kwargs)
            released.wait(60)  # until the test is done (or, at worst, a minute)
            return real_getaddrinfo("127.0.0.1", *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", silent_resolver)
        try:
            severity, message = model_problem(MODEL, "huggingface", probe=True)
        finally:
            released.set()
        assert severity == ERROR and "hub.example cannot be reached" in message
