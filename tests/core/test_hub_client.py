"""Search, details, files and errors through the real SDKs, against the local fake hub."""

from __future__ import annotations

import socket
import threading

import pytest

from core.hub.errors import HubAccessError, HubNotFoundError, HubUnavailableError
from core.hub.records import SearchQuery
from core.hub.source import open_hub
from tests.hubserver import TOKEN, FakeHubServer, closed_port_url, standard_hub


@pytest.fixture
def hub_server(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("MODELSCOPE_API_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_search_sorts_and_filters(hub_server, hub):
    source = open_hub(hub)
    page = source.search(SearchQuery(text="qwen", sort="downloads"))
    assert [m.model_id for m in page.items] == [
        "Qwen/Qwen2.5-7B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "Qwen/Qwen2.5-Tiny-Instruct"]
    assert page.items[0].params == 7_000_000_000 and page.items[0].downloads == 900000
    assert page.items[0].license == "apache-2.0" and page.items[0].updated.startswith("2024-09-19")
    by_likes = source.search(SearchQuery(text="qwen", sort="likes"))
    assert by_likes.items[0].model_id == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    recent = source.search(SearchQuery(sort="recent"))
    assert recent.items[0].model_id == "Qwen/Qwen2.5-Tiny-Instruct"
    owner = source.search(SearchQuery(owner="deepseek-ai"))
    assert [m.model_id for m in owner.items] == ["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]
    small = source.search(SearchQuery(text="qwen", size_class="small"))
    assert [m.model_id for m in small.items] == ["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]
    # The query went to the server, not filtered here: the search parameter is on the wire.
    assert any("models" in path for _, path, _ in hub_server.hub.requests)


def test_modelscope_pagination(hub_server):
    source = open_hub("modelscope")
    first = source.search(SearchQuery(page=1, page_size=2))
    second = source.search(SearchQuery(page=2, page_size=2))
    assert first.total == 4 and first.has_more and not second.has_more  # the private one is hidden
    assert len(first.items) == 2 and len(second.items) == 2
    assert {m.model_id for m in first.items}.isdisjoint({m.model_id for m in second.items})


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_details_read_card_config_and_hashes(hub_server, hub):
    details = open_hub(hub).details("Qwen/Qwen2.5-Tiny-Instruct")
    assert details.readme.startswith("# Qwen2.5 Tiny")
    assert details.config["model_type"] == "qwen2" and details.config["hidden_size"] == 64
    sizes = {f.path: f.size for f in details.files}
    assert sizes["model.safetensors"] == 256 * 1024 and details.total_size == sum(sizes.values())
    weights = next(f for f in details.files if f.path == "model.safetensors")
    import hashlib

    assert weights.sha256 == hashlib.sha256(bytes(range(256)) * 1024).hexdigest()


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_cdns_403_to_the_model_cards_link_is_said_to_be_the_link_not_a_gated_model(hub_server, hub):
    """The model card and config.json come, as every file, through the hub's CDN on a signed link. The CDN's
    403 page (the link expired or refused) made the details say "access to …/README.md is denied (403): the
    model is gated or private", and to set a token, which no token would change. It says the storage host
    refused the link, and to try again (a new try asks the hub for a new link). The fake hub's files come
    through a 302 to "localhost"; the metadata is the hub's own."""
    from urllib.parse import urlsplit

    hub_server.hub.cdn, hub_server.hub.cdn_refusals = True, -1
    details = open_hub(hub).details("Qwen/Qwen2.5-Tiny-Instruct")
    cdn = f"localhost:{urlsplit(hub_server.url).port}"
    name = {"modelscope": "ModelScope", "hf": "Hugging Face"}[hub]
    assert details.readme is None or details.readme == "", details.readme
    [card] = [note for note in details.notes if note.startswith("The model card could not be read: ")]
    assert f"{cdn} refused the download link {name} gave for Qwen/Qwen2.5-Tiny-Instruct/README.md (HTTP 403): a " \
           "signed link that expired or was refused by that storage server" in card, card
    assert f"Try again: each try asks {name} for a new link." in card, card
    assert "gated" not in card and "TOKEN" not in card and "login page (" not in card, card
    hub_server.hub.cdn_refusals = 0  # the CDN takes the links again: the card reads
    assert open_hub(hub).details("Qwen/Qwen2.5-Tiny-Instruct").readme.startswith("# Qwen2.5 Tiny")


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_missing_private_and_gated_models_say_so(hub_server, hub):
    source = open_hub(hub)
    with pytest.raises(HubNotFoundError, match="does not exist"):
        source.details("nobody/nothing")
    with pytest.raises(HubAccessError) as private:
        source.details("acme/private-model")
    assert private.value.status == 401 and ("MODELSCOPE_API_TOKEN" if hub == "modelscope" else "HF_TOKEN") in str(private.value)
    with pytest.raises(HubAccessError) as gated:
        source.details("meta/gated-model")
    assert gated.value.status == 403 and "gated" in str(gated.value)


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_token_from_environment_opens_private_model(hub_server, hub, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_API_TOKEN" if hub == "modelscope" else "HF_TOKEN", TOKEN)
    details = open_hub(hub).details("acme/private-model")
    assert details.summary.model_id == "acme/private-model"


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_slow_hub_times_out_with_a_clear_message(hub_server, hub):
    # The hub holds every answer until the test lets it go: the error can only be the client giving up.
    hub_server.hub.hold = threading.Event()
    source = open_hub(hub, timeout_s=0.5)
    try:
        with pytest.raises(HubUnavailableError, match="did not answer in time"):
            source.search(SearchQuery(text="qwen"))
        assert hub_server.hub.requests  # asked, and gave up before the server answered
    finally:
        hub_server.hub.hold.set()


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_no_server_is_a_clear_message_in_seconds(tmp_path, monkeypatch, hub):
    # "In seconds" is a property, not a speed: ModelScope does not try a refused connection again, and
    # Hugging Face's retries (with back-off) are abandoned at the source's own deadline.
    url = closed_port_url()
    port = int(url.rsplit(":", 1)[1])
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", url)
    monkeypatch.setenv("HF_ENDPOINT", url)
    attempts: list[object] = []
    connect = socket.socket.connect

    def counted(sock, address):
        if isinstance(address, tuple) and address[1] == port:
            attempts.append(address)
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", counted)
    from core.hub.hf_source import _CALL_THREAD

    def sdk_calls() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name.startswith(_CALL_THREAD)}

    before = sdk_calls()
    with pytest.raises(HubUnavailableError) as error:
        open_hub(hub).search(SearchQuery(text="qwen"))
    if hub == "modelscope":  # its clients are built with one attempt
        assert len(attempts) == 1, attempts
    else:  # the SDK retries with back-off for tens of seconds: the answer did not wait for it to give up
        assert attempts and any(thread.is_alive() for thread in sdk_calls() - before)
    assert url in str(error.value) and "the connection was refused" in str(error.value)


def test_missing_sdk_says_install_the_training_stack(monkeypatch):
    import sys

    from core.hub.errors import HubSdkMissingError

    monkeypatch.setitem(sys.modules, "modelscope_hub", None)  # what an app-only install looks like
    with pytest.raises(HubSdkMissingError, match="install the training stack"):
        open_hub("modelscope")


def _many_then_large(hub):
    """40 models without a size in their names, most downloaded, then one of 32B: on page 3 of 20."""
    import json

    from tests.hubserver import FakeRepo, tiny_config

    for index in range(40):
        hub.add(FakeRepo(f"many/variant-{index:02d}", files={"config.json": json.dumps(tiny_config()).encode()},
                         downloads=10_000_000 + index))
    hub.add(FakeRepo("acme/Coder-32B", files={"config.json": b"{}"}, downloads=1))


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_size_class_is_found_on_a_later_page(hub_server, hub):
    """The hubs cannot filter by size: the QA's `--size large` said "No models match these filters" off a first
    page without one, while page 4 held a 32B model. The search reads on to the first page that has one."""
    _many_then_large(hub_server.hub)
    page = open_hub(hub).search(SearchQuery(size_class="large"))
    assert [m.model_id for m in page.items] == ["acme/Coder-32B"] and page.page == 3, page
    # the next page goes on after the one returned
    assert not open_hub(hub).search(SearchQuery(size_class="large", page=page.page + 1)).items


def test_the_cli_says_when_the_scan_for_a_size_stopped_with_pages_left(hub_server, monkeypatch, capsys):
    import core.hub.records
    from core.cli import main

    _many_then_large(hub_server.hub)
    monkeypatch.setattr(core.hub.records, "SIZE_SCAN_PAGES", 2)
    assert main(["models", "search", "--size", "large"]) == 0
    err = capsys.readouterr().err
    assert "No large model on pages 1-2 of the 45 found on ModelScope" in err and "--page 3 looks further" in err
    assert "No models match" not in err, err
    assert main(["models", "search", "--size", "large", "--page", "3"]) == 0
    assert "acme/Coder-32B" in capsys.readouterr().out
