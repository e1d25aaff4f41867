"""`tunedeck chat` as a person uses it: a message that does not fit the model's context or that the chat
template refuses is said in one line and left out, the session going on; Ctrl+C during a reply stops that
reply (its text kept) and the session goes on, Ctrl+C at the prompt ends it. Real processes on the tiny
LoRA run (its model's context: 2048 tokens) and a whole tiny model; CPU only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from tests.fixtures.lifecycle.finished_run import ROOT


def _chat(home, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "core", "chat", *args], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})


class _Reader:
    """A stream read in a thread, so the test can wait for what has come so far."""

    def __init__(self, stream) -> None:
        self.text = ""
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        while piece := stream.read(1):
            self.text += piece

    def wait_for(self, predicate, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while not predicate(self.text):
            assert time.monotonic() < end, f"not reached; so far: {self.text[-2000:]!r}"
            time.sleep(0.05)


def test_a_message_past_the_context_is_said_and_left_out_and_the_session_goes_on(lora_run):
    """The CLI sent any conversation to generate, past the model's context too. 300 characters are 308
    tokens here: with --max-tokens 2000 they go past 2048 and are refused in one line; "Name a colour." (14
    tokens) then fits, as it would not had the refused message stayed in the conversation."""
    home, run = lora_run
    proc = _chat(home, run.id, "--temperature", "0", "--max-tokens", "2000")
    out, err = proc.communicate("x" * 300 + "\nName a colour.\n\n", timeout=180)
    assert proc.returncode == 0, err[-2000:]
    said = [line for line in err.splitlines() if "past this model's context of 2048" in line]
    assert len(said) == 1 and "2308" in said[0] and "left out" in said[0], err[-2000:]
    assert "Traceback" not in err
    assert out.strip() == "Blue.", (out, err[-1000:])  # the only reply: the refused message got none


def test_piped_messages_with_blank_lines_between_them_are_all_answered(lora_run):
    """`tunedeck chat RUN < prompts.txt` ended at the file's first blank line with exit 0: the messages after
    it were dropped unsaid. Piped, blank lines are skipped (a file's Windows line ends too) and the session
    ends with its input: both messages are answered, one reply a line."""
    home, run = lora_run
    proc = _chat(home, run.id, "--temperature", "0", "--max-tokens", "8")
    out, err = proc.communicate("Name a colour.\r\n\r\n\nSay yes.\r\n", timeout=180)
    assert proc.returncode == 0, err[-2000:]
    replies = out.splitlines()
    assert len(replies) == 2 and replies[0] == "Blue." and replies[1].strip(), (out, err[-1000:])
    assert "blank lines skipped" in err and "an empty line" not in err, err[-1000:]


def test_a_message_the_chat_template_refuses_is_skipped_and_the_session_goes_on(tmp_path):
    """A chat template's refusal (Gemma's: no system message) ended the session with exit 2 at the first
    message. Now each refused message is said in its one line and the session reads the next."""
    from tests.core.test_lifecycle_serve_template import (
        FAILING_TEMPLATE,
        GEMMA_TEMPLATE,
        tiny_model_with_template,
    )

    folder = tiny_model_with_template(tmp_path / "gemma-style", GEMMA_TEMPLATE)
    proc = _chat(tmp_path / "home", "--model-dir", str(folder), "--system", "Be brief.", "--max-tokens", "4")
    out, err = proc.communicate("Hi\nHello\n\n", timeout=180)
    assert proc.returncode == 0, err[-2000:]
    refused = [line for line in err.splitlines() if "refuses the system role" in line]
    assert len(refused) == 2, err[-2000:]  # both messages said, the session alive after the first
    assert "Traceback" not in err and out.strip() == ""
    # A template failing in Python (a TypeError, not jinja's raise_exception) ended the chat in a traceback:
    # each message says it in one line, naming the template, and the session goes on as for a refusal.
    folder = tiny_model_with_template(tmp_path / "failing", FAILING_TEMPLATE)
    proc = _chat(tmp_path / "home", "--model-dir", str(folder), "--max-tokens", "4")
    out, err = proc.communicate("Hi\nHello\n\n", timeout=180)
    assert proc.returncode == 0, err[-2000:]
    failed = [line for line in err.splitlines() if "chat template failed on these messages (TypeError" in line]
    assert len(failed) == 2 and "tokenizer_config.json" in failed[0], err[-2000:]
    assert "Traceback" not in err and out.strip() == ""


def test_ctrl_c_stops_the_reply_and_the_session_goes_on_and_at_the_prompt_ends_it(lora_run):
    """Ctrl+C during a reply ended the whole session (exit 130, the model to load again). Now it stops that
    reply: its text stays on stdout (and in the conversation), one line says so, and the next message is
    answered. Ctrl+C at the prompt still ends the session with 130, an empty line or Ctrl+D with 0. The
    random base (--base) babbles up to its 1500 max tokens: it is stopped long before."""
    home, run = lora_run
    proc = _chat(home, run.id, "--base", "--temperature", "0", "--max-tokens", "1500")
    out, err = _Reader(proc.stdout), _Reader(proc.stderr)
    try:
        err.wait_for(lambda text: "ready" in text)
        for number, message in enumerate(("Hi", "Again"), start=1):
            start = len(out.text)
            proc.stdin.write(message + "\n")
            proc.stdin.flush()
            out.wait_for(lambda text, start=start: len(text) - start >= 20)  # the reply is streaming in
            proc.send_signal(signal.SIGINT)
            err.wait_for(lambda text, number=number: text.count("reply stopped") == number)
            assert proc.poll() is None  # still in the session
            out.wait_for(lambda text: text.endswith("\n"))
            assert len(out.text) - start < 1500 * 4
        proc.send_signal(signal.SIGINT)  # at the prompt: the session ends, as it always did
        assert proc.wait(timeout=60) == 130
        assert "Traceback" not in err.text, err.text[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
