"""Every language has the same messages: same files, same keys, same placeholders and markup per key;
every key the code names literally exists in English."""

from __future__ import annotations

import ast
import json
import re
import string
from collections import Counter
from pathlib import Path

import pytest

from core import i18n

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "core" / "i18n"
ENGLISH = CATALOGUE / "en"
# zh is listed by name so that an empty or deleted folder fails instead of quietly testing nothing.
OTHER_LANGUAGES = sorted(
    {"zh"} | {p.name for p in CATALOGUE.iterdir() if p.is_dir() and p.name != "en" and any(p.glob("*.json"))}
)
# Rich/Textual markup tags: [b], [/], [/b], [$error], [bold red] … but not "[0, 1]" or "[question, answer]".
MARKUP = re.compile(r"\[/?\$?[a-z][a-z_ -]*\]|\[/\]")


def _load(path: Path) -> dict[str, str]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path}: must be a flat JSON object"
    for key, value in data.items():
        assert isinstance(value, str), f"{path}: '{key}' must map to a string"
    return data


def _fields(text: str) -> Counter:
    """The replacement fields of a str.format text, with their conversion and format spec."""
    return Counter(
        (name, conversion, spec) for _, name, spec, conversion in string.Formatter().parse(text) if name is not None
    )


def test_there_is_a_second_language():
    assert "zh" in OTHER_LANGUAGES
    assert i18n.available_languages() == sorted(["en", *OTHER_LANGUAGES])


@pytest.mark.parametrize("language", OTHER_LANGUAGES)
def test_same_files_in_every_language(language):
    english = {p.name for p in ENGLISH.glob("*.json")}
    other = {p.name for p in (CATALOGUE / language).glob("*.json")}
    assert sorted(english - other) == [], f"{language}: catalogue files missing (copy and translate them)"
    assert sorted(other - english) == [], f"{language}: files with no English original"


def _pairs():
    for language in OTHER_LANGUAGES:
        for path in sorted(ENGLISH.glob("*.json")):
            yield pytest.param(language, path.name, id=f"{language}/{path.name}")


@pytest.mark.parametrize(("language", "name"), list(_pairs()))
def test_same_keys_placeholders_and_markup(language, name):
    english = _load(ENGLISH / name)
    other_path = CATALOGUE / language / name
    if not other_path.exists():
        pytest.fail(f"{other_path} is missing")
    other = _load(other_path)
    assert sorted(set(english) - set(other)) == [], f"{other_path}: keys missing"
    assert sorted(set(other) - set(english)) == [], f"{other_path}: keys not in {ENGLISH / name}"
    problems = []
    for key, text in english.items():
        if _fields(text) != _fields(other[key]):
            problems.append(f"{key}: placeholders {sorted(_fields(text))} vs {sorted(_fields(other[key]))}")
        if Counter(MARKUP.findall(text)) != Counter(MARKUP.findall(other[key])):
            problems.append(f"{key}: markup {MARKUP.findall(text)} vs {MARKUP.findall(other[key])}")
        if text.strip() and not other[key].strip():
            problems.append(f"{key}: empty translation")
    assert problems == [], f"{other_path}:\n" + "\n".join(problems)


@pytest.mark.parametrize("language", ["en", *OTHER_LANGUAGES])
def test_catalogue_loads_without_duplicates(language):
    i18n.catalogue.cache_clear()
    messages = i18n.catalogue(language)
    assert len(messages) == len(i18n.catalogue("en"))


def test_language_switch_changes_text_and_back():
    try:
        i18n.set_language("zh")
        chinese = i18n.t("app.mode.runs")
        i18n.set_language("en")
        assert i18n.t("app.mode.runs") == "Runs"
        assert chinese != "Runs" and any("\u4e00" <= ch <= "\u9fff" for ch in chinese)
    finally:
        i18n.set_language("en")


def test_locale_picks_chinese(monkeypatch):
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    assert i18n.language_from_locale() == "zh"
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    assert i18n.language_from_locale() == "en"


@pytest.mark.parametrize("value", ["zh_TW.UTF-8", "zh_HK.UTF-8", "zh_TW.Big5", "zh_SG", "zh-TW", "zh-Hant",
                                   "zh_TW@euro"])
def test_every_chinese_locale_gets_the_chinese_catalogue(monkeypatch, value):
    """Traditional-Chinese locales get the Simplified catalogue (README says so): better than English.
    A BCP 47 form (zh-TW, zh-Hant, as some terminals set it) was read as the language "zh-tw": English."""
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", value)
    assert i18n.language_from_locale() == "zh"


def _t_calls():
    """(file, line, first argument node, call node) of every ``t(...)`` call in core/ and tui/, and of every
    ``Message(...)`` (a message kept as data, rendered later: the same key and parameter rules apply)."""
    for folder in ("core", "tui"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                first = node.args[0]
                is_key = isinstance(first, ast.Constant) and isinstance(first.value, str) and "." in first.value
                if name == "t" or (name == "Message" and is_key):  # core.data's chat Message("user", …) is not
                    yield path.relative_to(ROOT), node.lineno, node.args[0], node


def test_every_literal_key_exists_in_english():
    english = i18n.catalogue("en")
    missing = []
    seen = 0
    for path, line, arg, _call in _t_calls():
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            seen += 1
            if arg.value not in english:
                missing.append(f"{path}:{line}: t({arg.value!r})")
        elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            # t(f"app.theme.{name}"): at least one key must start with the literal prefix.
            prefix = arg.values[0].value
            seen += 1
            if not any(key.startswith(prefix) for key in english):
                missing.append(f"{path}:{line}: no key starts with {prefix!r}")
    assert seen > 100, "the scan found almost no t() calls; is it still looking in the right place?"
    assert missing == [], "keys used in code but not in core/i18n/en/*.json:\n" + "\n".join(missing)


def test_every_literal_call_gives_the_placeholders_its_text_needs():
    """A missing parameter would raise only when that message is shown (often: when an error happens)."""
    english = i18n.catalogue("en")
    wrong = []
    for path, line, arg, call in _t_calls():
        if not (isinstance(arg, ast.Constant) and arg.value in english):
            continue
        if any(kw.arg is None for kw in call.keywords):  # t(key, **params): not checkable here
            continue
        given = {kw.arg for kw in call.keywords}
        needed = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(english[arg.value])
                  if name}
        if not needed <= given:
            wrong.append(f"{path}:{line}: t({arg.value!r}) lacks {sorted(needed - given)}")
    assert wrong == [], "\n".join(wrong)


def test_a_text_shown_without_parameters_has_no_escaped_braces():
    """t(key) without parameters returns the text as it is (Message formats it later): a ``{{`` there reaches
    the user doubled, as data check's "array of records ([{{...}}, ...])" did."""
    english = i18n.catalogue("en")
    wrong = [f"{path}:{line}: t({arg.value!r})" for path, line, arg, call in _t_calls()
             if isinstance(arg, ast.Constant) and arg.value in english and not call.keywords
             and ("{{" in english[arg.value] or "}}" in english[arg.value])]
    assert wrong == [], "\n".join(wrong)


def test_chinese_says_loss_in_chinese():
    """GLOSSARY.md: loss = 损失. The wizard's dataset line read 其中 25% 的 token 参与 loss. The word stays only
    where it names data or code: the ``loss: false`` of a message, a metric or config key."""
    zh = i18n.catalogue("zh")
    code = re.compile(r"`[^`]*`|'[^']*'|\{[^}]*\}|\bloss (false|true)\b|\w*_loss\w*|loss_\w+")
    wrong = [f"{key}: {text}" for key, text in zh.items() if re.search(r"\bloss\b", code.sub("", text))]
    assert wrong == [], "\n".join(wrong)


def test_a_status_in_a_message_is_its_label():
    """A run's or a download's status value (finished, failed) reached Chinese text as it is: 任务 … 未在运行
    （状态：finished）, 实测运行以 failed 结束, 沿用failed的那次下载. A ``status=`` parameter given a ``.status``
    attribute must go through ``state_label`` (core.runs.states) or ``download_state_label`` (core.hub.download),
    which say it in the interface language."""
    wrong = [f"{path}:{line}: {ast.unparse(call)}" for path, line, _, call in _t_calls()
             for keyword in call.keywords
             if keyword.arg == "status" and isinstance(keyword.value, ast.Attribute) and keyword.value.attr == "status"]
    assert wrong == [], "\n".join(wrong)


def test_chinese_calls_a_run_a_task():
    """GLOSSARY.md: a run is 任务. 运行 before a run's id reads as the verb, "execute 20261207-…", and the
    --allow-shared-gpus help said 运行中的运行 ("a running run"). 运行 as the noun also stood in for a run
    beside 任务 elsewhere: 实测运行 (a probe run), 本次运行, 运行目录, 运行配置, 该运行, 运行上次启动. 运行 stays
    where it is the verb (运行 'tunedeck resume …', 再次运行, 正在运行的服务, 运行中)."""
    zh = i18n.catalogue("zh")
    noun = (r"运行 \{(id|run)\}|运行中的运行|(一个|(?<!重)新|实测|本次|该|每个|删除|自|恢复)运行"
            r"|运行 ?(目录|配置|YAML|键|文件|上次|会|需要|开始|都|已停)|(?<!在)运行的")
    wrong = [f"{key}: {text}" for key, text in zh.items() if re.search(noun, text)]
    assert wrong == [], "\n".join(wrong)


def test_chinese_counts_gpus_and_writes_units_one_way():
    """GPUs were 1 张 GPU in plan's text and 2 块 GPU in config's, the GPU screen's and runs'; throughput was
    token/秒 in plan, tokens/s in estimate and TOK/S, Tok/s, tok/s in columns. GLOSSARY.md: a GPU is counted
    with 张 (块 stays for chunks: 分成 {tiles} 块计算, 每块生成 logits); tokens/s in prose, tok/s in columns,
    labels and status lines."""
    zh = i18n.catalogue("zh")
    gpu_block = re.compile(r"(?:\d|\}|[这每单多一两几]) ?块(?!计算|生成)")
    rate = re.compile(r"tokens?/秒|Tok/s|TOK/S|token/s\b|tokens/秒")
    wrong = [f"{key}: {text}" for key, text in zh.items() if gpu_block.search(text) or rate.search(text)]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("language", ["en", *OTHER_LANGUAGES])
def test_a_magnitude_is_written_as_core_units_writes_it(language):
    """core.units.format_magnitude writes 40.4M, 1.2M: a catalogue text that put its own unit after a number
    (``{millions} M trainable parameters``, ``{size} M characters``) showed 40.4 M beside the 7.6B of a
    column. The number comes formatted, unit and all."""
    spaced = re.compile(r"(?:\d|\}) [KMB](?![A-Za-z])")
    wrong = [f"{key}: {text}" for key, text in i18n.catalogue(language).items() if spaced.search(text)]
    assert wrong == [], "\n".join(wrong)


def test_chinese_names_a_language_with_the_spacing_it_needs():
    """The palette's Language entry read 下次启动时使用English: a language is named in its own words
    (English, 中文), so the Chinese text around the name must read right whether the name is Latin or CJK."""
    glued = re.compile(r"[\u4e00-\u9fff][A-Za-z]|[A-Za-z][\u4e00-\u9fff]")
    try:
        i18n.set_language("zh")
        shown = [i18n.t(key, name=i18n.t(f"app.language.{language}"))
                 for key in ("app.cmd.language", "app.cmd.language_help", "app.language_saved")
                 for language in i18n.available_languages()]
    finally:
        i18n.set_language("en")
    assert [text for text in shown if glued.search(text)] == []
