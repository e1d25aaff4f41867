"""The server took OpenAI's ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``tools`` /
``tool_choice`` and ``response_format`` and silently left them out: a client asking for a banned token, fewer
repeats, tool calls or JSON got an ordinary reply and no word. Now the penalties and the bias change the
logits as OpenAI defines them, and what the server cannot do is a 400 naming the parameter; their neutral
values (what SDKs send by default) are still taken silently. The real server over loopback in this process,
on a whole tiny model (random weights), greedy; CPU only. The expected tokens are computed here from the
model's own logits."""

from __future__ import annotations

import pytest

from tests.core.test_lifecycle_serve_chat_logprobs import MESSAGES, _chat
from tests.core.test_lifecycle_serve_logprobs import _expected, served  # noqa: F401 - the module's server


def _greedy(loaded, prompt: list[int], steps: int, adjust) -> list[int]:
    """Greedy tokens after ``prompt``, each step's log-probabilities changed by ``adjust(row, generated)``."""
    generated: list[int] = []
    for _ in range(steps):
        row = _expected(loaded, prompt + generated)[-1].clone()
        generated.append(int(adjust(row, generated).argmax()))
    return generated


def _prompt(loaded) -> list[int]:
    from core.lifecycle.chat import prompt_ids

    return prompt_ids(loaded, MESSAGES)[0].tolist()


def _reply_ids(loaded, reply) -> list[int]:
    return loaded.tokenizer(reply["choices"][0]["message"]["content"], add_special_tokens=False)["input_ids"]


def test_frequency_and_presence_penalties_lower_the_tokens_already_generated(served):  # noqa: F811
    url, loaded = served
    steps = 8

    def penalised(row, generated):
        for token in set(generated):  # OpenAI: mu[j] - c[j] * frequency - (c[j] > 0) * presence
            row[token] -= generated.count(token) * 1.5 + 0.5
        return row

    plain = _greedy(loaded, _prompt(loaded), steps, lambda row, _generated: row)
    expected = _greedy(loaded, _prompt(loaded), steps, penalised)
    assert expected != plain  # the penalty changes this model's greedy reply: the test can tell
    code, reply = _chat(url, messages=MESSAGES, max_tokens=steps, temperature=0, frequency_penalty=1.5,
                        presence_penalty=0.5)
    assert code == 200, reply
    assert reply["choices"][0]["message"]["content"] == loaded.tokenizer.decode(expected, skip_special_tokens=True)


def test_logit_bias_forces_and_bans_tokens_on_both_endpoints(served):  # noqa: F811
    url, loaded = served
    plain = _greedy(loaded, _prompt(loaded), 1, lambda row, _generated: row)[0]
    forced = loaded.tokenizer(" hello", add_special_tokens=False)["input_ids"][0]
    assert forced != plain
    code, reply = _chat(url, messages=MESSAGES, max_tokens=3, temperature=0, logit_bias={str(forced): 100})
    assert code == 200, reply
    assert reply["choices"][0]["message"]["content"] == loaded.tokenizer.decode([forced] * 3)

    def banned(row, _generated):
        row[plain] -= 100
        return row

    expected = _greedy(loaded, _prompt(loaded), 2, banned)
    code, reply = _chat(url, messages=MESSAGES, max_tokens=2, temperature=0, logit_bias={str(plain): -100})
    assert code == 200, reply
    assert reply["choices"][0]["message"]["content"] == loaded.tokenizer.decode(expected, skip_special_tokens=True)
    from tests.core.test_lifecycle_serve_logprobs import _post

    code, reply = _post(url, prompt="Hello", max_tokens=2, temperature=0, logit_bias={str(forced): 100})
    assert code == 200 and reply["choices"][0]["text"] == loaded.tokenizer.decode([forced] * 2), reply


def test_neutral_values_clients_send_by_default_are_taken(served):  # noqa: F811
    url, _loaded = served
    code, reply = _chat(url, messages=MESSAGES, max_tokens=1, temperature=0, presence_penalty=0,
                        frequency_penalty=0.0, logit_bias={}, tools=[], tool_choice="none",
                        response_format={"type": "text"}, parallel_tool_calls=True)
    assert code == 200, reply
    code, reply = _chat(url, messages=MESSAGES, max_tokens=1, tool_choice="auto", logit_bias=None, tools=None)
    assert code == 200, reply


TOOL = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [TOOL]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "now"}}}, "tool_choice"),
    ({"functions": [TOOL["function"]]}, "functions"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": "1"}, "frequency_penalty"),
    ({"logit_bias": {"hello": 1}}, "logit_bias"), ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"), ({"logit_bias": [1]}, "logit_bias"),
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),  # a digit to str.isdigit, not to int()
])
def test_what_the_server_cannot_honour_is_a_400_naming_the_param(served, body, param):  # noqa: F811
    url, _loaded = served
    code, reply = _chat(url, **{"messages": MESSAGES, "max_tokens": 1, **body})
    assert code == 400 and reply["error"]["param"] == param, (body, reply)
    assert param in reply["error"]["message"]
