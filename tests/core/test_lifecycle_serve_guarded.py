"""The detached server as an exposed service: API key, body-size limit, non-loopback warning, and usage
counted from the generated ids. Real servers over loopback on a real finished tiny LoRA run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.fixtures.lifecycle.finished_run import tunedeck
from tests.network import ipv6_loopback

KEY = "td-test-key-8f2c"


def _request(url: str, data: bytes | None = None, key: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _chat_body(**extra) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12,
                       "temperature": 0, **extra}).encode()


def _stop(home, run) -> None:
    stopped = tunedeck(home, "serve", run.id, "--stop")
    assert stopped.returncode == 0, stopped.stderr


def test_public_host_warns_and_the_env_key_and_body_limit_guard_every_v1_route(lora_run):
    home, run = lora_run
    proc = tunedeck(home, "serve", run.id, "--host", "0.0.0.0", "--max-body-bytes", "4096", "--json",
                    TUNEDECK_API_KEY=KEY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        assert "0.0.0.0" in proc.stderr and "other machines can reach" in proc.stderr
        assert "clients need the API key" in proc.stderr
        assert state["auth"] is True and state["healthy"] is True  # health knows a 401 means "up"
        with open(f"/proc/{state['pid']}/cmdline", "rb") as handle:
            assert KEY.encode() not in handle.read()  # the key never shows in ps
        log = (home / "serve" / run.id / "server.log").read_text()
        assert "WARNING" in log and "other machines can reach" in log
        base = f"http://127.0.0.1:{state['port']}"
        # /health is open; every /v1 route wants the key, and says so in OpenAI's error shape.
        assert _request(base + "/health")[0] == 200
        for url, data in ((base + "/v1/models", None), (base + "/v1/chat/completions", _chat_body()),
                          (base + "/v1/nothing-here", None)):
            for key in (None, "wrong-key"):
                code, body = _request(url, data, key)
                assert code == 401, (url, key, code, body)
                assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
                assert "Authorization: Bearer" in body["error"]["message"]
        code, body = _request(base + "/v1/models", key=KEY)
        assert code == 200 and [m["id"] for m in body["data"]] == [run.id, run.id + "-base"]
        from openai import AuthenticationError, OpenAI

        with pytest.raises(AuthenticationError):
            OpenAI(base_url=base + "/v1", api_key="wrong-key", timeout=60, max_retries=0).models.list()
        reply = OpenAI(base_url=base + "/v1", api_key=KEY, timeout=60, max_retries=0).chat.completions.create(
            model=run.id, temperature=0, max_tokens=12, messages=[{"role": "user", "content": "Name a colour."}])
        assert reply.choices[0].message.content.strip() == "Blue."
        # A body over the limit is refused with 413 (and the server goes on answering).
        padding = "x" * 8000
        code, body = _request(base + "/v1/chat/completions", _chat_body(user=padding), KEY)
        assert code == 413 and body["error"]["code"] == "request_too_large", body
        assert "4096" in body["error"]["message"] and "--max-body-bytes" in body["error"]["message"]
        code, body = _request(base + "/v1/chat/completions", b"{}", KEY,
                              headers={"Content-Length": "-5"})
        assert code == 400, body
        code, body = _request(base + "/v1/chat/completions", _chat_body(), KEY)
        assert code == 200 and body["choices"][0]["message"]["content"].strip() == "Blue."
        from core.lifecycle.serve import probe_request

        with pytest.raises(Exception, match="401: it requires an API key"):
            probe_request(base + "/v1", run.id, api_key="")
        with pytest.raises(Exception, match="401: it refused the API key in TUNEDECK_API_KEY"):
            probe_request(base + "/v1", run.id, api_key="wrong-key")
        assert probe_request(base + "/v1", run.id, prompt="Say yes.", api_key=KEY)[0].strip() == "Yes."
        # Any other refusal in the server's own words (urllib said "HTTP Error 404: Not Found")
        with pytest.raises(Exception, match=r"answered 404: The model `nosuch` does not exist\. This server serves"):
            probe_request(base + "/v1", "nosuch", api_key=KEY)
    finally:
        _stop(home, run)


def _expected_ids(run, prompt: str, max_tokens: int, variant: str) -> tuple[int, list[int], set[int]]:
    """(prompt length, generated ids, end ids) from plain transformers ``generate``, greedy."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs (OMP_NUM_THREADS=1): the same sums, the same argmax
    try:
        return _generate(run, prompt, max_tokens, variant)
    finally:
        torch.set_num_threads(threads)


def _generate(run, prompt: str, max_tokens: int, variant: str) -> tuple[int, list[int], set[int]]:
    import torch

    from core.lifecycle.source import load_finetuned, resolve_model_source

    loaded = load_finetuned(resolve_model_source(run), "cpu")
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"]
    model = loaded.model
    with torch.no_grad():
        if variant == "base":
            with model.disable_adapter():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id)
        else:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=loaded.tokenizer.pad_token_id)
    eos = model.generation_config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [eos]) | {loaded.tokenizer.eos_token_id}
    return int(ids.shape[-1]), out[0, ids.shape[-1]:].tolist(), ends


def test_usage_and_finish_reason_come_from_the_generated_ids_streaming_and_not(lora_run):
    from openai import OpenAI

    home, run = lora_run
    cases = [("Name a colour.", 12, run.id, "tuned"), ("Hi", 7, run.id + "-base", "base")]
    expected = {model: _expected_ids(run, prompt, max_tokens, variant) for prompt, max_tokens, model, variant in cases}
    proc = tunedeck(home, "serve", run.id, "--api-key", KEY, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        assert "other machines" not in proc.stderr  # loopback: no warning
        with open(f"/proc/{state['pid']}/cmdline", "rb") as handle:
            assert KEY.encode() not in handle.read()
        client = OpenAI(base_url=state["url"], api_key=KEY, timeout=120, max_retries=0)
        for prompt, max_tokens, model, _variant in cases:
            prompt_len, ids, ends = expected[model]
            hit_eos = bool(ids) and ids[-1] in ends
            finish = "length" if len(ids) >= max_tokens and not hit_eos else "stop"
            reply = client.chat.completions.create(model=model, temperature=0, max_tokens=max_tokens,
                                                   messages=[{"role": "user", "content": prompt}])
            assert reply.usage.completion_tokens == len(ids) >= 1, (model, reply.usage, ids)
            assert reply.usage.prompt_tokens == prompt_len
            assert reply.usage.total_tokens == prompt_len + len(ids)
            assert reply.choices[0].finish_reason == finish, (model, ids)
            stream = client.chat.completions.create(model=model, temperature=0, max_tokens=max_tokens, stream=True,
                                                    stream_options={"include_usage": True},
                                                    messages=[{"role": "user", "content": prompt}])
            chunks = list(stream)
            finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            assert finishes == [finish]
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
            assert chunks[-1].usage.prompt_tokens == prompt_len
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == reply.choices[0].message.content
        # The learned answer ends with the end token, which counts (it was generated) though it decodes to "".
        _prompt_len, tuned_ids, ends = expected[run.id]
        assert tuned_ids[-1] in ends
        # The base babbles to the limit: "length", exactly max_tokens tokens.
        assert len(expected[run.id + "-base"][1]) == 7
    finally:
        _stop(home, run)


def test_serve_refuses_a_bad_port_checkpoint_or_run_in_one_line_before_starting_anything(lora_run):
    """These used to spawn the server and print its log's Python traceback ("the server did not come
    up …"); now, like merge, one line says what is wrong and no server process or state file is made."""
    import shutil
    import socket

    from core.lifecycle.serve import serve_dir

    home, run = lora_run
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        cases = [(["--port", "99999"], "--port must be a port number from 1 to 65535", 2),
                 (["--port", "-1"], "not -1", 2),
                 (["--port", str(busy)], f"cannot listen on 127.0.0.1 port {busy}", 1),
                 (["--checkpoint", "999"], "has no complete checkpoint 999; complete checkpoints: 15, 30", 2)]  # not there: 2 (was 1)
        for extra, says, code in cases:
            proc = tunedeck(home, "serve", run.id, *extra)
            assert proc.returncode == code, (extra, proc.returncode, proc.stderr)
            assert says in proc.stderr, (extra, proc.stderr)
            assert "Traceback" not in proc.stderr and "did not come up" not in proc.stderr, proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    shutil.rmtree(run.checkpoints_dir)
    proc = tunedeck(home, "serve", run.id)
    assert proc.returncode == 2 and "ended (finished) without a complete checkpoint" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (serve_dir(run.id) / "state.json").exists()  # nothing was started


def test_vllm_refuses_a_merged_folder_that_is_no_whole_merge_and_says_how_to_merge(lora_run, monkeypatch):
    """vLLM serves the run's merged folder. One left half-written (config.json, no weights, no provenance)
    was handed to vLLM as it was, and vLLM's own error said nothing of the merge. Now the folder must pass
    the test merge and export reuse it by (complete_merge); else one line says what is wrong and the
    command that merges it again, before any server process or state file. A whole merge goes through to
    the backend (here, vLLM not being installed, the server fails to come up: past the check)."""
    import core.lifecycle.serve as serve
    from core.lifecycle.merge import default_merge_dir, merge_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    monkeypatch.setattr(serve, "choose_backend", lambda requested: "vllm")
    merged = default_merge_dir(run, 30)
    merged.mkdir(parents=True)
    (merged / "config.json").write_text("{}")
    with pytest.raises(LifecycleError) as caught:  # no merge of tunedeck's: --force would not replace it
        serve.start_server(run, backend="vllm", timeout=30)
    said = str(caught.value)
    assert f"{merged} holds 1 entry: config.json" in said and "move or delete it yourself" in said
    assert not (serve.serve_dir(run.id) / "state.json").exists()  # nothing started
    assert {p.name for p in merged.iterdir()} == {"config.json"}  # the folder left as it was
    # a merge cut short (its provenance names another checkpoint): merging it again with --force is the way
    (merged / "tunedeck_merge.json").write_text(json.dumps({"checkpoint": "elsewhere", "step": 30}))
    with pytest.raises(LifecycleError) as caught:
        serve.start_server(run, backend="vllm", timeout=30)
    said = str(caught.value)
    assert f"{merged} is not a whole merge of checkpoint 30" in said and "vllm cannot serve it" in said
    assert f"tunedeck merge {run.id} --checkpoint 30 --force" in said
    assert not (serve.serve_dir(run.id) / "state.json").exists()  # nothing started
    assert {p.name for p in merged.iterdir()} == {"config.json", "tunedeck_merge.json"}

    merge_run(run, force=True)
    with pytest.raises(LifecycleError) as caught:
        serve.start_server(run, backend="vllm", timeout=30)
    assert "the server did not come up" in str(caught.value) and "vllm" in str(caught.value)
    assert "not a whole merge" not in str(caught.value)


def _not_models(base):
    """Four --model-dir folders that are no model to load, each with what the refusal must say."""
    import shutil

    from tests.fixtures.lifecycle.finished_run import TINY

    notes = base / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("not a model")
    stopped, bare = base / "stopped", base / "bare"
    for folder in (stopped, bare):
        shutil.copytree(TINY, folder)  # config.json and tokenizer, no weights
    (stopped / "model.safetensors.part").write_bytes(b"\0" * 1024)
    return [(base / "nowhere", "is not a folder (it does not exist)"),
            (notes, "has no config.json, so it is not a model folder"),
            (stopped, "holds a download that is not finished (1 .part/.incomplete file)"),
            (bare, "has a config.json but no weights (*.safetensors, *.bin), so there is nothing to load")]


def test_serve_refuses_a_model_dir_that_is_no_model_before_starting_anything(lora_run, tmp_path, monkeypatch):
    """`serve --model-dir DIR` handed DIR to the server as it was: a folder with no config.json, a stopped
    download or no weights started a server that died in its log ("the server did not come up" and
    transformers' traceback), or vLLM's own error. Now, for every backend, one line names the folder and
    what is wrong (exit 2), before any server process or state file."""
    import core.lifecycle.serve as serve
    from core.lifecycle.source import LifecycleError

    home, _run = lora_run
    folders = _not_models(tmp_path)
    for folder, says in folders:
        proc = tunedeck(home, "serve", "--model-dir", str(folder))
        assert proc.returncode == 2, (folder, proc.returncode, proc.stderr[-2000:])
        assert f"--model-dir {folder} {says}" in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "did not come up" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (home / "serve" / folder.name).exists()  # nothing was started
    monkeypatch.setattr(serve, "choose_backend", lambda requested: requested)  # vLLM is not installed here
    for backend in ("vllm", "lmdeploy"):
        for folder, says in folders:
            with pytest.raises(LifecycleError) as caught:
                serve.start_server(None, backend=backend, model_dir=folder, timeout=30)
            assert f"--model-dir {folder} {says}" in str(caught.value) and caught.value.exit_code == 2
            assert not (home / "serve" / folder.name).exists()


def test_serve_model_dir_relative_to_where_it_is_typed(lora_run):
    """The server runs in tunedeck's own folder, so a relative --model-dir was looked for there: the check
    passed where the user typed it and the server failed to find it. Now it is made absolute first. A
    merge's own folder, ``checkpoint-N`` (every run's merge of step N is called so), serves as
    ``<run id>-checkpoint-N``."""
    import os
    import subprocess
    import sys

    from core.lifecycle.merge import merge_run
    from tests.fixtures.lifecycle.finished_run import ROOT

    home, run = lora_run
    merged = merge_run(run).out
    proc = subprocess.run([sys.executable, "-m", "core", "serve", "--model-dir", merged.name, "--json"],
                          cwd=merged.parent, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        assert state["healthy"] is True
        status, models = _request(state["url"] + "/models")
        assert merged.name.startswith("checkpoint-") and state["run_id"] == f"{run.id}-{merged.name}"
        assert status == 200 and [m["id"] for m in models["data"]] == [f"{run.id}-{merged.name}"]
    finally:
        stopped = tunedeck(home, "serve", "--stop", f"{run.id}-{merged.name}")
        assert stopped.returncode == 0, stopped.stderr


@pytest.mark.skipif(not ipv6_loopback(), reason="this box has no IPv6 loopback (::1 cannot be bound)")
def test_serve_on_an_ipv6_address_listens_there(lora_run):
    """`--host ::1` used to pass the look before spawning and then fail in the server (an IPv4 socket asked
    to bind an IPv6 address: 'the server did not come up'). Now the server listens on IPv6 and answers."""
    home, run = lora_run
    proc = tunedeck(home, "serve", run.id, "--host", "::1", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        assert state["url"] == f"http://[::1]:{state['port']}/v1" and state["healthy"] is True
        assert _request(f"http://[::1]:{state['port']}/health") == (200, {"status": "ok", "model": run.id})
        assert "other machines can reach" not in proc.stderr  # ::1 is a loopback address
    finally:
        _stop(home, run)


def _port_left_in_time_wait() -> int:
    """A loopback port whose server (SO_REUSEADDR, as ours and uvicorn bind) closed a connection first and
    stopped: the port's end of that connection is still bound (TIME_WAIT), as after `serve --stop`."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
            assert client.recv(1) == b""  # the close has arrived
    return port


def test_the_look_before_serving_and_the_free_port_pick_bind_one_way_each_with_its_own_reuse(monkeypatch):
    """check_listen_address and the free-port pick each bound a socket their own way (only the first with
    SO_REUSEADDR): one helper now, core.listen.bind_and_close, each still with the option right for it. The
    look binds as the server will, reusing a port left in TIME_WAIT (the server can listen there, so the look
    must not refuse it); the pick asks for a port no socket holds, so it does not reuse."""
    import socket
    from http.server import BaseHTTPRequestHandler

    from core import listen
    from core.lifecycle import serve
    from core.lifecycle.server import ChatServer

    port = _port_left_in_time_wait()
    with pytest.raises(OSError):
        listen.bind_and_close("127.0.0.1", port, reuse_address=False)  # the port is still held
    assert listen.bind_and_close("127.0.0.1", port, reuse_address=True) == port
    serve.check_listen_address("127.0.0.1", port)  # accepted: and the server does bind it
    server = ChatServer("127.0.0.1", port, BaseHTTPRequestHandler)
    server.server_close()

    free = listen.free_port("127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", free))  # a port nobody holds: bound without reuse

    calls = []
    real = listen.bind_and_close

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(serve, "bind_and_close", recorded)
    monkeypatch.setattr(listen, "bind_and_close", recorded)
    serve.check_listen_address("127.0.0.1", 0)
    serve.free_port("127.0.0.1")  # the pick start_server hands vLLM/LMDeploy
    assert calls == [(("127.0.0.1", 0), {"reuse_address": True}), (("127.0.0.1", 0), {"reuse_address": False})]


def test_an_unknown_backend_is_named_as_unknown_with_the_ones_there_are(lora_run):
    """`serve --backend bogus` said "backend bogus is not installed" (as if installing it would help). Now a
    name that is no backend is refused as such, in one line listing the valid ones (exit 2), before
    anything starts; a known backend that is not installed still says so."""
    from core.lifecycle.serve import serve_dir

    home, run = lora_run
    for name in ("bogus", "VLLM", ""):
        proc = tunedeck(home, "serve", run.id, "--backend", name, "--host", "0.0.0.0")
        assert proc.returncode == 2, (name, proc.returncode, proc.stderr)
        said = proc.stderr.strip()
        assert f"--backend {name} is not a backend tunedeck knows" in said, said
        assert "choose one of: auto, transformers, vllm, lmdeploy" in said and "not installed" not in said
        assert len(said.splitlines()) == 1 and "Traceback" not in said, said  # not even the host warning
        assert not (serve_dir(run.id) / "state.json").exists()
    import importlib.util

    if importlib.util.find_spec("lmdeploy") is None:
        proc = tunedeck(home, "serve", run.id, "--backend", "lmdeploy")
        assert proc.returncode == 1 and "backend lmdeploy is not installed" in proc.stderr, proc.stderr


def test_serve_model_dir_needs_no_run_and_is_filed_under_its_own_id(lora_run, tmp_path):
    """`serve --model-dir DIR` demanded a RUN (exit 2) while `chat --model-dir` did not, and its help spoke of
    chatting; given a run, the folder's server was filed under the run (its panel called it the run's) while
    serving the folder's id. Now the folder alone is served, filed under its own id (the folder's name),
    --status and --stop find it by that id or by --model-dir, and the run has no server of it."""
    import shutil

    from core.lifecycle.merge import merge_run
    from core.lifecycle.serve import server_state

    home, run = lora_run
    folder = tmp_path / "my-model"
    shutil.copytree(merge_run(run).out, folder)
    helped = tunedeck(home, "serve", "--help")
    flat = " ".join(helped.stdout.split())
    assert "serve this model folder" in flat and "chat with this model folder" not in flat, flat
    for extra in ([run.id, "--model-dir", str(folder)], []):  # both, or neither: say to give one
        proc = tunedeck(home, "serve", *extra)
        assert proc.returncode == 2 and "one of the two" in proc.stderr, (extra, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = tunedeck(home, "serve", "--model-dir", str(folder), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        assert state["run_id"] == "my-model" and state["model_dir"] == str(folder) and state["healthy"] is True
        status, models = _request(state["url"] + "/models")
        assert status == 200 and [m["id"] for m in models["data"]] == ["my-model"]
        recorded = json.loads((home / "serve" / "my-model" / "state.json").read_text())
        assert recorded["model_dir"] == str(folder) and "run" not in recorded
        assert server_state(run.id) is None and not (home / "serve" / run.id).exists()  # not the run's
        for ref in (["my-model"], ["--model-dir", str(folder)]):
            status = tunedeck(home, "serve", "--status", "--json", *ref)
            assert status.returncode == 0, (ref, status.stderr)
            assert json.loads(status.stdout)["pid"] == state["pid"], status.stdout
        again = tunedeck(home, "serve", "--model-dir", str(folder))
        assert again.returncode == 1 and "already running" in again.stderr
        assert "tunedeck serve --stop my-model" in again.stderr
        assert tunedeck(home, "serve", run.id, "--status").returncode == 1  # the run has no server
        # another folder of the same name is not taken for this one ("already running", --stop stopping
        # the wrong model): refused, naming the folder that holds the name
        (tmp_path / "other").mkdir()
        namesake = shutil.copytree(folder, tmp_path / "other" / "my-model")
        proc = tunedeck(home, "serve", "--model-dir", str(namesake))
        assert proc.returncode == 1 and f"the name my-model is already served, from {folder}" in proc.stderr, \
            proc.stderr
        assert tunedeck(home, "serve", "--status", "--json", "my-model").returncode == 0  # untouched
    finally:
        stopped = tunedeck(home, "serve", "--stop", "--model-dir", str(folder))
    assert stopped.returncode == 0 and "server of my-model stopped" in stopped.stderr, stopped.stderr
    again = tunedeck(home, "serve", "--stop", "my-model")  # nothing left to stop: said, not an error
    assert again.returncode == 0 and "no server is running for my-model" in again.stderr, again.stderr


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_serve_on_an_address_that_is_not_this_machines_says_to_choose_another_host(host):
    """`serve --host` with an address of no interface here (TEST-NET-1, never assigned) or a name that does
    not resolve said "cannot listen on HOST port 0 ...; choose another --port" (exit 1): the port was not
    the problem, and "port 0" is none the user gave. It names the host and --host, exit 2 (the request)."""
    from core.lifecycle.serve import check_listen_address
    from core.lifecycle.source import LifecycleError

    with pytest.raises(LifecycleError) as caught:
        check_listen_address(host, 0)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and f"cannot listen on {host} (" in message, message
    assert "choose another --host" in message and "--port" not in message and "port 0" not in message, message


def test_a_public_host_that_is_refused_is_said_alone_without_the_public_host_warning(lora_run):
    """`serve --host 192.0.2.1` (an address of no interface here, TEST-NET-1) printed the warning that other
    machines can reach the server, then refused the host: a warning about a server that never started. The
    refusals come first now; the warning only for a start that goes ahead. CPU only, nothing started."""
    from core.lifecycle.serve import serve_dir

    home, run = lora_run
    for extra in (["--host", "192.0.2.1"], ["--host", "0.0.0.0", "--checkpoint", "999"]):
        proc = tunedeck(home, "serve", run.id, *extra)
        assert proc.returncode in (1, 2), (extra, proc.stderr)
        assert "other machines can reach" not in proc.stderr, (extra, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, (extra, proc.stderr)
    assert not (serve_dir(run.id) / "state.json").exists()  # nothing was started


def test_the_apps_test_request_to_a_server_that_is_gone_says_so_in_the_interfaces_language():
    """The serve panel's t with nothing listening at the URL (the server stopped): "URL: <urlopen error
    [Errno 111] Connection refused>", urllib's English, under zh too. Now a line of the interface's language
    that points at the panel's own rows. A port this test bound and let go; no server."""
    import socket

    from core.i18n import current_language, set_language
    from core.lifecycle.serve import probe_request
    from core.lifecycle.source import LifecycleError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    before = current_language()
    try:
        for language, said in (("en", f"{url} did not answer (Connection refused): the server may have stopped"),
                               ("zh", f"{url} 没有应答（Connection refused）：服务器可能已停止")):
            set_language(language)
            with pytest.raises(LifecycleError) as info:
                probe_request(url, "m", timeout=30)
            assert str(info.value).startswith(said), str(info.value)
            assert "urlopen" not in str(info.value) and "Errno" not in str(info.value)
    finally:
        set_language(before)
