"""The estimator's calibration matrix (issue #19): the real engine (``tunedeck train``) on one H200 over a
declared list of rows, each measured and set against ``core.estimate`` for the same settings.

How the next session runs it
----------------------------
``python bench/calibration_matrix.py --list`` prints the rows, the parts they fall into and each part's
expected seconds (the time model below: process start + data + model build + steps + final save, from
``bench/results/engine-*.json`` / ``engine-longctx-*``). Every part is planned at <= 540 s so that one
device call (10 minutes at most) runs one part with room for the wheel install. On the one-GPU machine,
with ``.whl`` (bitsandbytes, liger-kernel: ``../shared/device/wheels.sh``) carried::

    bash bench/device/calibration_call.sh 1     # -> $OUT/calibration-part1.json/.md, box.txt, log
    bash bench/device/calibration_call.sh 2
    ...                                           # every part that --list prints, one call each

Commit each part's ``calibration-partK.json`` + ``.md`` under ``bench/results/estimate_matrix/`` as it
comes back (the files are rewritten after every row: a call that is killed keeps what it measured). A
part cut short is re-run for the rows it lacks with ``bash bench/device/calibration_call.sh K --only
REGEX`` and committed as ``calibration-partK-b.json``: the report merges by row name (a finished or
out-of-memory record stands; a failed one is replaced by a later file's). Then::

    python bench/calibration_matrix.py --report-only bench/results/estimate_matrix/calibration-*.json \
        bench/results/estimate_matrix/profile-2.json

writes ``bench/results/estimate_matrix/engine-matrix.md``: every row measured vs estimated, medians and
worst errors, the fit-verdict check, and the issue's targets as pass/fail lines. The estimates there are
those recorded at measurement; ``--reestimate --report .../engine-matrix-now.md`` makes every measured
row's estimate again with the estimator as it is (for the settings the row ran), to see what a change to
``core/estimate`` does to the errors. Files of later calls that measured rows again (``--profile N`` calls,
``profile-K.json``) may be given after the parts: the first measurement counts, and the report lists each
row measured more than once with its rates and their spread (the device's run-to-run noise on it). Files of
a later engine (``ENGINE_GENERATIONS``: ``calibration-gcfreeze-*.json``, measured after the engine's
garbage-collector fix; ``calibration-kernels-*.json``, 40 LoRA and QLoRA rows measured again on 2026-12-04 with
the fused LoRA kernels, three ``--only`` calls of ``python3 bench/calibration_matrix.py`` after
``bench/device/setup.sh``) count before every earlier one, the mean of their calls where several measured a row.
``profile-3*.json`` are not calibration rows: the host probe (``bench/hostprobe``) sampled those runs and
slowed their Python-bound steps.
``--list`` gives the
number of parts and the expected device minutes: at this writing 82 rows (77 to run, 5 skipped), 8
parts, 61 device minutes in all — more than one session's 30 device minutes. The part numbers stay as
they are while the rows and the time constants below are unchanged: compare the first part's ``wall_s``
with its ``expected_s`` before changing the constants, and never between parts of one matrix; new rows go
at the end. Done (2026-12-02, one session, three calls and a short fourth): parts 1-3 (496, 447, 410 s
of wall time against 537, 500, 464 expected) and part 4's first three rows; its other nine are left::

    bash bench/device/calibration_call.sh 4 --only \
      '^7b-lora-b(4-s2048-ckpt(14|-auto)|1-s1024-ckpt|8-s1024-ckpt|16-s1024-ckpt|1-s8192-ckpt|1-s32768-ckpt|1-s65536-ckpt(-offload)?)$'

committed as ``calibration-part4-b.json``; then parts 5-8.

Per row: the engine's status (``finished``, ``oom`` — the engine's own out-of-memory event — or
``failed`` with its reason, ``skipped`` with why), the NVML peak (all compute processes, every 0.1 s:
what the estimator's peak is compared with), torch's max allocated / reserved, tokens/s in steady state
(the engine's metrics: non-padding tokens over wall time after the warm-up steps; packed rows, so every
token is real), the settings the engine reports it ran (fused loss, checkpointed layers, tiles), the
wall seconds against the time model, and the estimator's peak, tokens/s and fit verdict for the same
settings (re-estimated with the fused loss and checkpointed layers the engine reported) with the errors.

How the fits use these rows
---------------------------
- ``bench/memory_fit.py``: the memory constants, on the parts' NVML, reserved and allocated peaks.
- ``bench/estimate_calibrate.py``: the speed constants (GEMM and attention efficiencies, the hidden-size
  term, the CPU launch time per layer and pass) on every finished untiled row (``merged_records``), with the
  7B/8B ``engine-speed``/``engine-longctx`` rows; leave one model out is its validation.
- ``bench/matrix_terms_fit.py``: the terms of their own rows (the tiled MLP's launch cost, mixed-precision
  full fine-tuning's fp32 cost, DoRA's output rescaling), on the parts.
- The rows measured before the launcher resolved ``tiled_mlp: auto`` by fit (parts 1-3 and the first three
  rows of part 4, 2026-12-02) ran the engine's rule (tiles from 16k tokens in checkpointed blocks): their
  ``tiled_mlp_run`` says ``auto``, a later untiled row's ``false``. ``plan_as_run`` builds the plan of what
  a record ran, estimated with ``tiles_by_fit=False`` (``--reestimate`` and the fits do).

Skipped by design (the 64 GB disk of the one-GPU machine): QLoRA of 32B/72B (the bare config's bf16
random weights are written to disk first: 66 / 145 GB), full fine-tuning whose final checkpoint (the
engine always saves at the end, and refuses up front when it cannot) does not fit the disk: 7B mixed,
14B and larger. Those rows are declared with the reason so that the report shows the hole.

``--estimate-only``: no GPU, every row's estimator call (the test). ``--tiny --cpu``: one tiny-model
row through the same runner on a CPU (the test).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import engine_speed as es  # noqa: E402  (bench/ is not a package)
from results_files import write_results  # noqa: E402  (bench/ is not a package)

CONFIG_DIR = ROOT / "bench" / "configs"
MODELS = {  # key -> (label, published config.json)
    "0.5b": ("Qwen2.5-0.5B", CONFIG_DIR / "qwen2.5-0.5b.json"),
    "1.5b": ("Qwen2.5-1.5B", CONFIG_DIR / "qwen2.5-1.5b.json"),
    "3b": ("Qwen2.5-3B", CONFIG_DIR / "qwen2.5-3b.json"),
    "7b": ("Qwen2.5-7B", CONFIG_DIR / "qwen2.5-7b.json"),
    "8b": ("Llama-3-8B", CONFIG_DIR / "llama-3-8b.json"),
    "14b": ("Qwen2.5-14B", CONFIG_DIR / "qwen2.5-14b.json"),
    "32b": ("Qwen2.5-32B", CONFIG_DIR / "qwen2.5-32b.json"),
    "72b": ("Qwen2.5-72B", CONFIG_DIR / "qwen2.5-72b.json"),
    "tiny": ("tiny", ROOT / "core" / "assets" / "tiny" / "config.json"),
}
for _key, (_label, _path) in MODELS.items():  # engine_speed's runner finds configs by key
    es.CONFIGS.setdefault(_key, _path)

PART_LIMIT_S = 540.0
LORA_DROPOUT = 0.05  # the engine's default
GIB = 2**30
DISK_FREE_GB = 46.0  # what the one-GPU machine's 64 GB disk had free for a run (the 7B full save of 45.7 GB fit)

# ---- the time model (seconds) ------------------------------------------------------------------------
PART_OVERHEAD_S = 30.0  # wheel install + this script's start (imports, model folders)
START_S = 16.0  # `tunedeck train` -> supervisor -> worker imports, Trainer build (engine-0.5b: 2 starts in 46 s)
END_S = 2.0  # the worker's exit, the sampler, the run's files
FIRST_STEP_S = 3.0  # kernel autotuning, allocator warm-up
OOM_STEP_S = 10.0  # at most this much of the first step before an out-of-memory error
COMPILE_S = 60.0  # compile_layers: torch.compile of the decoder layer
BUILD_S_PER_B = 0.4  # random init straight on the GPU, per billion parameters
QLORA_LOAD_S_PER_B = 3.0  # 4-bit load from the random bf16 weights (7B: 20 s in engine-longctx-f)
MATERIALIZE_S_PER_B = 2.5  # those weights made once per model and part (init + 2 GB/B written)
SAVE_GB_PER_S = 0.9  # the final checkpoint (7B pure bf16 full: 45.7 GB in 51 s)
TOKENIZE_PER_S = 150_000.0
STEP_FLOOR_S = 0.15
FUSED_RUNS = ("liger", "triton", "chunked", "none")  # the losses an engine reports it ran (core.train.fused_loss)


@dataclass(frozen=True)
class Row:
    """One configuration of the engine. ``ckpt``: True (every layer), False (off), an int N (the first N
    layers: ``checkpoint_layers: N``) or "auto" (the engine's own choice). ``switches``: other run keys
    (fused_ce, lora_input_upcast, lora_fused_add, compile_layers, qlora_upcast, optimizer, attn)."""

    model: str
    method: str  # full, lora, dora, qlora
    micro: int
    seq: int
    ckpt: bool | int | str = True
    pure_bf16: bool = True  # full only: False = mixed precision (fp32 master weights and moments)
    offload: bool = False  # offload_activations
    tiled_mlp: str | int = "auto"
    switches: tuple[tuple[str, Any], ...] = ()
    axis: str = ""  # what the row covers (report grouping)
    expect: str = "fit"  # "fit" or "oom": what the row is there for (the measurement decides)
    skip: str = ""  # why this row cannot run on the one-GPU machine
    steps: int | None = None  # default: by the row's step time
    prompt: float = 0.0  # the share of each row that is the question (no target): what the LM head skips

    @property
    def name(self) -> str:
        parts = [self.model, self.method + ("" if self.method != "full" else "-bf16" if self.pure_bf16 else "-mixed"),
                 f"b{self.micro}", f"s{self.seq}",
                 {True: "ckpt", False: "nockpt", "auto": "ckpt-auto"}.get(self.ckpt, f"ckpt{self.ckpt}")]
        if self.offload:
            parts.append("offload")
        if self.tiled_mlp != "auto":
            parts.append(f"tiles-{self.tiled_mlp}")
        parts += [f"{k}-{v}".replace("_", "") for k, v in self.switches]
        if self.prompt:
            parts.append(f"prompt{round(100 * self.prompt)}")
        return "-".join(str(p) for p in parts)

    @property
    def switch(self) -> dict[str, Any]:
        return dict(self.switches)

    def overrides(self) -> dict[str, Any]:
        """Run keys beyond engine_speed.run_tunedeck's (which sets method, micro, seq, LoRA r16/32,
        gradient_checkpointing from the spec, pure_bf16 for full)."""
        out: dict[str, Any] = {}
        if self.method == "full" and not self.pure_bf16:
            out["pure_bf16"] = False
        if self.ckpt is not True and self.ckpt is not False:
            out["checkpoint_layers"] = self.ckpt
        if self.offload:
            out["offload_activations"] = True
        if self.tiled_mlp != "auto":
            out["tiled_mlp"] = self.tiled_mlp
        out.update(self.switch)
        return out

    def engine(self) -> str:
        """engine_speed's engine string: ``tunedeck+key=value...`` (values read back as YAML)."""
        text = "tunedeck"
        for key, value in self.overrides().items():
            text += f"+{key}={json.dumps(value) if isinstance(value, bool) else value}"
        return text


def time_speed_factor(row: Row, billions: float) -> float:
    """The engine's tokens/s over the (uncalibrated) estimator's, a little under what the committed runs
    showed: 7B at 2k tokens 1.6-2.0x (engine-speed-*), 7B at 32k-98k 2.6-3.2x (engine-longctx-*), DoRA
    0.74x, 0.5B 0.68-0.86x without checkpointing and down to ~0.55x with it (estimate_calibration.md)."""
    if billions < 2:
        return 0.55
    if row.method == "dora":
        return 0.7
    return 2.5 if row.micro * row.seq >= 32768 else 1.6


def _r(model: str, method: str, micro: int, seq: int, axis: str, **kw: Any) -> Row:
    return Row(model, method, micro, seq, axis=axis, **kw)


# Execution order: grouped by model (a model's QLoRA rows together: its random weights are made once per
# part and deleted before the next model, for the disk), OOM rows last within a model.
ROWS: tuple[Row, ...] = (
    # ---- Qwen2.5-0.5B
    _r("0.5b", "lora", 4, 2048, "size"),
    _r("0.5b", "lora", 1, 1024, "micro", ckpt=False),
    _r("0.5b", "lora", 4, 1024, "micro", ckpt=False),
    _r("0.5b", "lora", 16, 1024, "micro", ckpt=False),
    _r("0.5b", "lora", 8, 4096, "ckpt", ckpt=False),
    _r("0.5b", "lora", 8, 4096, "ckpt"),
    _r("0.5b", "lora", 2, 512, "seq"),
    _r("0.5b", "lora", 1, 32768, "seq"),
    _r("0.5b", "lora", 4, 8192, "switch", switches=(("fused_ce", False),)),
    _r("0.5b", "lora", 4, 2048, "switch", ckpt=False, switches=(("attn", "eager"),)),
    _r("0.5b", "dora", 4, 2048, "method"),
    _r("0.5b", "full", 8, 2048, "method", ckpt=False),
    _r("0.5b", "full", 8, 2048, "method", ckpt=False, pure_bf16=False),
    _r("0.5b", "full", 1, 32768, "seq"),
    _r("0.5b", "qlora", 4, 2048, "method"),
    _r("0.5b", "lora", 4, 16384, "oom", ckpt=False, switches=(("fused_ce", False),), expect="oom"),
    # ---- Qwen2.5-1.5B
    _r("1.5b", "lora", 4, 2048, "size"),
    _r("1.5b", "dora", 4, 2048, "method"),
    _r("1.5b", "full", 8, 2048, "ckpt", ckpt=False),
    _r("1.5b", "full", 8, 2048, "ckpt", ckpt=14),
    _r("1.5b", "full", 8, 2048, "ckpt"),
    _r("1.5b", "full", 4, 2048, "method", pure_bf16=False),
    _r("1.5b", "full", 4, 2048, "switch", pure_bf16=False, switches=(("optimizer", "adamw_torch"),)),
    _r("1.5b", "full", 4, 2048, "switch", pure_bf16=False, switches=(("optimizer", "adamw_8bit"),)),
    _r("1.5b", "qlora", 4, 2048, "method"),
    # ---- Qwen2.5-3B
    _r("3b", "lora", 4, 2048, "size"),
    _r("3b", "full", 4, 2048, "method"),
    _r("3b", "full", 2, 2048, "method", pure_bf16=False),
    _r("3b", "qlora", 4, 2048, "method"),
    _r("3b", "qlora", 16, 1024, "micro"),
    _r("3b", "full", 8, 4096, "oom", ckpt=False, pure_bf16=False, expect="oom"),
    # ---- Qwen2.5-7B
    _r("7b", "qlora", 4, 2048, "method"),
    _r("7b", "qlora", 4, 2048, "switch", switches=(("qlora_upcast", True),)),
    _r("7b", "qlora", 1, 32768, "seq", offload=True),
    _r("7b", "qlora", 1, 131072, "seq", offload=True),
    _r("7b", "lora", 4, 2048, "size"),
    _r("7b", "lora", 4, 2048, "ckpt", ckpt=False),
    _r("7b", "lora", 4, 2048, "ckpt", ckpt=14),
    _r("7b", "lora", 4, 2048, "ckpt", ckpt="auto"),
    _r("7b", "lora", 1, 1024, "micro"),
    _r("7b", "lora", 8, 1024, "micro"),
    _r("7b", "lora", 16, 1024, "micro"),
    _r("7b", "lora", 1, 8192, "seq"),
    _r("7b", "lora", 1, 32768, "seq"),
    _r("7b", "lora", 1, 65536, "seq"),
    _r("7b", "lora", 1, 65536, "seq", offload=True),
    _r("7b", "lora", 1, 65536, "switch", offload=True, tiled_mlp="false"),
    _r("7b", "lora", 2, 8192, "switch", tiled_mlp=4),
    _r("7b", "lora", 4, 2048, "switch", switches=(("fused_ce", False),)),
    _r("7b", "lora", 4, 2048, "switch", switches=(("fused_ce", "chunked"),)),
    _r("7b", "lora", 4, 2048, "switch", switches=(("lora_input_upcast", True),)),
    _r("7b", "lora", 4, 2048, "switch", switches=(("lora_fused_add", False),)),
    _r("7b", "lora", 4, 2048, "switch", switches=(("compile_layers", True),)),
    _r("7b", "dora", 4, 2048, "method"),
    _r("7b", "dora", 2, 2048, "ckpt", ckpt=False),
    _r("7b", "full", 4, 2048, "method"),
    _r("7b", "full", 4, 2048, "ckpt", ckpt="auto"),
    _r("7b", "full", 2, 2048, "method", pure_bf16=False,
       skip="final checkpoint ~91 GB (fp32 weights + moments) > the 64 GB disk: the engine refuses it up front"),
    _r("7b", "lora", 8, 2048, "edge", ckpt=False),  # near the edge: fits (115.7 GiB in engine-speed-lora-a)
    # declared to run out of memory; it ran (3 steps, 138.9 of 140.4 GiB, part 6): the edge from the other side
    _r("7b", "lora", 10, 2048, "edge", ckpt=False, steps=3),
    # ran out of memory on the engine before the fused LoRA kernels (part 6, 139.1 GiB); estimated to fit on the engine
    # with them (96 GiB: no dropped-out copies or masks kept); it ran in 94.6 (calibration-edges-e)
    _r("7b", "lora", 1, 24576, "edge", ckpt=False, steps=3),
    _r("7b", "full", 8, 4096, "oom", ckpt=False, expect="oom"),
    # ---- Llama-3-8B
    _r("8b", "qlora", 4, 2048, "size"),
    _r("8b", "qlora", 1, 131072, "seq", offload=True),
    # ran out of memory on the engine before the fused LoRA kernels (part 6, 139.7 GiB); estimated to fit on the engine
    # with them (118 GiB: no dropped-out copies or masks kept); it ran in 117.8 (calibration-edges-e)
    _r("8b", "qlora", 1, 32768, "edge", ckpt=False, steps=3),
    _r("8b", "lora", 4, 2048, "size"),
    _r("8b", "lora", 1, 32768, "seq", offload=True),
    # ---- Qwen2.5-14B
    _r("14b", "qlora", 4, 2048, "size"),
    _r("14b", "lora", 4, 2048, "size"),
    _r("14b", "lora", 1, 32768, "seq", offload=True),
    _r("14b", "full", 1, 2048, "method",
       skip="final checkpoint ~89 GB (bf16 weights + moments) > the 64 GB disk: the engine refuses it up front"),
    # ---- Qwen2.5-32B
    _r("32b", "lora", 2, 2048, "size"),
    # ran out of memory on the engine before the fused LoRA kernels (part 7, 139.8 GiB); estimated to fit on the engine
    # with them (107 GiB: no dropped-out copies or masks kept); it ran in 107.6 (calibration-edges-e)
    _r("32b", "lora", 2, 2048, "edge", ckpt=False, steps=3),
    _r("32b", "qlora", 4, 2048, "size", skip="QLoRA of a bare config writes its bf16 random weights first: 66 GB > disk"),
    _r("32b", "full", 1, 2048, "oom", expect="oom",
       skip="final checkpoint ~197 GB > the 64 GB disk: the engine refuses it before it could run out of memory"),
    # ---- Qwen2.5-72B
    _r("72b", "lora", 1, 2048, "oom", expect="oom"),  # near the edge: 135 GiB of weights
    _r("72b", "qlora", 1, 2048, "size", skip="QLoRA of a bare config writes its bf16 random weights first: 145 GB > disk"),
    # ---- The tiled MLP's cost, added after parts 1-3 ran (appended, so that those parts keep their rows):
    # the 0.5B row of part 1 that ran in 37 tiles (11.9k tok/s), untiled; and 7B at 16k / 24k tokens tiled
    # (as the engine's rule tiles them: 5 and 7 tiles) against untiled, which the long-context issue left open.
    _r("0.5b", "lora", 8, 4096, "tiles", tiled_mlp="false"),
    _r("7b", "lora", 1, 16384, "tiles", tiled_mlp=5),
    _r("7b", "lora", 1, 16384, "tiles", tiled_mlp="false"),
    _r("7b", "lora", 1, 24576, "tiles", tiled_mlp=7),
    _r("7b", "lora", 1, 24576, "tiles", tiled_mlp="false"),
    # ---- Steps that wait on the CPU, at other layer counts than the 0.5B's 24 and the 1.5B/7B's 28 (added with
    # the garbage-collector fix, for the per-layer launch cost): 36 layers untiled, 48 checkpointed, QLoRA's
    # dequantisation calls at a token count where the GPU has little to do.
    _r("3b", "lora", 1, 1024, "host", ckpt=False),
    _r("14b", "lora", 1, 1024, "host"),
    _r("1.5b", "qlora", 1, 1024, "host"),
    # ---- The out-of-memory side of the edges the fused LoRA kernels moved (the three rows above that ran out of
    # memory before them are estimated to fit now): twice their tokens; both ran out of memory (calibration-edges-e)
    _r("7b", "lora", 1, 49152, "oom", ckpt=False, expect="oom"),
    _r("32b", "lora", 4, 2048, "oom", ckpt=False, expect="oom"),
    # ---- Half of every row a prompt without a target, which tunedeck's loss keeps out of the LM head
    # (``TrainingPlan.target_share``): against the same rows without one (0.5b-lora-b8-s4096-nockpt,
    # 7b-lora-b4-s2048-ckpt, and the wizard's 7B plan's shape), in one call
    _r("0.5b", "lora", 8, 4096, "prompt", ckpt=False, prompt=0.5),
    _r("7b", "lora", 4, 2048, "prompt", prompt=0.5),
    _r("7b", "lora", 16, 2048, "prompt", ckpt=False),
    _r("7b", "lora", 16, 2048, "prompt", ckpt=False, prompt=0.5),
)
TINY_ROWS: tuple[Row, ...] = (_r("tiny", "lora", 2, 128, "tiny", ckpt=False, steps=4),)


def log(text: str) -> None:
    print(f"[calibration_matrix {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---- the estimator for a row -----------------------------------------------------------------------------
def run_values(row: Row) -> dict[str, Any]:
    """The row's run keys as ``tunedeck train`` reads them (the estimator maps them with
    ``core.estimate.run_plan``, as the engine's launcher does)."""
    values: dict[str, Any] = {
        "model": str(MODELS[row.model][1]), "method": row.method, "precision": "bf16",
        "pure_bf16": row.pure_bf16 and row.method == "full", "micro_batch_size": row.micro, "max_seq_len": row.seq,
        "gradient_accumulation": 1, "gradient_checkpointing": row.ckpt is not False,
        "checkpoint_layers": row.ckpt if isinstance(row.ckpt, int) and not isinstance(row.ckpt, bool)
        else "auto" if row.ckpt == "auto" else "all",
        "offload_activations": row.offload, "tiled_mlp": row.tiled_mlp, "lora_rank": 16, "lora_dropout": LORA_DROPOUT,
    }
    values.update(row.switch)  # fused_ce, optimizer, attn, qlora_upcast, ... as the row sets them
    return values


def _layers_for_auto(row: Row, gpu_name: str) -> int | None:
    """``checkpoint_layers: auto`` as the engine's launcher resolves it (None: every layer)."""
    from core.estimate.checkpointing import resolve_checkpoint_layers

    value = resolve_checkpoint_layers(SimpleNamespace(**run_values(row)), gpu_name)
    return None if value == "all" else int(value)


def plan_options(row: Row, gpu_name: str = "H200", fused_run: str | None = None,
                 layers_run: int | None = None, target_share: float | None = None) -> dict[str, Any]:
    """``core.estimate.TrainingPlan`` options for the row's run keys (``core.estimate.run_plan``, on a GPU
    with liger-kernel installed, as the device has). ``fused_run`` / ``layers_run``: the loss (FUSED_RUNS) and the
    checkpointed layer count the engine reported it ran; ``target_share``: the share of the data's tokens with a
    target (``target_share()``; default: what the row's prompt leaves)."""
    from core.estimate.run_plan import plan_options_for_run

    values = run_values(row)
    options = plan_options_for_run(values)
    fused = values.get("fused_ce", "auto")
    if fused_run is None:  # what the engine resolves on a GPU with liger-kernel installed (the device has it)
        fused_run = "none" if fused is False else fused if fused in ("chunked", "liger") else "triton"
    options.update(fused_ce=fused_run != "none", fused_ce_impl=fused_run if fused_run != "none" else "triton",
                   target_share=1.0 - row.prompt if target_share is None else target_share)
    if layers_run is not None and row.ckpt is not False:
        options["checkpoint_layers"] = int(layers_run)
    elif row.ckpt == "auto":
        options["checkpoint_layers"] = _layers_for_auto(row, gpu_name)
    return options


def estimate_row(row: Row, gpu_name: str | None = None, fused_run: str | None = None,
                 layers_run: int | None = None, target_share: float | None = None) -> dict[str, Any]:
    """The estimator's peak, tokens/s and fit verdict for the row on ``gpu_name`` (default H200), ``tiled_mlp:
    auto`` chosen by fit as the launcher chooses it."""
    from core.estimate import plan_for_model

    gpu = gpu_name or "H200"
    try:
        plan = plan_for_model(str(MODELS[row.model][1]), exact_count=False,
                              **plan_options(row, gpu, fused_run, layers_run, target_share))
    except Exception as exc:  # reported in the row, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
    return estimate_plan(plan, gpu)


ROWS_BY_NAME: dict[str, Row] = {r.name: r for r in ROWS}


def plan_as_run(record: dict[str, Any]) -> tuple[Row, Any] | None:
    """The declared row of a measured record and the ``TrainingPlan`` of what the engine reported it ran: the
    loss, the checkpointed layers and ``tiled_mlp`` (``false`` where the launcher resolved ``auto`` untiled;
    ``auto`` otherwise, the engine's own rule: estimate it with ``tiles_by_fit=False``). None: not declared."""
    from core.estimate import plan_for_model

    row = ROWS_BY_NAME.get(record["row"])
    if row is None:
        return None
    layers = record.get("checkpoint_layers_run")
    fused = record.get("fused_ce_run") if record.get("fused_ce_run") in FUSED_RUNS else None
    options = plan_options(row, "H200", fused, layers if isinstance(layers, int) else None, record.get("target_share"))
    if record.get("tiled_mlp_run") is not None:
        options["tiled_mlp"] = record["tiled_mlp_run"]
    # the engine's switches as it reported them; one it did not report ran as its default did then: off in the
    # files from before the fused LoRA kernels (none of them existed yet), on where the plan turns it on in the
    # later ones (whose records kept three of the switches: measure_row's list was short)
    later = engine_generation(record.get("file", "")) >= KERNELS_GENERATION
    for key in es.LORA_SWITCHES:
        ran = record.get(f"{key}_run")
        if ran is not None or not later or key in SWITCHES_AFTER_KERNELS:
            options[key] = bool(ran)
    return row, plan_for_model(str(MODELS[row.model][1]), exact_count=False, **options)


def estimate_plan(plan: Any, gpu_name: str, tiles_by_fit: bool = True) -> dict[str, Any]:
    """The estimate of ``plan`` on ``gpu_name`` as a record's ``estimate`` (see ``core.estimate.estimate``)."""
    from core.estimate import estimate, find_gpu

    try:
        result = estimate(plan, find_gpu(gpu_name), tiles_by_fit=tiles_by_fit)
    except Exception as exc:  # reported in the row, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
    static = sum(v for k, v in result.breakdown.items() if k in ("weights", "cuda_context"))
    return {"peak_gib": round(result.peak_gib, 2), "tokens_per_s": round(result.tokens_per_s, 1),
            "verdict": result.verdict, "fits": result.fits, "capacity_gib": round(result.capacity_gib, 2),
            "margin_gib": round(result.margin_gib, 2), "peak_phase": result.peak_phase,
            "weights_gib": round(static, 2), "seconds_per_step": round(result.seconds_per_step, 3),
            "total_params": result.total_params, "checkpointed_layers": plan.checkpointed_layers,
            "mlp_tiles": result.plan["mlp_tiles"],
            "fused_ce": "none" if not plan.fused_ce else plan.fused_ce_impl,
            "breakdown_gib": {k: round(v, 2) for k, v in result.breakdown.items()}}


# ---- the time model --------------------------------------------------------------------------------------
def row_steps(row: Row, est: dict[str, Any] | None = None, steps: int | None = None) -> tuple[int, int]:
    """(steps, warm-up steps left out of the rate): enough steps for a steady rate, few where one is long.
    ``steps`` (``--steps``) overrides the row's count, for a longer window on rows whose steps are short."""
    if steps:
        return steps, max(4, steps // 5)
    if row.steps:
        return row.steps, max(1, row.steps // 3)
    if row.expect == "oom":
        return 3, 1
    tokens = row.micro * row.seq
    if tokens >= 65536:
        return 2, 1
    if tokens >= 32768:
        return 3, 1
    step_s = (est or {}).get("seconds_per_step") or 1.0
    return (12, 4) if step_s < 0.4 else (6, 2)


def checkpoint_gb(row: Row) -> float:
    """The final checkpoint the engine writes (``core.runs.disk_space``'s own size)."""
    from core.runs.disk_space import estimate_checkpoint_size

    cfg = {"model": str(MODELS[row.model][1]), "method": row.method, "lora_rank": 16,
           "optimizer": row.switch.get("optimizer", "auto"), "pure_bf16": row.method == "full" and row.pure_bf16,
           "precision": "bf16", "zero_stage": 0}
    size = estimate_checkpoint_size(cfg)
    return size.total / 1e9 if size else 0.0


def disk_gb(row: Row) -> float:
    """What the row holds on the disk at once: its final checkpoint, and for QLoRA of a bare config the
    bf16 random weights it is quantised from (2 bytes a parameter). Rows above ``DISK_FREE_GB`` are
    declared skipped (the test checks both ways)."""
    total = estimate_row(row).get("total_params") or 0
    return checkpoint_gb(row) + (2 * total / 1e9 if row.method == "qlora" else 0.0)


def expected_seconds(row: Row, est: dict[str, Any], materialize: bool) -> float:
    """What the row should take on the H200 (the sum of the module's time constants)."""
    if row.skip:
        return 0.0
    billions = (est.get("total_params") or 0) / 1e9
    steps, _ = row_steps(row, est)
    build = 3.0 + (QLORA_LOAD_S_PER_B if row.method == "qlora" else BUILD_S_PER_B) * billions
    made = (5.0 + MATERIALIZE_S_PER_B * billions) if materialize and row.method == "qlora" else 0.0
    records = row.micro * steps + 2
    data = 2.0 + records * row.seq / TOKENIZE_PER_S
    speed = (est.get("tokens_per_s") or 1000.0) * time_speed_factor(row, billions)
    step = max(STEP_FLOOR_S, row.micro * row.seq / speed)
    compile_s = COMPILE_S if row.switch.get("compile_layers") else 0.0
    if row.expect == "oom":
        at_build = (est.get("weights_gib") or 0) > (est.get("capacity_gib") or 1e9)
        return START_S + data + made + build + (0.0 if at_build else FIRST_STEP_S + min(step, OOM_STEP_S)) + END_S
    save = checkpoint_gb(row) / SAVE_GB_PER_S + 1.0
    return START_S + data + made + build + compile_s + FIRST_STEP_S + steps * step + save + END_S


def plan_parts(rows: tuple[Row, ...], limit_s: float = PART_LIMIT_S) -> list[list[tuple[Row, float]]]:
    """Rows in order into parts of at most ``limit_s`` (part overhead included); a part pays the random
    weights of each QLoRA model it runs once."""
    parts: list[list[tuple[Row, float]]] = []
    current: list[tuple[Row, float]] = []
    used = PART_OVERHEAD_S
    made: set[str] = set()
    for row in rows:
        est = estimate_row(row)
        if row.skip:
            current.append((row, 0.0))
            continue
        cost = expected_seconds(row, est, materialize=row.model not in made)
        if current and used + cost > limit_s and any(s > 0 for _, s in current):
            parts.append(current)
            current, used, made = [], PART_OVERHEAD_S, set()
            cost = expected_seconds(row, est, materialize=True)
        current.append((row, cost))
        used += cost
        if row.method == "qlora":
            made.add(row.model)
    if current:
        parts.append(current)
    return parts


def part_seconds(part: list[tuple[Row, float]]) -> float:
    return PART_OVERHEAD_S + sum(s for _, s in part)


# ---- measurement -----------------------------------------------------------------------------------------
def _classify(result: dict[str, Any]) -> tuple[str, str | None]:
    status = result.get("status")
    if status == "finished":
        return "finished", None
    if result.get("oom"):
        return "oom", str(result.get("reason") or "out of memory")[:300]
    return "failed", f"{status}: {result.get('reason') or 'no reason given'}"[:400]


def _error(estimated: float | None, measured: float | None) -> float | None:
    return round((estimated - measured) / measured, 4) if estimated and measured else None


def target_share(path: Path, seq: int) -> float | None:
    """The share of the data's tokens that have a target at ``seq`` tokens a row, as the planner counts it
    (``core.plan.summarise_dataset`` with the bench models' tokenizer): what the estimate's LM head reads."""
    from core.assets import tiny_model_dir
    from core.plan import summarise_dataset

    share = summarise_dataset(path, str(tiny_model_dir())).target_share(seq)
    return None if share is None else round(share, 4)


def measure_row(ctx: dict[str, Any], row: Row, timeout_s: float, gpu_name: str | None) -> dict[str, Any]:
    """The row through engine_speed.run_engine (``tunedeck train``), then the estimate for what ran."""
    steps, warmup = row_steps(row, estimate_row(row, gpu_name), ctx.get("steps_override"))
    spec = {"model": row.model, "method": row.method, "micro": row.micro, "seq": row.seq, "gpus": 1,
            "ckpt": row.ckpt is not False, "name": f"cal-{row.model}-{row.method}"}
    # --profile N: N more steps, torch-profiled after the row's own (its rate is taken before them)
    extra = ctx.get("profile_steps", 0)
    ctx["dataset"] = lambda seq, n=row.micro * (steps + extra) + 2: ctx["datasets"](seq, n, round(row.prompt * seq))
    row_ctx = {**ctx, "steps": steps + extra, "warmup": warmup, "profile": f"{steps + 1}:{extra}" if extra else ""}
    began = time.monotonic()
    result = es.run_engine(row_ctx, row.engine(), spec, row.seq, timeout_s)
    wall = round(time.monotonic() - began, 1)
    status, reason = _classify(result)
    fused_run = result.get("fused_ce") if result.get("fused_ce") in FUSED_RUNS else None
    layers_run = result.get("checkpoint_layers_run")
    share = target_share(ctx["dataset"](row.seq), row.seq)
    estimate = estimate_row(row, gpu_name, fused_run, layers_run if isinstance(layers_run, int) else None, share)
    peak = max(result["peak_gib"]) if result.get("peak_gib") else None
    out = {
        "status": status, "reason": reason, "engine": row.engine(), "steps": result.get("steps"),
        "steps_asked": steps, "warmup": warmup, "wall_s": wall,
        "peak_gib": peak, "peak_source": result.get("peak_source"),
        "torch_peak_allocated_gib": result.get("torch_peak_allocated_gib"),
        "torch_peak_reserved_gib": result.get("torch_peak_reserved_gib"),
        "tokens_per_s": result.get("tokens_per_s"), "rate_from": result.get("rate_from"), "mfu": result.get("mfu"),
        "step_s": result.get("step_s"),
        "loss": result.get("loss"), "optimizer_run": result.get("optimizer"), "fused_ce_run": result.get("fused_ce"),
        "checkpoint_layers_run": layers_run, "tiled_mlp_run": result.get("tiled_mlp_run"),
        **{f"{key}_run": result.get(f"{key}_run") for key in es.LORA_SWITCHES},
        "config_run": result.get("config"), "target_share": share, "estimate": estimate,
    }
    if result.get("profile"):
        out["profile"] = result["profile"]
    if result.get("peak_source") == "nvml":  # the errors mean something against the GPU's memory only
        out["peak_error"] = _error(estimate.get("peak_gib"), peak) if status == "finished" else None
        out["speed_error"] = _error(estimate.get("tokens_per_s"), result.get("tokens_per_s")) \
            if status == "finished" else None
    return out


def drop_random_weights(ctx: dict[str, Any], keep: str | None) -> None:
    """Free the disk of the bare configs' random bf16 weights unless the next row needs ``keep``'s."""
    made = ctx.setdefault("weights_made", set())
    if made and made != ({keep} if keep else set()):
        shutil.rmtree(ctx["home"] / "cache" / "random-init", ignore_errors=True)
        made.clear()


# ---- report ----------------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return f"{value:+.1%}" if value is not None else "-"


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(f"{v:.{digits}f}" for v in value) or "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def verdict_right(record: dict[str, Any]) -> bool | None:
    """Finished: the estimate must put the peak within the GPU (fits or tight); out of memory: it must say
    does_not_fit. None where the row says nothing about fitting (failed otherwise, skipped, no estimate)."""
    verdict = (record.get("estimate") or {}).get("verdict")
    if verdict is None:
        return None
    if record.get("status") == "finished":
        return verdict in ("fits", "tight")
    if record.get("status") == "oom":
        return verdict == "does_not_fit"
    return None


def table(records: list[dict[str, Any]]) -> list[str]:
    lines = ["| # | row | axis | status | steps | peak GiB (NVML) | torch alloc / reserved | est. GiB | err | "
             "tok/s | est. tok/s | err | est. verdict | verdict ok | wall s (model) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(records, 1):
        est = r.get("estimate") or {}
        status = r.get("status") or "-"
        if r.get("reason") and status != "finished":
            status += f" ({str(r['reason'])[:70]})"
        ok = verdict_right(r)
        lines.append("| " + " | ".join([
            str(i), r["row"], r.get("axis", ""), status.replace("|", "/"), _num(r.get("steps")),
            _num(r.get("peak_gib"), 2),
            f"{_num(r.get('torch_peak_allocated_gib'))} / {_num(r.get('torch_peak_reserved_gib'))}",
            _num(est.get("peak_gib"), 2) if "error" not in est else f"error: {est['error'][:60]}",
            _pct(r.get("peak_error")), _num(r.get("tokens_per_s")), _num(est.get("tokens_per_s")),
            _pct(r.get("speed_error")), est.get("verdict") or "-", {True: "yes", False: "**NO**", None: "-"}[ok],
            f"{_num(r.get('wall_s'))} ({_num(r.get('expected_s'), 0)})"]) + " |")
    return lines


def render_part(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Calibration matrix, {meta.get('part_label', 'rows')}: the engine vs the estimator (issue #19)", "",
             f"{meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}. "
             f"Command: `{meta['command']}`. Errors: (estimate - measured) / measured, peak against "
             f"{'NVML (all compute processes)' if meta.get('peak_source') == 'nvml' else 'the RSS of the run (CPU: no error computed)'}.",
             ""]
    return "\n".join(lines + table(records)) + "\n"


TARGETS = {"peak_median": 0.04, "peak_worst": 0.12, "peak_under": -0.05, "speed_median": 0.10,
           "speed_worst": 0.25, "rows": 60}


def target_lines(records: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """The issue's targets as pass/fail lines, each computed from the rows it names; and whether all pass."""
    measured = [r for r in records if r.get("status") in ("finished", "oom")]
    peaks = [r["peak_error"] for r in records if r.get("status") == "finished" and r.get("peak_error") is not None]
    speeds = [r["speed_error"] for r in records if r.get("status") == "finished" and r.get("speed_error") is not None]
    finished = [r for r in records if r.get("status") == "finished"]
    verdicts = [(r, verdict_right(r)) for r in measured]
    lines, all_ok = [], True

    def check(ok: bool, text: str) -> None:
        nonlocal all_ok
        all_ok = all_ok and ok
        lines.append(f"- {'PASS' if ok else 'FAIL'}: {text}")

    check(len(measured) >= TARGETS["rows"],
          f"{len(measured)} rows measured by the engine (finished or out of memory; target >= {TARGETS['rows']})")
    check(bool(peaks) and len(peaks) == len(finished),
          f"peak error known for {len(peaks)} of {len(finished)} finished rows (every one needs its NVML peak)")
    if peaks:
        med, worst, under = statistics.median(abs(e) for e in peaks), max(abs(e) for e in peaks), min(peaks)
        check(med <= TARGETS["peak_median"], f"peak memory median |error| {med:.1%} (target <= 4%)")
        check(worst <= TARGETS["peak_worst"], f"peak memory worst |error| {worst:.1%} (target <= 12%)")
        low = [r["row"] for r in finished if (r.get("peak_error") or 0) < TARGETS["peak_under"]]
        check(under >= TARGETS["peak_under"], f"peak memory most under the measurement {under:+.1%} "
              f"(target: never more than 5% under){'; under: ' + ', '.join(low) if low else ''}")
    check(bool(speeds) and len(speeds) == len(finished),
          f"tokens/s error known for {len(speeds)} of {len(finished)} finished rows")
    if speeds:
        med, worst = statistics.median(abs(e) for e in speeds), max(abs(e) for e in speeds)
        check(med <= TARGETS["speed_median"], f"tokens/s median |error| {med:.1%} (target <= 10%)")
        check(worst <= TARGETS["speed_worst"], f"tokens/s worst |error| {worst:.1%} (target <= 25%)")
    wrong = [r["row"] for r, ok in verdicts if ok is False]
    unknown = [r["row"] for r, ok in verdicts if ok is None]
    ooms = sum(1 for r in measured if r["status"] == "oom")
    check(bool(verdicts) and not wrong and not unknown,
          f"fit verdict right for {sum(1 for _, ok in verdicts if ok)} of {len(verdicts)} measured rows "
          f"({ooms} out of memory){'; wrong: ' + ', '.join(wrong) if wrong else ''}"
          f"{'; no estimate: ' + ', '.join(unknown) if unknown else ''}")
    return lines, all_ok


def render_report(records: list[dict[str, Any]], sources: list[str], again: bool = False) -> str:
    lines_targets, all_ok = target_lines(records)
    failed = [r for r in records if r.get("status") == "failed"]
    skipped = [r for r in records if r.get("status") == "skipped"]
    tight = [r["row"] for r in records if r.get("status") == "finished" and (r.get("estimate") or {}).get("verdict") == "tight"]
    lines = ["# Estimator calibration matrix: the engine (`tunedeck train`) vs `core.estimate` (issue #19)", "",
             f"Merged by `bench/calibration_matrix.py --report-only` from {', '.join(sources)}. "
             "Peak: NVML, all compute processes, sampled every 0.1 s; tokens/s: the engine's steady rate "
             "(non-padding tokens of packed rows after the warm-up steps). Error = (estimate - measured) / measured. "
             + ("Estimates: made again by the estimator as it is now (`--reestimate`), for the settings each row "
                "ran." if again else "Estimates: as recorded when each row was measured."),
             "", "## Targets", ""] + lines_targets + [
             "", f"Overall: {'all targets met' if all_ok else 'targets NOT met'}.", ""]
    if tight:
        lines.append(f"Finished rows the estimator called tight (under capacity, inside its margin): {', '.join(tight)}.")
        lines.append("")
    if failed:
        lines += ["Failed for other reasons than memory (not counted): "
                  + "; ".join(f"{r['row']} ({str(r.get('reason'))[:80]})" for r in failed), ""]
    if skipped:
        lines += ["Skipped: " + "; ".join(f"{r['row']} ({r.get('reason')})" for r in skipped), ""]
    names = {r["row"] for r in records}
    missing = [row.name for row in ROWS if row.name not in names]
    if missing and names & {row.name for row in ROWS}:
        lines += [f"Declared but in none of these files ({len(missing)}: parts not run yet): {', '.join(missing)}", ""]
    by_axis: dict[str, list[float]] = {}
    for r in records:
        if r.get("peak_error") is not None:
            by_axis.setdefault(r.get("axis", ""), []).append(abs(r["peak_error"]))
    if by_axis:
        lines += ["Median |peak error| by axis: " + ", ".join(
            f"{axis} {statistics.median(v):.1%} ({len(v)})" for axis, v in sorted(by_axis.items())), ""]
    lines += memory_terms(records)
    lines += ["## Rows", ""] + table(records)
    return "\n".join(lines) + "\n"


def memory_terms(records: list[dict[str, Any]]) -> list[str]:
    """Two terms of the peak that the rows measure directly, against the estimator's: what NVML sees above
    torch's reserved memory (the CUDA context and the libraries' workspaces), and torch's reserved above
    its allocated memory (the caching allocator's slack)."""
    rows = [r for r in records if r.get("status") == "finished" and r.get("peak_source") == "nvml"
            and r.get("torch_peak_reserved_gib") and r.get("torch_peak_allocated_gib")]
    if not rows:
        return []
    context = [r["peak_gib"] - max(r["torch_peak_reserved_gib"]) for r in rows]
    modelled = [(r.get("estimate") or {}).get("breakdown_gib", {}).get("cuda_context") for r in rows]
    lines = ["## Two memory terms measured directly", "",
             f"- NVML above torch's reserved memory (CUDA context, cuBLAS/cuDNN workspaces): median "
             f"{statistics.median(context):.2f} GiB, {min(context):.2f}-{max(context):.2f} over {len(rows)} rows; "
             f"the estimate's cuda_context: {', '.join(sorted({f'{m:.2f}' for m in modelled if m is not None}))} GiB.",
             "- torch's reserved above its allocated memory at the peak (the caching allocator's slack) against "
             "the estimate's allocator_slack, GiB:", "",
             "| row | reserved - allocated | estimate's slack | peak phase (estimate) |", "|---|---|---|---|"]
    for r in rows:
        slack = max(r["torch_peak_reserved_gib"]) - max(r["torch_peak_allocated_gib"])
        est = r.get("estimate") or {}
        lines.append(f"| {r['row']} | {slack:.2f} | {est.get('breakdown_gib', {}).get('allocator_slack', '-')} | "
                     f"{est.get('peak_phase', '-')} |")
    return lines + [""]


def reestimate(record: dict[str, Any], gpu_name: str = "H200") -> dict[str, Any]:
    """``record`` with its estimate made again by the estimator as it is now (for the same settings: the loss
    and the checkpointed layers the engine reported, the tiled MLP as it ran) and its errors with it."""
    ran = plan_as_run(record)
    if ran is None or record.get("status") not in ("finished", "oom"):
        return record
    estimate = estimate_plan(ran[1], gpu_name, tiles_by_fit=False)
    out = {**record, "estimate": estimate}
    if record.get("status") == "finished" and record.get("peak_source") == "nvml":
        out["peak_error"] = _error(estimate.get("peak_gib"), record.get("peak_gib"))
        out["speed_error"] = _error(estimate.get("tokens_per_s"), record.get("tokens_per_s"))
    return out


# Files measured after the engine began freezing its setup's objects out of the garbage collector (81a334d):
# from there the steps that wait on the CPU ran 15-60% faster (every full collection had walked over a million
# objects), so such a file's row stands for the engine as it is, whatever an earlier file says of it.
# Files measured on the engine with the fused LoRA kernels (sessions 13-21: the grouped LoRA node, the dropout,
# SwiGLU and norm kernels, no host synchronisation in a step; measured at f1e5be5): its LoRA and QLoRA rows ran
# 8-47% faster than the same rows before it, more than the switches the estimator models account for.
KERNELS_GENERATION = 2
# Switches younger than the kernels generation's files: a record without one ran without it
SWITCHES_AFTER_KERNELS = ("lora_fold_dh", "lora_swiglu_db")
# Files measured after offload_activations' prefetch took its buffers from the compute stream's pool (session 23):
# the offloaded rows' reserved memory fell by up to 4 GiB (the side stream's pool had held ~10 block inputs).
PREFETCH_GENERATION = 3
ENGINE_GENERATIONS: tuple[tuple[str, int], ...] = (("calibration-gcfreeze-", 1),
                                                   ("calibration-kernels-", KERNELS_GENERATION),
                                                   ("calibration-edges-", KERNELS_GENERATION),
                                                   ("calibration-offload-", PREFETCH_GENERATION))


def engine_generation(name: str) -> int:
    """Which engine a result file measured: 0 before the garbage-collector fix, 1 after it, 2 with the fused
    LoRA kernels, 3 with the offload prefetch's fix (ENGINE_GENERATIONS)."""
    return max((g for prefix, g in ENGINE_GENERATIONS if Path(name).name.startswith(prefix)), default=0)


def merged_records(files: list[str], again: bool = False) -> list[dict[str, Any]]:
    """The records of the result files, one per row, each saying its ``file``. A row measured by a later
    engine (``engine_generation``) stands for it; within one engine the first finished or out-of-memory
    record stands (a skipped or failed one is replaced), and when several calls finished the row its
    tokens/s is their mean (``rates`` lists each call's: on the rows that wait on the CPU the box's calls
    differ by up to a third). ``again``: each estimated again (``reestimate``)."""
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for name in sorted(files, key=lambda f: -engine_generation(f)):  # stable: the given order within one
        data = json.loads(Path(name).read_text(encoding="utf-8"))
        gpu = (data.get("meta") or {}).get("gpu_name") or "H200"
        for r in data["results"]:
            r = {**r, "file": Path(name).name}  # before reestimate: plan_as_run reads the switches by file
            if again:
                r = reestimate(r, gpu)
            if r.get("status") == "finished" and r.get("tokens_per_s"):
                r["rates"] = [[r["file"], r["tokens_per_s"]]]
            if r["row"] not in seen:
                seen[r["row"]] = len(records)
                records.append(r)
                continue
            kept = records[seen[r["row"]]]
            if kept.get("status") not in ("finished", "oom"):
                records[seen[r["row"]]] = r
            elif (r.get("rates") and kept.get("rates")
                  and engine_generation(kept["file"]) == engine_generation(r["file"])):
                kept["rates"] += r["rates"]
                kept["tokens_per_s"] = round(statistics.mean(rate for _, rate in kept["rates"]), 1)
                kept["speed_error"] = _error((kept.get("estimate") or {}).get("tokens_per_s"), kept["tokens_per_s"])
    return records


def repeat_lines(files: list[str]) -> list[str]:
    """The rows that finished in more than one call, with each call's tokens/s: the spread is the device's
    run-to-run noise on that row, which no fit can read tighter. Calls that ran the row differently (the
    launcher's ``tiled_mlp: auto`` resolved by fit since 504ff0a, by the engine's rule before) say how."""
    measured: dict[str, list[tuple[str, float, Any]]] = {}
    for name in sorted(files, key=lambda f: -engine_generation(f)):
        for r in json.loads(Path(name).read_text(encoding="utf-8"))["results"]:
            if r.get("status") == "finished" and r.get("tokens_per_s"):
                measured.setdefault(r["row"], []).append((Path(name).name, float(r["tokens_per_s"]),
                                                          r.get("tiled_mlp_run")))
    repeated = {row: runs for row, runs in measured.items() if len(runs) > 1}
    if not repeated:
        return []
    lines = ["## Rows measured more than once", "",
             "The same row finished in more than one call. The tables above count the latest engine's calls "
             "(`engine_generation`: the files after the garbage-collector fix first), their mean where it has "
             "several. The spread, largest over smallest tokens/s, is the device's run-to-run noise on that row "
             "(across the fix: the fix too): a speed error smaller than it cannot be told from noise.", "",
             "| row | tokens/s by call | spread |", "|---|---|---|"]
    for row, runs in repeated.items():
        rates = [rate for _, rate, _ in runs]
        differ = len({tiles for _, _, tiles in runs}) > 1
        lines.append(f"| {row} | " + ", ".join(
            f"{rate:,.0f} ({name}{f', tiled_mlp {tiles}' if differ else ''})" for name, rate, tiles in runs)
            + f" | {'- (run differently)' if differ else f'{max(rates) / min(rates) - 1:+.0%}'} |")
    return [*lines, ""]


def report(files: list[str], out: Path, again: bool = False) -> int:
    records = merged_records(files, again)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(records, [Path(f).name for f in files], again)
    out.write_text("\n".join([text.rstrip("\n"), "", *repeat_lines(files)]).rstrip("\n") + "\n", encoding="utf-8")
    print(out.read_text(encoding="utf-8"))
    return 0 if target_lines(records)[1] else 1


# ---- main ------------------------------------------------------------------------------------------------
def _parse_part(text: str, count: int) -> int:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match:
        raise ValueError(f"--part {text!r}: write K/N")
    k, n = int(match.group(1)), int(match.group(2))
    if n != count or not 1 <= k <= n:
        raise ValueError(f"--part {text}: the rows fall into {count} parts (see --list); write K/{count}")
    return k


def list_parts(parts: list[list[tuple[Row, float]]]) -> str:
    lines = []
    total = 0.0
    for k, part in enumerate(parts, 1):
        seconds = part_seconds(part)
        total += seconds
        lines.append(f"part {k}/{len(parts)}: {seconds:.0f} s expected, {sum(1 for r, _ in part if not r.skip)} rows")
        for row, s in part:
            lines.append(f"  {row.name:<58} {row.axis:<7} {'skipped: ' + row.skip if row.skip else f'{s:5.0f} s'}")
    rows = [r for p in parts for r, _ in p]
    lines.append(f"{len(rows)} rows ({sum(1 for r in rows if not r.skip)} to run, "
                 f"{sum(1 for r in rows if r.skip)} skipped, {sum(1 for r in rows if r.expect == 'oom' and not r.skip)} "
                 f"meant to run out of memory), {len(parts)} parts, {total / 60:.1f} device minutes expected")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the rows, the parts and their expected seconds")
    parser.add_argument("--part", default="", metavar="K/N", help="run part K of the N that --list prints")
    parser.add_argument("--only", default="", metavar="REGEX", help="only the rows whose name matches")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "estimate_matrix"), help="results folder")
    parser.add_argument("--estimate-only", action="store_true", help="no GPU: every row's estimate")
    parser.add_argument("--report-only", nargs="+", metavar="FILE", help="merge part JSONs into the report")
    parser.add_argument("--report", default=str(ROOT / "bench" / "results" / "estimate_matrix" / "engine-matrix.md"))
    parser.add_argument("--reestimate", action="store_true",
                        help="with --report-only: estimate every measured row again with the estimator as it is now")
    parser.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of this call")
    parser.add_argument("--home", default=None, help="TUNEDECK_HOME for runs and caches (default: a temp dir)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="run N more steps per row under torch.profiler (core/train/profiling.py); its summary "
                             "goes into the row's record and STEM-profiles.md (the rate is the row's own steps')")
    parser.add_argument("--steps", type=int, default=0, metavar="N",
                        help="N steps for every row instead of its own count (warm-up N/5, at least 4): a longer "
                             "window for rows whose steps are short")
    parser.add_argument("--tiny", action="store_true", help="the bundled tiny model's row (pipeline test)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (with --tiny)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.report_only:
        return report(args.report_only, Path(args.report), args.reestimate)

    all_rows = TINY_ROWS if args.tiny else ROWS
    parts = plan_parts(all_rows)
    if args.list:
        print(list_parts(parts))
        return 0
    label = "all rows"
    rows = list(all_rows)
    if args.part:
        try:
            k = _parse_part(args.part, len(parts))
        except ValueError as exc:
            parser.error(str(exc))
        rows, label = [r for r, _ in parts[k - 1]], f"part {k}/{len(parts)}"
    if args.only:
        rows = [r for r in rows if re.search(args.only, r.name)]
        label += f" matching {args.only!r}"
    if not rows:
        parser.error("no row selected")
    expected = {r.name: s for part in parts for r, s in part}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = ("calibration-estimates" if args.estimate_only else
            f"calibration-part{args.part.split('/')[0]}" if args.part else "calibration-rows")
    out_json, out_md = out_dir / f"{stem}.json", out_dir / f"{stem}.md"

    import torch
    import transformers

    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the engine's processes too
    cuda = torch.cuda.is_available() and not args.cpu and not args.estimate_only
    gpu_name = torch.cuda.get_device_name(0) if cuda else None
    meta = {"device": f"{gpu_name} x 1" if cuda else "CPU" if not args.estimate_only else "no device (estimates)",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "part_label": label,
            "peak_source": "nvml" if cuda else "rss", "gpu_name": gpu_name,
            "command": "python bench/calibration_matrix.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    records: list[dict[str, Any]] = []

    def record(r: Row, result: dict[str, Any]) -> None:
        records.append({"row": r.name, "axis": r.axis, "expect": r.expect, "settings": asdict(r),
                        "expected_s": round(expected.get(r.name, 0.0), 1), **result})
        write_results(out_md, {"meta": meta, "results": records}, render_part(records, meta))
        profiles = [f"## {rec['row']}\n\n{rec.get('tokens_per_s')} tok/s unprofiled\n\n```\n{rec['profile']}```\n"
                    for rec in records if rec.get("profile")]
        if profiles:
            (out_dir / f"{stem}-profiles.md").write_text("\n".join(profiles), encoding="utf-8")

    if args.estimate_only:
        for r in rows:
            record(r, {"status": "skipped" if r.skip else "estimate only", "reason": r.skip or None,
                       "estimate": estimate_row(r, "H200")})
        bad = [rec["row"] for rec in records if "error" in rec["estimate"]]
        log(f"{len(records)} estimates -> {out_json}{'; errors: ' + ', '.join(bad) if bad else ''}")
        return 1 if bad else 0

    if not cuda and not args.tiny:
        parser.error("the matrix measures the engine on a GPU (--tiny --cpu for the pipeline, --estimate-only)")
    home = Path(args.home or tempfile.mkdtemp(prefix="tunedeck-calibration-"))
    home.mkdir(parents=True, exist_ok=True)
    datasets: dict[tuple[int, int, int], Path] = {}

    def dataset(seq: int, records_n: int, prompt_tokens: int) -> Path:
        key = (seq, records_n, prompt_tokens)
        if key not in datasets:
            datasets[key] = es.make_long_dataset(home, seq, records_n, prompt_tokens)
        return datasets[key]

    ctx: dict[str, Any] = {
        "home": home, "cpu": not cuda, "datasets": dataset, "profile_steps": args.profile, "drop_checkpoints": True,
        "steps_override": args.steps or None,
        "weights_made": set(),  # shared with each row's copy of the context (engine_speed.ensure_random_weights)
        "lora_dropout": LORA_DROPOUT, "peak_flops": es.gpu_peak_flops() if cuda else None,
        "model_dirs": {m: es.make_model_dir(home, m) for m in {r.model for r in rows}},
    }
    for index, r in enumerate(rows):
        if r.skip:
            record(r, {"status": "skipped", "reason": r.skip, "estimate": estimate_row(r, gpu_name)})
            continue
        drop_random_weights(ctx, r.model if r.method == "qlora" else None)
        left = args.budget_s - (time.monotonic() - started)
        if left < min(90.0, 0.5 * expected.get(r.name, 60.0) + 10) and cuda:
            record(r, {"status": "skipped", "reason": f"budget: {left:.0f} s left", "estimate": estimate_row(r, gpu_name)})
            continue
        log(f"{index + 1}/{len(rows)} {r.name} ({left:.0f} s left, ~{expected.get(r.name, 0):.0f} s expected)")
        result = measure_row(ctx, r, max(30.0, left - 10), gpu_name)
        record(r, result)
        log(f"  -> {result['status']} {result.get('tokens_per_s')} tok/s, peak {result.get('peak_gib')} GiB "
            f"(est. {result['estimate'].get('peak_gib')} GiB {result['estimate'].get('verdict')}), {result['wall_s']} s")
    drop_random_weights(ctx, None)
    print(out_md.read_text(encoding="utf-8"))
    return 0 if all(rec["status"] in ("finished", "oom", "skipped") for rec in records) else 1


if __name__ == "__main__":
    sys.exit(main())
