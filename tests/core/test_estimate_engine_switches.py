"""The estimator's view of the engine's speed/memory switches: chunked cross-entropy and QLoRA without upcast."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.estimate import TrainingPlan, architecture_from_config, estimate, find_gpu, plan_for_model
from core.estimate.activations import block_activations, head_activation_bytes
from core.estimate.calibration import DEFAULT_CALIBRATION as CAL
from core.estimate.memory import logits_and_loss_bytes
from core.estimate.precision import precision_layout
from core.train.fused_loss import chunk_tokens_for

H, VOCAB = 64, 1000
TINY = architecture_from_config({
    "model_type": "llama", "hidden_size": H, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB, "tie_word_embeddings": False,
}, name="tiny")


def _layout(p: TrainingPlan):
    return precision_layout(p, CAL.adam8bit_bytes_per_param)


def test_chunked_logits_term_is_one_chunk_of_plain_logits_plus_the_hidden_gradient():
    p = TrainingPlan(architecture=TINY, micro_batch_size=2, seq_len=4096, fused_ce_impl="chunked")
    tokens = 8192
    assert chunk_tokens_for(VOCAB) == 4096 and chunk_tokens_for(152064) == 512
    expected = 4096 * VOCAB * CAL.plain_ce_bytes_per_logit + tokens * H * 2 + 4 * tokens
    assert logits_and_loss_bytes(TINY, p, _layout(p), CAL) == expected
    plain = replace(p, fused_ce=False)
    assert logits_and_loss_bytes(TINY, plain, _layout(plain), CAL) == tokens * VOCAB * CAL.plain_ce_bytes_per_logit
    short = replace(p, micro_batch_size=1, seq_len=100)  # fewer tokens than a chunk: the chunk is the batch
    assert logits_and_loss_bytes(TINY, short, _layout(short), CAL) == (
        100 * VOCAB * CAL.plain_ce_bytes_per_logit + 100 * H * 2 + 400)


def test_chunked_ce_keeps_the_standard_blocks_and_the_head_input():
    """Without Liger its RMSNorm/SwiGLU savings do not apply; the chunks keep the LM head's input."""
    liger = TrainingPlan(architecture=TINY, lora_dropout=0.0)
    chunked = replace(liger, fused_ce_impl="chunked")
    plain = replace(liger, fused_ce=False)
    assert block_activations(TINY, chunked, _layout(chunked), CAL) == block_activations(TINY, plain, _layout(plain), CAL)
    assert block_activations(TINY, liger, _layout(liger), CAL).per_token < block_activations(TINY, chunked, _layout(chunked), CAL).per_token
    assert head_activation_bytes(TINY, chunked, _layout(chunked)) == head_activation_bytes(TINY, plain, _layout(plain)) + 2 * H


def test_chunked_ce_lowers_the_7b_peak_against_plain_logits():
    gpu = find_gpu("H200")
    base = plan_for_model("Qwen2.5-7B", method="lora", micro_batch_size=4, seq_len=2048)
    plain = estimate(replace(base, fused_ce=False), gpu).peak_gib
    chunked = estimate(replace(base, fused_ce_impl="chunked"), gpu).peak_gib
    assert chunked < plain - 5  # 8192 tokens x 152k vocabulary: the plain logits alone are > 10 GiB


def test_qlora_without_upcast_keeps_activations_bf16_and_is_the_default():
    base = plan_for_model("Qwen2.5-7B", method="qlora", micro_batch_size=1, seq_len=8192)
    assert base.kbit_upcast is False
    ours, upcast = _layout(base), _layout(replace(base, kbit_upcast=True))
    assert (ours.residual, ours.frozen_weight) == (2.0, 2.0)
    assert (upcast.residual, upcast.frozen_weight) == (4.0, 4.0)
    gpu = find_gpu("H200")
    assert estimate(base, gpu).peak_gib < estimate(replace(base, kbit_upcast=True), gpu).peak_gib


def test_estimate_cli_flags_for_the_switches(tmp_path, monkeypatch, capsys):
    import json

    from core.cli import main

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    common = ["estimate", "--model", "Qwen2.5-7B", "--method", "qlora", "--seq-len", "8192", "--json"]
    peaks = {}
    for name, extra in (("ours", []), ("chunked", ["--chunked-ce"]), ("upcast", ["--qlora-upcast"])):
        assert main([*common, *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        peaks[name] = out["peak_gib"]
        if name == "chunked":
            assert out["plan"]["fused_ce_impl"] == "chunked" and out["plan"]["kbit_upcast"] is False
        if name == "upcast":
            assert out["plan"]["kbit_upcast"] is True
    assert peaks["ours"] < peaks["chunked"] < peaks["upcast"]


def test_offloaded_activations_leave_two_block_inputs_on_the_gpu():
    """The input of the block being recomputed and the next one's, prefetched (core.train.offload); measured
    on the H200's offloaded rows, whose recompute factor then matches the other rows' (memory-fit.md)."""
    from core.estimate.activations import activation_sizes

    base = plan_for_model("Qwen2.5-7B", method="qlora", micro_batch_size=1, seq_len=32768)
    offloaded = replace(base, offload_activations=True)
    arch = base.architecture
    kept = (arch.num_layers - 2) * 2 * arch.hidden_size * 32768  # bf16 block inputs
    plain_sizes = activation_sizes(arch, base, _layout(base), CAL)
    off_sizes = activation_sizes(arch, offloaded, _layout(offloaded), CAL)
    assert plain_sizes.in_backward - off_sizes.in_backward == pytest.approx(kept)
    gpu = find_gpu("RTX 4090")  # 24 GiB; both tiled as the engine's rule says (by fit, only one would be)
    # 26 inputs of 0.22 GiB less, minus the larger allocator slack offloading was measured to bring
    assert estimate(offloaded, gpu, tiles_by_fit=False).peak_gib < estimate(base, gpu, tiles_by_fit=False).peak_gib - 4.5


def test_tiled_mlp_leaves_one_tile_of_the_mlp_in_the_recomputed_block():
    """``tiled_mlp``: at 96k tokens the recomputed block keeps the MLP's input and one tile of its
    tensors; ``auto`` leaves short micro-batches and blocks that are not checkpointed plain."""
    from core.estimate.activations import activation_sizes, mlp_saved_bytes, recompute_layers

    base = plan_for_model("Qwen2.5-7B", method="qlora", micro_batch_size=1, seq_len=98304, offload_activations=True)
    plain = replace(base, tiled_mlp="false")
    arch = base.architecture
    assert base.mlp_tiles(True) == 28 and base.mlp_tiles(False) == 1
    assert replace(base, seq_len=16383).mlp_tiles(True) == 1 and replace(base, seq_len=16384).mlp_tiles(True) == 5
    tiled_sizes = activation_sizes(arch, base, _layout(base), CAL)
    plain_sizes = activation_sizes(arch, plain, _layout(plain), CAL)
    mlp = mlp_saved_bytes(arch, base, _layout(base)) * 98304
    saved = plain_sizes.in_backward - tiled_sizes.in_backward
    factor = recompute_layers(base, CAL)  # the recomputed block, with its gradients
    assert 0.9 * mlp < saved <= factor * mlp  # all of the MLP's tensors but one tile's
    gpu = find_gpu("RTX 4090")  # 24 GiB
    assert estimate(base, gpu).peak_gib < estimate(plain, gpu).peak_gib - 10


def test_auto_tiles_only_where_the_untiled_plan_does_not_fit():
    """``tiled_mlp: auto`` on a card with room (an H200, 141 GB) leaves a 0.5B LoRA at 32k tokens untiled, and
    the same plan is faster untiled; on a 24 GiB card a 7B QLoRA at 96k tokens keeps its tiles (untiled it
    does not fit). ``tiles_by_fit=False`` is the engine's rule alone (tiled)."""
    small = plan_for_model("Qwen2.5-0.5B", method="lora", micro_batch_size=8, seq_len=4096)
    h200 = find_gpu("H200")
    assert small.mlp_tiles(True) == 37
    chosen, ruled = estimate(small, h200), estimate(small, h200, tiles_by_fit=False)
    assert chosen.plan["mlp_tiles"] == 1 and ruled.plan["mlp_tiles"] == 37
    assert chosen.fits and chosen.peak_gib > ruled.peak_gib
    assert chosen.tokens_per_s > 3 * ruled.tokens_per_s  # measured on the H200: 11.9k tok/s tiled
    assert chosen.tokens_per_s == estimate(replace(small, tiled_mlp="false"), h200).tokens_per_s

    long = plan_for_model("Qwen2.5-7B", method="qlora", micro_batch_size=1, seq_len=98304, offload_activations=True)
    rtx = find_gpu("RTX 4090")
    assert not estimate(replace(long, tiled_mlp="false"), rtx).fits
    kept = estimate(long, rtx)
    assert kept.plan["mlp_tiles"] == 28 and kept.fits


def test_the_tiled_mlp_costs_launch_time_per_tile_and_layer():
    """The tile term: tiles x tiled layers x the per-method constant, on top of the untiled step."""
    from core.estimate.architecture import count_parameters
    from core.estimate.speed import mlp_tile_seconds, step_time

    plan = plan_for_model("Qwen2.5-0.5B", method="lora", micro_batch_size=1, seq_len=32768, tiled_mlp=37)
    assert mlp_tile_seconds(plan, CAL) == pytest.approx(37 * 24 * CAL.mlp_tile_s["lora"])
    partial = replace(plan, checkpoint_layers=10, tiled_mlp="auto")  # auto: the 10 checkpointed blocks only
    assert mlp_tile_seconds(partial, CAL) == pytest.approx(37 * 10 * CAL.mlp_tile_s["lora"])
    assert mlp_tile_seconds(replace(plan, tiled_mlp="false"), CAL) == 0.0
    counts = count_parameters(plan.architecture)
    trainable = 1_000_000
    tiled = step_time(plan.architecture, counts, trainable, plan, find_gpu("H200"), CAL)
    plain = step_time(plan.architecture, counts, trainable, replace(plan, tiled_mlp="false"), find_gpu("H200"), CAL)
    assert tiled.dispatch_s - plain.dispatch_s == pytest.approx(37 * 24 * CAL.mlp_tile_s["lora"])
    assert tiled.total_s > 2 * plain.total_s  # measured: 2.22 s a step tiled (14.8k tok/s)


def test_matrix_term_constants_are_the_committed_fit():
    """``Calibration.mlp_tile_s``, ``fp32_model_s_per_element``, ``dora_output_bytes_per_element`` and
    ``qlora_upcast_bytes_per_element`` are what ``bench/matrix_terms_fit.py`` fitted on the H200 rows (its JSON): change one only by re-running the fit
    and committing its output."""
    import json
    from pathlib import Path

    fitted = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "estimate_matrix"
                         / "matrix-terms-fit.json").read_text(encoding="utf-8"))
    assert CAL.mlp_tile_s == pytest.approx(fitted["mlp_tile_s"])
    assert CAL.fp32_model_s_per_element == pytest.approx(fitted["fp32_model_s_per_element"])
    assert CAL.dora_output_bytes_per_element == pytest.approx(fitted["dora_output_bytes_per_element"])
    used = [row for row in fitted["rows"] if row["used"]]
    assert {row["method"] for row in used if row["term"] == "mlp_tile_s"} == {"full", "lora", "qlora"}
    assert sum(row["term"] == "fp32_model_s_per_element" for row in used) >= 5
    assert sum(row["term"] == "dora_output_bytes_per_element" for row in used) >= 4
    assert CAL.qlora_upcast_bytes_per_element == pytest.approx(fitted["qlora_upcast_bytes_per_element"])
    assert [row["file"] for row in used if row["term"] == "qlora_upcast_bytes_per_element"] == \
        ["calibration-kernels-c.json"]


def test_qlora_upcast_is_estimated_on_a_gpu_its_term_was_not_fitted_on():
    """``qlora_upcast: true``'s fp32 outputs (``qlora_upcast_bytes_per_element``) were solved on the H200's row; the
    same row on an H100 (bench/results/qlora-upcast/calibration-upcast-b: 3.35 against 4.8 TB/s, the same matmul
    peak) is the check: its tokens/s and peak within the fitted bands, and the term is what moves it."""
    import json
    from pathlib import Path

    run = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "qlora-upcast"
                      / "calibration-upcast-b.json").read_text(encoding="utf-8"))
    assert run["meta"]["gpu_name"].startswith("NVIDIA H100")
    measured = run["results"][0]
    assert measured["row"] == "7b-qlora-b4-s2048-ckpt-qloraupcast-True"
    plan = plan_for_model("Qwen2.5-7B", method="qlora", micro_batch_size=4, seq_len=2048, kbit_upcast=True)
    h100 = find_gpu("H100")
    ours = estimate(plan, h100)
    assert ours.tokens_per_s == pytest.approx(measured["tokens_per_s"], rel=0.05)
    assert ours.peak_gib == pytest.approx(measured["peak_gib"], rel=0.05)
    without = estimate(plan, h100, replace(CAL, qlora_upcast_bytes_per_element=0.0))
    assert without.tokens_per_s > measured["tokens_per_s"] * 1.2  # what the estimate said before the term


def test_mixed_precision_full_fine_tuning_pays_its_measured_cost_over_pure_bf16():
    """On the H200 the 0.5B full mixed-precision row ran 62.0k tok/s, pure bf16 98.9k at the same shape."""
    mixed = plan_for_model("Qwen2.5-0.5B", method="full", micro_batch_size=8, seq_len=2048,
                           gradient_checkpointing=False)
    pure = replace(mixed, precision="pure-bf16")
    h200 = find_gpu("H200")
    ratio = estimate(mixed, h200).tokens_per_s / estimate(pure, h200).tokens_per_s
    assert 0.5 < ratio < 0.75  # measured 0.63
    lora = plan_for_model("Qwen2.5-0.5B", method="lora", micro_batch_size=8, seq_len=2048)
    from core.estimate.speed import fp32_model_seconds

    assert fp32_model_seconds(lora.architecture, lora, CAL) == 0.0
    assert fp32_model_seconds(pure.architecture, pure, CAL) == 0.0
    assert fp32_model_seconds(mixed.architecture, replace(mixed, zero_stage=2, num_gpus=2), CAL) == 0.0
