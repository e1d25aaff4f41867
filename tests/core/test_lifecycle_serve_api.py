"""The chat completions API checks a request as OpenAI's (and vLLM's) does: stop strings, the model asked
for, the ranges of max_tokens / temperature / top_p / n, and the model's context. One real server (our
transformers backend) on a real finished tiny LoRA run, asked over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.fixtures.lifecycle.finished_run import finished_run, tunedeck


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(run id, base URL …/v1) of one server for the whole module, stopped at its end."""
    home, run_id = finished_run(tmp_path_factory.mktemp("lifecycle-serve-api"))
    proc = tunedeck(home, "serve", run_id, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        yield run_id, state["url"]
    finally:
        stopped = tunedeck(home, "serve", run_id, "--stop")
        assert stopped.returncode == 0, stopped.stderr


def api_call(url: str, path: str, body: dict) -> tuple[int, dict]:
    """POST ``body`` to the server's ``path`` (under /v1): the status and the JSON answer, an error's too."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, **body) -> tuple[int, dict]:
    return api_call(url, "/chat/completions", body)


def _ask(prompt: str = "Hi") -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def test_a_stop_string_ends_the_reply_before_it_streaming_and_not(served):
    """`stop` was ignored: the reply ran on past it. Now generation ends on the token that completes the
    first stop string; the text ends before it; finish_reason is "stop" (not "length")."""
    from openai import OpenAI

    run_id, url = served
    client = OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)
    # The tuned answer to this ends "… = 2.": stopped at its last three characters, a reply cut in the
    # middle; the random base babbles to max_tokens ("length"), stopped three characters in it is "stop".
    for model, prompt in ((run_id, "What is 1 + 1?"), (run_id + "-base", "Name a colour.")):
        code, full = _post(url, model=model, messages=_ask(prompt), temperature=0, max_tokens=30)
        assert code == 200, full
        text = full["choices"][0]["message"]["content"]
        stop = text.rstrip()[-3:] if model == run_id else text[3:6]
        expected = text[:text.find(stop)]
        assert expected.strip() and len(text) >= len(expected) + len(stop), (text, stop)
        for stops in (stop, [stop], ["never-in-this-reply", stop]):
            code, reply = _post(url, model=model, messages=_ask(prompt), temperature=0, max_tokens=30, stop=stops)
            assert code == 200, reply
            assert reply["choices"][0]["message"]["content"] == expected, (stops, text, reply)
            assert reply["choices"][0]["finish_reason"] == "stop"
            assert reply["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]  # generation ended
            chunks = list(client.chat.completions.create(model=model, messages=_ask(prompt), temperature=0,
                                                         max_tokens=30, stop=stops, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
            assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
        if model != run_id:
            assert full["choices"][0]["finish_reason"] == "length"  # without the stop string
    for bad in (["a", "b", "c", "d", "e"], 7, [1], {"x": "y"}):
        code, reply = _post(url, messages=_ask(), max_tokens=5, stop=bad)
        assert code == 400 and reply["error"]["param"] == "stop", (bad, reply)
        assert reply["error"]["type"] == "invalid_request_error"


def test_an_unknown_model_is_404_and_the_listed_ids_are_served(served):
    """`"model": "nope"` was answered by the fine-tuned model under the run's id. Now it is OpenAI's 404
    model_not_found; the ids /v1/models lists answer, and a request without a model gets the tuned one."""
    run_id, url = served
    with urllib.request.urlopen(url + "/models", timeout=30) as response:
        listed = [m["id"] for m in json.loads(response.read())["data"]]
    assert listed == [run_id, run_id + "-base"]
    for model in ("nope", run_id + "-other", run_id.upper(), 5):
        code, reply = _post(url, model=model, messages=_ask(), max_tokens=3)
        assert code == 404, (model, reply)
        error = reply["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "model", error
        assert error["code"] == "model_not_found" and f"`{model}` does not exist" in error["message"], error
        assert run_id in error["message"]  # says what is served
    for model in listed:
        code, reply = _post(url, model=model, messages=_ask(), max_tokens=3, temperature=0)
        assert code == 200 and reply["model"] == model, reply
    code, reply = _post(url, messages=_ask("Name a colour."), max_tokens=12, temperature=0)
    assert code == 200 and reply["model"] == run_id and reply["choices"][0]["message"]["content"].strip() == "Blue."


@pytest.mark.parametrize(("field", "value"), [
    ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 2.5), ("max_tokens", "10"), ("max_tokens", True),
    ("max_completion_tokens", 0), ("temperature", -0.1), ("temperature", 2.5), ("temperature", "hot"),
    ("top_p", 0), ("top_p", 1.5), ("top_p", -1), ("n", 2), ("n", 0), ("seed", "x"), ("stream", "yes"),
    ("seed", 1 << 63), ("seed", -(1 << 63) - 1),
])
def test_a_value_out_of_range_is_refused_naming_the_param(served, field, value):
    """max_tokens 0 gave 256 tokens (the default, through `or`), -5 gave 200, top_p 0 became 1.0, n 2 was
    ignored, a seed past 64 bits was a 500 "generation failed: Overflow when unpacking long long": each is now
    a 400 invalid_request_error naming the parameter."""
    _run_id, url = served
    code, reply = _post(url, messages=_ask(), **{"max_tokens": 4, field: value})
    assert code == 400, (field, value, reply)
    error = reply["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field, error
    assert field in error["message"] and json.dumps(value) in error["message"], error
    if field == "n":
        assert "must be 1" in error["message"]


def test_values_given_are_used_as_given(served):
    """Given values are not replaced by defaults: max_tokens 1 is one token, max_completion_tokens (OpenAI's
    newer name) counts as max_tokens, n 1 and edge values of the ranges are accepted."""
    run_id, url = served
    base = run_id + "-base"  # babbles to the limit
    for body, tokens in (({"max_tokens": 1}, 1), ({"max_completion_tokens": 3}, 3),
                         ({"max_completion_tokens": 2, "max_tokens": 9}, 2)):
        code, reply = _post(url, model=base, messages=_ask(), temperature=0, **body)
        assert code == 200, (body, reply)
        assert reply["usage"]["completion_tokens"] == tokens and reply["choices"][0]["finish_reason"] == "length"
    for body in ({"n": 1}, {"temperature": 2, "top_p": 1, "seed": 3}, {"temperature": 0.5, "top_p": 0.01},
                 {"seed": (1 << 63) - 1}, {"seed": -(1 << 63)},
                 {"stop": None, "n": None, "top_p": None, "temperature": None}):
        code, reply = _post(url, model=base, messages=_ask(), max_tokens=2, **body)
        assert code == 200 and len(reply["choices"]) == 1, (body, reply)


def test_the_prompt_and_max_tokens_must_fit_the_models_context(served):
    """A 24,009-token prompt against max_position_embeddings 2048 got 200. Now, as vLLM: a prompt with no
    room left is refused; a max_tokens given that goes past the context is refused and says the counts; with
    max_tokens left out, the default is cut to the room the context has."""
    from tests.fixtures.lifecycle.finished_run import TINY

    limit = json.loads((TINY / "config.json").read_text())["max_position_embeddings"]
    assert limit == 2048
    run_id, url = served
    base = run_id + "-base"
    code, reply = _post(url, model=base, messages=_ask("word " * (limit + 200)), max_tokens=5)
    assert code == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    assert reply["error"]["param"] == "messages" and reply["error"]["type"] == "invalid_request_error"
    assert f"maximum context length is {limit} tokens" in reply["error"]["message"], reply
    # A prompt that leaves about 40 tokens, as the server counts it (its usage; one token asked for).
    def prompt_tokens(words: int) -> int:
        code, reply = _post(url, model=base, messages=_ask("word " * words), max_tokens=1)
        assert code == 200, reply
        return reply["usage"]["prompt_tokens"]

    fixed, per_100 = prompt_tokens(0), prompt_tokens(100) - prompt_tokens(0)
    words = (limit - 40 - fixed) * 100 // per_100
    messages, prompt = _ask("word " * words), prompt_tokens(words)
    assert limit - 60 <= prompt <= limit - 30, prompt
    room = limit - prompt
    code, reply = _post(url, model=base, messages=messages, max_tokens=room + 60, temperature=0)
    assert code == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    assert (f"maximum context length is {limit} tokens. However, you requested {prompt + room + 60} tokens "
            f"({prompt} in the messages, {room + 60} in the completion)") in reply["error"]["message"], reply
    code, reply = _post(url, model=base, messages=messages, max_tokens=room, temperature=0)
    assert code == 200 and reply["usage"]["prompt_tokens"] == prompt, reply
    code, reply = _post(url, model=base, messages=messages, temperature=0)  # default 256, cut to the room
    assert code == 200, reply
    usage, finish = reply["usage"], reply["choices"][0]["finish_reason"]
    assert usage["prompt_tokens"] == prompt and 1 <= usage["completion_tokens"] <= room, reply
    assert finish == "stop" or usage["completion_tokens"] == room, reply  # cut at the room, not at 256


def _client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=url, api_key="unused", timeout=120, max_retries=0)


def test_error_objects_carry_openais_string_code_or_null_not_the_http_status(served):
    """`error.code` held the HTTP status (400, 404); OpenAI's API puts a string code or null there, with
    `type`, `message` and `param`. The real openai client reads them so: `.code` is None or a string, the
    status stays on the response."""
    import openai

    run_id, url = served
    client = _client(url)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=run_id, messages=_ask(), max_tokens=3, temperature=5)
    assert caught.value.status_code == 400
    assert caught.value.code is None and caught.value.param == "temperature", caught.value.body
    assert caught.value.type == "invalid_request_error" and "temperature" in caught.value.message
    with pytest.raises(openai.NotFoundError) as caught:  # a route the server has not
        client.get("/no-such-route", cast_to=object)
    assert caught.value.status_code == 404 and caught.value.code is None, caught.value.body
    assert caught.value.type == "invalid_request_error" and "/v1/no-such-route" in caught.value.message
    with pytest.raises(openai.NotFoundError) as caught:  # a model not served keeps its named code
        client.chat.completions.create(model="nope", messages=_ask(), max_tokens=3)
    assert caught.value.code == "model_not_found" and caught.value.param == "model"
    request = urllib.request.Request(url + "/chat/completions", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=60)
    assert raw.value.code == 400
    error = json.loads(raw.value.read())["error"]
    assert error["code"] is None and error["type"] == "invalid_request_error" and error["message"], error


@pytest.mark.parametrize(("body", "said"), [
    (b"{not json", "is not valid JSON (Expecting property name"), (b"\xff\xfe{", "is not valid JSON"),
    (b'[{"role": "user"}]', 'must be one JSON object (e.g. {"model": ..., "messages": [...]}), not [{"role"'),
    (b'"hi"', 'must be one JSON object'),
])
def test_a_body_that_is_no_json_object_is_said_so_with_what_to_send(served, body, said):
    """A body that was not JSON got the bare parser's words ("Expecting property name enclosed in double
    quotes: line 1 column 2 (char 1)"), not saying it was the body's JSON, and one that was not an object an
    English literal under any locale. Now both say what is wrong with the body and what to send, from the
    catalogue."""
    _run_id, url = served
    for path in ("/chat/completions", "/completions"):
        request = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as raw:
            urllib.request.urlopen(request, timeout=60)
        assert raw.value.code == 400
        error = json.loads(raw.value.read())["error"]
        assert error["type"] == "invalid_request_error" and error["param"] is None, error
        assert error["message"].startswith("The request body ") and said in error["message"], error


def test_models_retrieve_answers_each_served_id_and_404s_any_other(served):
    """GET /v1/models/{id} answered 404 "no route", so `client.models.retrieve(id)` failed for the very ids
    /v1/models lists. Now it gives their model object; another id is OpenAI's 404 model_not_found."""
    import openai

    run_id, url = served
    client = _client(url)
    listed = [m.id for m in client.models.list()]
    assert listed == [run_id, run_id + "-base"]
    for model_id in listed:
        model = client.models.retrieve(model_id)
        assert (model.id, model.object, model.owned_by) == (model_id, "model", "tunedeck")
    for other in ("nope", run_id + "-other", "org/name"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve(other)
        assert caught.value.code == "model_not_found" and caught.value.type == "invalid_request_error"
        assert f"`{other}` does not exist" in caught.value.message and run_id in caught.value.message


def test_messages_are_checked_roles_and_content_as_openai_takes_them(served):
    """A role "robot" was accepted and a dict content stringified into the prompt. Now the roles are
    system, user, assistant (developer taken as system), content a string or text parts (joined); anything
    else is a 400 naming the message and field. Asked through the real openai client."""
    import openai

    run_id, url = served
    client = _client(url)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say yes."},
               {"role": "assistant", "content": "Yes."}]
    bad = [
        (2, {"role": "robot", "content": "Hi"}, "messages[2].role"),
        (3, {"role": "user", "content": {"text": "Hi"}}, "messages[3].content"),
        (3, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]},
         "messages[3].content"),
        (3, {"role": "user", "content": []}, "messages[3].content"),
        (3, {"role": "user"}, "messages[3].content"),
        (3, {"role": "tool", "content": "42", "tool_call_id": "call_1"}, "messages[3].role"),
        (0, {"content": "Hi"}, "messages[0].role"),
    ]
    for index, message, param in bad:
        messages = [*history[:index], message]
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=run_id, messages=messages, max_tokens=3)
        assert caught.value.param == param and param in caught.value.message, (message, caught.value.body)
        assert caught.value.type == "invalid_request_error" and caught.value.code is None
    as_text = client.chat.completions.create(model=run_id, messages=_ask("Name a colour."), max_tokens=12,
                                             temperature=0)
    assert as_text.choices[0].message.content.strip() == "Blue."
    parts = [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]
    as_parts = client.chat.completions.create(model=run_id, messages=[{"role": "user", "content": parts}],
                                              max_tokens=12, temperature=0)
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens  # the same prompt, parts joined
    for role in ("system", "developer"):  # developer is OpenAI's newer name for system
        reply = client.chat.completions.create(
            model=run_id, messages=[{"role": role, "content": "Be brief."}, *history[1:], *_ask("A pet?")],
            max_tokens=12, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length")
        if role == "system":
            system_usage, system_text = reply.usage.prompt_tokens, reply.choices[0].message.content
    assert (reply.usage.prompt_tokens, reply.choices[0].message.content) == (system_usage, system_text)


def test_the_legacy_completions_endpoint_answers_the_openai_client(served):
    """/v1/completions (lm-eval's local-completions, older SDKs) was a 404. Now a prompt string, or a list
    of them (a choice each), is continued as it is (no chat template: the tuned model's own chat-templated
    text gets its learned answer), streamed or not, with stop strings, the checks of the chat endpoint
    (n, max_tokens, the context) and OpenAI's text_completion shape and usage."""
    import openai
    from transformers import AutoTokenizer

    from tests.fixtures.lifecycle.finished_run import TINY

    run_id, url = served
    client = _client(url)
    templated = AutoTokenizer.from_pretrained(TINY).apply_chat_template(
        _ask("Name a colour."), tokenize=False, add_generation_prompt=True)
    reply = client.completions.create(model=run_id, prompt=templated, max_tokens=12, temperature=0)
    assert reply.object == "text_completion" and reply.model == run_id and reply.id.startswith("cmpl-")
    [choice] = reply.choices
    assert choice.text.strip() == "Blue." and choice.finish_reason == "stop" and choice.index == 0, reply
    assert reply.usage.prompt_tokens == 14 and reply.usage.completion_tokens > 0  # the prompt as it was sent
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # the random base babbles: a list of two prompts is two choices, usage summed; stop ends one early
    both = client.completions.create(model=run_id + "-base", prompt=["Once upon", templated], max_tokens=6,
                                     temperature=0)
    assert [c.index for c in both.choices] == [0, 1] and all(c.finish_reason == "length" for c in both.choices)
    assert both.usage.completion_tokens == 12, both.usage
    text = both.choices[0].text
    stopped = client.completions.create(model=run_id + "-base", prompt="Once upon", max_tokens=6, temperature=0,
                                        stop=[text[2:4]])
    assert stopped.choices[0].text == text[:2] and stopped.choices[0].finish_reason == "stop", (text, stopped)
    chunks = list(client.completions.create(model=run_id + "-base", prompt=["Once upon", templated],
                                            max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    for index, choice in enumerate(both.choices):
        pieces = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(p.text for p in pieces) == choice.text and len(pieces) > 2, pieces
        assert [p.finish_reason for p in pieces if p.finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    for bad, param in (({"prompt": 5}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [1, 2.5]}, "prompt"),
                       ({"prompt": ""}, "prompt"), ({"prompt": "Hi", "n": 2}, "n"),
                       ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"), ({"prompt": "Hi", "suffix": "!"}, "suffix"),
                       ({"prompt": "Hi", "logprobs": 99}, "logprobs"),
                       ({"prompt": "word " * 2100, "max_tokens": 5}, "prompt"),
                       ({"prompt": "word " * 400, "max_tokens": 2000}, "prompt")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=run_id, **{"max_tokens": 3, **bad})
        assert refused.value.param == param and refused.value.type == "invalid_request_error", (bad, refused.value)
    assert "in your prompt; 2000 for the completion" in refused.value.message, refused.value.message
    assert refused.value.code == "context_length_exceeded"


def test_echoed_logprobs_score_with_the_adapter_for_the_run_and_without_it_for_base(served):
    """lm-eval's loglikelihood request (echo, logprobs, max_tokens 0) on the learned answer: the run's model
    (adapter on) finds it far likelier than the base (adapter switched off for the `-base` id)."""
    from transformers import AutoTokenizer

    from tests.fixtures.lifecycle.finished_run import TINY

    run_id, url = served
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    context = tokenizer.apply_chat_template(_ask("Name a colour."), tokenize=False, add_generation_prompt=True)
    ctxlen = len(tokenizer(context)["input_ids"])
    totals = {}
    for model in (run_id, run_id + "-base"):
        request = urllib.request.Request(url + "/completions", data=json.dumps(
            {"model": model, "prompt": context + "Blue.", "max_tokens": 0, "echo": True, "logprobs": 1,
             "temperature": 0}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            [choice] = json.loads(response.read())["choices"]
        assert choice["text"] == context + "Blue."
        totals[model] = sum(choice["logprobs"]["token_logprobs"][ctxlen:])  # the answer's tokens
    assert totals[run_id] > totals[run_id + "-base"] + 5, totals


def test_a_method_no_route_takes_is_openais_404_json_not_an_html_page(served):
    """DELETE, PUT, PATCH and OPTIONS got http.server's HTML "501 Unsupported method" page, which an API client
    cannot read as an error. Now each is answered in OpenAI's error JSON, a body sent with it read first (no
    reset): a 404 "Invalid URL (METHOD path)" on a path the server has not, a 405 naming what it takes on one
    it has (the openai client's models.delete included)."""
    import http.client
    import urllib.parse

    import openai

    run_id, url = served
    with pytest.raises(openai.APIStatusError) as caught:
        _client(url).models.delete(run_id)
    assert caught.value.status_code == 405 and caught.value.response.headers["allow"] == "GET, HEAD"
    assert caught.value.type == "invalid_request_error" and f"DELETE /v1/models/{run_id}" in caught.value.message
    where = urllib.parse.urlsplit(url)
    for method in ("PUT", "PATCH", "OPTIONS", "DELETE"):
        for path, status in (("/v1/chat/completions", 405), ("/v1/nothing", 404)):
            connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
            connection.request(method, path, body=json.dumps({"messages": _ask()}),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == status and response.getheader("Content-Type") == "application/json", method
            assert response.getheader("Allow") == ("POST" if status == 405 else None), (method, path)
            error = json.loads(response.read())["error"]
            assert error["type"] == "invalid_request_error" and f"({method} {path})" in error["message"]
            connection.close()


def test_a_route_asked_with_a_method_it_does_not_take_is_405_with_allow(served):
    """GET /v1/chat/completions (a browser, ``curl URL`` without ``-d``) and HEAD on it were a 404 "Invalid URL",
    which sent a user looking for a typo in a URL that is right, and POST /v1/models the same. Now each is a
    405 Method Not Allowed with ``Allow`` naming the methods the route takes, in OpenAI's error JSON (HEAD: its
    headers, no body), a body sent with the POST read first (no reset)."""
    import http.client
    import urllib.parse

    run_id, url = served
    where = urllib.parse.urlsplit(url)
    cases = [("GET", "/v1/chat/completions", "POST"), ("GET", "/v1/completions/", "POST"),
             ("HEAD", "/v1/completions", "POST"), ("POST", "/v1/models", "GET, HEAD"),
             ("POST", "/health", "GET, HEAD"), ("POST", f"/v1/models/{run_id}", "GET, HEAD")]
    for method, path, allowed in cases:
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
        body = json.dumps({"messages": _ask(), "padding": "x" * (1 << 17)}) if method == "POST" else None
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        assert response.status == 405, (method, path, data)
        assert response.getheader("Allow") == allowed and response.getheader("Content-Type") == "application/json"
        if method == "HEAD":
            assert data == b"" and int(response.getheader("Content-Length")) > 0
        else:
            error = json.loads(data)["error"]
            assert error["type"] == "invalid_request_error" and error["code"] is None, error
            assert f"({method} {path.rstrip('/')})" in error["message"] and allowed in error["message"], error
        connection.close()
    code, reply = _post(url, messages=_ask(), max_tokens=2)  # the route itself still answers its method
    assert code == 200, reply
    status, _headers, _body = _raw(url, "POST", "/v1/nothing")
    assert status == 404


def test_streamed_chat_logprobs_are_the_adapters_for_the_run_and_the_bases_for_base(served):
    """Streamed chat logprobs come from each generation step of the model asked for: the run's (adapter on)
    and the base (adapter off for the `-base` id), each the same as its answer not streamed; the learned
    reply's end token (no text) is not among them."""
    run_id, url = served
    client = _client(url)
    for model in (run_id, run_id + "-base"):
        body = {"model": model, "messages": _ask("Name a colour."), "max_tokens": 12, "temperature": 0,
                "logprobs": True, "top_logprobs": 2}
        [whole] = client.chat.completions.create(**body).choices
        text, streamed = "", []
        for chunk in client.chat.completions.create(**body, stream=True):
            if chunk.choices and chunk.choices[0].logprobs is not None:
                text += chunk.choices[0].delta.content
                streamed += chunk.choices[0].logprobs.content
        assert text == whole.message.content
        assert [entry.token for entry in streamed] == [entry.token for entry in whole.logprobs.content]
        assert [entry.logprob for entry in streamed] == pytest.approx(
            [entry.logprob for entry in whole.logprobs.content], abs=1e-4)
        assert [[top.token for top in entry.top_logprobs] for entry in streamed] == [
            [top.token for top in entry.top_logprobs] for entry in whole.logprobs.content]
        if model == run_id:
            assert text.strip() == "Blue." == "".join(entry.token for entry in streamed).strip(), text
            assert whole.finish_reason == "stop"


def _raw(url: str, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """``method path`` sent over a bare socket, read to the end: (status, headers, body as it came)."""
    import socket
    import urllib.parse

    where = urllib.parse.urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=60) as connection:
        connection.sendall(f"{method} {path} HTTP/1.0\r\nHost: {where.netloc}\r\n\r\n".encode())
        data = b""
        while chunk := connection.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status.split()[1]), {name.lower(): value for name, value in headers.items()}, body


def test_head_is_answered_as_get_is_headers_only(served):
    """HEAD (``curl -I``, an uptime monitor's or a proxy's probe) got http.server's HTML "501 Unsupported
    method" page. Now it is answered as GET is there, its status and headers without the body: 200 for the
    health, models and a model served, OpenAI's 404 JSON headers for a path or model the server has not."""
    run_id, url = served
    for path, status in (("/health", 200), ("/v1/models", 200), (f"/v1/models/{run_id}", 200),
                         ("/v1/models/not-served", 404), ("/v1/nothing", 404), ("/v1/chat/completions", 405)):
        code, headers, body = _raw(url, "HEAD", path)
        get_code, get_headers, get_body = _raw(url, "GET", path)
        assert code == get_code == status and body == b"", (path, code, body)
        assert headers["content-type"] == get_headers["content-type"] == "application/json", path
        # the length of the body GET gets, a refusal's naming the method asked with
        assert int(headers["content-length"]) == len(get_body.replace(b"(GET ", b"(HEAD ")), path
