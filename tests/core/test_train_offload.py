"""Offloaded gradient checkpointing: the same loss and gradients as plain checkpointing.

On this CPU-only box the parking device is the compute device, so what is tested is the plumbing
(every checkpointed block goes through the parking path, gradients flow back through the copies), not
the GPU memory it saves; the estimator's term for that is tested in test_estimate_engine_switches.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.train import offload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def _run(install: bool, monkeypatch) -> tuple[float, dict, int]:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)), dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    stash = offload.HostStash()
    fetched = []
    real_fetch = offload.ParkedInput.fetch

    def counting_fetch(self):
        fetched.append(self.index)
        return real_fetch(self)

    if install:
        assert offload.install_offloaded_checkpointing(model, force=True, stash=stash) == model.config.num_hidden_layers
        monkeypatch.setattr(offload.ParkedInput, "fetch", counting_fetch)
    ids = torch.randint(3, 900, (2, 20), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, (stash.parked, fetched)


def test_offloaded_checkpointing_matches_plain_checkpointing(monkeypatch):
    plain_loss, plain_grads, _ = _run(False, monkeypatch)
    loss, grads, (parked, fetched) = _run(True, monkeypatch)
    assert parked == 4  # each of the 4 blocks parked its input once
    assert fetched == [3, 2, 1, 0]  # and got it back once, for its recomputation, last block first
    assert loss == pytest.approx(plain_loss, abs=1e-6)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        assert torch.allclose(grads[name], plain_grads[name], atol=1e-6), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's RNG state is what is at stake: needs CUDA")
def test_recomputation_draws_the_forward_dropout_mask_on_cuda():
    """The parked input is on the CPU; the GPU's RNG state must still be replayed in the recomputation,
    else the dropout mask of backward differs from the forward's and the gradients are silently wrong."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).cuda()

    def block(x):
        return torch.nn.functional.dropout(layer(x), p=0.5, training=True)

    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    results = []
    for checkpointed in (False, True):
        x.grad, layer.weight.grad = None, None
        torch.cuda.manual_seed(1)
        out = offload.offloaded_checkpoint(block, x) if checkpointed else block(x)
        (out * torch.arange(64, device="cuda")).sum().backward()
        results.append((out.detach(), x.grad.clone(), layer.weight.grad.clone()))
    for plain, offloaded in zip(*results, strict=True):
        assert torch.allclose(plain, offloaded, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory, the side stream and the prefetch need CUDA")
def test_offloaded_checkpointing_on_cuda_prefetches_and_keeps_the_gradients():
    """The real path: pinned host copies on a side stream, each block's input prefetched while the block
    after it is recomputed; the loss and the gradients are those of plain checkpointing."""
    from transformers import AutoConfig, AutoModelForCausalLM

    results = []
    prefetched = []
    real_fetch = offload.ParkedInput.fetch

    def watching_fetch(self):
        prefetched.append((self.index, self.prefetched is not None))
        return real_fetch(self)

    for install in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)), dtype=torch.float32).cuda()
        model.config.use_cache = False
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        stash = offload.HostStash()
        if install:
            offload.install_offloaded_checkpointing(model, stash=stash)
            offload.ParkedInput.fetch = watching_fetch
        try:
            ids = torch.randint(3, 900, (2, 256), generator=torch.Generator().manual_seed(1)).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        finally:
            offload.ParkedInput.fetch = real_fetch
        torch.cuda.synchronize()
        results.append((loss.item(), {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.grad is not None}))
        if install:
            assert stash.parked == 4
            # every block the caching allocator holds is the current stream's: no pool of the side stream's
            current = torch.cuda.current_stream().cuda_stream
            assert {segment["stream"] for segment in torch.cuda.memory_snapshot()} == {current}
    (plain_loss, plain_grads), (loss, grads) = results
    assert prefetched == [(3, False), (2, True), (1, True), (0, True)]
    assert loss == pytest.approx(plain_loss, abs=1e-6)
    for name in grads:
        assert torch.allclose(grads[name], plain_grads[name], atol=1e-6), name


def test_pinned_chunks_cover_the_input_and_round_up_by_less_than_one_chunk():
    """torch's pinned allocator rounds each request up to a power of two: one 2.8 GB block input (393k
    tokens x 3584 x bf16) would pin 4 GiB. In chunks the parked inputs of 28 blocks fit the host."""
    from core.train.offload import PIN_CHUNK_BYTES, chunk_bounds

    def pinned(nbytes: int) -> int:  # what the allocator really takes for one request
        return 1 << (nbytes - 1).bit_length()

    numel, size = 393_216 * 3_584, 2
    bounds = chunk_bounds(numel, size)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))  # contiguous, no overlap
    assert max((end - start) * size for start, end in bounds) <= PIN_CHUNK_BYTES
    whole, chunked = pinned(numel * size), sum(pinned((end - start) * size) for start, end in bounds)
    assert whole - numel * size > 1.4e9  # the waste the chunks avoid
    assert chunked - numel * size < PIN_CHUNK_BYTES
    assert chunk_bounds(5, 4, chunk_bytes=8) == [(0, 2), (2, 4), (4, 5)]
