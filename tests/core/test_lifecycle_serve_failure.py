"""A generation that fails part way (CUDA out of memory on a long reply, the likeliest) while its reply is
streamed: the client is told, in OpenAI's error event, never left with a reply that just stops. The real
server (``ChatServer`` with the real handler) over loopback, in this process, on a whole tiny model (random
weights, the bundled tokenizer); the model's forward pass (torch's, not ours) made to fail from its fourth
call on, as an out-of-memory does. CPU only, no GPU assumed."""

from __future__ import annotations

import json
import threading
import urllib.request

import torch

from tests.core.test_lifecycle_serve_template import tiny_model_with_template
from tests.fixtures.lifecycle.finished_run import TINY


def test_a_stream_whose_generation_fails_ends_with_an_error_event_then_done(tmp_path):
    """The stream stopped mid-reply with no finish_reason, no error and no [DONE] (the failure only in the
    server's log): clients took the cut reply for a whole one. Now it ends with OpenAI's error event
    (server_error, the failure's words: the openai client raises it) and [DONE]; the server goes on serving."""
    from transformers import AutoTokenizer

    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir

    folder = tiny_model_with_template(tmp_path / "model", AutoTokenizer.from_pretrained(TINY).chat_template)
    loaded = load_model_dir(folder, "cpu")
    real_forward, calls = loaded.model.forward, []

    def forward(*args, **kwargs):
        calls.append(1)
        if failing.is_set() and len(calls) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(*args, **kwargs)

    failing = threading.Event()
    loaded.model.forward = forward
    server = ChatServer("127.0.0.1", 0, make_handler(ChatBackend(loaded, "tiny")))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    barred = {str(i): -100 for i in loaded.tokenizer.all_special_ids}

    def ask(stream: bool) -> tuple[int, bytes]:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": stream,
                "temperature": 0, "logit_bias": barred}  # no end token: the reply outlives the failing call
        request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    try:
        failing.set()
        code, raw = ask(stream=True)
        assert code == 200
        events = [line[6:] for line in raw.splitlines() if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and "CUDA out of memory" in error["message"], error
        assert "generation failed" in error["message"]
        chunks = [json.loads(event) for event in events[:-2]]
        assert chunks and all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks), chunks
        calls.clear()
        code, raw = ask(stream=False)  # the same failure unstreamed: a 500 saying it, from the catalogue
        assert code == 500, raw
        assert json.loads(raw)["error"]["message"].startswith("generation failed: CUDA out of memory"), raw
        failing.clear()
        code, raw = ask(stream=True)  # and the server goes on: the next stream ends as a finished reply does
        events = [line[6:] for line in raw.splitlines() if line.startswith(b"data: ")]
        assert code == 200 and events[-1] == b"[DONE]" and b'"error"' not in raw, raw[-300:]
        assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        server.shutdown()
        server.server_close()
