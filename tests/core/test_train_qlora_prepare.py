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


def _qlora(home: Path, upcast: bool, checkpointing: bool = True):
    torch.manual_seed(11)  # the same adapter initialisation for both recipes
    cfg = {"method": "qlora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "qlora_upcast": upcast,
           "gradient_checkpointing": checkpointing}
    model = wrap_lora(_quantised_tiny(home), cfg, torch.bfloat16)
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
