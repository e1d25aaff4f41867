"""/v1/completions refused ``echo`` and ``logprobs`` (400), so lm-evaluation-harness's loglikelihood tasks
(its ``local-completions`` model: ``echo: true``, ``logprobs: 1``, ``max_tokens`` 0 or 1, prompts as strings
or token-id lists) could not run against ``tunedeck serve``. Now each token of the echoed prompt and of the
completion comes with its log-probability, its likeliest alternatives and its text offset, as OpenAI's legacy
completions API gives them. The real server (``ChatServer``, the real handler) over loopback, in this process,
on a whole tiny model (random weights, the bundled tokenizer); CPU only. The expected numbers are the
model's own logits, computed here."""

from __future__ import annotations

import math
import threading

import pytest

from tests.core.test_lifecycle_serve_api import api_call
from tests.core.test_lifecycle_serve_template import tiny_model_with_template


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL …/v1, the loaded model the server answers with)."""
    from transformers import AutoTokenizer

    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir
    from tests.fixtures.lifecycle.finished_run import TINY

    template = AutoTokenizer.from_pretrained(TINY).chat_template
    folder = tiny_model_with_template(tmp_path_factory.mktemp("scored") / "model", template)
    loaded = load_model_dir(folder, "cpu")
    server = ChatServer("127.0.0.1", 0, make_handler(ChatBackend(loaded, "scored")))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", loaded
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, **body) -> tuple[int, dict]:
    return api_call(url, "/completions", body)


def _expected(loaded, ids: list[int]):
    """log_softmax of the model's logits over ``ids``: row i is the distribution of token i + 1."""
    import torch

    with torch.no_grad():
        logits = loaded.model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def _check_scores(loaded, ids: list[int], logprobs: dict, first: int, k: int) -> None:
    """The choice's logprobs for ``ids[first:]`` are the model's own, with its argmax among the top ones."""
    expected = _expected(loaded, ids)
    tokenizer = loaded.tokenizer
    assert len(logprobs["token_logprobs"]) == len(ids) - first == len(logprobs["top_logprobs"])
    assert logprobs["tokens"] == [tokenizer.decode([i]) for i in ids[first:]]
    for place, (got, top) in enumerate(zip(logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True)):
        position = first + place
        if position == 0:
            assert got is None and top is None  # nothing before the first token predicts it
            continue
        row = expected[position - 1]
        assert got == pytest.approx(float(row[ids[position]]), abs=1e-4), position
        best = int(row.argmax())
        assert top[tokenizer.decode([best])] == pytest.approx(float(row[best]), abs=1e-4)
        assert max(top.values()) == pytest.approx(float(row.max()), abs=1e-4)
        assert tokenizer.decode([ids[position]]) in top  # the token itself, always (OpenAI: up to k + 1)
        assert len(top) <= k + 1


def test_echo_with_max_tokens_0_scores_each_prompt_token_as_the_model_does(served):
    """lm-eval's loglikelihood request: two prompts, max_tokens 0, echo, logprobs 2. Each choice is its
    prompt given back, every token scored (the first null), offsets into the prompt."""
    url, loaded = served
    prompts = ["The capital of France is Paris", "One, two, three, four"]
    code, reply = _post(url, prompt=prompts, max_tokens=0, echo=True, logprobs=2, temperature=0)
    assert code == 200, reply
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for prompt, choice in zip(prompts, reply["choices"], strict=True):
        assert choice["text"] == prompt and choice["finish_reason"] == "length"
        ids = loaded.tokenizer(prompt)["input_ids"]
        _check_scores(loaded, ids, choice["logprobs"], 0, 2)
        offsets = choice["logprobs"]["text_offset"]
        assert [prompt[start:start + len(token)] for start, token in
                zip(offsets, choice["logprobs"]["tokens"], strict=True)] == choice["logprobs"]["tokens"]
    assert reply["usage"]["completion_tokens"] == 0
    assert reply["usage"]["prompt_tokens"] == sum(len(loaded.tokenizer(p)["input_ids"]) for p in prompts)


def test_token_id_prompts_with_one_greedy_token_are_scored_through_it(served):
    """lm-eval sends token ids (its tokenized requests) and max_tokens 1: the echoed prompt and the one
    generated token are scored; greedy, that token is the argmax the top alternatives lead with."""
    url, loaded = served
    ids = loaded.tokenizer("Once upon a time")["input_ids"]
    code, reply = _post(url, prompt=[ids], max_tokens=1, echo=True, logprobs=1, temperature=0)
    assert code == 200, reply
    [choice] = reply["choices"]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) + 1
    generated = int(_expected(loaded, ids)[-1].argmax())
    _check_scores(loaded, [*ids, generated], logprobs, 0, 1)
    assert math.isclose(logprobs["token_logprobs"][-1], max(logprobs["top_logprobs"][-1].values()))
    assert choice["text"] == loaded.tokenizer.decode(ids) + loaded.tokenizer.decode([generated],
                                                                                       skip_special_tokens=True)


def test_logprobs_without_echo_score_the_completion_only_offsets_counted_from_the_prompt(served):
    """Without echo only the generated tokens are scored; their offsets count from the prompt's start, as
    OpenAI's do."""
    url, loaded = served
    prompt = "Hello there"
    code, reply = _post(url, prompt=prompt, max_tokens=3, logprobs=0, temperature=0)
    assert code == 200, reply
    [choice] = reply["choices"]
    ids = loaded.tokenizer(prompt)["input_ids"]
    generated: list[int] = []
    for _ in range(3):  # greedy, as temperature 0 generates
        generated.append(int(_expected(loaded, ids + generated)[-1].argmax()))
    assert choice["text"] == loaded.tokenizer.decode(generated, skip_special_tokens=True)
    logprobs = choice["logprobs"]
    _check_scores(loaded, ids + generated, logprobs, len(ids), 0)
    assert logprobs["text_offset"][0] == len(prompt)
    assert logprobs["text_offset"][1:] == [len(prompt) + len("".join(logprobs["tokens"][:i])) for i in (1, 2)]
    assert all(len(top) == 1 for top in logprobs["top_logprobs"])  # logprobs 0: the token itself


@pytest.mark.parametrize(("body", "param"), [
    ({"max_tokens": 0}, "max_tokens"),  # 0 generates nothing: only an echoed prompt is scored alone
    ({"max_tokens": -1, "echo": True}, "max_tokens"),
    ({"logprobs": 21}, "logprobs"), ({"logprobs": "1"}, "logprobs"), ({"logprobs": True}, "logprobs"),
    ({"echo": "yes"}, "echo"), ({"echo": True, "stream": True}, "echo"),
    ({"prompt": [[1, 10**9]]}, "prompt"), ({"prompt": [[]]}, "prompt"), ({"prompt": [1, 2.5]}, "prompt"),
    ({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix"),
])
def test_a_scoring_request_it_cannot_answer_is_a_400_naming_the_param(served, body, param):
    url, _loaded = served
    code, reply = _post(url, **{"prompt": "Hi", "max_tokens": 2, **body})
    assert code == 400 and reply["error"]["param"] == param, (body, reply)


def _with_bos(folder):
    """The model folder's tokenizer made to put its BOS (``<|endoftext|>``) before every text it encodes, as
    Llama's, Mistral's and Gemma's do."""
    import json

    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    bos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
    path.write_text(json.dumps(tokenizer), encoding="utf-8")
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": "<|endoftext|>"}),
                                                  encoding="utf-8")
    return folder


def test_an_echoed_text_prompts_logprobs_leave_out_the_bos_the_tokenizer_added(tmp_path):
    """With a tokenizer that adds a BOS (Llama's, Mistral's, Gemma's), an echoed text prompt's logprobs began
    with the BOS token ("<|endoftext|>", "<s>"), which is no part of the echoed text: the tokens did not join
    into the text, and every text_offset was shifted by the BOS's length, so a client cutting the text at the
    offsets (lm-eval, a highlighter) cut in the wrong places. Now the tokens are the text's own, each offset
    where its token is in the text, the first scored given the BOS (the model's own log-probability)."""
    from transformers import AutoTokenizer

    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir
    from tests.fixtures.lifecycle.finished_run import TINY

    folder = _with_bos(tiny_model_with_template(tmp_path / "model", AutoTokenizer.from_pretrained(TINY).chat_template))
    loaded = load_model_dir(folder, "cpu")
    prompt = "Name a colour."
    ids = loaded.tokenizer(prompt)["input_ids"]
    assert ids[0] == 0 and ids[1:] == loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]  # a BOS added
    server = ChatServer("127.0.0.1", 0, make_handler(ChatBackend(loaded, "bos")))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        code, reply = _post(f"http://127.0.0.1:{server.server_address[1]}/v1", prompt=prompt, max_tokens=0,
                            echo=True, logprobs=1, temperature=0)
    finally:
        server.shutdown()
        server.server_close()
    assert code == 200, reply
    [choice] = reply["choices"]
    logprobs = choice["logprobs"]
    assert choice["text"] == prompt == "".join(logprobs["tokens"]), logprobs  # max_tokens 0: the prompt scored
    for token, offset in zip(logprobs["tokens"], logprobs["text_offset"], strict=True):
        assert choice["text"][offset:offset + len(token)] == token, (token, offset, logprobs)
    expected = _expected(loaded, ids)
    assert logprobs["token_logprobs"][0] == pytest.approx(float(expected[0, ids[1]]), abs=1e-4)
    assert len(logprobs["tokens"]) == len(ids) - 1 == len(logprobs["text_offset"])
