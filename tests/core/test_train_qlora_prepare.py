"""QLoRA without peft's fp32 upcast: dtypes, where gradients go, and the same losses as the upcast recipe.

bitsandbytes 0.50 quantises and runs NF4 layers on the CPU, so the real 4-bit tiny model trains here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")

from core.train.fused_loss import forward_chunked_loss  # noqa: E402
from core.train.model_setup import materialize_random_weights, wrap_lora  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def _quantised_tiny(home: Path):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    source = materialize_random_weights(TINY, seed=5, dtype=torch.bfloat16)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(str(source), quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": "cpu"}, attn_implementation="sdpa")
    model.config.use_cache = False
    return model


def _qlora(home: Path, upcast: bool, checkpointing: bool = True, **keys):
    cfg = {"method": "qlora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "qlora_upcast": upcast,
           "gradient_checkpointing": checkpointing, **keys}
    base = _quantised_tiny(home)  # (the first call makes the random weights, from their own seed)
    torch.manual_seed(11)  # the same adapter initialisation for both recipes
    model = wrap_lora(base, cfg, torch.bfloat16)
    if checkpointing:  # as the Trainer does it: non-reentrant
        model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _batch():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 900, (2, 24), generator=g)
    labels = ids.clone()
    labels[:, :6] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _decoder_output_dtype(model, batch) -> torch.dtype:
    seen = {}
    decoder = model.get_base_model().get_decoder()

    def hook(_module, _args, output) -> None:
        seen["dtype"] = output.last_hidden_state.dtype

    handle = decoder.register_forward_hook(hook)
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    handle.remove()
    return seen["dtype"]


def test_preparation_keeps_bf16_and_trains_only_the_adapters(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    ours = _qlora(tmp_path, upcast=False)
    plain = _qlora(tmp_path, upcast=True)
    for name, param in ours.named_parameters():
        if "lora_" in name:
            assert param.requires_grad and param.dtype == torch.float32, name
        else:
            assert not param.requires_grad, name
            assert param.dtype == torch.bfloat16, (name, param.dtype)  # NF4 storage is bf16 too (quant_storage)
    base_fp32 = [n for n, p in plain.named_parameters() if "lora_" not in n and p.dtype == torch.float32]
    assert any("embed_tokens" in n for n in base_fp32) and any("norm" in n for n in base_fp32)
    batch = _batch()
    assert _decoder_output_dtype(ours, batch) == torch.bfloat16
    assert _decoder_output_dtype(plain, batch) == torch.float32  # the upcast makes the residual stream fp32

    loss = forward_chunked_loss(ours, ours, batch)
    loss.backward()
    grads = {n: p.grad for n, p in ours.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in n for n in grads)
    assert all(grads[n].abs().sum() > 0 for n in grads if "lora_B" in n)  # B = 0 at start: A gets none yet


def test_losses_match_the_upcast_recipe_over_a_few_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    batch = _batch()
    curves = {}
    for upcast in (True, False):
        model = _qlora(tmp_path, upcast, checkpointing=False)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        losses = []
        for _ in range(4):
            optimizer.zero_grad(set_to_none=True)
            loss = forward_chunked_loss(model, model, batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves[upcast] = losses
    upcast_losses, ours = curves[True], curves[False]
    assert ours[-1] < ours[0] - 0.05  # it learns
    for a, b in zip(upcast_losses, ours, strict=True):
        assert abs(a - b) / a < 0.02, (upcast_losses, ours)  # bf16 noise, not a different training


def test_the_upcast_recipe_keeps_peft_fp32_sums_under_autocast(tmp_path, monkeypatch):
    """qlora_upcast: true is the plain recipe: a 4-bit base returns its fp32 input's dtype, and peft adds the
    bf16 LoRA update to that in fp32. The engine's fused add (an addmm, which autocast rounds to bf16) made
    those sums bf16, losing the small early updates: on the 7B the upcast run's loss stayed at the bf16 run's
    (11.516 against the plain recipe's 11.353, engine-speed-m-qlora). Each adapted linear's output now has
    peft's dtype, the first block's q/k/v the very same numbers, and the loss is peft's."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    batch = _batch()
    runs = {}
    for name, keys in (("peft", {"lora_fused_add": False, "lora_grouped": False, "lora_input_upcast": True}),
                       ("engine", {})):
        model = _qlora(tmp_path, upcast=True, checkpointing=False, **keys)
        for param_name, param in model.named_parameters():
            if "lora_B" in param_name:  # B starts at zero: give the updates something to add
                param.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(param_name)))
        outputs = {}
        for module_name, module in model.named_modules():
            if type(module).__name__ == "Linear4bit" and hasattr(module, "lora_A"):
                module.register_forward_hook(lambda _m, _a, out, key=module_name, seen=outputs:
                                             seen.setdefault(key, out.detach()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward_chunked_loss(model, model, batch)
        runs[name] = (loss.item(), outputs)
    (peft_loss, peft_out), (loss, out) = runs["peft"], runs["engine"]
    assert out.keys() == peft_out.keys() and len(out) == 7 * len(_blocks(model))
    for key, value in out.items():
        assert value.dtype == peft_out[key].dtype, key
        widened = key.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj")
        assert value.dtype == (torch.float32 if widened else torch.bfloat16), (key, value.dtype)
    for key in [k for k in out if ".layers.0.self_attn." in k and k.rsplit(".", 1)[-1] != "o_proj"]:
        assert torch.equal(out[key], peft_out[key]), key
    assert loss == pytest.approx(peft_loss, rel=1e-3)


def _dequantisations(monkeypatch) -> list[int]:
    """Counts the NF4 weights dequantised from now on: by bitsandbytes' own 4-bit matmul (the base layer's
    forward: on a GPU at training sizes it dequantises and calls F.linear) and by the grouped node's
    ``_base_weight``."""
    import bitsandbytes

    from core.train import lora_group

    calls = [0]

    def counted(real):
        def call(*args, **kwargs):
            calls[0] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(bitsandbytes, "matmul_4bit", counted(bitsandbytes.matmul_4bit))
    monkeypatch.setattr(lora_group, "_base_weight", counted(lora_group._base_weight))
    return calls


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_reusing_the_recomputes_dequantised_weights_drops_a_pass_and_changes_no_number(tmp_path, monkeypatch,
                                                                                      dropout):
    """qlora_reuse_dequantised: in checkpointed blocks the backward takes the weights the recompute
    dequantised (a third fewer dequantisations); the loss and every adapter's gradient are the same."""
    from core.train.model_setup import dequantised_reusing

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    batch = _batch()
    runs = {}
    for reuse in (False, True):
        model = _qlora(tmp_path, upcast=False, lora_dropout=dropout, qlora_reuse_dequantised=reuse,
                       recompute_skip_down=False)  # (its own test below)
        # equal weights in both models (one seed), so the masks must be too: seed the dropout as well
        torch.manual_seed(3)
        calls = _dequantisations(monkeypatch)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # as the Trainer runs (the grouped node needs it here)
            loss = forward_chunked_loss(model, model, batch)
        forward_calls = calls[0]
        loss.backward()
        runs[reuse] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                       forward_calls, calls[0])
    linears = 7 * len(_blocks(model))
    assert runs[False][2] == runs[True][2] == linears  # the forward dequantises each weight once either way
    assert runs[False][3] == 3 * linears  # forward, recompute, backward
    assert runs[True][3] == 2 * linears  # the backward took the recompute's
    assert runs[True][0] == runs[False][0]
    assert runs[True][1].keys() == runs[False][1].keys() and runs[True][1]
    for name, grad in runs[False][1].items():
        assert torch.equal(runs[True][1][name], grad), name
    assert dequantised_reusing({"method": "qlora", "gradient_checkpointing": True, "qlora_reuse_dequantised": True})
    assert not dequantised_reusing({"method": "qlora", "gradient_checkpointing": False,
                                    "qlora_reuse_dequantised": True})



def test_skipping_the_recomputed_down_projection_with_reused_weights_changes_no_number(tmp_path, monkeypatch):
    """recompute_skip_down on QLoRA: the recompute neither dequantises nor multiplies the down projection's
    weight, so its backward dequantises it itself; still two dequantisations of every weight a step, and
    the loss and every adapter's gradient are reuse's alone."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    batch = _batch()
    runs = {}
    for skip in (False, True):
        model = _qlora(tmp_path, upcast=False, lora_dropout=0.1, qlora_reuse_dequantised=True,
                       recompute_skip_down=skip)
        torch.manual_seed(3)
        calls = _dequantisations(monkeypatch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward_chunked_loss(model, model, batch)
        loss.backward()
        runs[skip] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                      calls[0])
    assert runs[True][2] == runs[False][2] == 2 * 7 * len(_blocks(model))
    assert runs[True][0] == runs[False][0] and runs[True][1]
    for name, grad in runs[False][1].items():
        assert torch.equal(runs[True][1][name], grad), name

def test_without_checkpointing_nothing_is_kept_for_backward_whatever_the_key(tmp_path, monkeypatch):
    """Outside checkpointed blocks the key changes nothing: kept there, every block's weights would stay in
    bf16 until its backward (as much memory as plain LoRA's frozen model)."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    counts = []
    for forced in (False, True):
        model = _qlora(tmp_path, upcast=False, checkpointing=False, qlora_reuse_dequantised=True)
        groups = {id(m._tunedeck_group): m._tunedeck_group for m in model.modules() if hasattr(m, "_tunedeck_group")}
        assert groups and not any(g.reuse_dequantised for g in groups.values())  # the run has no checkpointing
        for group in groups.values():
            group.reuse_dequantised = forced  # asked for anyway: the block, not checkpointed, says no
            assert group.block is not None and not group._reuse()
        calls = _dequantisations(monkeypatch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward_chunked_loss(model, model, _batch())
        loss.backward()
        counts.append(calls[0])
    assert counts[0] == counts[1] > 7 * len(_blocks(model))  # the backward dequantised again: nothing was kept


def _blocks(model):
    from core.train.engine_switches import decoder_layers

    return decoder_layers(model)
