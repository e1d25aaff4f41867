"""A failed hub call said for a person (what failed, what to do, the raw detail apart), through the real
SDKs against the local fake hub or an address nobody answers on; the CLI's twin of the Models screen."""

from __future__ import annotations

import time

import pytest

from core.cli import main
from core.hub import hf_source
from core.hub.errors import HubUnavailableError
from core.hub.problems import PROXY_ENV, REASONS, describe_error, status_problem, unreachable_problem
from core.hub.reachability import HubReachability
from core.hub.records import SearchQuery
from core.hub.source import open_hub
from core.i18n import catalogue
from tests.hubserver import FakeHubServer, closed_port_url, standard_hub

ENV = {"modelscope": "MODELSCOPE_ENDPOINT", "hf": "HF_ENDPOINT"}


@pytest.fixture(autouse=True)
def private_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in (*PROXY_ENV, "MODELSCOPE_API_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def search_problem(hub: str, **source_options):
    with pytest.raises(HubUnavailableError) as error:
        open_hub(hub, **source_options).search(SearchQuery(text="qwen"))
    problem = error.value.problem
    assert problem is not None and describe_error(error.value, hub) is problem
    return problem


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_refused_connection_is_one_sentence_with_advice_and_the_raw_text_apart(hub, monkeypatch):
    url = closed_port_url()
    monkeypatch.setenv(ENV[hub], url)
    problem = search_problem(hub)
    assert (problem.kind, problem.reason, problem.offline) == ("unreachable", "refused", True)
    assert problem.summary.endswith(f"not reachable at {url}: the connection was refused.")
    assert "Pool(" not in problem.summary and "Max retries" not in problem.summary
    assert any("HTTPS_PROXY" in advice for advice in problem.advice)
    assert any(f"{ENV[hub]} is set to {url}" in advice for advice in problem.advice)
    assert "Connection refused" in problem.detail  # the library's own words, whole, for whoever wants them


def test_unknown_host_says_dns(monkeypatch):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://no-such-hub.invalid")  # .invalid never resolves
    problem = search_problem("modelscope")
    assert problem.reason in ("dns", "timeout") and problem.offline
    if problem.reason == "dns":
        assert "does not resolve (DNS)" in problem.summary


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_slow_hub_did_not_answer_in_time(hub):
    with FakeHubServer(standard_hub()) as server:
        server.hub.slow_s = 3.0
        problem = search_problem(hub, endpoint=server.url, timeout_s=0.5)
    assert problem.kind == "timeout" and problem.offline
    assert problem.summary.endswith(f"did not answer in time at {server.url}.")
    mirror = "https://modelscope.ai" if hub == "modelscope" else "https://hf-mirror.com"
    assert any(mirror in advice for advice in problem.advice)  # no endpoint variable set: a mirror to try


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_an_endpoint_that_is_no_hub_answers_404_to_a_search_and_is_not_a_missing_model(hub):
    with FakeHubServer(standard_hub()) as server:
        problem = search_problem(hub, endpoint=f"{server.url}/not-a-hub", timeout_s=120.0)  # it answers: no race
    assert (problem.kind, problem.status, problem.offline) == ("status", 404, False)
    assert "HTTP 404 to a search" in problem.summary and "does not exist" not in problem.summary
    assert f"may not point at a {'ModelScope' if hub == 'modelscope' else 'Hugging Face'} server" in problem.advice[0]


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_web_page_in_place_of_the_hub_is_said_so_in_search_and_details(hub, monkeypatch, capsys):
    """The QA's box sat behind a captive portal (every address answered 200 with its login page): the
    ModelScope search said "No models match 'qwen'", the Hugging Face one "The request failed
    (JSONDecodeError)", and ``models info`` on either ended in a traceback. Each now says the hub's address
    answered a web page, what that usually is, and what to do; the CLI exits 3 without a traceback."""
    with FakeHubServer(standard_hub()) as server:
        server.hub.web_page = True
        monkeypatch.setenv(ENV[hub], server.url)
        problem = search_problem(hub, timeout_s=120.0)  # it answers: no race
        assert (problem.kind, problem.offline) == ("unreachable", True)
        assert problem.summary.endswith(f"at {server.url} answered with a web page, not its API: a captive portal "
                                        "or a proxy's login page (this box is not really online), or a website "
                                        "at that address.")
        assert f"{ENV[hub]} may not point at a" in problem.advice[0]
        assert "text/html" in problem.detail
        with pytest.raises(HubUnavailableError) as error:
            open_hub(hub, timeout_s=120.0).details("Qwen/Qwen2.5-Tiny-Instruct")
        assert error.value.problem.summary == problem.summary
        for command in (["search", "qwen"], ["info", "Qwen/Qwen2.5-Tiny-Instruct"]):
            assert main(["models", *command, "--hub", hub]) == 3
            out, err = capsys.readouterr()
            assert "Traceback" not in err and "No models match" not in out + err
            assert "answered with a web page" in err


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_json_and_files_a_mirror_labels_text_html_are_accepted(hub, monkeypatch, capsys):
    """Any successful answer labelled text/html was refused on the header alone: a mirror or proxy labelling
    the hub's JSON (or a README) so was said to be a captive portal. The body is looked at: JSON and files
    labelled text/html are accepted; an HTML page is still refused (the test above)."""
    from core.hub.http import raise_if_web_page

    raise_if_web_page(hub, 200, "text/html", "http://x/api", b'  {"Data": []}')
    with pytest.raises(HubUnavailableError):
        raise_if_web_page(hub, 200, "text/html", "http://x/api", b"\n  <!DOCTYPE html><html></html>")
    with FakeHubServer(standard_hub()) as server:
        server.hub.label_html = True
        monkeypatch.setenv(ENV[hub], server.url)
        source = open_hub(hub, timeout_s=120.0)
        assert "Qwen/Qwen2.5-Tiny-Instruct" in [m.model_id for m in source.search(SearchQuery(text="qwen")).items]
        details = source.details("Qwen/Qwen2.5-Tiny-Instruct")
        assert details.summary.model_id == "Qwen/Qwen2.5-Tiny-Instruct" and details.config and details.files
        assert source.read_small_file("Qwen/Qwen2.5-Tiny-Instruct", "config.json").startswith(b"{")
        assert main(["models", "info", "Qwen/Qwen2.5-Tiny-Instruct", "--hub", hub]) == 0
        assert "web page" not in capsys.readouterr().err


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_website_answering_404_pages_is_no_hub_for_info_as_for_a_search(hub, monkeypatch, capsys):
    """An endpoint variable naming a website (every path a 404 "Not Found" page): a search said the hub
    answered 404 and the endpoint may not be a hub, but ``models info`` said the model "does not exist
    (404). Check the spelling": a wrong lead. Both now say a website answered, not a hub, and what to fix."""
    with FakeHubServer(standard_hub()) as server:
        server.hub.web_page, server.hub.web_page_status = True, 404
        monkeypatch.setenv(ENV[hub], server.url)
        with pytest.raises(HubUnavailableError) as error:
            open_hub(hub, timeout_s=120.0).details("Qwen/Qwen2.5-Tiny-Instruct")  # it answers: no race
        problem = error.value.problem
        name = "ModelScope" if hub == "modelscope" else "Hugging Face"
        assert (problem.kind, problem.status, problem.offline) == ("status", 404, False)
        assert problem.summary == (f"{name} at {server.url} answered HTTP 404 with a web page, not its API: a "
                                   f"website is at that address, not a {name} server.")
        assert problem.advice[0].startswith(f"{ENV[hub]} may not point at a {name} server")
        assert search_problem(hub, timeout_s=120.0).summary == problem.summary  # the search says the same
        assert main(["models", "info", "Qwen/Qwen2.5-Tiny-Instruct", "--hub", hub]) == 3
        err = capsys.readouterr().err
        assert "does not exist" not in err and f"not a {name} server" in err
        server.hub.web_page = False  # the hub itself: a model it lacks is still one that does not exist
        with pytest.raises(Exception) as missing:
            open_hub(hub, timeout_s=120.0).details("Qwen/No-Such-Model")
        assert "does not exist (404)" in str(missing.value)


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_a_login_page_answering_401_or_403_is_no_token_problem_for_info(hub, status, monkeypatch):
    """A proxy's or a captive portal's HTML login page (HTTP 401/403 on every path) read as the hub's word on the
    token ("needs a login (401) … set MODELSCOPE_API_TOKEN"): it is now said as a web page where the API belongs."""
    with FakeHubServer(standard_hub()) as server:
        server.hub.web_page, server.hub.web_page_status = True, status
        monkeypatch.setenv(ENV[hub], server.url)
        with pytest.raises(HubUnavailableError) as error:
            open_hub(hub, timeout_s=120.0).details("Qwen/Qwen2.5-Tiny-Instruct")
    problem = error.value.problem
    name = "ModelScope" if hub == "modelscope" else "Hugging Face"
    assert (problem.kind, problem.status) == ("status", status)
    assert problem.summary.startswith(f"{name} at {server.url} answered HTTP {status} with a web page, not its API: "
                                      "a proxy's or a captive portal's login page"), problem.summary
    assert problem.advice[0].startswith(f"{ENV[hub]} may not point at a {name} server")


def _no_hf_calls_left() -> None:
    """Wait until no HF call thread is alive (abandoned ones end at their next request: the SDK's
    back-off is at most 8 s), so that none closes the SDK's shared client under this test's call."""
    import threading

    deadline = time.monotonic() + 60
    while any(t.name.startswith(hf_source._CALL_THREAD) for t in threading.enumerate()):
        assert time.monotonic() < deadline, "an HF call thread outlived its caller"
        time.sleep(0.05)


def test_a_slow_hf_hub_that_answers_gets_the_read_timeout_and_only_failed_attempts_the_retry_grace(monkeypatch):
    from huggingface_hub.utils import close_session

    monkeypatch.setattr(hf_source, "RETRY_GRACE_S", 0.05)
    _no_hf_calls_left()
    close_session()  # a kept-alive connection to an earlier test's server, whose port this one may reuse, is reset
    with FakeHubServer(standard_hub()) as server:
        server.hub.slow_s = 0.5  # ten times the grace: no attempt failed, so the call waits on
        page = open_hub("hf", endpoint=server.url, timeout_s=120.0).search(SearchQuery(text="qwen"))
    assert page.items
    problem = search_problem("hf", endpoint=closed_port_url(), timeout_s=120.0)
    assert problem.reason == "refused"  # the first failed attempt's reason, when the grace ended the wait


def test_an_abandoned_hf_call_stops_retrying(monkeypatch):
    """The SDK retries a 503 five times over ~23 s; once the caller has given up, the call's thread ends at
    its next request instead of going on (and closing the SDK's shared client under later calls)."""
    monkeypatch.setattr(hf_source, "RETRY_GRACE_S", 0.05)
    _no_hf_calls_left()
    with FakeHubServer(standard_hub()) as server:
        server.hub.status = 503
        problem = search_problem("hf", endpoint=server.url, timeout_s=120.0)
        _no_hf_calls_left()
        requests = len(server.hub.requests)
    assert (problem.kind, problem.status) == ("status", 503)
    assert requests == 1  # the first attempt only: the retry a second later found its caller gone


def test_statuses_and_proxies_give_their_own_advice(monkeypatch):
    busy = status_problem("modelscope", "https://modelscope.cn", 503, "qwen")
    assert busy.summary == "ModelScope answered HTTP 503 at https://modelscope.cn." and "try again in a while" in busy.advice[0]
    assert "wait a minute" in status_problem("hf", "https://huggingface.co", 429, "x").advice[0]
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    problem = unreachable_problem("hf", "https://huggingface.co", "ProxyError('Unable to connect to proxy')")
    assert problem.reason == "proxy" and problem.advice[0] == "Check the network and the proxy in HTTPS_PROXY."


def test_every_reason_has_words():
    messages = catalogue("en")
    assert all(f"hub.reason.{reason}" in messages for reason in REASONS)


def test_the_memory_of_an_unreachable_hub_lasts_a_while_and_an_answer_clears_it():
    now = [100.0]
    memory = HubReachability(hold_s=30.0, clock=lambda: now[0])
    offline = unreachable_problem("modelscope", "https://modelscope.cn", "[Errno 111] Connection refused")
    memory.failed(offline)
    now[0] += 12
    recent = memory.recent_failure("modelscope")
    assert recent is not None and recent.problem is offline and recent.age_s == 12
    assert memory.recent_failure("hf") is None  # per hub
    now[0] += 18
    assert memory.recent_failure("modelscope") is None  # forgotten after hold_s
    memory.failed(offline)
    memory.answered("modelscope")
    assert memory.recent_failure("modelscope") is None
    memory.failed(status_problem("modelscope", "https://modelscope.cn", 503, "qwen"))
    assert memory.recent_failure("modelscope") is None  # the hub answered: not out of reach


# --- the headless twin --------------------------------------------------------------------------------
def test_cli_search_offline_prints_the_same_message_and_exits_non_zero(monkeypatch, capsys):
    url = closed_port_url()
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", url)
    for extra in ([], ["--json"]):
        assert main(["models", "search", "qwen", *extra]) == 3
        out, err = capsys.readouterr()
        assert out == "" and "Traceback" not in err
        lines = err.splitlines()
        assert lines[0] == f"tunedeck: ModelScope is not reachable at {url}: the connection was refused."
        assert lines[1] == "Check the network, or set HTTPS_PROXY if this box needs a proxy."
        assert lines[2] == f"MODELSCOPE_ENDPOINT is set to {url}: check it, or unset it for https://modelscope.cn."
        assert "tunedeck models list" in lines[3] and "tiny" in lines[3]
        assert lines[4].startswith("detail: ") and "Connection refused" in lines[4]


def test_cli_search_without_results_says_so_with_a_hint(monkeypatch, capsys):
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "search", "zzz", "--owner", "Qwen"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "No models match 'zzz' on ModelScope.",
        "Filters in force: --owner Qwen --task text-generation; drop one to widen the search.",
        "Try other or fewer words, or --hub hf.",
    ]


def test_cli_list_names_the_bundled_models(capsys):
    import json

    assert main(["models", "list", "--json"]) == 0
    bundled = json.loads(capsys.readouterr().out)["bundled"]
    assert bundled[0] == {"name": "tiny", "kind": "builtin", "path": bundled[0]["path"]}
    assert {"name": "Qwen2.5-7B", "kind": "config"}.items() <= next(b for b in bundled if b["name"] == "Qwen2.5-7B").items()
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "built-in, trains offline" in out


@pytest.mark.parametrize(("hub", "env"), [("modelscope", "MODELSCOPE_API_TOKEN"), ("hf", "HF_TOKEN")])
def test_a_rejected_token_is_said_so_not_advised_to_be_set(hub, env, monkeypatch, capsys):
    """With a wrong token set, the 401 said 'set {env} to a token with access' though it was set."""
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv(ENV[hub], server.url)
        assert main(["models", "info", "acme/private-model", "--hub", hub]) == 3
        err = capsys.readouterr().err
        assert "needs a login" in err and f"Set {env} to a token" in err  # no token: log in
        monkeypatch.setenv(env, "bad-token")
        assert main(["models", "info", "acme/private-model", "--hub", hub]) == 3
        err = capsys.readouterr().err
        assert f"the token in {env} was rejected (401)" in err and "wrong or expired" in err
        assert "needs a login" not in err and "bad-token" not in err
