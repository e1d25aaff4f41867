"""``lora_swiglu_fused`` (on by default on GPUs; the H200's 7B loss equals plain's, engine-speed-e): the gate/up
LoRA updates added inside the SwiGLU kernel.

On CPU the Triton kernels run in Triton's interpreter (``tests/conftest.py``), in fp32:

- the forward and the in-place backward equal torch's ``silu(gate + sg hg Bg^T) * (up + su hu Bu^T)`` and its
  autograd gradients, ranks padded or not, ragged sizes;
- on the tiny model (4 SiLU MLPs, LoRA on every linear) the fused path runs in every MLP, with and without
  checkpointing, and the loss and every adapter's gradient equal peft's own forward; with dropout the masks
  are the fused kernels' in both, so the same comparison holds against the grouped node's adds;
- ``lora_swiglu_fused: false`` leaves the MLPs alone.

The GPU test (``-m gpu``) runs the compiled kernels in bf16 on CUDA at a 7B's MLP width against torch in
float64. (Against what they replace, the ``lora_B`` adds and Liger's SwiGLU, bit for bit, they are not: on the
H200 13% of one result's elements rounded the other way, engine-speed-summary.md, session 16.)
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.core.test_engine_switches import IDS, assert_close, loss_and_grads, tiny_lora  # noqa: E402
from tests.core.test_lora_dropout_kernel import interpreted  # noqa: E402

ON = {"lora_swiglu_fused": True, "lora_swiglu_down": False}  # the SwiGLU switch alone (down: DOWN)


@pytest.fixture
def kernels(monkeypatch):
    interpreted(monkeypatch, "core.train.lora_dropout_kernel")
    return interpreted(monkeypatch, "core.train.lora_swiglu_kernel")


def _reference(gate, up, hidden, b, sg, su, grad):
    """The product and the gradients of gate and up (the full pre-activations) by torch's autograd."""
    rank = hidden.shape[1] // 2
    g = gate.double().requires_grad_(True)
    u = up.double().requires_grad_(True)
    pre_g = g + sg * hidden[:, :rank].double() @ b[:, :rank].double().t()
    pre_u = u + su * hidden[:, rank:].double() @ b[:, rank:].double().t()
    out = torch.nn.functional.silu(pre_g) * pre_u
    out.backward(grad.double())
    return out.detach(), g.grad, u.grad


@pytest.mark.parametrize("rank", [4, 16])
def test_forward_and_backward_equal_torch(kernels, rank):
    torch.manual_seed(rank)
    rows, n, sg, su = 37, 70, 2.0, 0.5
    gate, up = torch.randn(rows, n), torch.randn(rows, n)
    hidden, b = torch.randn(rows, 2 * rank), torch.randn(n, 2 * rank) / rank
    grad = torch.randn(rows, n)
    want, want_dg, want_du = _reference(gate, up, hidden, b, sg, su, grad)

    got = kernels.forward(gate, up, hidden, b, sg, su)
    assert got.dtype == gate.dtype and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)
    dg, du = gate.clone(), up.clone()
    kernels.backward(grad, dg, du, hidden, b, sg, su)  # in place over the base outputs
    assert torch.allclose(dg.double(), want_dg, rtol=1e-5, atol=1e-5)
    assert torch.allclose(du.double(), want_du, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(dg, gate)  # (it did write)


def _count(monkeypatch, kernels) -> dict:
    calls = {"forward": 0, "backward": 0}
    for name in calls:
        original = getattr(kernels, name)

        def counting(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setattr(kernels, name, counting)
    return calls


@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager", "checkpointed"])
def test_the_tiny_model_keeps_peft_loss_and_gradients(kernels, monkeypatch, checkpointing):
    plain = tiny_lora({"lora_grouped": False, "lora_fused_add": False}, checkpointing=checkpointing)
    fused = tiny_lora(ON, checkpointing=checkpointing)
    mlps = [m for m in fused.modules() if getattr(m, "_tunedeck_swiglu", None) is not None]
    assert len(mlps) == 4
    loss_plain, grads_plain = loss_and_grads(plain, IDS, autocast=False)
    calls = _count(monkeypatch, kernels)
    loss_fused, grads_fused = loss_and_grads(fused, IDS, autocast=False)
    assert calls == {"forward": 4 * (2 if checkpointing else 1), "backward": 4}
    assert loss_fused == pytest.approx(loss_plain, rel=1e-6)
    assert_close(grads_plain, grads_fused, rel=1e-5)


def test_with_dropout_the_fused_product_equals_the_grouped_adds(kernels, monkeypatch):
    """Dropout through the fused dropout kernels (the same hash masks either way): the SwiGLU switch alone."""
    adds = tiny_lora({"lora_dropout": 0.1, "lora_swiglu_fused": False})
    fused = tiny_lora({"lora_dropout": 0.1, **ON})
    assert not any(hasattr(m, "_tunedeck_swiglu") for m in adds.modules())
    results = []
    for model in (adds, fused):
        torch.manual_seed(5)  # the kernels' seeds come from the CPU generator
        results.append(loss_and_grads(model, IDS, autocast=False))
    (loss_adds, grads_adds), (loss_fused, grads_fused) = results
    assert loss_fused == pytest.approx(loss_adds, rel=1e-6)
    assert_close(grads_adds, grads_fused, rel=1e-5)
    plain = tiny_lora({"lora_dropout": 0.1, "lora_grouped": False})  # torch's masks: another loss
    torch.manual_seed(5)
    assert loss_and_grads(plain, IDS, autocast=False)[0] != pytest.approx(loss_fused, rel=1e-6)


def test_the_fused_swiglu_goes_back_over_a_forward_put_there_at_train_begin(kernels, monkeypatch):
    """The Trainer applies Liger's kernels in ``train()``, after ``wrap_lora``: Liger's instance patch replaces
    each MLP's forward (the first H200 run of this switch ran Liger's SwiGLU and the adds, engine-speed-swiglu-a).
    The engine's train-begin callback puts the fused SwiGLU back over it, once."""
    import types

    from core.train.engine_switches import EngineSwitchesCallback

    model = tiny_lora(ON)
    mlps = [m for m in model.modules() if getattr(m, "_tunedeck_swiglu", None) is not None]
    for mlp in mlps:  # what an instance patch does
        mlp.forward = types.MethodType(type(mlp).forward, mlp)
    calls = _count(monkeypatch, kernels)
    loss_and_grads(model, IDS, autocast=False)
    assert calls["forward"] == 0
    callback = EngineSwitchesCallback(None, False, "false", lora_swiglu=True)
    callback.on_train_begin(None, None, None, model=model)
    callback.on_train_begin(None, None, None, model=model)  # idempotent: one layer of wrapping
    model.zero_grad()
    loss_and_grads(model, IDS, autocast=False)
    assert calls == {"forward": 4, "backward": 4}


def test_the_tile_bench_picks_the_fastest_tiles_within_the_error_bound_and_the_engine_takes_them(tmp_path,
                                                                                                 monkeypatch):
    import json
    import sys
    from pathlib import Path

    from core.train.lora_dropout_kernel import load_tiles

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import lora_swiglu_kernel as bench  # the bench script, for its choice

    def tile(bm, fwd, bwd, ok=True):
        return {"BM": bm, "BN": 128, "num_warps": 4, "forward_ms": fwd, "backward_ms": bwd, "ok": ok}

    rows = [{"tiles": [tile(16, 0.30, 0.90), tile(32, 0.40, 0.50), tile(64, 0.10, 0.10, ok=False)]},
            {"tiles": [tile(16, 0.60, 1.80), tile(32, 0.80, 0.70), tile(64, 0.20, 0.20)]}]
    chosen = bench.overall(rows)  # 64 is fastest but over the error bound at one token count
    assert chosen == {"forward": {"BM": 16, "BN": 128, "num_warps": 4}, "backward": {"BM": 32, "BN": 128, "num_warps": 4}}
    assert bench.overall([{"tiles": [tile(16, 0.3, 0.3, ok=False)]}]) == {}
    path = tmp_path / "tiles.json"
    path.write_text(json.dumps({"overall": chosen}))
    tiles = {"forward": {"BM": 1, "BN": 1, "num_warps": 1}, "backward": {"BM": 2, "BN": 2, "num_warps": 2}}
    load_tiles(tiles, "TUNEDECK_LORA_SWIGLU_TILES")
    assert tiles["forward"]["BM"] == 1  # unset: the module's own
    monkeypatch.setenv("TUNEDECK_LORA_SWIGLU_TILES", str(path))
    load_tiles(tiles, "TUNEDECK_LORA_SWIGLU_TILES")
    assert tiles == chosen


@pytest.mark.gpu
@pytest.mark.parametrize("rank", [16, 64])
def test_compiled_kernels_in_bf16_equal_torch(rank):
    import core.train.lora_swiglu_kernel as kernels

    torch.manual_seed(0)
    rows, n, sg, su = 8192, 18944, 2.0, 2.0
    dev = {"device": "cuda", "dtype": torch.bfloat16}
    gate, up = torch.randn(rows, n, **dev), torch.randn(rows, n, **dev)
    hidden, b = torch.randn(rows, 2 * rank, **dev), torch.randn(n, 2 * rank, **dev) / rank
    grad = torch.randn(rows, n, **dev)
    want, want_dg, want_du = _reference(gate, up, hidden, b, sg, su, grad)
    got = kernels.forward(gate, up, hidden, b, sg, su)
    dg, du = gate.clone(), up.clone()
    kernels.backward(grad, dg, du, hidden, b, sg, su)
    for x, ref in ((got, want), (dg, want_dg), (du, want_du)):
        err = ((x.double() - ref).abs() / (ref.abs() + 1.0)).max().item()
        assert err < 2e-2, err  # bf16 rounding of the result, relative to its size



DOWN = {**ON, "lora_swiglu_down": True}  # the default


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager", "checkpointed"])
def test_the_down_projection_inside_the_swiglu_keeps_the_loss_and_gradients(kernels, monkeypatch, dropout,
                                                                           checkpointing):
    """``lora_swiglu_down``: the down projection's dropout and ``lora_A`` (forward and both gradients) inside the
    SwiGLU kernels. Against the same engine without it (the dropout kernels' masks either way, drawn from the same
    seeds): the same loss and gradients, the dropout kernels never run over the down's input, and the down
    node keeps no copy of its input."""
    import core.train.lora_dropout_kernel as dropout_kernels

    cfg = {"lora_dropout": dropout}
    apart = tiny_lora({**cfg, **ON}, checkpointing=checkpointing)
    inside = tiny_lora({**cfg, **DOWN}, checkpointing=checkpointing)
    assert sum(getattr(m, "fuse_in_swiglu", False) for m in
               {id(g): g for g in (getattr(m, "_tunedeck_group", None) for m in inside.modules()) if g}.values()) == 4
    results, widths = [], []
    original = dropout_kernels.dropout_lora_a

    def watching(x, *args, **kwargs):
        widths.append(x.shape[-1])
        return original(x, *args, **kwargs)

    monkeypatch.setattr(dropout_kernels, "dropout_lora_a", watching)
    fused = {"forward": 0}
    forward_down = kernels.forward_down

    def counting(*args, **kwargs):
        fused["forward"] += 1
        return forward_down(*args, **kwargs)

    monkeypatch.setattr(kernels, "forward_down", counting)
    for model in (apart, inside):
        torch.manual_seed(5)  # the kernels' seeds come from the CPU generator
        widths.clear()
        results.append(loss_and_grads(model, IDS, autocast=False))
        results[-1] += (sorted(set(widths)),)
        assert fused["forward"] == (0 if model is apart else 4 * (2 if checkpointing else 1))
    (loss_apart, grads_apart, widths_apart), (loss_inside, grads_inside, widths_inside) = results
    intermediate = apart.config.intermediate_size
    if dropout:
        assert intermediate in widths_apart and intermediate not in widths_inside
    assert loss_inside == pytest.approx(loss_apart, rel=1e-6)
    assert_close(grads_apart, grads_inside, rel=1e-5)
    down_a = [k for k in grads_inside if "down_proj.lora_A" in k]
    assert len(down_a) == 4 and all(grads_inside[k].abs().max() > 0 for k in down_a)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_the_b_gradients_summed_in_the_swiglu_kernel_are_the_matmuls(kernels, monkeypatch, dropout):
    """``lora_swiglu_db`` (the default, with the down projection inside): the SwiGLU backward kernel sums the gate/up
    adapters' B gradients from the gradients it writes, and the gate/up node, given B detached, makes none. Against
    the same engine with the two matmuls (the same masks): the same loss and gradients, every B's non-zero; the
    kernel is asked for them once a block."""
    cfg = {"lora_dropout": dropout, **DOWN}
    matmuls = tiny_lora({**cfg, "lora_swiglu_db": False})
    inside = tiny_lora(cfg)
    asked = []
    backward_down = kernels.backward_down

    def watching(*args, **kwargs):
        asked.append(kwargs.get("b_grad") is not None)
        return backward_down(*args, **kwargs)

    monkeypatch.setattr(kernels, "backward_down", watching)
    results = []
    for model in (matmuls, inside):
        torch.manual_seed(5)
        asked.clear()
        results.append(loss_and_grads(model, IDS, autocast=False))
        assert asked == [model is inside] * 4
    (loss_matmuls, grads_matmuls), (loss_inside, grads_inside) = results
    assert loss_inside == pytest.approx(loss_matmuls, rel=1e-6)
    assert_close(grads_matmuls, grads_inside, rel=1e-5)
    b = [k for k in grads_inside if ("gate_proj.lora_B" in k or "up_proj.lora_B" in k)]
    assert len(b) == 8 and all(grads_inside[k].abs().max() > 0 for k in b)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["eager", "checkpointed"])
def test_dh_from_the_base_matmul_keeps_the_loss_and_gradients(kernels, monkeypatch, dropout, checkpointing):
    """``lora_fold_dh``: q/k/v, gate/up and the down projection inside the SwiGLU kernels make their adapters' dh
    in the base's input-gradient matmul (``home_lora_bases``: each base weight the first columns of a buffer with
    its group's slots). Against the same engine without it (the same masks): the same loss and gradients to the
    roundings of one matmul against two, the separate dh matmuls never run for those linears (o's still does),
    the forward reads the same weights, and the buffers' slots hold s B after a step."""
    from core.train import lora_group

    cfg = {"lora_dropout": dropout, **DOWN}
    results = []
    for fold in (False, True):
        model = tiny_lora(cfg, checkpointing=checkpointing)
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if "base_layer.weight" in n}
        if fold:
            assert lora_group.home_lora_bases(model) == 4 * 6  # q, k, v, gate, up, down a block; o alone is not
            assert lora_group.home_lora_bases(model) == 4 * 6  # idempotent
            for name, param in model.named_parameters():
                if "base_layer.weight" in name:
                    assert torch.equal(param, weights[name])  # the forward's weights, now views
                    assert param.is_contiguous() == ("o_proj" in name), name
        calls = []
        original = torch.mm

        def watching(a, b, *args, seen=calls, mm=original, **kwargs):
            seen.append((tuple(a.shape), tuple(b.shape)))
            return mm(a, b, *args, **kwargs)

        monkeypatch.setattr(lora_group.torch, "mm", watching)
        torch.manual_seed(5)
        results.append(loss_and_grads(model, IDS, autocast=False) + (list(calls),))
        monkeypatch.setattr(lora_group.torch, "mm", original)
        if fold:
            layer = model.base_model.model.model.layers[1].self_attn.k_proj  # (block 0's input wants no gradient)
            home, col, rank = layer._tunedeck_fold
            b = layer.lora_B["default"].weight
            assert torch.equal(home[:, col:col + rank], b * layer.scaling["default"])  # its slot
            assert home[:, col - rank:col].count_nonzero() == home[:, col + rank:].count_nonzero() == 0  # q's, v's
            assert home.stride(0) * home.element_size() % lora_group.FOLD_ROW_BYTES == 0  # (+ zero padding)
    (loss_apart, grads_apart, mm_apart), (loss_folded, grads_folded, mm_folded) = results
    assert loss_folded == pytest.approx(loss_apart, rel=1e-6)
    assert_close(grads_apart, grads_folded, rel=1e-5)
    # one dh matmul less for q, k, v, gate, up and down a block (the first of a group's base matmuls is still an
    # mm, the others addmm_), but block 0's q/k/v where its input (the embeddings') wants no gradient: no dx to fold
    # into (checkpointing's input hook gives it one)
    assert len(mm_apart) - len(mm_folded) == 4 * 6 - (0 if checkpointing else 3)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_the_down_kernels_equal_torch(kernels, dropout):
    """The kernels alone against torch in float64: the product, ``hd = dropout(c) @ Ad^T`` with the dropout
    kernels' masks (``lora_dropout_kernel.masks``), and backward's d gate, d up and dAd, with the down adapter's
    input term added to the product's gradient first."""
    import core.train.lora_dropout_kernel as dk

    torch.manual_seed(3)
    rows, n, rank, rd, sg, su, seed = 37, 70, 4, 8, 2.0, 0.5, 1234
    gate, up = torch.randn(rows, n), torch.randn(rows, n)
    hidden, b = torch.randn(rows, 2 * rank), torch.randn(n, 2 * rank) / rank
    a = torch.randn(rd, n) / n**0.5
    grad, dhd = torch.randn(rows, n), torch.randn(rows, rd)
    scale = dk.keep_scale(dropout) if dropout else 1.0
    keep = dk.masks(rows, n, 1, seed, dropout)[0] if dropout else torch.ones(rows, n, dtype=torch.bool)

    g = gate.double().requires_grad_(True)
    u = up.double().requires_grad_(True)
    aa = a.double().requires_grad_(True)
    bb = b.double().requires_grad_(True)
    c = torch.nn.functional.silu(g + sg * hidden[:, :rank].double() @ bb[:, :rank].t()) \
        * (u + su * hidden[:, rank:].double() @ bb[:, rank:].t())
    hd = (c * keep * scale) @ aa.t()
    torch.autograd.backward([c, hd], [grad.double(), dhd.double()])

    got_c, got_hd = kernels.forward_down(gate, up, hidden, b, a, sg, su, seed, dropout)
    assert torch.allclose(got_c.double(), c.detach(), rtol=1e-5, atol=1e-5)
    assert torch.allclose(got_hd.double(), hd.detach(), rtol=1e-5, atol=1e-5)
    dg, du = gate.clone(), up.clone()
    got_da = kernels.backward_down(grad, dg, du, hidden, b, a, dhd, sg, su, seed, dropout)
    assert torch.allclose(dg.double(), g.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(du.double(), u.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(got_da.double(), aa.grad, rtol=1e-5, atol=1e-5)
    dg, du, got_db = gate.clone(), up.clone(), torch.full(b.shape, float("nan"))  # [Bg | Bu]'s, summed in the kernel
    again = kernels.backward_down(grad, dg, du, hidden, b, a, dhd, sg, su, seed, dropout, b_grad=got_db)
    assert torch.equal(again, got_da) and torch.allclose(dg.double(), g.grad, rtol=1e-5, atol=1e-5)
    assert torch.allclose(got_db.double(), bb.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_compiled_down_kernels_in_bf16_equal_torch(dropout):
    import core.train.lora_dropout_kernel as dk
    import core.train.lora_swiglu_kernel as kernels

    torch.manual_seed(0)
    rows, n, rank, sg, su, seed = 8192, 18944, 16, 2.0, 2.0, 99
    dev = {"device": "cuda", "dtype": torch.bfloat16}
    gate, up = torch.randn(rows, n, **dev), torch.randn(rows, n, **dev)
    hidden, b = torch.randn(rows, 2 * rank, **dev), torch.randn(n, 2 * rank, **dev) / rank
    a = torch.randn(rank, n, **dev) / n**0.5
    grad, dhd = torch.randn(rows, n, **dev), torch.randn(rows, rank, **dev)
    scale = dk.keep_scale(dropout) if dropout else 1.0
    keep = dk.masks(rows, n, 1, seed, dropout, "cuda")[0] if dropout else torch.ones(rows, n, dtype=torch.bool,
                                                                                      device="cuda")
    want_c, want_dg, want_du = _reference(gate, up, hidden, b, sg, su, grad)  # float64
    c, hd = kernels.forward_down(gate, up, hidden, b, a, sg, su, seed, dropout)
    want_hd = (c.double() * keep * scale) @ a.double().t()  # from the kernel's own rounded product
    dc = (grad.double() + (dhd.double() @ a.double()) * keep * scale)
    _, want_dg, want_du = _reference(gate, up, hidden, b, sg, su, dc.to(torch.bfloat16))
    want_da = dhd.double().t() @ (c.double() * keep * scale)
    dg, du = gate.clone(), up.clone()
    db = torch.empty(b.shape, dtype=torch.float32, device="cuda")
    da = kernels.backward_down(grad, dg, du, hidden, b, a, dhd, sg, su, seed, dropout, b_grad=db)
    # dB from the kernel's own rounded gradients and s h rounded, as the grouped node's matmul takes them
    want_db = torch.cat([dg.double().t() @ (hidden[:, :rank].float() * sg).to(torch.bfloat16).double(),
                         du.double().t() @ (hidden[:, rank:].float() * su).to(torch.bfloat16).double()], dim=1)
    for x, ref in ((c, want_c), (hd, want_hd), (dg, want_dg), (du, want_du), (da, want_da), (db, want_db)):
        err = ((x.double() - ref).abs() / (ref.abs() + 1.0)).max().item()
        assert err < 2e-2, err


def test_fast_math_only_where_its_ptx_runs(kernels, monkeypatch):
    """``FAST`` is inline NVIDIA PTX for bf16: never in Triton's interpreter (these CPU tests), under ROCm, for
    other dtypes, or with ``FAST_MATH`` off; on a CUDA build with bf16 it is on."""
    assert not kernels.fast_math(torch.bfloat16)  # the interpreter runs no PTX
    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert kernels.fast_math(torch.bfloat16)
    assert not kernels.fast_math(torch.float16) and not kernels.fast_math(torch.float32)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not kernels.fast_math(torch.bfloat16)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(kernels, "FAST_MATH", False)
    assert not kernels.fast_math(torch.bfloat16)


@pytest.mark.gpu
def test_fast_math_gives_the_plain_paths_bits(monkeypatch):
    """``FAST`` (the packed round trips and the flushing sigmoid, bf16 on a GPU) against the plain Triton ops, in
    all four kernels, on pre-activations from -80 to 80: the same bits in every output, the fp32 partial sums too;
    and the SwiGLU-down kernels with their registers capped or not the same bits again."""
    import core.train.lora_swiglu_kernel as kernels

    torch.manual_seed(0)
    rows, n, rank, sg, su, seed, p = 4096, 18944, 16, 2.0, 2.0, 7, 0.05
    dev = {"device": "cuda", "dtype": torch.bfloat16}
    gate, up = torch.randn(rows, n, **dev) * 4, torch.randn(rows, n, **dev) * 4
    gate[0] = torch.linspace(-80, 80, n, device="cuda")  # far into both tails of the sigmoid
    hidden, b = torch.randn(rows, 2 * rank, **dev), torch.randn(n, 2 * rank, **dev) / rank
    a = torch.randn(rank, n, **dev) / n**0.5
    grad, dhd = torch.randn(rows, n, **dev), torch.randn(rows, rank, **dev)

    def outputs() -> list[torch.Tensor]:
        dg, du = gate.clone(), up.clone()
        kernels.backward(grad, dg, du, hidden, b, sg, su)
        c, hd = kernels.forward_down(gate, up, hidden, b, a, sg, su, seed, p)
        dg2, du2, db = gate.clone(), up.clone(), torch.empty(b.shape, dtype=torch.float32, device="cuda")
        da = kernels.backward_down(grad, dg2, du2, hidden, b, a, dhd, sg, su, seed, p, b_grad=db)
        return [kernels.forward(gate, up, hidden, b, sg, su), dg, du, c, hd, dg2, du2, da, db]

    assert kernels.fast_math(torch.bfloat16)
    fast = outputs()
    monkeypatch.setattr(kernels, "FAST_MATH", False)
    plain = outputs()
    for i, (x, y) in enumerate(zip(fast, plain, strict=True)):
        assert torch.equal(x, y), (i, (x.float() - y.float()).abs().max().item())
    # the registers a thread capped or not (more programs a multiprocessor, bench/kernel_occupancy.py): the same code,
    # the same bits (the module's own: the forward uncapped, the backward capped at 168)
    monkeypatch.setattr(kernels, "FAST_MATH", True)
    monkeypatch.setitem(kernels.TILES, "down_forward", {**kernels.TILES["down_forward"], "num_stages": 2, "maxnreg": 128})
    monkeypatch.setitem(kernels.TILES, "down_backward", {**kernels.TILES["down_backward"], "maxnreg": None})
    for i, (x, y) in enumerate(zip(outputs(), fast, strict=True)):
        assert torch.equal(x, y), (i, (x.float() - y.float()).abs().max().item())
