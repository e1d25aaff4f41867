"""Chinese text wraps between its characters, never inside the Latin words, numbers and keys it holds,
and no line starts with a closing mark (，。）). Rich broke lines at whitespace only: a Chinese paragraph
was one word, folded at the last cell, so the wizard's model step read 模型浏览器（Ctr / l+P，模型）."""

from __future__ import annotations

import rich._wrap
from rich._wrap import divide_line

import tui.app  # noqa: F401  (applies the wrapping, as the app does)
from core.text_width import cell_len


def lines(text: str, width: int) -> list[str]:
    offsets = [0, *divide_line(text, width), len(text)]
    return [text[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]


def test_the_wrapping_is_in_place():
    from tui.wide_char_wrap import words

    assert rich._wrap.words is words


def test_chinese_breaks_between_characters_and_keeps_latin_words_whole():
    text = ("Hub ID（Qwen/Qwen2.5-7B-Instruct）、本地目录或内置名称：tiny、Qwen2.5-0.5B … Qwen2.5-72B、Qwen3-8B、"
            "Meta-Llama-3-8B、Mistral-7B-v0.1。也可在模型浏览器（Ctrl+P，模型）中按 p 选择。")
    for width in range(32, 100):  # the longest unbreakable piece, （Qwen/Qwen2.5-7B-Instruct）、, is 30 cells
        wrapped = lines(text, width)
        assert "".join(wrapped) == text
        assert all(cell_len(line.rstrip()) <= width for line in wrapped), (width, wrapped)
        for token in ("Ctrl+P", "Qwen2.5-7B-Instruct", "Mistral-7B-v0.1", "Meta-Llama-3-8B"):
            assert any(token in line for line in wrapped), (width, token, wrapped)
        assert not any(line[:1] in "，。、：）" for line in wrapped[1:]), (width, wrapped)
        assert not any(line.rstrip()[-1:] in "（“" for line in wrapped), (width, wrapped)


def test_a_closing_mark_stays_with_what_it_closes():
    assert lines("无法连接 ModelScope（http://127.0.0.1:9）：连接被拒绝。", 44) == [
        "无法连接 ModelScope（http://127.0.0.1:9）：", "连接被拒绝。"]


def test_text_without_wide_characters_wraps_as_before():
    text = "Hub id (Qwen/Qwen2.5-7B-Instruct), a local folder or a bundled name · 0.5B … 72B"
    offsets = []
    position = 0
    for start, end, word in rich._wrap.words(text):
        assert start == position and word == text[start:end]
        position = end
        offsets.append(start)
    assert [text[a:b] for a, b in zip(offsets, [*offsets[1:], len(text)], strict=True)] == \
        [m.group(0) for m in __import__("re").finditer(r"\s*\S+\s*", text)]
