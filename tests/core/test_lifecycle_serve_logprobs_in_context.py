"""Logprobs' token texts were each token decoded alone: with a SentencePiece tokenizer (Llama 2, Mistral,
Gemma: a Metaspace decoder that drops a text's leading space) "Hello world" came as the tokens "Hello" and
"world", so the tokens did not join into the reply, their ``bytes`` lacked the space and the legacy
``text_offset``s drifted off the text. Now each token's text is read in its place (the decode of it and the
few tokens before it, less theirs), streamed (across chunks) or not, chat and completions alike.

The real server (``ChatServer``, the real handler) over loopback in this process, asked through the real openai
client, on a whole tiny Llama (one layer, its output head zeroed so ``logit_bias`` alone picks each token)
with a word tokenizer built here, Llama 2's pre-tokenizer and decoder (byte fallback, one leading space
stripped); CPU only."""

from __future__ import annotations

import threading

import pytest

WORDS = ["<unk>", "<s>", "</s>", "▁Hello", "▁world", ",", "▁again", "▁Say", "▁something", "▁Once", "▁upon",
         "▁a", "▁time", "<0xC3>", "<0xA9>"]  # "é" as its bytes, as Llama 2's byte fallback gives it
REPLY = ["▁Hello", "▁world", ",", "▁again"]  # "Hello world, again"
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(an openai client of the server, the logit_bias that makes every reply REPLY)."""
    import torch
    from openai import OpenAI
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir

    folder = tmp_path_factory.mktemp("metaspace") / "model"
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])  # Llama 2's
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", chat_template=TEMPLATE)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                         tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.zero_()  # every logit 0: the bias alone picks
    model.save_pretrained(folder)
    loaded = load_model_dir(folder, "cpu")
    assert [loaded.tokenizer.decode([WORDS.index(w)]) for w in REPLY] == ["Hello", "world", ",", "again"]
    bias = _bias(REPLY)
    server = ChatServer("127.0.0.1", 0, make_handler(ChatBackend(loaded, "metaspace")))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="none",
                     max_retries=0, timeout=120), bias
    finally:
        server.shutdown()
        server.server_close()


def _bias(words: list[str]) -> dict[str, int]:
    """The logit_bias that makes a reply ``words`` in order: greedy, each token 4 down once picked (the
    penalties), every logit else 0."""
    return {str(WORDS.index(word)): 100 - place for place, word in enumerate(words)}


def _body(bias) -> dict:
    return {"model": "metaspace", "max_tokens": len(REPLY), "temperature": 0, "logit_bias": bias,
            "presence_penalty": 2, "frequency_penalty": 2}


def _chat(client, request: dict, stream: bool):
    """A chat answer's (text, logprobs.content), its chunks' put together when streamed."""
    if not stream:
        [choice] = client.chat.completions.create(**request).choices
        return choice.message.content, choice.logprobs.content
    text, content = "", []
    for chunk in client.chat.completions.create(**request, stream=True):
        [choice] = chunk.choices
        text += choice.delta.content or ""
        content += choice.logprobs.content if choice.logprobs else []
    return text, content


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_tokens_keep_their_spaces_and_join_into_the_reply(served, stream):
    client, bias = served
    request = {**_body(bias), "messages": [{"role": "user", "content": "Say something"}], "logprobs": True,
               "top_logprobs": 2}
    text, content = _chat(client, request, stream)
    assert text == "Hello world, again"
    assert [entry.token for entry in content] == ["Hello", " world", ",", " again"]
    assert bytes(b for entry in content for b in entry.bytes).decode("utf-8") == text
    # an alternative reads in the same place (the model's distribution is even: any words, each with its space)
    after_a_word = {word.replace("▁", " ") for word in WORDS}
    assert all(top.token in after_a_word for entry in content[1:] for top in entry.top_logprobs), content


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_tokens_join_into_the_text_and_their_offsets_index_it(served, stream):
    client, bias = served
    prompt = "Once upon a time"
    request = {**_body(bias), "prompt": prompt, "logprobs": 2}
    if stream:
        text, tokens, offsets, tops = "", [], [], []
        for chunk in client.completions.create(**request, stream=True):
            [choice] = chunk.choices
            text += choice.text
            if choice.logprobs:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
                tops += choice.logprobs.top_logprobs
    else:
        [choice] = client.completions.create(**request).choices
        text, tokens = choice.text, choice.logprobs.tokens
        offsets, tops = choice.logprobs.text_offset, choice.logprobs.top_logprobs
    assert text == "Hello world, again" and "".join(tokens) == text
    whole = prompt + text
    assert [whole[at:at + len(token)] for at, token in zip(offsets, tokens, strict=True)] == tokens
    assert offsets[0] == len(prompt)
    assert all(token in top for token, top in zip(tokens, tops, strict=True))  # the token itself, as it reads


@pytest.mark.parametrize("stream", [False, True])
def test_a_character_as_byte_tokens_keeps_each_tokens_own_byte_after_a_word(served, stream):
    """"Hello" then "é" as its two byte tokens: each byte token's text is U+FFFD (part of a character) and its
    ``bytes`` its own byte, so the tokens' bytes join into the reply."""
    client, _ = served
    reply = ["▁Hello", "<0xC3>", "<0xA9>"]
    request = {**_body(_bias(reply)), "max_tokens": len(reply),
               "messages": [{"role": "user", "content": "Say something"}], "logprobs": True}
    text, content = _chat(client, request, stream)
    assert text == "Helloé"
    assert [(entry.token, entry.bytes) for entry in content] == [("Hello", list(b"Hello")), ("\ufffd", [0xC3]),
                                                                  ("\ufffd", [0xA9])]
