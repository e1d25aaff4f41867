"""``lora_dropout_fused`` (default on GPUs): a LoRA group's dropout inside its ``lora_A`` kernels.

On CPU the Triton kernels run in Triton's interpreter (the kernels' code, not a copy; ``tests/conftest.py``
switches it on for the session, these tests ask for it with ``TUNEDECK_TRITON_INTERPRET=1``), in fp32:

- each kernel (forward, input gradient, adapter gradients) equals a reference built with torch from the
  masks ``lora_dropout_kernel.masks`` draws, for groups of 1-3 linears, ranks padded or not, ragged sizes;
- the masks keep 1 - p of the elements and are independent across neighbours, linears and seeds;
- through the grouped node, a q/k/v group's outputs and gradients equal that reference built by hand;
- a checkpointed model recomputes the same masks (its gradients equal the eager model's, and differ from the
  same model without dropout);
- what the kernels do not take (p >= 0.5, mixed ranks, float64, ``lora_dropout_fused: false``) runs
  torch's dropout.

The GPU test (``-m gpu``) runs the compiled kernels in bf16 on CUDA against the same reference.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.core.test_engine_switches import IDS, assert_close, loss_and_grads, tiny_lora  # noqa: E402
from tests.core.test_lora_group import _qkv  # noqa: E402


def interpreted(monkeypatch, name: str):
    """The Triton kernel module ``name``, its kernels run on CPU tensors in Triton's interpreter."""
    import importlib

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("Triton's interpreter must be on before Triton is imported (tests/conftest.py does it)")
    monkeypatch.setenv("TUNEDECK_TRITON_INTERPRET", "1")
    return importlib.import_module(name)


@pytest.fixture
def kernels(monkeypatch):
    return interpreted(monkeypatch, "core.train.lora_dropout_kernel")


def _reference(x, a, dh, dx, masks, p, groups):
    import core.train.lora_dropout_kernel as module

    rank = a.shape[0] // groups
    scale = module.keep_scale(p)  # 1 / (1 - p), p rounded as the kernels' threshold rounds it
    assert abs(scale * (1.0 - p) - 1.0) < 2e-5
    dropped = [x.double() * masks[g] * scale for g in range(groups)]
    blocks = [slice(g * rank, (g + 1) * rank) for g in range(groups)]
    hidden = torch.cat([dropped[g] @ a[blocks[g]].double().t() for g in range(groups)], dim=1)
    dx_out = dx.double() + sum((dh[:, blocks[g]].double() @ a[blocks[g]].double()) * masks[g] * scale
                               for g in range(groups))
    da = torch.cat([dh[:, blocks[g]].double().t() @ dropped[g] for g in range(groups)])
    return hidden, dx_out, da


@pytest.mark.parametrize("groups", [1, 2, 3])
@pytest.mark.parametrize("rank", [4, 16])
def test_each_kernel_equals_torch_on_the_same_masks(kernels, groups, rank):
    torch.manual_seed(groups * 10 + rank)
    rows, width, p, seed = 37, 70, 0.25, 987_654_321
    x = torch.randn(rows, width)
    a = torch.randn(groups * rank, width)
    dh = torch.randn(rows, groups * rank)
    dx = torch.randn(rows, width)
    masks = kernels.masks(rows, width, groups, seed, p)
    hidden, dx_want, da_want = _reference(x, a, dh, dx, masks, p, groups)

    got = kernels.dropout_lora_a(x, a, groups, seed, p)
    assert got.shape == (rows, groups * rank) and got.dtype == x.dtype
    assert torch.allclose(got.double(), hidden, rtol=1e-5, atol=1e-4)
    dx_got = dx.clone()
    kernels.add_input_grad(dx_got, dh, a, groups, seed, p)
    assert torch.allclose(dx_got.double(), dx_want, rtol=1e-5, atol=1e-4)
    da_got = kernels.adapter_grads(x, dh, groups, rank, seed, p)
    assert da_got.dtype == torch.float32 and torch.allclose(da_got.double(), da_want, rtol=1e-5, atol=1e-4)
    # both gradients in one kernel (each mask drawn once), over several row shares of a few row blocks
    dx_both = dx.clone()
    da_both = kernels.backward(x, dh, a, dx_both, groups, seed, p, tiles={"BN": 16, "BK": 64})
    assert torch.allclose(dx_both.double(), dx_want, rtol=1e-5, atol=1e-4)
    assert da_both.dtype == torch.float32 and torch.allclose(da_both.double(), da_want, rtol=1e-5, atol=1e-4)
    # another seed: other masks, other results
    assert not torch.allclose(kernels.dropout_lora_a(x, a, groups, seed + 1, p), got, atol=1e-3)


@pytest.mark.parametrize("split", [2, 4])
def test_the_forward_split_over_the_width_adds_up_to_the_whole(kernels, split):
    torch.manual_seed(split)
    rows, width, groups, rank, p, seed = 21, 200, 3, 8, 0.2, 4242
    x, a = torch.randn(rows, width), torch.randn(groups * rank, width)
    masks = kernels.masks(rows, width, groups, seed, p)
    hidden = _reference(x, a, torch.zeros(rows, groups * rank), torch.zeros(rows, width), masks, p, groups)[0]
    got = kernels.dropout_lora_a(x, a, groups, seed, p, tiles={"SPLIT": split})
    assert got.shape == (rows, groups * rank) and got.dtype == x.dtype
    assert torch.allclose(got.double(), hidden, rtol=1e-5, atol=1e-4)


def test_masks_keep_one_minus_p_independently(kernels):
    rows, width, p = 256, 1024, 0.1
    masks = kernels.masks(rows, width, 3, 2024, p)
    n = rows * width
    sigma = (p * (1 - p) / n) ** 0.5
    for mask in masks:
        assert abs(1.0 - mask.double().mean().item() - p) < 5 * sigma
    dropped = ~masks
    both = (p * p * (1 - p * p) / n) ** 0.5
    pairs = [(dropped[0], dropped[1]), (dropped[0], dropped[2]), (dropped[1], dropped[2]),
             (dropped[0][:, 1:], dropped[0][:, :-1]),  # neighbours in a row
             (dropped[0][1:], dropped[0][:-1])]  # the same column in neighbouring rows
    for left, right in pairs:
        assert abs((left & right).double().mean().item() - p * p) < 6 * both
    other = kernels.masks(rows, width, 1, 2025, p)[0]
    assert abs((dropped[0] & ~other).double().mean().item() - p * p) < 6 * both
    assert kernels.threshold(0.5) < 2**31  # the largest p the kernels take fits their 32-bit argument


@pytest.mark.parametrize("wide", [False, True])
def test_the_grouped_node_runs_the_kernels_with_exact_gradients(kernels, monkeypatch, wide):
    """A q/k/v group; ``wide``: its input is wider than ``BACKWARD_MAX_WIDTH``, where the two backward
    kernels run instead of the one."""
    from core.train.lora_group import group_lora_layers

    if wide:
        monkeypatch.setattr(kernels, "BACKWARD_MAX_WIDTH", 16)

    calls = {"forward": 0, "backward": 0, "input": 0, "adapters": 0}
    for name, key in (("dropout_lora_a", "forward"), ("backward", "backward"), ("add_input_grad", "input"),
                      ("adapter_grads", "adapters")):
        original = getattr(kernels, name)

        def counted(*args, _original=original, _key=key):
            calls[_key] += 1
            return _original(*args)

        monkeypatch.setattr(kernels, name, counted)
    model = _qkv(0.3, width=24, outs=(20, 12, 12), rank=4, dtype=torch.float32)
    assert group_lora_layers(model) == 1
    inner = model.base_model.model
    layers = [inner.q_proj, inner.k_proj, inner.v_proj]
    x = torch.randn(3, 7, 24, requires_grad=True)
    torch.manual_seed(123)
    out = model(x)
    out.square().sum().backward()
    if wide:
        assert calls == {"forward": 1, "backward": 0, "input": 1, "adapters": 1}
    else:
        assert calls == {"forward": 1, "backward": 1, "input": 0, "adapters": 0}  # both gradients in one kernel
    grads = [x.grad] + [p.grad for layer in layers
                        for p in (layer.lora_A["default"].weight, layer.lora_B["default"].weight)]

    # by hand, in float64: the seed the node draws from the CPU generator, the kernels' masks
    torch.manual_seed(123)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    masks = kernels.masks(21, 24, 3, seed, 0.3).view(3, 3, 7, 24)
    x_ref = x.detach().double().requires_grad_(True)
    params = [p.detach().double().requires_grad_(True) for layer in layers
              for p in (layer.lora_A["default"].weight, layer.lora_B["default"].weight)]
    parts = []
    for i, layer in enumerate(layers):
        base = layer.base_layer
        bias = None if base.bias is None else base.bias.double()
        dropped = x_ref * masks[i] * kernels.keep_scale(0.3)
        parts.append(torch.nn.functional.linear(x_ref, base.weight.double(), bias)
                     + 2.0 * (dropped @ params[2 * i].t()) @ params[2 * i + 1].t())
    ref = torch.cat(parts, dim=-1)
    ref.square().sum().backward()
    assert (~masks).any() and masks.any()
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-4)
    for got, want in zip(grads, [x_ref.grad] + [p.grad for p in params], strict=True):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-3 * want.abs().max().item())


def test_a_checkpointed_model_recomputes_the_same_masks(kernels):
    eager = tiny_lora({"lora_dropout": 0.1})
    checkpointed = tiny_lora({"lora_dropout": 0.1}, checkpointing=True)
    undropped = tiny_lora({})
    torch.manual_seed(5)
    loss_eager, grads_eager = loss_and_grads(eager, IDS, autocast=False)
    torch.manual_seed(5)
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed, IDS, autocast=False)
    torch.manual_seed(5)
    loss_plain, _ = loss_and_grads(undropped, IDS, autocast=False)
    assert loss_ckpt == pytest.approx(loss_eager, rel=1e-6)
    assert_close(grads_eager, grads_ckpt, rel=1e-5)
    assert abs(loss_eager - loss_plain) > 1e-4  # the dropout acted


def _count_dropout_lora_a(kernels, monkeypatch) -> dict:
    """Counts the kernels' ``dropout_lora_a`` calls from now on (``used["n"]``)."""
    used = {"n": 0}
    original = kernels.dropout_lora_a

    def counted(*args):
        used["n"] += 1
        return original(*args)

    monkeypatch.setattr(kernels, "dropout_lora_a", counted)
    return used


def test_the_recompute_takes_the_kept_lora_a_products_and_changes_no_number(kernels, monkeypatch):
    """``recompute_keep_lora_a``: a checkpointed block's recompute takes the lora_A products its first forward
    made instead of running the kernel again (the replayed generator gives it the same seed); the loss and every
    gradient are the same bits, and nothing stays kept after the step."""
    used = _count_dropout_lora_a(kernels, monkeypatch)
    runs = {}
    for keep in (False, True):
        model = tiny_lora({"lora_dropout": 0.1, "gradient_checkpointing": True, "recompute_keep_lora_a": keep,
                           "lora_swiglu_down": False}, checkpointing=True)  # (the down's: the SwiGLU kernels')
        groups = {id(m._tunedeck_group): m._tunedeck_group for m in model.modules() if hasattr(m, "_tunedeck_group")}
        assert len(groups) == 16 and all(g.keeps_lora_a is keep for g in groups.values())
        used["n"] = 0
        torch.manual_seed(5)
        loss, grads = loss_and_grads(model, IDS, autocast=False)
        runs[keep] = (loss, grads, used["n"])
        assert all(g._kept_a is None for g in groups.values())
    assert runs[False][2] == 2 * 16  # forward and recompute, 4 groups a block, 4 blocks
    assert runs[True][2] == 16  # the forward only
    assert runs[True][0] == runs[False][0]
    for name, grad in runs[False][1].items():
        assert torch.equal(runs[True][1][name], grad), name


def test_what_the_kernels_do_not_take_runs_torch_dropout(kernels, monkeypatch):
    x = torch.zeros(4, 8)
    assert kernels.usable(x, [8, 8, 8], [0.1] * 3, 4, 8)
    assert not kernels.usable(x, [8, 8, 8], [0.5] * 3, 4, 8)
    assert not kernels.usable(x, [8, 4], [0.1] * 2, 4, 8)
    assert not kernels.usable(x, [8], [0.1], 2**16, 2**15)  # 32-bit element counters
    assert not kernels.usable(x.double(), [8], [0.1], 4, 8)
    monkeypatch.delenv("TUNEDECK_TRITON_INTERPRET")
    assert not kernels.usable(x, [8], [0.1], 4, 8)  # a CPU tensor, not asked for
    monkeypatch.setenv("TUNEDECK_TRITON_INTERPRET", "1")

    used = _count_dropout_lora_a(kernels, monkeypatch)
    torch.manual_seed(5)
    loss_and_grads(tiny_lora({"lora_dropout": 0.1, "lora_dropout_fused": False}), IDS, autocast=False)
    assert used["n"] == 0
    torch.manual_seed(5)
    loss_and_grads(tiny_lora({"lora_dropout": 0.1, "lora_swiglu_down": False}), IDS, autocast=False)
    assert used["n"] == 16  # 4 groups a block, 4 blocks
    torch.manual_seed(5)
    loss_and_grads(tiny_lora({"lora_dropout": 0.1}), IDS, autocast=False)
    assert used["n"] == 16 + 12  # lora_swiglu_down (default): the down projection's in the SwiGLU kernels


def test_tiles_by_group_and_a_register_cap_go_from_the_occupancy_bench_to_the_kernels(kernels, tmp_path,
                                                                                       monkeypatch):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import kernel_occupancy as bench  # the bench script, for its choice

    own = dict(kernels.TILES["backward"])
    sixteen, capped = {**own, "BN": 16}, {**own, "maxnreg": 128}

    def row(groups, tiles, ms, error=0.0):
        return {"kernel": "backward", "groups": groups, "variant": {}, "tiles": tiles, "ms": ms, "error": error}

    rows = [row(3, own, 0.50), row(3, sixteen, 0.40, 1e-6), row(3, capped, 0.30, error=0.5),  # fastest, but wrong
            row(1, own, 0.20), row(1, capped, 0.19),
            {"kernel": "down_backward", "variant": {"maxnreg": 168}, "tiles": {"BM": 16, "maxnreg": 168}, "ms": 2.0,
             "error": 0.0},
            {"kernel": "down_forward", "variant": {}, "tiles": {"BM": 64}, "failed": "OutOfResources"}]
    chosen = bench.fastest(rows)
    assert chosen == {"backward:3": sixteen, "backward:1": capped, "down_backward": {"BM": 16, "maxnreg": 168}}
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"overall": {k: v for k, v in chosen.items() if k.startswith("backward:")}}))
    tiles = {name: dict(t) for name, t in kernels.TILES.items() if ":" not in name}  # no group's own tiles yet
    monkeypatch.setenv("TUNEDECK_LORA_DROPOUT_TILES", str(path))
    kernels.load_tiles(tiles, "TUNEDECK_LORA_DROPOUT_TILES")
    assert tiles["backward:3"] == sixteen and tiles["backward:1"] == capped and tiles["backward"] == own
    monkeypatch.setattr(kernels, "TILES", tiles)
    monkeypatch.delenv("TUNEDECK_TRITON_INTERPRET")  # the compiled kernels' tiles
    assert kernels._tiles("backward", 3, None) == sixteen
    assert kernels._tiles("backward", 2, None) == own  # no tiles of its own: the kernel's
    assert kernels._tiles("backward", 1, {"BK": 64}) == {**capped, "BK": 64}
    monkeypatch.setenv("TUNEDECK_TRITON_INTERPRET", "1")  # the interpreter takes none of the compiler's options
    assert set(kernels._tiles("backward", 1, None)) == {"BN", "BK"}
    monkeypatch.delenv("TUNEDECK_TRITON_INTERPRET")
    assert "maxnreg" not in kernels._tiles("backward", 1, {"maxnreg": None})  # None: the cap taken out (the bench)
    monkeypatch.setattr(torch.version, "hip", "6.4")  # Triton's AMD backend refuses the keyword
    assert "maxnreg" not in kernels._tiles("backward", 1, None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("TUNEDECK_TRITON_INTERPRET", "1")
    # and the kernels run with them: the interpreter's tiles, the same numbers as before
    torch.manual_seed(0)
    x, a, dh = torch.randn(40, 64), torch.randn(16, 64) / 8, torch.randn(40, 16)
    dx = torch.randn(40, 64)
    _, dx_want, da_want = _reference(x, a, dh, dx, kernels.masks(40, 64, 1, 9, 0.1), 0.1, 1)
    da = kernels.backward(x, dh, a, dx, 1, 9, 0.1)
    assert_close({"dx": dx.double(), "dA": da.double()}, {"dx": dx_want, "dA": da_want}, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the compiled kernels: needs a GPU")
@pytest.mark.parametrize("groups,width", [(3, 3584), (2, 3584), (1, 18944)])
def test_compiled_kernels_in_bf16_equal_torch_on_the_same_masks(groups, width):
    import core.train.lora_dropout_kernel as module

    torch.manual_seed(0)
    rows, rank, p, seed = 4096 + 37, 16, 0.05, 123_456_789
    device = torch.device("cuda")
    x = torch.randn(rows, width, device=device, dtype=torch.bfloat16)
    a = (torch.randn(groups * rank, width, device=device) * width**-0.5).to(torch.bfloat16)
    dh = torch.randn(rows, groups * rank, device=device, dtype=torch.bfloat16)
    dx = torch.randn(rows, width, device=device, dtype=torch.bfloat16)
    masks = module.masks(rows, width, groups, seed, p, device=device)
    hidden, dx_want, da_want = _reference(x, a, dh, dx, masks, p, groups)
    got = module.dropout_lora_a(x, a, groups, seed, p)
    assert (got.double() - hidden).abs().max().item() <= 2e-2 * hidden.abs().max().item()
    dx_got = dx.clone()
    module.add_input_grad(dx_got, dh, a, groups, seed, p)
    assert (dx_got.double() - dx_want).abs().max().item() <= 2e-2 * dx_want.abs().max().item()
    da_got = module.adapter_grads(x, dh, groups, rank, seed, p)
    assert (da_got.double() - da_want).abs().max().item() <= 1e-2 * da_want.abs().max().item()
    dx_both = dx.clone()  # both in one kernel
    da_both = module.backward(x, dh, a, dx_both, groups, seed, p)
    assert (dx_both.double() - dx_want).abs().max().item() <= 2e-2 * dx_want.abs().max().item()
    assert (da_both.double() - da_want).abs().max().item() <= 1e-2 * da_want.abs().max().item()
    keep = masks.double().mean().item()
    assert abs(keep - (1 - p)) < 1e-3
    # a seed of 1 (Triton would compile such an argument as a constant) runs and draws its own masks
    masks_1 = module.masks(rows, width, groups, 1, p, device=device)
    want_1 = _reference(x, a, dh, dx, masks_1, p, groups)[0]
    got_1 = module.dropout_lora_a(x, a, groups, 1, p)
    assert (got_1.double() - want_1).abs().max().item() <= 2e-2 * want_1.abs().max().item()
    # the forward's width shared among 4 programs a row block: fp32 partial sums, the same result
    got_split = module.dropout_lora_a(x, a, groups, seed, p, tiles={"SPLIT": 4})
    assert (got_split.double() - hidden).abs().max().item() <= 2e-2 * hidden.abs().max().item()
    # the module's tiles cap the registers a thread (more programs a multiprocessor, bench/kernel_occupancy.py):
    # without the cap the same code, the same bits; at 32 rows a tile (the tiles before) dA's fp32 sums in another order
    dx_free = dx.clone()
    da_free = module.backward(x, dh, a, dx_free, groups, seed, p, tiles={"maxnreg": None})
    assert torch.equal(dx_free, dx_both) and torch.equal(da_free, da_both)
    dx_32 = dx.clone()
    da_32 = module.backward(x, dh, a, dx_32, groups, seed, p, tiles={"BN": 32, "maxnreg": None})
    assert (dx_32.double() - dx_want).abs().max().item() <= 2e-2 * dx_want.abs().max().item()
    assert (da_32 - da_both).abs().max().item() <= 1e-5 * da_both.abs().max().item()
