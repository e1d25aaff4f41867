"""``lora_grouped`` (default on for LoRA and QLoRA) on CPU: the grouped LoRA node keeps peft's maths.

- dropout 0, bf16 autocast and fp32, with and without checkpointing: the tiny model's loss and every
  adapter's gradient equal peft's own forward (``lora_grouped: false, lora_fused_add: false``);
- dropout > 0: one group's outputs and gradients (input and adapters, float64) equal a reference built by
  hand from the same masks, and ``gradcheck`` passes on the input;
- what is not plain LoRA (disabled adapters, DoRA, peft's fp32 upcast) runs peft's own forward.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.core.test_engine_switches import IDS, assert_close, loss_and_grads, tiny_lora  # noqa: E402


def _group(module):
    return getattr(module, "_tunedeck_group", None)


def _counted(monkeypatch, owner, name: str) -> dict:
    """Counts the calls of ``owner.name`` from now on (``calls["n"]``)."""
    calls = {"n": 0}
    original = getattr(owner, name)

    def counting(*args):
        calls["n"] += 1
        return original(*args)

    monkeypatch.setattr(owner, name, counting)
    return calls


def _count_group_calls(monkeypatch) -> dict:
    from core.train import lora_group

    return _counted(monkeypatch, lora_group._GroupedLoRA, "apply")


def _b_first(monkeypatch, on: bool) -> dict:
    """``lora_group.B_FIRST`` set to ``on`` (``TUNEDECK_LORA_B_FIRST``); counts the frozen matmuls run alone
    (``_frozen``), which the update-first order never runs for a plain base."""
    from core.train import lora_group

    monkeypatch.setattr(lora_group, "B_FIRST", on)
    return _counted(monkeypatch, lora_group, "_frozen")


@pytest.mark.parametrize("b_first", [False, True], ids=["base-first", "update-first"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager", "checkpointed"])
@pytest.mark.parametrize("autocast", [True, False], ids=["bf16-autocast", "fp32"])
def test_grouped_lora_gives_peft_loss_and_gradients(autocast, checkpointing, b_first, monkeypatch):
    frozen = _b_first(monkeypatch, b_first)
    dtype = torch.bfloat16 if autocast else torch.float32
    plain = tiny_lora({"lora_grouped": False, "lora_fused_add": False}, dtype=dtype, checkpointing=checkpointing)
    grouped = tiny_lora({}, dtype=dtype, checkpointing=checkpointing)  # the default
    assert sum(_group(m) is not None for m in grouped.modules()) == 4 * 7
    assert not any(_group(m) is not None for m in plain.modules())
    from core.train.lora_group import group_lora_layers

    assert group_lora_layers(grouped) == 0  # idempotent
    loss_plain, grads_plain = loss_and_grads(plain, IDS, autocast=autocast)
    calls = _count_group_calls(monkeypatch)
    loss_grouped, grads_grouped = loss_and_grads(grouped, IDS, autocast=autocast)
    # 4 groups a block (q/k/v, gate/up, o, down), 4 blocks, recomputed once more when checkpointed
    assert calls["n"] == 16 * (2 if checkpointing else 1)
    assert (frozen["n"] == 0) == b_first, frozen  # the order asked for ran
    assert loss_grouped == pytest.approx(loss_plain, rel=1e-3 if autocast else 1e-6)
    assert_close(grads_plain, grads_grouped, rel=2e-2 if autocast else 1e-5)
    # every hand-off was taken: nothing of this step stays referenced
    groups = {id(g): g for g in (_group(m) for m in grouped.modules()) if g is not None}
    assert len(groups) == 16 and all(g._handed is None for g in groups.values())


def _qkv(dropout: float, width: int = 8, outs: tuple[int, int, int] = (6, 4, 4), rank: int = 3,
         dtype=torch.float64):
    """A q/k/v attention input (q and k with bias) under peft LoRA (scaling 2), lora_B drawn."""
    from peft import LoraConfig, get_peft_model

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(width, outs[0], bias=True)
            self.k_proj = torch.nn.Linear(width, outs[1], bias=True)
            self.v_proj = torch.nn.Linear(width, outs[2], bias=False)

        def forward(self, x):
            return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)

    torch.manual_seed(0)
    model = get_peft_model(Attention().to(dtype), LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout,
                                                             target_modules=["q_proj", "k_proj", "v_proj"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.5)
    model.train()
    return model


@pytest.mark.parametrize("b_first", [False, True], ids=["base-first", "update-first"])
def test_grouped_dropout_is_peft_dropout_with_exact_gradients(b_first, monkeypatch):
    from core.train.lora_group import group_lora_layers

    frozen = _b_first(monkeypatch, b_first)

    model = _qkv(0.3)
    assert group_lora_layers(model) == 1
    inner = model.base_model.model
    layers = [inner.q_proj, inner.k_proj, inner.v_proj]
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)

    torch.manual_seed(123)
    out = model(x)
    out.square().sum().backward()
    grads = [x.grad.clone()] + [p.grad.clone() for layer in layers
                               for p in (layer.lora_A["default"].weight, layer.lora_B["default"].weight)]

    # by hand: the same native_dropout draws, in the layers' order, then base + scale * B(A(dropped x))
    x_ref = x.detach().clone().requires_grad_(True)
    params = [p.detach().clone().requires_grad_(True) for layer in layers
              for p in (layer.lora_A["default"].weight, layer.lora_B["default"].weight)]
    torch.manual_seed(123)
    dropped = [torch.native_dropout(x_ref, 0.3, True)[0] for _ in layers]
    parts = []
    for i, layer in enumerate(layers):
        base = layer.base_layer
        parts.append(torch.nn.functional.linear(x_ref, base.weight, base.bias)
                     + 2.0 * (dropped[i] @ params[2 * i].t()) @ params[2 * i + 1].t())
    ref = torch.cat(parts, dim=-1)
    ref.square().sum().backward()
    assert torch.allclose(out, ref, atol=1e-12)
    assert (dropped[0] == 0).any() and not torch.equal(dropped[0], dropped[1])  # masks drawn, one per layer
    assert (frozen["n"] == 0) == b_first, frozen
    for got, want in zip(grads, [x_ref.grad] + [p.grad for p in params], strict=True):
        assert torch.allclose(got, want, atol=1e-10)

    def seeded(inputs):
        torch.manual_seed(7)
        return model(inputs)

    assert torch.autograd.gradcheck(seeded, (torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True),))


def test_what_is_not_plain_lora_runs_peft_forward(monkeypatch):
    calls = _count_group_calls(monkeypatch)
    plain = tiny_lora({"lora_grouped": False, "lora_fused_add": False})
    grouped = tiny_lora({})
    with grouped.disable_adapter(), torch.no_grad():
        base = grouped(input_ids=IDS).logits
    assert calls["n"] == 0
    with plain.disable_adapter(), torch.no_grad():
        assert torch.equal(base, plain(input_ids=IDS).logits)
    upcast = tiny_lora({"lora_input_upcast": True}, dtype=torch.bfloat16)
    assert not any(_group(m) is not None for m in upcast.modules())
    dora = tiny_lora({"method": "dora"})
    assert not any(_group(m) is not None for m in dora.modules())
    with torch.no_grad():
        grouped.eval()
        grouped(input_ids=IDS)  # eval: dropout off, still grouped
    assert calls["n"] == 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA kernels and bitsandbytes' 4-bit base: needs a GPU")
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_grouped_lora_keeps_peft_loss_and_gradients_on_cuda(method, tmp_path, monkeypatch):
    """Under CUDA bf16 autocast, with checkpointing, dropout 0: LoRA over a bf16 base and QLoRA over
    bitsandbytes' NF4 base (dequantised for the input's gradient) against peft's own forward."""
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    from core.train.model_setup import wrap_lora
    from tests.core.test_engine_switches import TINY

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)), dtype=torch.bfloat16) \
        .save_pretrained(tmp_path / "m")

    def run(cfg: dict):
        torch.manual_seed(0)  # the same lora_A draws for both runs
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16) if method == "qlora" else None
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.bfloat16, device_map={"": 0},
                                                     quantization_config=quant)
        model.config.use_cache = False
        model = wrap_lora(model, {"method": method, "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0,
                                  "gradient_checkpointing": True, **cfg})
        torch.manual_seed(1)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 0.05)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        model.train()
        ids = IDS.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grouped = sum(_group(m) is not None for m in model.modules())
        return loss.item(), {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.grad is not None}, grouped

    loss_plain, grads_plain, none = run({"lora_grouped": False, "lora_fused_add": False})
    frozen = _b_first(monkeypatch, False)
    loss_grouped, grads_grouped, grouped = run({})
    alone = frozen["n"]  # the frozen matmuls run alone, base first
    assert none == 0 and grouped == 4 * 7
    assert loss_grouped == pytest.approx(loss_plain, rel=1e-3)
    assert_close(grads_plain, grads_grouped, rel=2e-2)
    if method == "qlora":  # the recompute's dequantised weights kept for backward: bitsandbytes' forward maths
        loss_reused, grads_reused, _ = run({"qlora_reuse_dequantised": True})
        assert loss_reused == pytest.approx(loss_plain, rel=1e-3)
        assert_close(grads_plain, grads_reused, rel=2e-2)
    frozen = _b_first(monkeypatch, True)  # TUNEDECK_LORA_B_FIRST: the update first, the frozen matmul into it
    loss_first, grads_first, _ = run({"qlora_reuse_dequantised": True} if method == "qlora" else {})
    assert loss_first == pytest.approx(loss_plain, rel=1e-3)
    assert_close(grads_plain, grads_first, rel=2e-2)
    assert frozen["n"] < alone, (frozen, alone)  # it ran (gate/up's outputs, whose updates the SwiGLU kernels add, run alone)
    monkeypatch.setattr("core.train.lora_group.B_FIRST", False)
    # the recompute without the down projection's matmul: the grouped run's numbers (bit for bit on CPU; here
    # within the run-to-run spread of the GPU's attention backward)
    loss_skipped, grads_skipped, _ = run({"recompute_skip_down": True})
    assert loss_skipped == pytest.approx(loss_grouped, rel=1e-6)
    assert_close(grads_grouped, grads_skipped, rel=1e-3)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_the_recompute_skips_the_down_projection_and_the_gradients_are_the_same_bits(dropout):
    """``recompute_skip_down``: in a checkpointed Qwen2 block the recompute (in backward) runs no down-projection
    matmul (its output only feeds the block's output, which the recompute throws away); the loss and every
    adapter's gradient are bit for bit those of the full recompute."""
    from core.train.lora_group import skips_down

    runs = {}
    for skip in (False, True):
        model = tiny_lora({"lora_dropout": dropout, "gradient_checkpointing": True, "recompute_skip_down": skip},
                          checkpointing=True)
        downs = [m for name, m in model.named_modules() if name.endswith("mlp.down_proj") and _group(m)]
        assert len(downs) == 4 and all(_group(m).skip_in_backward is skip for m in downs)
        assert skips_down(model) is skip  # what the run's header says
        assert not any(_group(m).skip_in_backward for m in model.modules()
                       if _group(m) is not None and m not in downs)
        calls = []
        for down in downs:
            down.get_base_layer().register_forward_hook(lambda *_, seen=calls: seen.append(1))
        torch.manual_seed(5)  # the dropout masks (replayed by the recompute)
        loss, grads = loss_and_grads(model, IDS, autocast=False)
        runs[skip] = (loss, grads, len(calls))
    assert runs[False][2] == 2 * 4  # forward and recompute of every block
    assert runs[True][2] == 4  # the forward only
    assert runs[True][0] == runs[False][0]
    assert runs[True][1].keys() == runs[False][1].keys() and runs[True][1]
    for name, grad in runs[False][1].items():
        assert torch.equal(runs[True][1][name], grad), name


def test_a_block_that_does_not_end_with_its_mlp_recomputes_the_down_projection():
    """A model type outside ``MLP_ENDS_BLOCK`` (Gemma 2 normalises the MLP's output before the residual add,
    so the recompute's down output is read) keeps the whole recompute, whatever the key says."""
    from core.estimate.plan import MLP_ENDS_BLOCK
    from core.train.lora_group import group_lora_layers, skips_down

    model = tiny_lora({"lora_grouped": False})
    assert model.config.model_type in MLP_ENDS_BLOCK
    model.config.model_type = "gemma2"
    assert group_lora_layers(model, skip_down=True) == 16
    assert not skips_down(model)
