"""/v1/chat/completions took ``logprobs: true`` and ``top_logprobs`` and answered without them (``choices[i]``
had no ``logprobs``), so a client reading the chat API's token log-probabilities got nothing and no error.
Now each generated token comes as OpenAI's chat API gives it (``choices[i].logprobs.content[]``: ``token``,
``logprob``, ``bytes``, ``top_logprobs``), scored by the model's own distribution (streamed: its own test file,
test_lifecycle_serve_stream_logprobs.py). The real server over loopback in this process, on a whole tiny model
(random weights); CPU only. The expected numbers are log_softmax of the model's logits, computed here."""

from __future__ import annotations

import pytest

from tests.core.test_lifecycle_serve_api import api_call
from tests.core.test_lifecycle_serve_logprobs import _expected, served  # noqa: F401 - the module's server


def _chat(url: str, **body) -> tuple[int, dict]:
    return api_call(url, "/chat/completions", body)


MESSAGES = [{"role": "user", "content": "Say something"}]


def test_chat_logprobs_are_each_generated_tokens_own_with_its_top_alternatives(served):  # noqa: F811
    url, loaded = served
    code, reply = _chat(url, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    assert code == 200, reply
    [choice] = reply["choices"]
    from core.lifecycle.chat import prompt_ids

    tokenizer = loaded.tokenizer
    prompt = prompt_ids(loaded, MESSAGES)[0].tolist()
    generated: list[int] = []
    for _ in range(4):  # greedy, as temperature 0 generates
        generated.append(int(_expected(loaded, prompt + generated)[-1].argmax()))
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [tokenizer.decode([i]) for i in generated]
    assert "".join(entry["token"] for entry in content) == choice["message"]["content"]
    expected = _expected(loaded, prompt + generated)
    for place, (token_id, entry) in enumerate(zip(generated, content, strict=True)):
        row = expected[len(prompt) + place - 1]
        assert entry["logprob"] == pytest.approx(float(row[token_id]), abs=1e-4)
        assert entry["bytes"] == list(entry["token"].encode("utf-8")) or "\ufffd" in entry["token"]  # a byte token's: its own
        values, ids = row.topk(3)
        assert [top["token"] for top in entry["top_logprobs"]] == [tokenizer.decode([i]) for i in ids.tolist()]
        assert [top["logprob"] for top in entry["top_logprobs"]] == pytest.approx(values.tolist(), abs=1e-4)
        assert all(top["bytes"] == list(top["token"].encode("utf-8")) or "\ufffd" in top["token"]
                   for top in entry["top_logprobs"])
    assert len(content) == reply["usage"]["completion_tokens"]


def test_chat_logprobs_without_top_logprobs_list_no_alternatives_and_none_asked_is_null(served):  # noqa: F811
    url, _loaded = served
    code, reply = _chat(url, messages=MESSAGES, max_tokens=2, temperature=0, logprobs=True)
    assert code == 200, reply
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and all(entry["top_logprobs"] == [] for entry in content)
    code, reply = _chat(url, messages=MESSAGES, max_tokens=2, temperature=0, logprobs=False)
    assert code == 200 and reply["choices"][0]["logprobs"] is None, reply


@pytest.mark.parametrize(("body", "param"), [
    ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true, as OpenAI refuses it
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": True}, "top_logprobs"),
])
def test_chat_logprobs_it_cannot_answer_are_a_400_naming_the_param(served, body, param):  # noqa: F811
    url, _loaded = served
    code, reply = _chat(url, **{"messages": MESSAGES, "max_tokens": 2, **body})
    assert code == 400 and reply["error"]["param"] == param, (body, reply)
