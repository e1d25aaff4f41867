"""Chat (CLI and streaming) and the detached OpenAI-compatible server, with a real tiny LoRA run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.fixtures.lifecycle.finished_run import ROOT, finished_run, tunedeck


def test_stream_chat_yields_pieces_as_they_are_generated(lora_run):
    from core.lifecycle.chat import GenerationSettings, build_messages, stream_chat
    from core.lifecycle.source import load_finetuned, resolve_model_source

    _home, run = lora_run
    loaded = load_finetuned(resolve_model_source(run), "cpu")
    messages = build_messages([{"role": "user", "content": "Name a colour."}], "Be brief.")
    assert messages[0] == {"role": "system", "content": "Be brief."}
    greedy = GenerationSettings(temperature=0.0, max_tokens=12)
    assert "".join(stream_chat(loaded, messages, greedy)).strip() == "Blue."  # learned answer
    # The random base babbles word after word: the first word must reach us while tokens are still being
    # generated. The model's 8th forward pass waits until a piece has arrived (a state, not a speed): a
    # stream that only gives its pieces at the end would keep it waiting until the ceiling.
    import threading

    first_piece, waited = threading.Event(), []
    forwards = []

    def hold(_module, _args, _output):
        forwards.append(len(forwards))
        if len(forwards) == 8:
            waited.append(first_piece.wait(timeout=120))

    handle = loaded.model.get_input_embeddings().register_forward_hook(hold)  # once per forward pass
    try:
        arrivals = []
        for piece in stream_chat(loaded, messages, GenerationSettings(temperature=0.0, max_tokens=60), "base"):
            arrivals.append((len(forwards), piece))
            first_piece.set()
    finally:
        handle.remove()
    assert len(arrivals) >= 5, arrivals
    assert waited == [True]  # the 8th forward pass saw a piece already delivered
    assert arrivals[0][0] <= 8 < len(forwards), (arrivals[0][0], len(forwards))
    assert "".join(p for _n, p in arrivals) != "Blue."


def test_a_stop_string_deep_in_a_long_reply_ends_generation_on_its_token(lora_run):
    """The stop check decodes the reply's last tokens only (the whole reply each token was quadratic): a stop
    string that comes 40 tokens in still ends generation on the token that completes it."""
    from core.lifecycle.chat import GenerationOutcome, GenerationSettings, build_messages, stream_chat
    from core.lifecycle.source import load_finetuned, resolve_model_source

    _home, run = lora_run
    loaded = load_finetuned(resolve_model_source(run), "cpu")
    messages = build_messages([{"role": "user", "content": "Name a colour."}], "")
    sampled = GenerationSettings(temperature=1.0, max_tokens=60, seed=0)  # the random base, sampled: varied
    full = GenerationOutcome()
    text = "".join(stream_chat(loaded, messages, sampled, "base", outcome=full))
    assert len(full.ids) == 60
    # the stop: five characters from token k >= 40 on, found first there (the window holds 4 x 5 + 8 tokens)
    for k in range(40, 56):
        head = loaded.tokenizer.decode(full.ids[:k], skip_special_tokens=True)
        stop = text[len(head):len(head) + 5]
        if text.startswith(head) and len(stop) == 5 and text.find(stop) == len(head):
            break
    else:
        raise AssertionError(f"no stop string to take from {text!r}")
    cut = GenerationOutcome()
    settings = GenerationSettings(temperature=1.0, max_tokens=60, seed=0, stop=(stop,))
    reply = "".join(stream_chat(loaded, messages, settings, "base", outcome=cut))
    assert reply == head and cut.hit_stop
    assert k < len(cut.ids) <= k + 5 < 60, (k, len(cut.ids))  # ended on the token completing the stop


def test_a_stream_closed_early_has_ended_its_generation_and_given_the_adapter_back(lora_run):
    """A client that left mid-stream let the server go on to the next request while the abandoned
    generation ran on in its thread, on the same model: two generations at once, and a base reply's
    switched-off adapter switched back on (or left off) under the next one. Closing the stream now ends
    the generation before it returns. The generation is held at its 3rd forward pass until the close is
    asked for, with the model's end token taken away, so without the fix it still has ~2000 tokens to go."""
    import threading

    from core.lifecycle.chat import GenerationSettings, build_messages, stream_chat
    from core.lifecycle.source import load_finetuned, resolve_model_source

    _home, run = lora_run
    loaded = load_finetuned(resolve_model_source(run), "cpu")
    loaded.model.generation_config.eos_token_id = None  # nothing ends it but max_tokens or the close
    reached, closing = threading.Event(), threading.Event()
    forwards = []

    def hold(_module, _args, _output):
        forwards.append(1)
        if len(forwards) == 3:
            reached.set()
            closing.wait(timeout=120)

    def adapter_off() -> bool:
        return any(getattr(m, "disable_adapters", False) for m in loaded.model.modules() if hasattr(m, "lora_A"))

    handle = loaded.model.get_input_embeddings().register_forward_hook(hold)
    try:
        messages = build_messages([{"role": "user", "content": "Name a colour."}], "")
        pieces = stream_chat(loaded, messages, GenerationSettings(temperature=1.0, max_tokens=2000, seed=0), "base")
        next(pieces)
        assert reached.wait(timeout=120)
        assert adapter_off()  # the base answers: its adapter is switched off while it generates
        closing.set()
        pieces.close()
        assert not [th for th in threading.enumerate() if th.name == "tunedeck-generate"], len(forwards)
        assert not adapter_off()
        assert len(forwards) < 2000
    finally:
        closing.set()
        handle.remove()


def test_a_client_gone_before_its_non_streamed_reply_ends_the_generation(lora_run, monkeypatch):
    """A non-streamed request whose client went away (its timeout, Ctrl+C) was generated to its end, up to
    max_tokens, holding the server's one-model lock while every other request waited. The server now looks
    for the client while it generates and stops for nobody. Our server in this process on the tiny LoRA run,
    the base with its end token taken away; the generation is held at its 5th forward pass until the client
    has closed its socket and the server has seen it, so without the look it would go on to 2000 tokens."""
    import socket
    import threading

    import core.lifecycle.server as server
    from core.lifecycle.source import load_finetuned, resolve_model_source

    _home, run = lora_run
    loaded = load_finetuned(resolve_model_source(run), "cpu")
    loaded.model.generation_config.eos_token_id = None
    started, closed, seen_gone = threading.Event(), threading.Event(), threading.Event()
    forwards = []

    def hold(_module, _args, _output):
        forwards.append(1)
        if len(forwards) == 5:
            started.set()
            closed.wait(timeout=120)
            seen_gone.wait(timeout=60)  # a ceiling: without the look nothing ever sees the client gone

    real_client_gone = getattr(server, "client_gone", None)

    def looked(connection):
        gone = real_client_gone(connection)
        if gone:
            seen_gone.set()
        return gone

    monkeypatch.setattr(server, "client_gone", looked, raising=False)
    backend = server.ChatBackend(loaded, run.id)
    httpd = server.ChatServer("127.0.0.1", 0, server.make_handler(backend))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    handle = loaded.model.get_input_embeddings().register_forward_hook(hold)
    try:
        body = json.dumps({"model": run.id + "-base", "messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 2000, "temperature": 1.0, "seed": 0}).encode()
        client = socket.create_connection(("127.0.0.1", httpd.server_address[1]))
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert started.wait(timeout=120)  # the generation has begun: the client gives up
        client.close()
        closed.set()
        assert backend.lock.acquire(timeout=120)  # the generation ended and let the model go
        backend.lock.release()
        assert seen_gone.is_set() and len(forwards) < 1000, len(forwards)
    finally:
        closed.set()
        seen_gone.set()
        handle.remove()
        httpd.shutdown()
        httpd.server_close()


def test_chat_cli_reads_stdin_lines_and_streams_replies(lora_run):
    home, run = lora_run
    proc = subprocess.Popen([sys.executable, "-m", "core", "chat", run.id, "--temperature", "0", "--max-tokens",
                             "12", "--system", ""], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    out, err = proc.communicate("Name a colour.\n\n", timeout=180)
    assert proc.returncode == 0, err[-2000:]
    assert out.strip() == "Blue.", (out, err[-1000:])  # stdout holds replies only
    assert "ready" in err


def test_chat_refuses_a_model_dir_that_is_no_model_in_one_line(tmp_path):
    """`chat --model-dir DIR` (and the chat screen's worker) loaded DIR unchecked: a bare config.json or a
    folder that is no model ended in transformers' own error, or a traceback. Now the folder check of
    `serve --model-dir` refuses it first, naming the folder and what to do."""
    import shutil

    from tests.fixtures.lifecycle.finished_run import TINY

    bare, notes = tmp_path / "bare", tmp_path / "notes"
    shutil.copytree(TINY, bare)  # config.json and tokenizer, no weights
    notes.mkdir()
    cases = [(bare, "has a config.json but no weights (*.safetensors, *.bin), so there is nothing to load"),
             (notes, "has no config.json, so it is not a model folder")]
    for folder, says in cases:
        proc = subprocess.run([sys.executable, "-m", "core", "chat", "--model-dir", str(folder)], cwd=ROOT,
                              input="Hi\n\n", capture_output=True, text=True, timeout=180,
                              env={**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 2, (folder, proc.returncode, proc.stderr[-2000:])
        assert proc.stderr.startswith(f"tunedeck: --model-dir {folder} {says}"), proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1 and "tunedeck merge RUN" in proc.stderr
        assert "Traceback" not in proc.stderr and "loading" not in proc.stderr and proc.stdout == ""
        worker = subprocess.run([sys.executable, "-m", "core.lifecycle.chat_worker", "--model-dir", str(folder)],
                                cwd=ROOT, input="", capture_output=True, text=True, timeout=180,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        [event] = [json.loads(line) for line in worker.stdout.splitlines()]
        assert worker.returncode == 1 and event["event"] == "error" and event["id"] is None
        assert f"--model-dir {folder} {says}" in event["message"], event


def test_chat_checks_a_model_dir_once(tmp_path, monkeypatch, capsys):
    """`chat --model-dir DIR` looked at DIR twice: its own check before "loading …", then load_model_dir's
    again. Once now, and the folder is still loaded and chatted with (a whole tiny model, random weights)."""
    import io
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    import core.config.model_checks as model_checks
    from core.cli import dispatch
    from tests.fixtures.lifecycle.finished_run import TINY

    folder = tmp_path / "whole"
    shutil.copytree(TINY, folder)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(folder)
    looks = []
    real = model_checks.folder_problem

    def counted(*args, **kwargs):
        looks.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(model_checks, "folder_problem", counted)
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))  # no question: load, say ready, end
    assert dispatch(["chat", "--model-dir", str(folder)]) == 0
    err = capsys.readouterr().err
    assert f"loading {folder}" in err.lower() and "ready" in err, err
    assert looks == [folder]


def test_serve_answers_openai_client_streaming_and_not_then_stops(lora_run):
    from openai import OpenAI

    from core.lifecycle.serve import server_state

    home, run = lora_run
    proc = tunedeck(home, "serve", run.id, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        assert state["host"] == "127.0.0.1" and state["url"] == f"http://127.0.0.1:{state['port']}/v1"
        assert state["backend"] == "transformers" and state["healthy"] is True
        assert (home / "serve" / run.id / "state.json").is_file()
        client = OpenAI(base_url=state["url"], api_key="unused", timeout=60)
        assert [m.id for m in client.models.list()] == [run.id, run.id + "-base"]
        reply = client.chat.completions.create(model=run.id, temperature=0, max_tokens=12,
                                               messages=[{"role": "user", "content": "Name a colour."}])
        assert reply.choices[0].message.content.strip() == "Blue."
        assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 5
        stream = client.chat.completions.create(model=run.id + "-base", temperature=0, max_tokens=40,
                                                stream=True, messages=[{"role": "user", "content": "Hi"}])
        chunks = [c.choices[0].delta.content for c in stream]
        texts = [c for c in chunks if c]
        assert len(texts) >= 3 and chunks[-1] is None  # several pieces, then the finish chunk
        from core.lifecycle.serve import probe_request  # the app's test request

        probe_reply, seconds = probe_request(state["url"], run.id, prompt="Say yes.")
        assert probe_reply.strip() == "Yes." and seconds > 0
        again = tunedeck(home, "serve", run.id)
        assert again.returncode == 1 and "already running" in again.stderr
        status = tunedeck(home, "serve", run.id, "--status", "--json")
        assert json.loads(status.stdout)["healthy"] is True
    finally:
        stopped = tunedeck(home, "serve", run.id, "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert server_state(run.id) is None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(state["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("server process still alive after --stop")
    assert tunedeck(home, "serve", run.id, "--stop").returncode == 0  # none left to stop: no failure


def _chat(home, *args: str) -> subprocess.CompletedProcess:
    """`tunedeck chat ARGS` asked one question on stdin."""
    return subprocess.run([sys.executable, "-m", "core", "chat", *args], cwd=ROOT, input="Say yes.\n\n",
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})


def test_a_server_of_an_older_checkpoint_says_which_it_serves(lora_run):
    """A server started while the run trained (or with --checkpoint) goes on serving that checkpoint; `serve RUN`
    after the run finished only said "already running", and neither `--status` nor the app said which
    checkpoint answered. The state records the step; a second `serve` asking for another checkpoint (the
    newest, by default) says which one runs and how to get the one asked for."""
    home, run = lora_run
    proc = tunedeck(home, "serve", run.id, "--checkpoint", "15", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    try:
        assert json.loads(proc.stdout)["step"] == 15
        again = tunedeck(home, "serve", run.id)
        assert again.returncode == 1
        assert "serving checkpoint 15, not 30" in again.stderr and f"tunedeck serve --stop {run.id}" in again.stderr
        same = tunedeck(home, "serve", run.id, "--checkpoint", "15")
        assert same.returncode == 1 and "already running" in same.stderr and "not 30" not in same.stderr
        status = tunedeck(home, "serve", run.id, "--status")
        assert status.returncode == 0 and f"{run.id} checkpoint 15: http://127.0.0.1:" in status.stderr
        assert json.loads(tunedeck(home, "serve", run.id, "--status", "--json").stdout)["step"] == 15
    finally:
        tunedeck(home, "serve", "--stop", run.id)


def test_chat_base_on_a_full_fine_tune_is_refused_saying_what_to_chat_with(shared, tmp_path):
    """`chat RUN --base` on a full fine-tune answered with the fine-tuned model, saying nothing: there is no
    adapter to switch off. Refused now before anything loads (exit 2), naming what to chat with instead:
    the base's own folder where it is on this box, else why there is no base to chat with. A model folder
    has no adapter either: `--model-dir DIR --base` is refused too."""
    import shutil

    import yaml
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.fixtures.lifecycle.finished_run import TINY

    home, run_id = finished_run(shared, method="full")
    proc = _chat(home, run_id, "--base", "--temperature", "0", "--max-tokens", "5")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == "" and "loading" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"tunedeck: run {run_id} is a full fine-tune: it has no adapter to switch off"), \
        proc.stderr
    assert "no weights (the run started from random weights)" in proc.stderr  # the tiny base: none to load

    whole = tmp_path / "whole"  # the same run, trained from a whole local model: that folder is the base
    shutil.copytree(TINY, whole)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(whole)
    config_path = home / "runs" / run_id / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config_path.write_text(yaml.safe_dump({**config, "model": str(whole)}))
    proc = _chat(home, run_id, "--base")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert proc.stderr.rstrip().endswith(f"chat with the base itself: tunedeck chat --model-dir {whole}"), proc.stderr

    proc = _chat(home, "--model-dir", str(whole), "--base")
    assert proc.returncode == 2 and proc.stdout == "" and "loading" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"tunedeck: --base switches a run's adapter off, and the model in {whole}"), \
        proc.stderr
    proc = _chat(home, run_id, "--temperature", "0", "--max-tokens", "5")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]  # without --base: the tuned model


def test_chat_refuses_a_max_tokens_below_one_and_a_negative_temperature_as_argparse_does(tmp_path):
    """`chat --max-tokens 0` (or -4) and `--temperature -1` were taken, and the reply was a lone "�" (one
    token made anyway). argparse refuses them now, naming the option and its bound, before anything loads."""
    cases = [(["--max-tokens", "0"], "argument --max-tokens: got 0; must be at least 1"),
             (["--max-tokens", "-4"], "argument --max-tokens: got -4; must be at least 1"),
             (["--temperature", "-1"], "argument --temperature: got -1.0; must be at least 0")]
    for extra, says in cases:
        proc = _chat(tmp_path / "home", "--model-dir", str(tmp_path / "nothing-here"), *extra)
        assert proc.returncode == 2 and proc.stdout == "", (extra, proc.stderr)
        assert proc.stderr.splitlines()[-1] == f"tunedeck chat: error: {says}", (extra, proc.stderr)
        assert "usage: tunedeck chat" in proc.stderr and "loading" not in proc.stderr
