"""``rms_norm_rows`` (on by default on GPUs): a frozen RMSNorm's backward one program a row.

On CPU the Triton kernels run in Triton's interpreter (``tests/conftest.py``):

- forward and backward equal transformers' Qwen2RMSNorm (fp32 statistics, the normalised input rounded to the
  input's dtype before the weight) and its autograd gradient, in fp32 and in bf16 to within one rounding, on
  ragged widths; the weight gets no gradient and the gradient is written over the incoming one;
- ``use_row_kernels`` covers the norms Liger patched, leaves the rest, runs Liger's forward where the kernels do
  not apply (a trained weight, another casting, narrow rows) and is idempotent.

The GPU test (``-m gpu``) runs the compiled kernels in bf16 on CUDA at a 7B's width against Liger's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.core.test_engine_switches import assert_close  # noqa: E402
from tests.core.test_lora_dropout_kernel import interpreted  # noqa: E402


@pytest.fixture
def kernels(monkeypatch):
    return interpreted(monkeypatch, "core.train.rms_norm_kernel")


def _hf_norm(x, weight, eps):
    """transformers' Qwen2RMSNorm / LlamaRMSNorm forward."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class _LigerLike(torch.nn.Module):
    """A norm as Liger's instance patch leaves it: its attributes and a forward of its own."""

    def __init__(self, width, casting="llama", offset=0.0, trained=False, dtype=torch.float32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width, dtype=dtype) + 0.5, requires_grad=trained)
        self.variance_epsilon, self.offset, self.casting_mode, self.in_place = 1e-6, offset, casting, True
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return _hf_norm(x, self.weight, self.variance_epsilon)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_forward_and_backward_equal_transformers_norm(kernels, dtype, tol):
    torch.manual_seed(0)
    rows, width, eps = 3 * 7, 300, 1e-6
    x = (torch.randn(3, 7, width) * 3).to(dtype)
    weight = (torch.rand(width) + 0.5).to(dtype)
    grad = torch.randn(3, 7, width).to(dtype)

    ref_x = x.clone().requires_grad_(True)
    want = _hf_norm(ref_x, weight, eps)
    want.backward(grad)

    got_x = x.clone().requires_grad_(True)
    got = kernels.FrozenRMSNorm.apply(got_x, weight, eps)
    assert got.dtype == dtype and got.shape == x.shape
    assert ((got.double() - want.double()).abs() / (want.double().abs() + 1)).max() < tol
    incoming = grad.clone()
    got.backward(incoming)
    assert ((got_x.grad.double() - ref_x.grad.double()).abs() / (ref_x.grad.double().abs() + 1)).max() < tol
    assert rows == got_x.grad.reshape(-1, width).shape[0]
    assert not torch.equal(got_x.grad, torch.zeros_like(got_x.grad))


def test_a_gradient_whose_rows_are_strided_is_read_in_place_and_gives_the_same_result(kernels):
    """``lora_fold_dh`` hands the norm the first columns of a wider gradient: read in place (no copy made first),
    the result a new dense tensor equal to the dense gradient's, and the wider tensor left as it was."""
    torch.manual_seed(1)
    width = 300
    x = torch.randn(4, 5, width) * 2
    weight = torch.rand(width) + 0.5
    wide = torch.randn(4, 5, width + 24)
    strided = wide[..., :width]
    dense = strided.contiguous()
    before = wide.clone()
    got = []
    for grad in (dense, strided):
        leaf = x.clone().requires_grad_(True)
        kernels.FrozenRMSNorm.apply(leaf, weight, 1e-6).backward(grad)
        got.append(leaf.grad)
    assert got[1].is_contiguous() and torch.equal(got[0], got[1])
    assert torch.equal(wide, before)


def test_the_kernels_go_over_the_norms_liger_patched_and_only_where_they_apply(kernels):
    width = 300
    model = torch.nn.ModuleDict({
        "frozen": _LigerLike(width), "trained": _LigerLike(width, trained=True),
        "gemma": _LigerLike(width, casting="gemma", offset=1.0), "narrow": _LigerLike(64),
        "plain": torch.nn.LayerNorm(width),
    })
    assert kernels.use_row_kernels(model) == 4  # the four Liger-like norms, not the LayerNorm
    assert kernels.use_row_kernels(model) == 4  # idempotent: wrapped once
    x = torch.randn(5, width)
    for name in ("frozen", "trained", "gemma"):
        model[name](x)
    model["narrow"](torch.randn(5, 64))
    assert model["frozen"].calls == 0  # the row kernels ran
    assert model["trained"].calls == model["gemma"].calls == model["narrow"].calls == 1  # Liger's forward ran
    assert not hasattr(model["plain"].forward, "tunedeck_rms_rows")


@pytest.mark.gpu
def test_compiled_kernels_in_bf16_equal_liger():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from liger_kernel.ops import LigerRMSNormFunction

    import core.train.rms_norm_kernel as kernels

    torch.manual_seed(0)
    x = torch.randn(4096, 3584, device="cuda", dtype=torch.bfloat16) * 2
    weight = torch.rand(3584, device="cuda", dtype=torch.bfloat16) + 0.5
    grad = torch.randn_like(x)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    want = LigerRMSNormFunction.apply(a, weight, 1e-6, 0.0, "llama", True, None)
    got = kernels.FrozenRMSNorm.apply(b, weight, 1e-6)
    assert ((got.float() - want.float()).abs() / (want.float().abs() + 1)).max() < 1e-2
    want.backward(grad.clone())
    got.backward(grad.clone())
    assert ((b.grad.float() - a.grad.float()).abs() / (a.grad.float().abs() + 1)).max() < 1e-2


def _liger_like_qwen2(dtype):
    """A small Qwen2 (hidden 320: rows wide enough for the row kernels) whose RMSNorms carry what Liger's instance
    patch gives them (its llama casting, in place; their forward stays transformers', the same arithmetic), with
    every weight frozen but the q projections' (something to train), in train mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=300, hidden_size=320, intermediate_size=640, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="eager")
    model = Qwen2ForCausalLM(config).to(dtype)
    for name, param in model.named_parameters():
        param.requires_grad_("q_proj" in name)
    for module in model.modules():
        if type(module).__name__ == "Qwen2RMSNorm":
            module.weight.data.uniform_(0.5, 1.5)
            module.casting_mode, module.offset, module.in_place = "llama", 0.0, True
    model.train()
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager", "checkpointed"])
def test_the_residual_adds_inside_the_norms_keep_the_loss_and_gradients(kernels, monkeypatch, dtype, checkpointing):
    """``rms_norm_residual``: each block's attention add runs inside its second norm, and its MLP add inside the next
    block's first norm (the last block's inside the model's last norm); one kernel each way where autograd ran the
    add, the norm and the sum of the residual's two gradients apart. Checkpointed blocks run their own forward (where
    transformers checkpoints them: they are still recomputed). Against the row kernels alone on the same model and
    tokens: the same loss and gradients, to the bit in fp32 (the same roundings in the same order; Triton's
    interpreter rounds bf16 down, the GPU's compiled kernels to nearest as torch: the GPU test checks those)."""
    ids = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(3))
    calls = {"n": 0}
    fused = kernels.AddFrozenRMSNorm.apply

    def counting(*args):
        calls["n"] += 1
        return fused(*args)

    monkeypatch.setattr(kernels.AddFrozenRMSNorm, "apply", counting)
    norms, runs = kernels.FrozenRMSNorm.apply, {"norm": 0}

    def norm_counting(*args):
        runs["norm"] += 1
        return norms(*args)

    results = []
    for residual in (False, True):
        model = _liger_like_qwen2(dtype)
        assert kernels.use_row_kernels(model) == 2 * 3 + 1
        if residual:
            assert kernels.fuse_residual_norms(model) == 3 and kernels.fuse_residual_norms(model) == 3  # idempotent
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        calls["n"] = runs["norm"] = 0
        monkeypatch.setattr(kernels.FrozenRMSNorm, "apply", norm_counting)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        monkeypatch.setattr(kernels.FrozenRMSNorm, "apply", norms)
        assert calls["n"] == (2 * 3 if residual and not checkpointing else 0)  # both adds of each block
        # the norms apart: none left but the first block's first when fused; each recomputed when checkpointed
        assert runs["norm"] == (1 if residual and not checkpointing else (2 * 3 + 1) + 2 * 3 * checkpointing)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.item(), grads))
        assert all(getattr(n, "_tunedeck_handed", None) is None for n in model.modules())  # each hand-off taken
    (loss_apart, grads_apart), (loss_fused, grads_fused) = results
    assert grads_apart.keys() == grads_fused.keys() and len(grads_fused) == 2 * 3  # q's weight and bias
    if dtype == torch.float32:
        assert loss_fused == loss_apart
        assert all(torch.equal(grad, grads_fused[name]) for name, grad in grads_apart.items())
    else:
        assert loss_fused == pytest.approx(loss_apart, rel=1e-3)
        assert_close({k: v.float() for k, v in grads_apart.items()}, {k: v.float() for k, v in grads_fused.items()},
                     rel=5e-2)
    assert all(grad.abs().max() > 0 for grad in grads_fused.values())


@pytest.mark.gpu
def test_compiled_residual_kernels_in_bf16_are_the_add_and_the_norm_to_the_bit():
    """``AddFrozenRMSNorm`` compiled for the GPU in bf16 at a 7B's width: h, the norm's output and the gradient of
    both summands equal torch's add, ``FrozenRMSNorm`` and autograd's sum of h's two gradients, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import core.train.rms_norm_kernel as kernels

    torch.manual_seed(0)
    a, b = (torch.randn(4096, 3584, device="cuda", dtype=torch.bfloat16) * s for s in (4, 1))
    weight = torch.rand(3584, device="cuda", dtype=torch.bfloat16) + 0.5
    dh, dy = torch.randn_like(a), torch.randn_like(a)
    want_a, want_b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    want_h = want_a + want_b
    want_y = kernels.FrozenRMSNorm.apply(want_h, weight, 1e-6)
    torch.autograd.backward([want_h, want_y], [dh.clone(), dy.clone()])
    got_a, got_b = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    got_h, got_y = kernels.AddFrozenRMSNorm.apply(got_a, got_b, weight, 1e-6)
    torch.autograd.backward([got_h, got_y], [dh.clone(), dy.clone()])
    for got, want in ((got_h, want_h), (got_y, want_y), (got_a.grad, want_a.grad), (got_b.grad, want_b.grad)):
        assert torch.equal(got, want)
