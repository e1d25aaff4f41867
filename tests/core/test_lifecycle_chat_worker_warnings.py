"""The chat screen's model process ignored every Python warning (``filterwarnings("ignore")``), and its
stderr goes nowhere: a warning of the model's own code (remote code), of ours or of the user's was never
seen. Now, as the server's log, only the machine-learning libraries' warnings are kept quiet
(``quiet_libraries``); any other becomes a ``warning`` record the app shows. The worker runs in this
process on a whole tiny model (random weights, CPU); its generation is replaced by one that warns."""

from __future__ import annotations

import io
import json
import shutil
import sys
import warnings


def test_the_chat_worker_says_a_warning_of_the_models_code_and_keeps_the_libraries_quiet(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    import core.lifecycle.chat as chat
    from core.lifecycle import chat_worker
    from tests.fixtures.lifecycle.finished_run import TINY

    folder = tmp_path / "whole"
    shutil.copytree(TINY, folder)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(folder)

    def warning_generation(loaded, ids, settings=None, variant="tuned", stop=None, outcome=None):
        # as a model's remote code (trust_remote_code) and transformers itself warn, mid-generation
        warnings.warn_explicit("this model's cache layout is deprecated", UserWarning, "modeling_mine.py", 12,
                               module="transformers_modules.mine.modeling_mine")
        warnings.warn_explicit("a library's own deprecation note", FutureWarning, "utils.py", 3,
                               module="transformers.generation.utils")
        yield "ok"

    monkeypatch.setattr(chat, "stream_prompt", warning_generation)
    request = {"id": 1, "variant": "tuned", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request) + "\n"))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # Python's own: each warning once where it is raised
        assert chat_worker.main(["--model-dir", str(folder)]) == 0
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    said = [r["message"] for r in records if r["event"] == "warning"]
    assert said == ["UserWarning: this model's cache layout is deprecated (modeling_mine.py:12)"], records
    assert [r["event"] for r in records if r["event"] != "warning"] == ["ready", "token", "done"], records
