"""argparse's own words in the interface language: usage:, section titles, -h help and its errors.

The CLI runs as a real subprocess; the coverage test reads the running interpreter's argparse source, so
CI on 3.10 and 3.12 checks that version's message ids."""

from __future__ import annotations

import argparse
import ast
import contextlib
import gettext
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core import i18n
from core.i18n.argparse_words import PREFIX, CatalogueArgumentParser, wrap_cells
from core.text_width import cell_len

ROOT = Path(__file__).resolve().parents[2]
# Message ids argparse raises only for a programming mistake in the parser's definition (never for
# anything a user types), so they are left in English.
DEVELOPER_ONLY = {
    "'required' is an invalid argument for positionals", "%r is not callable", ".__call__() not defined",
    'argument "-" with mode %r', "cannot have multiple subparser arguments",
    "cannot merge actions - two groups are named %r", "conflicting subparser alias: %s",
    "conflicting subparser: %s", "dest= is required for options like %r", "invalid conflict_resolution value: %r",
    "invalid option string %(option)r: must start with a character %(prefix_chars)r",
    "mutually exclusive arguments must be optional", "conflicting option string: %s",
    "conflicting option strings: %s",
}


def tunedeck(tmp_path: Path, *args: str, locale: str = "C") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LC_MESSAGES", "LANGUAGE")}
    env.update(TUNEDECK_HOME=str(tmp_path / "home"), LANG=locale, COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_subcommand_help_is_chinese_throughout(tmp_path):
    done = tunedeck(tmp_path, "--lang", "zh", "train", "--help")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("用法：tunedeck train ")
    assert "\n位置参数：\n" in out and "\n选项：\n" in out and "显示此帮助信息并退出" in out
    for english in ("usage:", "positional arguments", "options:", "show this help message"):
        assert english not in out
    # Wrapped usage lines line up under the first argument although "用法：" is 6 cells in 3 characters.
    lines = out.split("\n")
    first_arg = lines[0].index("[-h]") + 3  # 3 wide characters, one extra cell each
    assert lines[1].startswith(" ") and len(lines[1]) - len(lines[1].lstrip(" ")) == first_arg
    # Chinese help texts are wrapped by cells: nothing is wider than the 80-column terminal.
    assert max(cell_len(line) for line in lines) <= 80
    assert "多机训练：每行一个 'host [slots=N]' 的文件" in out


def test_wrap_cells_breaks_between_wide_characters_not_inside_words():
    lines = wrap_cells("多机训练：每行一个 'host [slots=N]' 的文件；第一行是节点 0，本机所在行决定其节点序号", 20)
    assert all(cell_len(line.rstrip("，；：。")) <= 20 for line in lines) and "".join(lines).count("slots=N]'") == 1
    assert not any(line.startswith(("，", "；", "：")) for line in lines)
    assert wrap_cells("短，", 4) == ["短，"]  # closing punctuation stays on its line even past the width


def test_top_level_help_and_version_help(tmp_path):
    out = tunedeck(tmp_path, "--lang", "zh", "--help").stdout
    assert "显示程序版本号并退出" in out and "show program's version" not in out


def test_unknown_command_is_reported_in_chinese(tmp_path):
    done = tunedeck(tmp_path, "--lang", "zh", "bogus")
    assert done.returncode == 2
    assert "tunedeck：错误：参数 COMMAND：无效的选择：'bogus'（可选：" in done.stderr
    assert "invalid choice" not in done.stderr and "usage:" not in done.stderr


def test_missing_required_argument_and_unrecognized_ones(tmp_path):
    done = tunedeck(tmp_path, "--lang", "zh", "stop")
    assert done.returncode == 2 and "tunedeck stop：错误：缺少必需的参数：RUN" in done.stderr
    done = tunedeck(tmp_path, "--lang", "zh", "runs", "--no-such-flag")
    assert done.returncode == 2 and "无法识别的参数：--no-such-flag" in done.stderr
    done = tunedeck(tmp_path, "--lang", "zh", "logs", "x", "--lines")
    assert done.returncode == 2 and "：需要一个参数值" in done.stderr, done.stderr


def test_english_and_locale(tmp_path):
    done = tunedeck(tmp_path, "stop")
    assert done.returncode == 2 and "tunedeck stop: error: the following arguments are required: RUN" in done.stderr
    assert done.stderr.startswith("usage: tunedeck stop")
    done = tunedeck(tmp_path, "bogus", locale="zh_CN.UTF-8")
    assert "无效的选择" in done.stderr


def _outputs(parser_class: type[argparse.ArgumentParser], argv: list[str]) -> tuple[str, str, int | None]:
    parser = parser_class(prog="demo", description="a parser")
    parser.add_argument("--count", type=int, help="how many")
    parser.add_argument("--mode", choices=["a", "b"])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--x", action="store_true")
    group.add_argument("--y", action="store_true")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    one = sub.add_parser("one", help="first")
    one.add_argument("target")
    one.add_argument("--pair", nargs=2)
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            code = exc.code
    return out.getvalue(), err.getvalue(), code


@pytest.mark.parametrize("argv", [
    ["--help"], ["one", "--help"], [], ["two"], ["--count", "x", "one", "t"], ["--mode", "c"],
    ["--x", "--y", "one", "t"], ["one"], ["one", "t", "--pair", "a"], ["one", "t", "extra"], ["--count"],
])
def test_english_output_is_byte_identical_to_plain_argparse(argv, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    i18n.set_language("en")
    assert _outputs(CatalogueArgumentParser, argv) == _outputs(argparse.ArgumentParser, argv)


def test_chinese_errors_in_process_and_the_stdlib_restored(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    try:
        i18n.set_language("zh")
        _, err, code = _outputs(CatalogueArgumentParser, ["--count", "x", "one", "t"])
        assert code == 2 and "demo：错误：参数 --count：无效的 int 值：'x'" in err
        _, err, _ = _outputs(CatalogueArgumentParser, ["--x", "--y", "one", "t"])
        assert "参数 --y：不能与参数 --x 同时使用" in err
        _, err, _ = _outputs(CatalogueArgumentParser, ["one", "t", "--pair", "a"])  # ngettext
        assert "参数 --pair：需要 2 个参数值" in err
        # A plain parser in the same process, in Chinese mode, still speaks the stdlib's English.
        _, err, _ = _outputs(argparse.ArgumentParser, ["--count", "x", "one", "t"])
        assert "error: argument --count: invalid int value" in err
    finally:
        i18n.set_language("en")
    assert argparse._ is gettext.gettext and argparse.ngettext is gettext.ngettext


def test_the_argument_prefix_python_3_10_leaves_untranslated_is_translated(capsys):
    """3.10 builds "argument X: ..." from a literal; the parser's error() translates that prefix."""
    parser = CatalogueArgumentParser(prog="demo")
    try:
        i18n.set_language("zh")
        with pytest.raises(SystemExit):
            parser.error("argument --count: 无效的 int 值：'x'")
    finally:
        i18n.set_language("en")
    assert "demo：错误：参数 --count：无效的 int 值：'x'" in capsys.readouterr().err


def _argparse_message_ids() -> set[str]:
    tree = ast.parse(Path(argparse.__file__).read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("_", "ngettext"):
            found |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def test_every_user_facing_message_id_of_this_python_is_translated():
    english = {text for key, text in i18n.catalogue("en").items() if key.startswith(PREFIX)}
    ids = _argparse_message_ids()
    assert len(ids) > 25, "the scan found almost no argparse messages; did argparse change how it looks them up?"
    missing = sorted(ids - english - DEVELOPER_ONLY)
    assert missing == [], f"argparse {sys.version_info[:2]} messages not in core/i18n/en/argparse.json: {missing}"
    # The ones this module passes explicitly in every version.
    assert {"usage: ", "options", "positional arguments", "show program's version number and exit"} <= english


def test_percent_placeholders_are_the_same_in_every_language():
    percent = re.compile(r"%(?:\(\w+\))?[sdr]")
    english = i18n.catalogue("en")
    for language in i18n.available_languages():
        messages = i18n.catalogue(language)
        for key, text in english.items():
            if key.startswith(PREFIX):
                assert sorted(percent.findall(messages[key])) == sorted(percent.findall(text)), (language, key)


@pytest.mark.parametrize("language", ["en", "zh"])
def test_train_help_explains_its_config_file_and_key_value_overrides(tmp_path, language):
    """QA: 'train --help' listed RUN.yaml and key=value with no word on either. Each says what it is, with
    an example of an override and where every key is documented, in the interface language."""
    done = tunedeck(tmp_path, "--lang", language, "train", "--help")
    assert done.returncode == 0, done.stderr
    squeezed = "".join(done.stdout.split())  # argparse wraps help texts (zh between any two characters)
    from core.config.schema import reference_path

    words = i18n.catalogue(language)
    for key in ("runs.config_arg_help", "runs.overrides_help"):
        assert "".join(words[key].replace("{reference}", reference_path()).split()) in squeezed, key
    # the reference where this install has it (a pip install has no checkout to name it relative to)
    assert "lora_rank=32" in squeezed and "".join(reference_path().split()) in squeezed
    for metavar in ("RUN.yaml", "key=value"):  # each positional's line carries its help, not the name alone
        line = next(line for line in done.stdout.splitlines() if line.strip().startswith(metavar))
        assert line.strip() != metavar, line
