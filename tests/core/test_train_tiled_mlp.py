"""``tiled_mlp``: the decoder's MLP over tiles of the sequence keeps the loss and the gradients.

On the bundled tiny model (CPU, fp32 unless said): tiled against plain with and without checkpointing,
full fine-tuning and LoRA; LoRA dropout replayed in the recomputation; inside a checkpointed block the
tiled MLP runs no extra forward; ``auto`` picks tiles from the token count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.train import offload, tiled_mlp  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def _model(lora_dropout: float | None = None, checkpointing: bool = False):
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.train.model_setup import wrap_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)), dtype=torch.float32)
    model.config.use_cache = False
    if lora_dropout is not None:
        model = wrap_lora(model, {"method": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": lora_dropout})
        torch.manual_seed(1)
        for name, param in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: give the adapters an effect to compare
                param.data.normal_(0, 0.05)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


IDS = torch.randint(3, 900, (2, 48), generator=torch.Generator().manual_seed(1))


def _loss_and_grads(model, seed: int = 5, autocast: bool = False):
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys() and a
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, worst


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("lora", [False, True])
def test_tiled_mlp_keeps_loss_and_gradients(lora, checkpointing):
    plain_loss, plain_grads = _loss_and_grads(_model(0.0 if lora else None, checkpointing))
    model = _model(0.0 if lora else None, checkpointing)
    assert tiled_mlp.install_tiled_mlp(model, 5) == 4  # 96 tokens in 5 tiles of 19-20, every block
    loss, grads = _loss_and_grads(model)
    assert loss == pytest.approx(plain_loss, abs=1e-6)
    _assert_close(grads, plain_grads, 1e-6)


def test_tiled_mlp_under_bf16_autocast_matches_plain_within_bf16_rounding():
    plain_loss, plain_grads = _loss_and_grads(_model(0.0, True), autocast=True)
    model = _model(0.0, True)
    tiled_mlp.install_tiled_mlp(model, 4)
    loss, grads = _loss_and_grads(model, autocast=True)
    assert loss == pytest.approx(plain_loss, rel=2e-3)
    scale = max(v.abs().max().item() for v in plain_grads.values())
    _assert_close(grads, plain_grads, 2e-2 * scale)


def test_dropout_masks_of_the_recomputation_are_those_of_the_forward():
    """With LoRA dropout the tiles draw their masks in order; the reference computes the same tiles with
    autograd all along (no recomputation), so equal gradients mean the backward replayed the masks."""
    model = _model(0.3, False)
    mlp = model.base_model.model.model.layers[0].mlp
    x = torch.randn(2, 48, 128, requires_grad=True)
    weight = torch.randn(2, 48, 128)
    torch.manual_seed(7)
    reference = torch.cat([mlp(t) for t in x.reshape(-1, 128).tensor_split(3)]).view(2, 48, 128)
    (reference * weight).sum().backward()
    ref_x = x.grad.clone()
    ref_w = {n: p.grad.clone() for n, p in mlp.named_parameters() if p.grad is not None}
    x.grad = None
    for p in mlp.parameters():
        p.grad = None
    torch.manual_seed(7)
    out = tiled_mlp.tiled_forward(mlp.forward, x, 3, skip_in_recompute=False)
    assert torch.equal(out, reference)
    (out * weight).sum().backward()
    assert torch.allclose(x.grad, ref_x, atol=1e-6)
    _assert_close({n: p.grad for n, p in mlp.named_parameters() if p.grad is not None}, ref_w, 1e-6)


def test_checkpointed_block_runs_each_tile_once_forward_and_once_backward(monkeypatch):
    """The block's recomputation only refills the MLP's saved input: its MLP forward is skipped."""
    model = _model(0.0, True)
    calls = []
    for layer in model.base_model.model.model.layers:
        original = layer.mlp.forward
        layer.mlp.forward = lambda x, _o=original: (calls.append(x.shape[0]), _o(x))[1]
    tiled_mlp.install_tiled_mlp(model, 3)
    plain_model = _model(0.0, True)
    plain_loss, plain_grads = _loss_and_grads(plain_model)
    loss, grads = _loss_and_grads(model)
    assert len(calls) == 4 * 3 * 2  # 4 blocks x 3 tiles x (forward + backward), not x 3
    assert loss == pytest.approx(plain_loss, abs=1e-6)
    _assert_close(grads, plain_grads, 1e-6)


def test_tiled_mlp_with_offloaded_checkpointing():
    plain_loss, plain_grads = _loss_and_grads(_model(0.0, True))
    model = _model(0.0, True)
    offload.install_offloaded_checkpointing(model, force=True, stash=offload.HostStash())
    tiled_mlp.install_tiled_mlp(model, 4)
    loss, grads = _loss_and_grads(model)
    assert loss == pytest.approx(plain_loss, abs=1e-6)
    _assert_close(grads, plain_grads, 1e-6)


@pytest.mark.parametrize(("setting", "tokens", "hidden", "tiles"), [
    (False, 100_000, 3584, 1), ("false", 100_000, 3584, 1), ("auto", 8192, 3584, 1), ("auto", 16_383, 3584, 1), ("auto", 16_384, 3584, 5),
    ("auto", 32_768, 3584, 10), ("auto", 98_304, 3584, 28), ("auto", 98_304, 4096, 24), (8, 1000, 3584, 8),
    (5000, 1000, 3584, 1000),
])
def test_tiles_for(setting, tokens, hidden, tiles):
    assert tiled_mlp.tiles_for(setting, tokens, hidden) == tiles


def test_plain_setting_installs_nothing_and_auto_only_checkpointed_blocks():
    model = _model(0.0, False)
    assert tiled_mlp.install_tiled_mlp(model, "false") == 0
    assert tiled_mlp.install_tiled_mlp(model, "auto") == 0  # no block is checkpointed
    assert not hasattr(model.base_model.model.model.layers[0].mlp, "_tunedeck_tiled")
    from core.train.engine_switches import limit_checkpointed_layers

    model = _model(0.0, True)
    limit_checkpointed_layers(model, 3)
    assert tiled_mlp.install_tiled_mlp(model, "auto") == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's RNG replay and autocast need CUDA")
def test_on_cuda_the_tiles_replay_the_gpu_dropout_masks_and_keep_the_gradients():
    model = _model(0.3, False).cuda()
    mlp = model.base_model.model.model.layers[0].mlp
    x = torch.randn(2, 48, 128, device="cuda", requires_grad=True)
    weight = torch.randn(2, 48, 128, device="cuda")
    runs = []
    for tiled in (False, True):
        x.grad = None
        for p in mlp.parameters():
            p.grad = None
        torch.cuda.manual_seed(7)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if tiled:
                out = tiled_mlp.tiled_forward(mlp.forward, x, 3, skip_in_recompute=False)
            else:
                out = torch.cat([mlp(t) for t in x.reshape(-1, 128).tensor_split(3)]).view(2, 48, 128)
        (out.float() * weight).sum().backward()
        runs.append((out.detach(), x.grad.clone(), {n: p.grad.clone() for n, p in mlp.named_parameters()
                                                     if p.grad is not None}))
    (ref_out, ref_x, ref_w), (out, gx, gw) = runs
    assert torch.equal(out, ref_out)  # the same masks: the outputs are bit-identical
    # The gradients are summed in another order under bf16 autocast: equal within its rounding.
    assert (gx - ref_x).abs().max().item() <= 1e-2 * ref_x.abs().max().item()
    _assert_close(gw, ref_w, 1e-2 * max(v.abs().max().item() for v in ref_w.values()))


def test_a_block_that_reads_its_mlp_output_again_recomputes_the_tiled_mlp():
    """Gemma 2 normalises the MLP's output before the residual add, and that norm saves its input: in a
    checkpointed block's recomputation the tiled MLP must compute its output, not leave it uninitialised
    (only blocks that end with their MLP, ``core.estimate.plan.MLP_ENDS_BLOCK``, may skip it)."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    def gemma():
        torch.manual_seed(0)
        config = Gemma2Config(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_implementation="eager")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        return model

    plain_loss, plain_grads = _loss_and_grads(gemma())
    model = gemma()
    assert tiled_mlp.install_tiled_mlp(model, 4) == 2
    loss, grads = _loss_and_grads(model)
    assert loss == pytest.approx(plain_loss, abs=1e-6)
    _assert_close(grads, plain_grads, 1e-5)
