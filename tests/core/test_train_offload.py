"""Offloaded gradient checkpointing: the same loss and gradients as plain checkpointing.

On this CPU-only box the parking device is the compute device, so what is tested is the plumbing
(every checkpointed block goes through the parking path, gradients flow back through the copies), not
the GPU memory it saves; the estimator's term for that is tested in test_estimate_engine_switches.
"""

from __future__ import annotations

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
    parked = []
    real_to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if args and args[0] == "cpu":
            parked.append(self.shape)
        return real_to(self, *args, **kwargs)

    if install:
        assert offload.install_offloaded_checkpointing(model, force=True) == model.config.num_hidden_layers
        monkeypatch.setattr(torch.Tensor, "to", counting_to)
    ids = torch.randint(3, 900, (2, 20), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    monkeypatch.setattr(torch.Tensor, "to", real_to)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, len(parked)


def test_offloaded_checkpointing_matches_plain_checkpointing(monkeypatch):
    plain_loss, plain_grads, _ = _run(False, monkeypatch)
    loss, grads, parked = _run(True, monkeypatch)
    assert parked == 4  # each of the 4 blocks parked its input once
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
