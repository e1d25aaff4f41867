"""``tunedeck models info``: the facts from config.json under translated labels (the JSON keeps its keys)."""

from __future__ import annotations

import json
import re

import pytest

from core import i18n
from core.cli import main
from core.text_width import cell_len
from tests.hubserver import FakeHubServer, standard_hub


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for name in ("MODELSCOPE_API_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "LC_ALL", "LC_MESSAGES", "LANGUAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", "C")
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        yield
    i18n.set_language("en")


def _facts_block(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith(("config.json:", "config.json：")))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_fact_labels_in_chinese_and_english(hub, capsys):
    assert main(["--lang", "zh", "models", "info", "Qwen/Qwen2.5-7B-Instruct"]) == 0
    block = _facts_block(capsys.readouterr().out)
    labels = [line.split()[0] for line in block]
    assert labels[:4] == ["架构", "模型类型", "参数量", "层数"] and "隐藏维度" in labels and "词表大小" in labels
    assert any(line.split()[0] == "已知模型系列" and line.split()[1] in ("是", "否（仅按") for line in block)
    assert not any(word in "\n".join(block) for word in ("hidden_size", "vocab_size", "True", "False"))
    # Values start in one column, counted in cells (a Chinese label is two cells per character).
    values = [re.match(r"^  \S.*?\s{2,}(\S.*)$", line).group(1) for line in block]
    starts = {cell_len(line) - cell_len(value) for line, value in zip(block, values, strict=True)}
    assert len(starts) == 1, block
    assert main(["--lang", "en", "models", "info", "Qwen/Qwen2.5-7B-Instruct"]) == 0
    english = _facts_block(capsys.readouterr().out)
    assert english[0].split()[0] == "architecture" and any(line.startswith("  hidden size ") for line in english)
    assert main(["--lang", "zh", "models", "info", "Qwen/Qwen2.5-7B-Instruct", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["facts"]["hidden_size"] > 0  # data keys stay as they are


def test_every_model_fact_has_a_label_in_every_language():
    """``models info`` labels each ModelFacts field from the catalogue: a new field needs its label."""
    import dataclasses

    from core.hub.facts import ModelFacts

    names = [field.name for field in dataclasses.fields(ModelFacts)]
    assert names
    for language in i18n.available_languages():
        messages = i18n.catalogue(language)
        assert [name for name in names if f"hub.cli.fact.{name}" not in messages] == [], language
