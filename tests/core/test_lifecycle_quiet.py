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
    code = ("import logging; from core.lifecycle.commands import _quiet_libraries; _quiet_libraries(); "
            "import deepspeed.utils.logging; "
            "logging.getLogger('DeepSpeed').warning('ds-warning'); logging.getLogger('DeepSpeed').error('ds-error'); "
            "b = logging.getLogger('bitsandbytes.backends.cpu.ops'); b.warning('bnb-warning'); b.error('bnb-error')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = proc.stdout + proc.stderr  # DeepSpeed's own handler writes to stdout
    assert "ds-error" in shown and "bnb-error" in shown, shown
    assert "ds-warning" not in shown and "bnb-warning" not in shown and "Setting accelerator" not in shown, shown
