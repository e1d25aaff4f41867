"""The after-training commands keep the libraries' import-time chatter off stderr, and their errors on it.

On a box without a GPU (this test box: no fake GPUs, nothing is asked of NVML) DeepSpeed logs "Setting
accelerator to CPU" when it is imported and bitsandbytes (on a CPU with AVX512-BF16) "Failed to load CPU
gemm_4bit_forward"; both came through on every merge / chat / evaluate / export."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.fixtures.lifecycle.finished_run import ROOT

NOISE = ("Setting accelerator to CPU", "gemm_4bit_forward", "kernels-community", "[WARNING]")


def test_merge_chat_evaluate_export_print_no_library_noise(lora_run):
    home, run = lora_run
    for args, said in ((("merge", run.id), "merging"), (("export", run.id, "--json"), ""),
                       (("evaluate", run.id), "perplexity"), (("chat", run.id, "--max-tokens", "3"), "ready")):
        proc = subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, input="Hi\n\n",
                              env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        assert not [n for n in NOISE if n in proc.stderr], (args, proc.stderr)
        assert said in proc.stderr, (args, proc.stderr)  # our own lines still show


def test_the_libraries_errors_still_show():
    """Quieted below ERROR only: a DeepSpeed or bitsandbytes error logged after the import is printed."""
    code = ("import logging; from core.lifecycle.library_noise import quiet_libraries; quiet_libraries(); "
            "import deepspeed.utils.logging; "
            "logging.getLogger('DeepSpeed').warning('ds-warning'); logging.getLogger('DeepSpeed').error('ds-error'); "
            "b = logging.getLogger('bitsandbytes.backends.cpu.ops'); b.warning('bnb-warning'); b.error('bnb-error')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = proc.stdout + proc.stderr  # DeepSpeed's own handler writes to stdout
    assert "ds-error" in shown and "bnb-error" in shown, shown
    assert "ds-warning" not in shown and "bnb-warning" not in shown and "Setting accelerator" not in shown, shown


def test_only_the_libraries_warnings_are_quieted_not_ours_nor_the_users():
    """Every Python warning was ignored (``filterwarnings("ignore")``): a warning of tunedeck's own code or of
    the user's went unseen too. Only warnings raised in the named libraries' modules are quieted now."""
    code = ("import warnings; from core.lifecycle.library_noise import quiet_libraries; quiet_libraries(); "
            "warnings.warn_explicit('hf-note', FutureWarning, 'modeling_utils.py', 1, "
            "module='transformers.modeling_utils'); "
            "warnings.warn_explicit('jit-note', UserWarning, '_script.py', 1, module='torch.jit._script'); "
            "warnings.warn_explicit('ours', UserWarning, 'merge.py', 1, module='core.lifecycle.merge'); "
            "warnings.warn_explicit('torchlike', UserWarning, 'x.py', 1, module='torchy_user_code'); "
            "warnings.warn('the-users', UserWarning)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hf-note" not in proc.stderr and "jit-note" not in proc.stderr, proc.stderr
    assert "ours" in proc.stderr and "the-users" in proc.stderr and "torchlike" in proc.stderr, proc.stderr


def test_the_servers_log_holds_its_own_lines_not_the_libraries_notes(lora_run):
    """The server's log began with bitsandbytes' "Failed to load CPU gemm_4bit_forward" (on a CPU with
    AVX512-BF16, as this test box) and transformers' FutureWarning: `serve` did not quiet the libraries as
    the other after-training commands do."""
    from tests.fixtures.lifecycle.finished_run import tunedeck

    home, run = lora_run
    started = tunedeck(home, "serve", run.id)
    assert started.returncode == 0, started.stderr[-2000:]
    stopped = tunedeck(home, "serve", run.id, "--stop")
    assert stopped.returncode == 0, stopped.stderr
    text = (home / "serve" / run.id / "server.log").read_text()
    assert "serving " + run.id in text, text
    assert not [n for n in (*NOISE, "FutureWarning", "warnings.warn") if n in text], text


def test_the_trainer_keeps_bitsandbytes_cpu_kernel_notice_out_of_train_log():
    """The trainer (whose stderr is train.log) quiets the same bitsandbytes notice below ERROR: it was the
    demo's first log line on a CPU with AVX512-BF16 ("Please make sure you already `pip install kernels`")."""
    code = ("import logging; from core.train.worker import _configure_logging; _configure_logging(0); "
            "b = logging.getLogger('bitsandbytes.backends.cpu.ops'); b.warning('bnb-warning'); b.error('bnb-error')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bnb-error" in proc.stderr, proc.stderr
    assert "bnb-warning" not in proc.stderr, proc.stderr
