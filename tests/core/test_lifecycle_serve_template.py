"""A chat template that refuses a role (Gemma's raise on a ``system`` message, through jinja's
``raise_exception``) is the client's request the model cannot take: the server answers OpenAI's 400 naming
``messages`` and the role, not a 500 "generation failed". The real server (``ChatServer`` with the real
handler) over loopback, in this process, on a whole tiny model (random weights, the bundled tokenizer with a
Gemma-style template); CPU only."""

from __future__ import annotations

import shutil
import threading

import pytest

from tests.fixtures.lifecycle.finished_run import TINY

# Gemma's chat template, as its tokenizer_config.json ships it (the turn markers are plain text here).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")


def tiny_model_with_template(folder, template: str):
    """A whole tiny model folder (random weights, the bundled tokenizer) whose chat template is ``template``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(TINY, folder)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(folder)
    return folder


def _served(folder, model_id: str):
    """A server on ``folder`` in this process, yielding its base URL (…/v1); shut down after."""
    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir

    server = ChatServer("127.0.0.1", 0, make_handler(ChatBackend(load_model_dir(folder, "cpu"), model_id)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def gemma_style(tmp_path_factory):
    """The base URL (…/v1) of a server on a tiny model whose chat template raises on a system message."""
    yield from _served(tiny_model_with_template(tmp_path_factory.mktemp("gemma-style") / "model", GEMMA_TEMPLATE),
                       "gemma-style")


def test_a_role_the_chat_template_refuses_is_a_400_naming_it(gemma_style):
    """A system message was answered 500 "generation failed: System role not supported" (server_error: the
    client retries, or blames the server). Now 400 invalid_request_error, param messages, saying the
    template refuses the system role and what to do; the same conversation without it is answered."""
    import openai

    client = openai.OpenAI(base_url=gemma_style, api_key="unused", timeout=120, max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="gemma-style", max_tokens=3, stream=stream, messages=[
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        error = refused.value.body
        assert refused.value.status_code == 400, error
        assert error["type"] == "invalid_request_error" and error["param"] == "messages", error
        assert "refuses the system role" in error["message"] and "System role not supported" in error["message"]
        assert "first user message" in error["message"], error  # what to do
    # a template's refusal of the turns themselves (two user messages in a row) is a 400 too, in its words
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gemma-style", max_tokens=3, messages=[
            {"role": "user", "content": "Hi"}, {"role": "user", "content": "again"}])
    assert refused.value.body["param"] == "messages" and "must alternate" in refused.value.body["message"]
    reply = client.chat.completions.create(model="gemma-style", max_tokens=3, temperature=0,
                                           messages=[{"role": "user", "content": "Hi"}])
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.prompt_tokens > 3


# Fails in Python (a TypeError: `+ 1` on a string), not through jinja's raise_exception.
FAILING_TEMPLATE = "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}"


@pytest.fixture(scope="module")
def failing_template(tmp_path_factory):
    """The base URL of a server on a tiny model whose chat template fails in Python (a TypeError: `+ 1` on
    the content), not through raise_exception."""
    yield from _served(tiny_model_with_template(tmp_path_factory.mktemp("failing-template") / "model",
                                                FAILING_TEMPLATE), "failing")


def test_a_template_failing_in_python_is_the_servers_500_and_a_bad_content_shape_the_clients_400(failing_template):
    """A template's TypeError was answered 400 with Python's bare words ("can only concatenate str (not
    "int") to str"), blaming the client. The messages reach the template as strings (an array of text
    parts joined), so that failure is the template's: a 500 server_error that names the chat template. A
    content of a shape the API refuses (an image part, null) is the client's 400, said before the template
    runs."""
    import openai

    client = openai.OpenAI(base_url=failing_template, api_key="unused", timeout=120, max_retries=0)
    for content in ("Hi", [{"type": "text", "text": "Hi"}]):  # the parts are joined: the template sees a string
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model="failing", max_tokens=3,
                                           messages=[{"role": "user", "content": content}])
        error = failed.value.body
        assert failed.value.status_code == 500 and error["type"] == "server_error", error
        assert "chat template failed" in error["message"] and "TypeError: can only concatenate" in error["message"]
        assert "not of the request" in error["message"], error
    for content in ([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}], None):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="failing", max_tokens=3,
                                           messages=[{"role": "user", "content": content}])
        assert refused.value.body["param"] == "messages[0].content", refused.value.body
