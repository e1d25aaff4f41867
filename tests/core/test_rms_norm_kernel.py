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
