"""A server stopped (``serve --stop``, the app's k: SIGTERM) while it answers: the request under way is
told the server is shutting down, in OpenAI's error shape, and the process ends cleanly. One real server
(our transformers backend) on the real finished tiny LoRA run, CPU only, no GPU assumed; the stop lands
while a stream is known to be under way (its chunks read), never by timing."""

from __future__ import annotations

import http.client
import json
import urllib.parse


def _special_ids() -> list[int]:
    """The tiny model's special tokens (its end tokens among them)."""
    from transformers import AutoTokenizer

    from tests.fixtures.lifecycle.finished_run import TINY

    return AutoTokenizer.from_pretrained(TINY).all_special_ids


def test_a_stream_cut_by_the_servers_stop_ends_with_an_error_event_not_a_silent_cut(lora_run):
    """The stream just stopped mid-reply (no finish_reason, no [DONE]): a client took the half reply for the
    whole one, and the process died in the interpreter's exit with generation threads running ("terminate
    called without an active exception" in its log). Now the generation is stopped at its next token, the
    stream ends with OpenAI's error event (server_error) and [DONE], and the log holds no abort."""
    from core.lifecycle import serve

    _home, run = lora_run
    state = serve.start_server(run, backend="transformers", timeout=300)
    log_path = serve.server_log_path(run.id)
    try:
        url = urllib.parse.urlsplit(state.url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        # the base model babbles on, its end tokens barred: 1900 tokens is far more than the stop lets it write
        body = {"model": run.id + "-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1900,
                "stream": True, "logit_bias": {str(i): -100 for i in _special_ids()}}
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        events = []
        while len(events) < 4:  # the role chunk, then pieces of the reply: the generation is under way
            line = response.readline()
            assert line, events
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
        assert serve.stop_server(run.id)
        events += [line[6:].strip() for line in response.read().splitlines() if line.startswith(b"data: ")]
        connection.close()
    finally:
        serve.stop_server(run.id)
    assert events[-1] == b"[DONE]", events[-3:]
    last = json.loads(events[-2])
    assert last["error"]["type"] == "server_error" and "shutting down" in last["error"]["message"], last
    chunks = [json.loads(event) for event in events[:-2]]
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks), chunks[-1]  # not "finished"
    assert sum(len(chunk["choices"][0]["delta"].get("content") or "") for chunk in chunks) > 0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    assert "terminate called" not in text and "Traceback" not in text, text[-2000:]
    assert "ended by the server's shutdown" in text


def test_a_request_still_being_read_when_the_stop_comes_is_answered_503_before_the_server_ends(tmp_path):
    """A request was counted (waited for by the stop) only once its body was read and its prompt templated:
    one whose body was still coming in when SIGTERM came was not waited for, and the process ended under it
    (the client got a reset, not the 503 the other requests get). Now it is counted from its first byte
    read: the stop waits, and it is answered OpenAI's shutting-down error. The real server (``ChatServer``
    with the real handler) over loopback in this process, the bundled tiny model; the request held half sent
    (a state, not a time). CPU only, no GPU assumed."""
    import socket
    import threading
    import time

    from transformers import AutoTokenizer

    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir
    from tests.core.test_lifecycle_serve_template import tiny_model_with_template
    from tests.fixtures.lifecycle.finished_run import TINY

    folder = tiny_model_with_template(tmp_path / "model", AutoTokenizer.from_pretrained(TINY).chat_template)
    backend = ChatBackend(load_model_dir(folder, "cpu"), "tiny")
    server = ChatServer("127.0.0.1", 0, make_handler(backend))
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    serving.start()
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    client = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=120)
    try:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        deadline = time.monotonic() + 120  # a generous bound for the handler to take the request, not a speed
        while backend.wait_idle(0):
            assert time.monotonic() < deadline, "the request being read was never counted as under way"
            time.sleep(0.02)
        backend.close()  # what SIGTERM does (main's shut_down), then the wait main does before it exits
        server.shutdown()
        assert not backend.wait_idle(0)  # the stop waits for it
        client.sendall(body[10:])
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
        head, _sep, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503") or head.startswith(b"HTTP/1.1 503"), answer
        error = json.loads(payload)["error"]
        assert error["type"] == "server_error" and "shutting down" in error["message"], error
        assert "generation" not in error["message"], error  # it never reached the model: nothing was stopped
        assert backend.wait_idle(60)
    finally:
        client.close()
        server.shutdown()
        server.server_close()
