"""``fused_ce: triton``: the LM head and the cross-entropy in ``core.train.linear_ce_kernel``.

On CPU the Triton kernel runs in Triton's interpreter (``tests/conftest.py``; these tests ask for it with
``TUNEDECK_TRITON_INTERPRET=1``), in fp32: the loss and the hidden states' gradient equal transformers'
``ForCausalLMLoss`` over materialised logits (ignored labels, several chunks, a vocabulary read in several
blocks, ``num_items_in_batch``); through a LoRA model the adapters' gradients equal the model's own loss's;
what it does not take (a trained, biased or wrapped head) is refused. The GPU test (``-m gpu``) runs the
compiled kernel in bf16 on CUDA against the same reference and checks that it never synchronises.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tests.core.test_lora_dropout_kernel import interpreted  # noqa: E402
from tests.core.test_train_fused_loss import _batch, _grads, _standard, _tiny_model  # noqa: E402


@pytest.fixture
def kernel(monkeypatch):
    return interpreted(monkeypatch, "core.train.linear_ce_kernel")


def _reference(hidden, labels, weight, num_items=None):
    logits = (hidden[:, :-1] @ weight.t()).float()
    targets = labels[:, 1:].reshape(-1)
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="sum")
    return total / (num_items if num_items is not None else (targets != -100).sum())


@pytest.mark.parametrize("chunk", [None, 5, 64])
@pytest.mark.parametrize("num_items", [None, 57])
@pytest.mark.parametrize("given_rows", [False, True])
def test_loss_and_gradient_equal_the_materialised_logits(kernel, monkeypatch, chunk, num_items, given_rows):
    """Vocabulary 150 read 64 logits at a time (three blocks, the last ragged); rows without a target (the
    prompt, a masked span, each row's last position) count nothing, whether the kernel reads them or only the
    collator's ``target_rows`` go through the head (their gradient scattered back, the others' 0)."""
    monkeypatch.setattr(kernel, "BLOCK", 64)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 13, 24, generator=g)
    weight = torch.randn(150, 24, generator=g) * 0.3
    labels = torch.randint(0, 150, (2, 13), generator=g)
    labels[:, :3] = -100
    labels[1, 7:10] = -100
    head = torch.nn.Linear(24, 150, bias=False)
    head.weight.data.copy_(weight)
    head.weight.requires_grad_(False)
    items = torch.tensor(num_items) if num_items is not None else None

    ours_in = hidden.clone().requires_grad_(True)
    rows = None
    if given_rows:
        from core.train.fused_loss import target_rows

        rows = target_rows(labels)
        assert rows.shape == (int((labels[:, 1:] != -100).sum()),)
    ours = kernel.linear_cross_entropy(ours_in, labels, head, num_items_in_batch=items, chunk=chunk, rows=rows)
    (ours * 3.0).backward()  # an incoming gradient other than 1 scales the kept one
    ref_in = hidden.clone().requires_grad_(True)
    expected = _reference(ref_in, labels, weight, items)
    (expected * 3.0).backward()
    assert ours.dim() == 0 and torch.allclose(ours, expected, rtol=1e-5, atol=1e-6), (ours, expected)
    assert torch.allclose(ours_in.grad, ref_in.grad, rtol=1e-4, atol=1e-6)
    assert ours_in.grad[:, -1].abs().max() == 0  # the last position predicts nothing


def test_the_rows_taken_fill_chunks_sized_by_the_batchs_positions(kernel, monkeypatch):
    """With the collator's rows, a chunk holds as many of them as the rule gives the whole batch (Liger's rule over
    every position), not the rule over the rows taken: half the rows a prompt is half the chunks, not half-full
    ones (a 0.5B's 128-row chunks, 126 a step, were as many as without the prompt: calibration-prompt-c)."""
    from core.train.fused_loss import target_rows

    asked, products = [], []
    rule = kernel.fused_chunk_tokens
    monkeypatch.setattr(kernel, "fused_chunk_tokens", lambda n, v, h: asked.append(n) or rule(n, v, h))
    mm = torch.mm
    monkeypatch.setattr(kernel.torch, "mm", lambda a, b, **kw: products.append(a.shape[0]) or mm(a, b, **kw))
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(4, 64, 8, generator=g, requires_grad=True)  # vocabulary 64 / hidden 8: 8 rows a chunk's share
    labels = torch.randint(0, 64, (4, 64), generator=g)
    labels[:, :40] = -100  # a prompt: 24 of 64 positions a row have a target, 96 in all
    head = torch.nn.Linear(8, 64, bias=False).requires_grad_(False)
    rows = target_rows(labels)
    kernel.linear_cross_entropy(hidden, labels, head, rows=rows).backward()
    assert asked == [256] and rows.numel() == 96
    step = rule(256, 64, 8)  # 32 rows a chunk (the rule over the 96 taken: 16)
    assert products == [size for start in range(0, 96, step) for size in [min(step, 96 - start)] * 2]


def test_no_counted_target_gives_zero_and_a_plain_number_divides_too(kernel):
    head = torch.nn.Linear(8, 20, bias=False).requires_grad_(False)
    hidden = torch.randn(1, 6, 8, requires_grad=True)
    none = torch.full((1, 6), -100)
    loss = kernel.linear_cross_entropy(hidden, none, head)
    assert loss.item() == 0.0
    loss.backward()
    assert hidden.grad.abs().max() == 0
    labels = torch.randint(0, 20, (1, 6))
    by_count = kernel.linear_cross_entropy(hidden, labels, head)
    by_number = kernel.linear_cross_entropy(hidden, labels, head, num_items_in_batch=10)
    assert torch.allclose(by_number * 10, by_count * 5, rtol=1e-5)


def test_through_a_lora_model_the_adapters_get_the_model_losss_gradients(kernel):
    """``forward_chunked_loss(kernel=True)``: the model runs with ``logits_to_keep=1`` and the kernel takes the
    decoder's output; loss and every adapter gradient equal the model's own loss over full logits."""
    from peft import LoraConfig, get_peft_model

    from core.train.fused_loss import forward_chunked_loss

    model = get_peft_model(_tiny_model(), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                      target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    batch = _batch(model.config.vocab_size)
    standard_loss, standard_grads = _standard(model, batch)
    model.zero_grad(set_to_none=True)
    loss = forward_chunked_loss(model, model, batch, chunk_tokens=16, kernel=True)
    loss.backward()
    grads = _grads(model)
    assert torch.allclose(loss.detach(), standard_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == standard_grads.keys() and all("lora_" in name for name in grads)
    for name in grads:
        assert torch.allclose(grads[name], standard_grads[name], rtol=1e-3, atol=1e-6), name


def test_what_the_kernel_does_not_take(kernel):
    """A trained head (full fine-tuning), a biased one, a subclass (4-bit, LoRA-wrapped), another width."""
    frozen = torch.nn.Linear(8, 20, bias=False).requires_grad_(False)
    assert kernel.usable(frozen, 8)
    assert not kernel.usable(frozen, 16)
    assert not kernel.usable(torch.nn.Linear(8, 20, bias=False), 8)  # trained
    assert not kernel.usable(torch.nn.Linear(8, 20).requires_grad_(False), 8)

    class Wrapped(torch.nn.Linear):
        pass

    assert not kernel.usable(Wrapped(8, 20, bias=False).requires_grad_(False), 8)
    with pytest.raises(ValueError, match="frozen"):
        kernel.linear_cross_entropy(torch.randn(1, 3, 8), torch.zeros(1, 3, dtype=torch.long),
                                    torch.nn.Linear(8, 20, bias=False))


def test_a_cpu_box_is_not_given_the_kernel(monkeypatch):
    """Without the interpreter switch a CPU tensor is not the kernel's: the config resolves to chunked."""
    from core.train.fused_loss import resolve_fused_ce
    from core.train.linear_ce_kernel import usable

    monkeypatch.delenv("TUNEDECK_TRITON_INTERPRET", raising=False)
    assert not usable(torch.nn.Linear(8, 20, bias=False).requires_grad_(False), 8)
    assert resolve_fused_ce("triton", cuda=False, liger_installed=True) == "chunked"
    assert resolve_fused_ce("triton", cuda=True, liger_installed=False) == "triton"


@pytest.mark.gpu
def test_gpu_bf16_kernel_matches_and_never_synchronises():
    """On CUDA, bf16 at a Qwen-sized vocabulary: loss and gradient within bf16 rounding of the materialised
    logits' (fp32 softmax), and the whole forward and backward pass torch's sync debug mode set to error,
    over every row and over the collator's ``target_rows``."""
    from core.train.fused_loss import target_rows
    from core.train.linear_ce_kernel import linear_cross_entropy

    torch.manual_seed(0)
    hidden = torch.randn(2, 1024, 512, device="cuda", dtype=torch.bfloat16)
    head = torch.nn.Linear(512, 151_936, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    labels = torch.randint(0, 151_936, (2, 1024), device="cuda")
    labels[:, :100] = -100
    rows = target_rows(labels.cpu()).cuda()  # the collator's, moved with the batch
    ref_in = hidden.clone().requires_grad_(True)
    expected = _reference(ref_in, labels, head.weight)
    expected.backward()
    for given in (None, rows):
        ours_in = hidden.clone().requires_grad_(True)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss = linear_cross_entropy(ours_in, labels, head, rows=given)
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.allclose(loss.float(), expected, rtol=2e-3), (loss, expected)
        diff = (ours_in.grad.float() - ref_in.grad.float()).abs().max()
        assert diff <= 2e-2 * ref_in.grad.float().abs().max(), diff
        assert ours_in.grad[:, :99].abs().max() == 0


@pytest.mark.gpu
def test_gpu_holds_one_chunk_of_logits_at_a_time():
    """The allocator's peak over the loss's forward is one chunk's logits (2 bytes a logit in bf16) and the
    batch's hidden-state gradient, not two chunks' (each chunk's logits were still held while the next chunk's
    were made: 4 bytes a logit at the peak, bench/results/lm-head-chunks.md). The estimator counts one
    (``core.estimate.memory.logits_and_loss_bytes``)."""
    from core.train.linear_ce_kernel import linear_cross_entropy

    torch.manual_seed(0)
    vocab, chunk = 151_936, 512
    hidden = torch.randn(2, 2048, 512, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
    head = torch.nn.Linear(512, vocab, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    labels = torch.randint(0, vocab, (2, 2048), device="cuda")
    linear_cross_entropy(hidden, labels, head, chunk=chunk).backward()  # warm-up: the kernel compiled
    hidden.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = linear_cross_entropy(hidden, labels, head, chunk=chunk)
    peak = torch.cuda.max_memory_allocated() - base
    logits = chunk * vocab * 2
    assert logits <= peak <= logits + 2 * hidden.numel() * 2 + 2**20, (peak, logits)
    loss.backward()
