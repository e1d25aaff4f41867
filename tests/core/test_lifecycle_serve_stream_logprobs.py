"""Streaming with logprobs was refused (a 400 naming ``logprobs``): a client that streams, as Open WebUI and
most chat front ends do, could not have its tokens' log-probabilities at all. Now each streamed chunk carries
the logprobs of the tokens whose text it carries, as OpenAI's do (chat: ``choices[0].logprobs.content``;
completions: ``choices[0].logprobs`` with ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``),
the same as the answer not streamed gives: text held back while it may begin a stop string brings its tokens
when it goes, and the tokens past a stop string are left out.

The real server (``ChatServer``, the real handler) over loopback in this process, asked through the real
openai client, on a whole tiny model (random weights seeded, so each run generates the same tokens; the
bundled tokenizer); CPU only. "Sampled" requests use a seed: streamed or not, the same tokens come."""

from __future__ import annotations

import threading

import pytest

MESSAGES = [{"role": "user", "content": "Say something"}]
SAMPLED = {"temperature": 1.0, "seed": 3, "max_tokens": 12}
NEVER = "\x07"  # in no reply: a stop string ending in it is only ever held back, never met


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(an openai client of the server, the loaded model it answers with)."""
    import torch
    from openai import OpenAI
    from transformers import AutoTokenizer

    from core.lifecycle.server import ChatBackend, ChatServer, make_handler
    from core.lifecycle.source import load_model_dir
    from tests.core.test_lifecycle_serve_template import tiny_model_with_template
    from tests.fixtures.lifecycle.finished_run import TINY

    torch.manual_seed(0)  # the model's random weights: the same replies each run
    folder = tiny_model_with_template(tmp_path_factory.mktemp("streamed") / "model",
                                      AutoTokenizer.from_pretrained(TINY).chat_template)
    loaded = load_model_dir(folder, "cpu")
    server = ChatServer("127.0.0.1", 0, make_handler(ChatBackend(loaded, "streamed")))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="none",
                     max_retries=0, timeout=120), loaded
    finally:
        server.shutdown()
        server.server_close()


def _whole_chat(client, **body):
    """The chat answer not streamed: (its text, its logprobs.content)."""
    reply = client.chat.completions.create(model="streamed", messages=MESSAGES, logprobs=True, **body)
    [choice] = reply.choices
    return choice.message.content, choice.logprobs.content


def _streamed_chat(client, **body):
    """The same request streamed: ([(a chunk's text, its logprobs.content)], usage)."""
    chunks, usage = [], None
    for chunk in client.chat.completions.create(model="streamed", messages=MESSAGES, logprobs=True, stream=True,
                                                stream_options={"include_usage": True}, **body):
        if not chunk.choices:
            usage = chunk.usage
            continue
        [choice] = chunk.choices
        if choice.delta.role or choice.finish_reason:  # the first chunk (the role) and the last: no tokens
            assert choice.logprobs is None and not choice.delta.content, chunk
            continue
        chunks.append((choice.delta.content, choice.logprobs.content))
    return chunks, usage


def _same_entries(streamed, whole) -> None:
    """Streamed chat logprobs are the whole answer's: the same tokens (text and bytes) and alternatives, the
    same log-probabilities (the one from each generation step's logits, the other from one pass over the reply:
    equal but for float rounding)."""
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in whole]
    for got, want in zip(streamed, whole, strict=True):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4), got.token
        assert [(t.token, t.bytes) for t in got.top_logprobs] == [(t.token, t.bytes) for t in want.top_logprobs]
        assert [t.logprob for t in got.top_logprobs] == pytest.approx([t.logprob for t in want.top_logprobs],
                                                                      abs=1e-4)


def test_each_streamed_chunk_carries_its_tokens_logprobs_as_the_whole_answer_has_them(served):
    client, _loaded = served
    text, whole = _whole_chat(client, temperature=0, max_tokens=6, top_logprobs=3)
    chunks, usage = _streamed_chat(client, temperature=0, max_tokens=6, top_logprobs=3)
    assert "".join(piece for piece, _ in chunks) == text
    streamed = [entry for _, content in chunks for entry in content]
    _same_entries(streamed, whole)
    assert len(streamed) == 6 == usage.completion_tokens
    assert all(len(entry.top_logprobs) == 3 for entry in streamed)
    for piece, content in chunks:  # no stop string: each token's text goes in the chunk of its logprobs
        assert "".join(entry.token for entry in content) == piece


def _tokens(client, **body) -> list[str]:
    """The sampled reply's tokens (not streamed, no stop string)."""
    return [entry.token for entry in _whole_chat(client, **{**SAMPLED, **body})[1]]


def test_text_held_back_for_a_stop_string_brings_its_tokens_logprobs_when_it_goes(served):
    """A stop string that begins with the last character of a token (and never comes whole): that character
    waits until the next token shows it is no stop string, and the token waits with it, going out in the
    chunk that carries the last of its text."""
    client, _loaded = served
    tokens = _tokens(client)
    k = next(k for k in range(1, len(tokens) - 1) if len(tokens[k]) >= 2 and "\ufffd" not in tokens[k]
             and tokens[k + 1] and not tokens[k + 1].endswith(tokens[k][-1])
             and tokens[k][-1] not in "".join(tokens[:k]) + tokens[k][:-1])
    held = tokens[k][-1]
    stop = held + NEVER
    text, whole = _whole_chat(client, **SAMPLED, stop=stop, top_logprobs=2)
    chunks, _usage = _streamed_chat(client, **SAMPLED, stop=stop, top_logprobs=2)
    assert "".join(piece for piece, _ in chunks) == text == "".join(tokens)
    _same_entries([entry for _, content in chunks for entry in content], whole)
    [at] = [i for i, (_, content) in enumerate(chunks) if tokens[k] in [entry.token for entry in content]]
    piece, content = chunks[at]  # the held character with the next token's text, and both tokens
    assert piece == held + tokens[k + 1] and [entry.token for entry in content] == [tokens[k], tokens[k + 1]]
    piece, content = chunks[at - 1]  # the token's text but its last character, and not the token yet
    assert piece == tokens[k][:-1] and content == []
    sent, scored = "", ""
    for piece, content in chunks:  # a token never comes before its text
        sent += piece
        scored += "".join(entry.token for entry in content)
        assert sent.startswith(scored)


def test_tokens_past_a_stop_string_are_left_out_of_the_streamed_logprobs(served):
    """A stop string across two tokens: the reply ends before it; its logprobs are the fewest tokens whose
    text reaches that end (the one the stop string begins in kept), never the token that completed it,
    though generated (usage counts it)."""
    client, _loaded = served
    tokens = _tokens(client)
    k = next(k for k in range(1, len(tokens) - 1) if len(tokens[k]) >= 2 and tokens[k + 1]
             and "\ufffd" not in tokens[k] + tokens[k + 1]
             and tokens[k][1:] + tokens[k + 1][0] not in "".join(tokens[:k + 1]))
    stop = tokens[k][1:] + tokens[k + 1][0]
    text, whole = _whole_chat(client, **SAMPLED, stop=stop)
    chunks, usage = _streamed_chat(client, **SAMPLED, stop=stop)
    assert "".join(piece for piece, _ in chunks) == text == "".join(tokens[:k]) + tokens[k][0]
    streamed = [entry for _, content in chunks for entry in content]
    _same_entries(streamed, whole)
    assert [entry.token for entry in streamed] == tokens[:k + 1]
    assert usage.completion_tokens == k + 2  # generated through the token completing the stop string


def test_streamed_completions_logprobs_are_the_whole_answers_offsets_from_each_prompt(served):
    """/v1/completions with two prompts, logprobs 2 and a stop string: each choice's chunks, put together,
    give the tokens, log-probabilities, alternatives and text offsets (counted from the prompt's start) that
    the answer not streamed gives."""
    client, _loaded = served
    prompts = ["Once upon a time", "The capital of France is"]
    tokens = _tokens(client)
    body = {"model": "streamed", "prompt": prompts, "logprobs": 2, **SAMPLED, "stop": tokens[2][-1] + NEVER}
    whole = client.completions.create(**body)
    merged = {index: {"text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
              for index in range(len(prompts))}
    for chunk in client.completions.create(**body, stream=True):
        [choice] = chunk.choices
        if choice.finish_reason:
            assert choice.logprobs is None and choice.text == ""
            continue
        into = merged[choice.index]
        into["text"] += choice.text
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            into[name] += getattr(choice.logprobs, name)
    for index, choice in enumerate(whole.choices):
        got, want = merged[index], choice.logprobs
        assert got["text"] == choice.text
        assert got["tokens"] == want.tokens and got["text_offset"] == want.text_offset
        assert got["text_offset"][0] == len(prompts[index])
        assert got["token_logprobs"] == pytest.approx(want.token_logprobs, abs=1e-4)
        for mine, theirs in zip(got["top_logprobs"], want.top_logprobs, strict=True):
            assert mine.keys() == theirs.keys() and list(mine.values()) == pytest.approx(list(theirs.values()),
                                                                                         abs=1e-4)
        assert "".join(got["tokens"]) == choice.text


def test_a_character_across_two_tokens_comes_in_one_chunk_with_each_tokens_own_bytes(served):
    """"é" generated as its two byte tokens (logit_bias makes the model pick them, the penalties the second
    after the first): each token's text shows U+FFFD, and its ``bytes`` were those of U+FFFD, so a client could
    not join them into the character. Now each has its own byte, streamed or not, and both come with the one
    chunk that carries the character."""
    client, loaded = served
    first, second = loaded.tokenizer("é", add_special_tokens=False)["input_ids"]  # byte-level BPE: C3, A9
    body = {"temperature": 0, "max_tokens": 2, "logit_bias": {str(first): 100, str(second): 98},
            "presence_penalty": 2, "frequency_penalty": 2}
    text, whole = _whole_chat(client, **body)
    chunks, _usage = _streamed_chat(client, **body)
    assert text == "é" and [entry.bytes for entry in whole] == [[0xC3], [0xA9]]
    [(piece, content)] = chunks
    assert piece == "é" and [entry.bytes for entry in content] == [[0xC3], [0xA9]]
    assert bytes(b for entry in content for b in entry.bytes).decode("utf-8") == text
    _same_entries(content, whole)


def test_a_reply_ending_in_a_character_across_tokens_before_a_stop_string_keeps_both_its_tokens(served):
    """"é" as its two byte tokens, then "ed", with the stop string "ed": the reply is "é" and its logprobs
    the two byte tokens. The answer not streamed counted the first one's text (U+FFFD, one character) as
    reaching the reply's end and left the second out: its bytes could not be joined back into "é", and it
    differed from the same reply streamed."""
    client, loaded = served
    first, second = loaded.tokenizer("é", add_special_tokens=False)["input_ids"]
    [ed] = loaded.tokenizer("ed", add_special_tokens=False)["input_ids"]
    # greedy with the penalties (4 off a token once picked): C3, then A9, then "ed"
    body = {"temperature": 0, "max_tokens": 3, "stop": "ed", "presence_penalty": 2, "frequency_penalty": 2,
            "logit_bias": {str(first): 100, str(second): 98.6, str(ed): 97.3}}
    text, whole = _whole_chat(client, **body)
    chunks, usage = _streamed_chat(client, **body)
    assert text == "é" and usage.completion_tokens == 3  # generated through "ed"
    assert [entry.bytes for entry in whole] == [[0xC3], [0xA9]]
    assert "".join(piece for piece, _ in chunks) == text
    _same_entries([entry for _, content in chunks for entry in content], whole)


def test_a_token_a_stop_string_begins_in_is_streamed_after_a_token_with_no_text(served):
    """A token that adds no text (a special token, skipped) comes out with the next one, "ed"; the stop
    string "d" begins in "ed": the reply is "e", its logprobs both tokens. The stream took the tokens of such
    a piece one by one, the first reaching the whole piece's end, and so left "ed" out: the streamed logprobs
    did not carry the reply's text and differed from the answer not streamed."""
    from core.lifecycle.chat import eos_ids

    client, loaded = served
    special = loaded.tokenizer.convert_tokens_to_ids("<|im_start|>")
    [ed] = loaded.tokenizer("ed", add_special_tokens=False)["input_ids"]
    assert special not in eos_ids(loaded)
    body = {"temperature": 0, "max_tokens": 3, "stop": "d", "presence_penalty": 2, "frequency_penalty": 2,
            "logit_bias": {str(special): 100, str(ed): 98}}
    text, whole = _whole_chat(client, **body)
    chunks, usage = _streamed_chat(client, **body)
    assert text == "e" and usage.completion_tokens == 2
    assert [entry.token for entry in whole] == ["", "ed"]
    assert "".join(piece for piece, _ in chunks) == text
    _same_entries([entry for _, content in chunks for entry in content], whole)


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
def test_with_include_usage_every_chunk_has_usage_null_and_the_last_the_usage(served, path):
    """OpenAI: with ``stream_options.include_usage`` "all other chunks will also include a usage field, but
    with a null value". Ours had no ``usage`` key at all but in the last chunk, so a client reading the key
    (a typed client, or ``chunk["usage"]`` on the raw JSON) failed on the first chunk. Read as raw events."""
    import json
    import urllib.request

    client, _loaded = served
    chat = path.startswith("chat")
    body = {"model": "streamed", "max_tokens": 3, "temperature": 0, "stream": True, "logprobs": True if chat else 1,
            "stream_options": {"include_usage": True},
            **({"messages": MESSAGES} if chat else {"prompt": "Once upon a time"})}
    request = urllib.request.Request(f"{client.base_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        events = [line[len(b"data: "):] for line in answer.read().splitlines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert len(chunks) >= 3 and all("usage" in chunk for chunk in chunks), chunks
    assert all(chunk["usage"] is None and chunk["choices"] for chunk in chunks[:-1]), chunks
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3, chunks[-1]


def test_an_end_token_with_text_is_no_part_of_the_reply_streamed_or_not(served):
    """A generation config's end token that is a plain token (here "."; a fine-tune's added "<|end|>" not
    marked special does the same) ended the reply with its text in it ("Blue." where the model said "Blue"
    and stopped), and the logprobs disagreed: the answer not streamed left the end token out, the stream
    gave it. Now its text is left out of the reply as any end token's is, and of both logprobs alike."""
    client, loaded = served
    word, dot = (loaded.tokenizer(text, add_special_tokens=False)["input_ids"] for text in (" colour", "."))
    assert len(word) == len(dot) == 1
    config = loaded.model.generation_config
    ends = config.eos_token_id
    config.eos_token_id = [*(ends if isinstance(ends, list) else [ends]), dot[0]]
    try:  # " colour" then "." (the penalties keep " colour" from coming twice), then the end
        body = {"temperature": 0, "max_tokens": 5, "logit_bias": {str(word[0]): 100, str(dot[0]): 98},
                "presence_penalty": 2, "frequency_penalty": 2}
        text, whole = _whole_chat(client, **body)
        chunks, usage = _streamed_chat(client, **body)
        [choice] = client.chat.completions.create(model="streamed", messages=MESSAGES, **body).choices
        completion = client.completions.create(model="streamed", prompt="Say", logprobs=1, **body).choices[0]
        streamed = list(client.completions.create(model="streamed", prompt="Say", logprobs=1, stream=True, **body))
    finally:
        config.eos_token_id = ends
    assert text == " colour" == choice.message.content and choice.finish_reason == "stop"
    assert usage.completion_tokens == 2  # the end token is counted, as generated
    assert "".join(piece for piece, _ in chunks) == text
    assert [entry.token for entry in whole] == [" colour"]
    _same_entries([entry for _, content in chunks for entry in content], whole)
    assert completion.text == " colour" and completion.finish_reason == "stop"
    assert completion.logprobs.tokens == [" colour"]
    assert "".join(chunk.choices[0].text for chunk in streamed) == " colour"
    assert [token for chunk in streamed if chunk.choices[0].logprobs
            for token in chunk.choices[0].logprobs.tokens] == [" colour"]


def test_a_character_after_stray_bytes_is_not_lost_streamed_or_not(served):
    """Three stray bytes (80 81 82: no character) then "中" as its three byte tokens (E4 B8 AD). The streamer
    held the text while it ended in U+FFFD for up to three tokens, then sent it whole, the first byte of "中"
    (its U+FFFD) with the junk; once "中" was complete the text was no longer than what had been sent, and "中"
    was never sent: the reply read "����" streamed and not. Now the junk goes and the last U+FFFD waits with
    its token, so the reply is the tokens' own text, "���中", and each token comes with the chunk its text is in."""
    client, loaded = served
    from core.lifecycle.scoring import _byte_level_table

    ids = loaded.tokenizer("中", add_special_tokens=False)["input_ids"]  # byte-level BPE: E4 B8 AD

    alphabet = {byte: char for char, byte in _byte_level_table().items()}
    stray = [loaded.tokenizer.convert_tokens_to_ids(alphabet[byte]) for byte in (0x80, 0x81, 0x82)]
    order = [*stray, *ids]
    assert len(order) == 6 and loaded.tokenizer.decode(order) == "\ufffd\ufffd\ufffd中"
    # each token's bias a little below the one before; the penalties (4 once generated) put each after it
    body = {"temperature": 0, "max_tokens": 6, "presence_penalty": 2, "frequency_penalty": 2,
            "logit_bias": {str(token): 100 - 0.6 * place for place, token in enumerate(order)}}
    text, whole = _whole_chat(client, **body)
    chunks, usage = _streamed_chat(client, **body)
    assert text == "\ufffd\ufffd\ufffd中" and usage.completion_tokens == 6, (text, whole)
    assert "".join(piece for piece, _ in chunks) == text
    assert [piece for piece, _ in chunks] == ["\ufffd\ufffd\ufffd", "中"]
    assert [len(content) for _, content in chunks] == [3, 3]
    _same_entries([entry for _, content in chunks for entry in content], whole)


def test_each_byte_token_of_a_three_byte_character_has_its_own_byte(served):
    """"中" generated as its three byte tokens (E4 B8 AD): the middle one's text read in its place was "" (the
    decode after E4 is still one U+FFFD), so its ``bytes`` were [], and a client joining the tokens' bytes got
    E4 AD, no character. Now each has its own byte, streamed or not, and they join into "中"."""
    client, loaded = served
    ids = loaded.tokenizer("中", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3
    body = {"temperature": 0, "max_tokens": 3, "presence_penalty": 2, "frequency_penalty": 2,
            "logit_bias": {str(token): 100 - 0.6 * place for place, token in enumerate(ids)}}
    text, whole = _whole_chat(client, **body)
    chunks, _usage = _streamed_chat(client, **body)
    assert text == "中" and [entry.bytes for entry in whole] == [[0xE4], [0xB8], [0xAD]], whole
    [(piece, content)] = chunks
    assert piece == "中" and bytes(b for entry in content for b in entry.bytes).decode("utf-8") == text
    _same_entries(content, whole)


def test_the_bytes_of_a_character_after_stray_bytes_come_with_its_chunk(served):
    """Two stray bytes (80 81) then "中" (E4 B8 AD): at the fourth token the text ends in one U+FFFD made of two
    tokens (E4 B8). The junk went out then, but with E4, as if the last U+FFFD were one token's: the chunk "��"
    carried three tokens, and the chunk "中" only B8 AD, so a client joining a chunk's bytes read E4 as junk
    and "中" as two stray bytes. Now every token of the unfinished character waits with it."""
    client, loaded = served
    from core.lifecycle.scoring import _byte_level_table

    alphabet = {byte: char for char, byte in _byte_level_table().items()}
    stray = [loaded.tokenizer.convert_tokens_to_ids(alphabet[byte]) for byte in (0x80, 0x81)]
    order = [*stray, *loaded.tokenizer("中", add_special_tokens=False)["input_ids"]]
    assert len(order) == 5 and loaded.tokenizer.decode(order) == "\ufffd\ufffd中"
    body = {"temperature": 0, "max_tokens": 5, "presence_penalty": 2, "frequency_penalty": 2,
            "logit_bias": {str(token): 100 - 0.6 * place for place, token in enumerate(order)}}
    text, whole = _whole_chat(client, **body)
    chunks, _usage = _streamed_chat(client, **body)
    assert text == "\ufffd\ufffd中", (text, whole)
    assert [piece for piece, _ in chunks] == ["\ufffd\ufffd", "中"]
    assert [[b for entry in content for b in entry.bytes] for _, content in chunks] == [[0x80, 0x81],
                                                                                       [0xE4, 0xB8, 0xAD]]
    _same_entries([entry for _, content in chunks for entry in content], whole)
