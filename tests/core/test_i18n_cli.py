"""The CLI speaks the chosen language: --lang, then the settings, then the locale; help texts included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tunedeck(tmp_path: Path, *args: str, locale: str = "C", settings: object = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LC_MESSAGES", "LANGUAGE")}
    env.update(TUNEDECK_HOME=str(tmp_path / "home"), LANG=locale)
    if settings is not None:
        path = subprocess.run([sys.executable, "-c", "from core.paths import settings_path; print(settings_path())"],
                              cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(settings if isinstance(settings, str) else json.dumps(settings), encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_lang_flag_translates_help_and_messages(tmp_path):
    done = tunedeck(tmp_path, "--lang", "zh", "data", "--help")
    assert done.returncode == 0 and "检查训练数据文件" in done.stdout
    done = tunedeck(tmp_path, "--lang=zh", "runs")
    assert done.returncode == 0 and "还没有训练任务" in done.stderr + done.stdout
    done = tunedeck(tmp_path, "--lang", "en", "data", "--help", locale="zh_CN.UTF-8")
    assert "check training data files" in done.stdout


def test_setting_then_locale_decide_when_no_flag(tmp_path):
    assert "检查训练数据文件" in tunedeck(tmp_path / "a", "data", "--help", settings={"language": "zh"}).stdout
    assert "check training data files" in tunedeck(tmp_path / "b", "data", "--help", locale="zh_CN.UTF-8",
                                                   settings={"language": "en"}).stdout
    assert "检查训练数据文件" in tunedeck(tmp_path / "c", "data", "--help", locale="zh_CN.UTF-8").stdout
    assert "check training data files" in tunedeck(tmp_path / "d", "data", "--help", locale="en_US.UTF-8").stdout


def test_unknown_language_is_a_usage_error(tmp_path):
    done = tunedeck(tmp_path, "--lang", "xx", "runs")
    assert done.returncode == 2 and "unknown language 'xx'" in done.stderr


def test_broken_settings_are_reported_in_the_locale_language(tmp_path):
    done = tunedeck(tmp_path, "runs", locale="zh_CN.UTF-8", settings="[1]")
    assert done.returncode == 2 and "设置必须是 JSON 对象" in done.stderr


def test_a_settings_file_that_is_a_folder_says_to_move_the_folder(tmp_path):
    """settings.json made a folder (by hand, or a tool that took the name) read "cannot read settings ([Errno 21]
    Is a directory: …); fix or delete the file": there is no file to fix. It says a folder is there and to move
    it; the CLI stops before doing anything, as for a broken file."""
    tunedeck(tmp_path, "runs", settings={})  # writes the file: its path is now known
    path = tmp_path / "home" / "settings.json"
    path.unlink()
    path.mkdir()
    done = tunedeck(tmp_path, "runs")
    assert done.returncode == 2, done.stderr
    assert f"{path}: cannot read settings: a folder is there" in done.stderr and "Errno" not in done.stderr
    assert "fix or delete the file" not in done.stderr
