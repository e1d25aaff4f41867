"""The engine's speed switches on the bundled tiny model (CPU): each keeps the maths of the plain path.

- ``lora_input_upcast: false`` (default): under bf16 autocast the loss and the adapters' gradients equal
  peft's upcasting path, the adapters stay fp32, and no fp32 copy of a LoRA input is made;
- ``checkpoint_layers: N``: only the first N layers are recomputed in backward; gradients unchanged;
- ``compile_layers``: a compiled decoder gives the same loss and gradients as the eager one;
- the estimator models partial checkpointing, and ``auto`` picks the fewest layers that fit.

Dropout is 0 where two paths are compared: a different path may draw a different dropout mask.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.estimate import find_gpu, plan_for_model  # noqa: E402
from core.estimate.checkpointing import (  # noqa: E402
    fewest_checkpointed_layers,
    resolve_checkpoint_layers,
    resolve_tiled_mlp,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def tiny_lora(cfg: dict, dtype=None, checkpointing: bool = False):
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.train.model_setup import wrap_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)), dtype=dtype or torch.float32)
    model.config.use_cache = False
    model = wrap_lora(model, {"method": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, **cfg})
    torch.manual_seed(1)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: give the adapters an effect to compare
            param.data.normal_(0, 0.05)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def loss_and_grads(model, ids, autocast: bool = True):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def assert_close(a: dict, b: dict, rel: float) -> None:
    assert a.keys() == b.keys() and a
    scale = max(v.abs().max().item() for v in a.values())
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= rel * scale, (worst, scale)


IDS = torch.randint(3, 1000, (2, 48), generator=torch.Generator().manual_seed(7))


def test_lora_inputs_stay_bf16_with_the_same_loss_and_gradients_as_peft_upcast():
    plain = tiny_lora({"lora_input_upcast": True}, dtype=torch.bfloat16)
    fast = tiny_lora({"lora_grouped": False}, dtype=torch.bfloat16)  # the default per layer (grouping aside)
    assert sum(getattr(m, "_tunedeck_bf16_inputs", False) for m in fast.modules()) == 28
    assert not any(getattr(m, "_tunedeck_bf16_inputs", False) for m in plain.modules())
    # the trained weights (and so the optimizer's state) stay fp32: only the input cast is skipped
    assert {p.dtype for n, p in fast.named_parameters() if "lora_" in n} == {torch.float32}

    # what reaches lora_A: a bf16 tensor without the switch's cast, peft's fp32 copy with it
    seen: dict[str, set] = {"plain": set(), "fast": set()}
    for name, model in (("plain", plain), ("fast", fast)):
        for module in model.modules():
            if hasattr(module, "lora_A"):
                module.lora_A["default"].register_forward_pre_hook(
                    lambda _m, args, key=name: seen[key].add(args[0].dtype))
    loss_plain, grads_plain = loss_and_grads(plain, IDS)
    loss_fast, grads_fast = loss_and_grads(fast, IDS)
    assert seen == {"plain": {torch.float32}, "fast": {torch.bfloat16}}
    assert loss_fast == pytest.approx(loss_plain, rel=1e-6)  # bf16 -> fp32 -> bf16 is lossless
    assert_close(grads_plain, grads_fast, rel=1e-3)
    # without autocast (a bf16 model run as it is) the adapters still get their fp32 input, as peft does
    seen["fast"].clear()
    with torch.no_grad():
        fast(input_ids=IDS)
    assert seen["fast"] == {torch.float32}


def test_checkpoint_layers_recomputes_only_the_first_n_layers_with_unchanged_gradients():
    from core.train.engine_switches import decoder_layers, limit_checkpointed_layers

    reference = tiny_lora({}, checkpointing=True)
    partial = tiny_lora({}, checkpointing=True)
    layers = decoder_layers(partial)
    assert len(layers) == 4 and all(layer.gradient_checkpointing for layer in layers)
    assert limit_checkpointed_layers(partial, 1) == 1
    assert [layer.gradient_checkpointing for layer in layers] == [True, False, False, False]

    calls = [0] * len(layers)
    for index, layer in enumerate(layers):
        layer.mlp.down_proj.base_layer.register_forward_hook(lambda *_a, i=index: calls.__setitem__(i, calls[i] + 1))
    loss_ref, grads_ref = loss_and_grads(reference, IDS, autocast=False)
    loss_part, grads_part = loss_and_grads(partial, IDS, autocast=False)
    assert calls == [2, 1, 1, 1]  # forward + recompute for the checkpointed layer only
    assert loss_part == pytest.approx(loss_ref, rel=1e-6)
    assert_close(grads_ref, grads_part, rel=1e-5)


def test_compiled_decoder_layers_give_the_eager_loss_and_gradients():
    from core.train.engine_switches import compile_decoder_layers

    eager = tiny_lora({}, checkpointing=True)
    compiled = tiny_lora({}, checkpointing=True)
    assert compile_decoder_layers(compiled) == 4
    loss_eager, grads_eager = loss_and_grads(eager, IDS, autocast=False)
    loss_compiled, grads_compiled = loss_and_grads(compiled, IDS, autocast=False)
    assert loss_compiled == pytest.approx(loss_eager, rel=1e-4)
    assert_close(grads_eager, grads_compiled, rel=1e-3)


def test_the_estimator_trades_memory_for_speed_layer_by_layer():
    from dataclasses import replace

    from core.estimate import estimate

    gpu = find_gpu("H200")
    plan = plan_for_model("Qwen/Qwen2.5-7B", exact_count=False, method="lora", micro_batch_size=4, seq_len=2048)
    rows = [estimate(replace(plan, checkpoint_layers=k), gpu) for k in (0, 7, 14, 21, 28)]
    peaks = [r.peak_gib for r in rows]
    speeds = [r.tokens_per_s for r in rows]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > 2 * peaks[-1]
    assert speeds == sorted(speeds, reverse=True) and speeds[0] > 1.15 * speeds[-1]
    # all 28 checkpointed is the plain switch; 0 of them the same as no checkpointing
    assert rows[-1].peak_gib == pytest.approx(estimate(plan, gpu).peak_gib)
    assert rows[0].peak_gib == pytest.approx(estimate(replace(plan, gradient_checkpointing=False), gpu).peak_gib)
    assert rows[2].plan["checkpointed_layers"] == 14


def test_auto_picks_the_fewest_layers_that_fit_the_card():
    from dataclasses import replace

    from core.estimate import estimate

    # (at 8 x 2048 an 80 GB card needs none since lora_swiglu_down: the MLP's product is kept by no block)
    plan = plan_for_model("Qwen/Qwen2.5-7B", exact_count=False, method="lora", micro_batch_size=12, seq_len=2048)
    for name in ("H200", "A100-80GB", "RTX 4090"):
        gpu = find_gpu(name)
        count = fewest_checkpointed_layers(plan, gpu)
        assert 0 <= count <= 28
        if count < 28 or estimate(replace(plan, checkpoint_layers=28), gpu).fits:
            assert estimate(replace(plan, checkpoint_layers=count), gpu).fits
        if count > 0:
            assert not estimate(replace(plan, checkpoint_layers=count - 1), gpu).fits
    assert fewest_checkpointed_layers(plan, find_gpu("H200")) < fewest_checkpointed_layers(plan, find_gpu("A100-80GB"))


def test_checkpoint_layers_key_and_its_auto_resolution():
    from core.config import ConfigError, RunConfig

    base = {"model": "Qwen/Qwen2.5-7B", "dataset": "data.jsonl", "micro_batch_size": 8, "max_seq_len": 2048}
    assert RunConfig.from_dict({**base, "checkpoint_layers": "AUTO"}).checkpoint_layers == "auto"
    assert RunConfig.from_dict({**base, "checkpoint_layers": "6"}).checkpoint_layers == 6
    assert RunConfig.from_dict(base).checkpoint_layers == "all"
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict({**base, "checkpoint_layers": "half"})
    assert "checkpoint_layers" in str(caught.value) and "auto" in str(caught.value)
    with pytest.raises(ConfigError):
        RunConfig.from_dict({**base, "checkpoint_layers": -1})

    config = RunConfig.from_dict({**base, "checkpoint_layers": "auto"})
    on_h200 = resolve_checkpoint_layers(config, "NVIDIA H200")
    on_a100 = resolve_checkpoint_layers(config, "NVIDIA A100-SXM4-80GB")
    assert isinstance(on_h200, int) and isinstance(on_a100, int) and on_h200 < on_a100
    assert resolve_checkpoint_layers(config, None) == "all"  # no GPU: the plain behaviour
    assert resolve_checkpoint_layers(config, "a GPU nobody knows") == "all"
    off = RunConfig.from_dict({**base, "checkpoint_layers": "auto", "gradient_checkpointing": False})
    assert resolve_checkpoint_layers(off, "NVIDIA H200") == "all"


def test_tiled_mlp_auto_is_resolved_by_fit_before_launch():
    """The launcher makes ``tiled_mlp: auto`` ``false`` where the run fits its GPU untiled (tiles cost launch
    time), keeps ``auto`` where it does not or where it cannot tell, and leaves a chosen value alone."""
    from core.config import RunConfig

    small = RunConfig.from_dict({"model": "Qwen/Qwen2.5-0.5B", "dataset": "data.jsonl", "method": "lora",
                                 "micro_batch_size": 8, "max_seq_len": 4096, "gradient_checkpointing": True})
    assert small.tiled_mlp == "auto"
    assert resolve_tiled_mlp(small, "NVIDIA H200") == "false"
    assert resolve_tiled_mlp(small, None) == "auto"  # no GPU known: the engine's rule (tiles, the safe side)
    assert resolve_tiled_mlp(small, "a GPU nobody knows") == "auto"
    short = RunConfig.from_dict({**small.to_dict(), "max_seq_len": 1024})
    assert resolve_tiled_mlp(short, "NVIDIA H200") == "auto"  # 8k tokens: the engine does not tile it anyway
    untouched = RunConfig.from_dict({**small.to_dict(), "gradient_checkpointing": False})
    assert resolve_tiled_mlp(untouched, "NVIDIA H200") == "auto"  # auto tiles checkpointed blocks only: none
    chosen = RunConfig.from_dict({**small.to_dict(), "tiled_mlp": 4})
    assert resolve_tiled_mlp(chosen, "NVIDIA H200") == 4
    long = RunConfig.from_dict({"model": "Qwen/Qwen2.5-7B", "dataset": "data.jsonl", "method": "qlora",
                                "micro_batch_size": 1, "max_seq_len": 98304, "gradient_checkpointing": True,
                                "offload_activations": True})
    assert resolve_tiled_mlp(long, "NVIDIA GeForce RTX 4090") == "auto"  # 24 GiB: untiled it does not fit


def test_a_tiny_run_records_the_switches_it_ran_with(tmp_path):
    """Through the real CLI: checkpoint_layers 2 of 4, the default bf16 LoRA inputs and the loss's chunk
    (``ce_chunk_tokens``, the CPU's chunked loss) reach the trainer."""
    from core.runs.jsonl import iter_records
    from tests.core.test_train_engine import _config, _tunedeck, _wait_final

    home = tmp_path / "home"
    cfg = _config(tmp_path, gradient_checkpointing=True, checkpoint_layers=2, max_steps=4, save_steps=100,
                  ce_chunk_tokens=24)
    started = _tunedeck(home, "train", str(cfg))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    final = _wait_final(home, run_id)
    assert final["status"] == "finished", final
    header = next(iter_records(home / "runs" / run_id / "metrics.jsonl"))
    assert header["checkpoint_layers"] == 2 and header["lora_input_upcast"] is False
    assert header["fused_ce"] == "chunked" and header["ce_chunk_tokens"] == 24
    log = (home / "runs" / run_id / "train.log").read_text()
    assert "checkpoint_layers: 2 of 4 decoder layers checkpointed" in log


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16-autocast", "fp32"])
def test_fused_lora_add_gives_peft_loss_and_gradients(autocast):
    from core.train.engine_switches import fuse_lora_add

    dtype = torch.bfloat16 if autocast else torch.float32
    plain = tiny_lora({"lora_fused_add": False}, dtype=dtype)
    fused = tiny_lora({"lora_grouped": False}, dtype=dtype)  # the default per layer (grouping aside)
    layers = [m for m in fused.modules() if getattr(m, "_tunedeck_fused_add", False)]
    assert len(layers) == 4 * 7  # every targeted linear of the 4 blocks
    assert not any(getattr(m, "_tunedeck_fused_add", False) for m in plain.modules())
    assert fuse_lora_add(fused) == 0  # idempotent
    calls = {"addmm": 0}
    original = torch.addmm

    def counting(*args, **kwargs):
        calls["addmm"] += 1
        return original(*args, **kwargs)

    loss_plain, grads_plain = loss_and_grads(plain, IDS, autocast=autocast)
    torch.addmm = counting
    try:
        loss_fused, grads_fused = loss_and_grads(fused, IDS, autocast=autocast)
    finally:
        torch.addmm = original
    assert calls["addmm"] == 28  # the fused path ran, once per LoRA layer
    assert loss_fused == pytest.approx(loss_plain, rel=1e-3 if autocast else 1e-6)
    assert_close(grads_plain, grads_fused, rel=2e-2 if autocast else 1e-5)
    # with the adapters disabled (what merge and evaluation compare against) the base output is untouched
    with fused.disable_adapter(), torch.no_grad():
        base = fused(input_ids=IDS).logits
    with plain.disable_adapter(), torch.no_grad():
        assert torch.equal(base, plain(input_ids=IDS).logits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels are what is at stake: needs a GPU")
def test_default_lora_switches_keep_the_plain_loss_and_gradients_on_cuda():
    """bf16 LoRA inputs and the fused add against peft's own forward, under CUDA autocast (dropout 0)."""

    def on_cuda(cfg: dict):
        model = tiny_lora(cfg, dtype=torch.bfloat16).cuda()
        ids = IDS.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.item(), {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.grad is not None}

    loss_plain, grads_plain = on_cuda({"lora_input_upcast": True, "lora_fused_add": False})
    loss_fast, grads_fast = on_cuda({})
    assert loss_fast == pytest.approx(loss_plain, rel=1e-3)
    assert_close(grads_plain, grads_fast, rel=2e-2)


def test_the_adapters_start_from_the_seed_whatever_the_generator_went_through(tmp_path):
    """The LoRA adapters' first draws come from the run's seed alone: a model loaded from files (a 4-bit
    model from the random-weights cache, say) draws nothing, so they used to depend on what had used the
    generator before (the 7B QLoRA rows started tunedeck and the plain recipe from other adapters)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.train.model_setup import load_model

    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY))).save_pretrained(tmp_path / "m")
    cfg = {"method": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "seed": 7}
    adapters = []
    for before in (1, 2):
        torch.manual_seed(before)  # what came before: another seed, other draws
        torch.rand(before * 100)
        model = load_model(cfg, tmp_path / "m", "cpu", torch.float32, torch.float32, 0, zero3=False)
        adapters.append({n: p.detach().clone() for n, p in model.named_parameters() if "lora_A" in n})
    assert adapters[0].keys() == adapters[1].keys() and adapters[0]
    for name, weight in adapters[0].items():
        assert torch.equal(adapters[1][name], weight), name
