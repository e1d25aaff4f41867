"""``fused_ce: triton``: the LM head and the cross-entropy fused, without a host synchronisation.

Liger's fused linear cross-entropy (``fused_ce: liger``) makes the host wait for the GPU three times a step
(engine-speed-sync-b's trace, bench/results/engine-speed-summary.md): its forward reads the number of counted
tokens with ``.item()`` and its backward compares the incoming gradient with 1.0 (``torch.equal``) twice. Each
wait empties the GPU's queue; the kernels after it wait for Python to launch them. This does the same work
with every number kept on the device:

- the hidden states go through the LM head a chunk of tokens at a time (the chunk's logits are about the
  size of the hidden states, as Liger's), in the compute dtype;
- one Triton program a token reads its row of logits twice: an online max and sum of exponentials (fp32)
  give the log-sum-exp, the loss ``lse - logit[target]``, then the row is overwritten in place with the
  logits' gradient ``(softmax - onehot(target)) / count``; a row whose target is ``-100`` gets loss 0 and
  gradient 0;
- the gradient of the chunk's hidden states is that row block times the LM head weight, made during the
  forward and kept for backward (as Liger's): backward only scales it by the incoming gradient.

The count (``num_items_in_batch`` from the Trainer, else the targets not ignored) divides on the device. The
shift of the labels is a padding of the targets. Where the collator counted the rows with a target on the host
(``target_rows``, a tensor whose length the host knows), only those go through the LM head, a chunk gathered at
a time, their gradient scattered into a zeroed one (the prompt, the padding and each row's last position cost
nothing; 5% of the wizard's 7B plan's rows in the bench data, often a third of a chat dataset's). Without it
(no boolean indexing here: a sync) the rows without a target cost their LM head work.

For a frozen LM head only (LoRA, QLoRA): a trained head (full fine-tuning) keeps the model's own loss
(``core.train.trainer``). Triton's interpreter runs the kernel on CPU tensors for the tests
(``TUNEDECK_TRITON_INTERPRET=1``, see ``core.train.lora_dropout_kernel.interpreted``).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from core.train.fused_loss import fused_chunk_tokens, shifted_targets
from core.train.lora_dropout_kernel import interpreted

IGNORE_INDEX = -100
BLOCK = 4096  # logits a row read at a time
NUM_WARPS = 16


@triton.jit
def _rows(logits_ptr, stride, targets_ptr, losses_ptr, scale_ptr, vocab, IGNORE: tl.constexpr,
          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    cols = tl.arange(0, BLOCK)
    top = float("-inf")
    total = 0.0
    for start in range(0, vocab, BLOCK):
        x = tl.load(base + start + cols, mask=start + cols < vocab, other=float("-inf")).to(tl.float32)
        new_top = tl.maximum(top, tl.max(x, 0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
        top = new_top
    lse = top + tl.log(total)
    valid = target != IGNORE
    picked = tl.load(base + tl.where(valid, target, 0)).to(tl.float32)
    tl.store(losses_ptr + row, tl.where(valid, lse - picked, 0.0))
    scale = tl.load(scale_ptr) * valid.to(tl.float32)
    for start in range(0, vocab, BLOCK):
        at = start + cols
        ok = at < vocab
        x = tl.load(base + at, mask=ok, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) - (at == target).to(tl.float32)
        tl.store(base + at, (grad * scale).to(logits_ptr.dtype.element_ty), mask=ok)


def usable(head: Any, hidden_size: int) -> bool:
    """Can the kernel run this head: a plain, frozen linear without bias over ``hidden_size`` features, on CUDA
    (or Triton's interpreter)."""
    if type(head) is not torch.nn.Linear or head.bias is not None:  # not a 4-bit, LoRA or other wrapped head
        return False
    weight = head.weight
    if weight.requires_grad or weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if weight.dim() != 2 or weight.shape[1] != hidden_size:  # e.g. a ZeRO-3 partition
        return False
    return weight.is_cuda or (interpreted() and weight.device.type == "cpu")


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The LM head's dtype under the run's autocast, as the model's own ``lm_head(hidden)`` would get."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                count: torch.Tensor, chunk: int | None, rows: torch.Tensor | None) -> torch.Tensor:
        dtype = _compute_dtype(hidden, weight)
        with torch.autocast(hidden.device.type, enabled=False):
            hidden = hidden.to(dtype)
            weight = weight.to(dtype)
            taken, vocab = hidden.shape[0] if rows is None else rows.shape[0], weight.shape[0]
            # Liger's rule over the batch's positions, not the rows taken: the chunks of a batch whose rows are half
            # prompt hold as many rows as without the prompt, half as many chunks (and launches: a 0.5B's step waits
            # on them), no more memory at the peak than the batch without a prompt has
            step = chunk or fused_chunk_tokens(hidden.shape[0], vocab, hidden.shape[1])
            scale = (1.0 / count.to(device=hidden.device, dtype=torch.float32).clamp(min=1.0)).reshape(1)
            losses = torch.empty(taken, dtype=torch.float32, device=hidden.device)
            grad_hidden = None
            if ctx.needs_input_grad[0]:  # rows not taken keep a zero gradient
                grad_hidden = torch.empty_like(hidden) if rows is None else torch.zeros_like(hidden)
            block = min(BLOCK, triton.next_power_of_2(vocab))
            options = {} if interpreted() else {"num_warps": NUM_WARPS}
            for start in range(0, taken, step):
                end = min(taken, start + step)
                part = hidden[start:end] if rows is None else hidden.index_select(0, rows[start:end])
                logits = torch.mm(part, weight.t())
                _rows[(end - start,)](logits, logits.stride(0), targets[start:end], losses[start:end], scale,
                                      vocab, IGNORE=IGNORE_INDEX, BLOCK=block, **options)
                if grad_hidden is not None:
                    if rows is None:  # the logits now hold their gradient
                        torch.mm(logits, weight, out=grad_hidden[start:end])
                    else:
                        grad_hidden.index_copy_(0, rows[start:end], torch.mm(logits, weight))
                # freed before the next chunk's are made, which then take their memory: one chunk's logits at the
                # peak, not two (8,192-token chunks of a 152k vocabulary: 2.4 GiB above the inputs, 4.7 before;
                # bench/results/lm-head/h100)
                del logits, part
        ctx.save_for_backward(grad_hidden)
        return losses.sum() * scale[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (grad_hidden,) = ctx.saved_tensors
        # always multiplied: asking whether grad is 1 would be a host synchronisation
        return grad_hidden * grad.to(grad_hidden.dtype), None, None, None, None, None


def linear_cross_entropy(hidden_states: torch.Tensor, labels: torch.Tensor, head: Any,
                         num_items_in_batch: Any = None, chunk: int | None = None,
                         rows: torch.Tensor | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy of ``head(hidden_states)`` against ``labels`` (shifted left by one,
    ``-100`` ignored), divided by ``num_items_in_batch`` when given, else by the counted targets: transformers'
    ``ForCausalLMLoss``, with no host synchronisation. ``hidden_states`` [batch, seq, hidden] (the decoder's
    output), ``labels`` [batch, seq]; ``head`` a frozen ``nn.Linear`` (``usable``); ``rows``
    (``core.train.fused_loss.target_rows``, from the collator): the flat positions that have a target, the
    only ones the LM head then reads (else every position, those without a target at loss and gradient 0)."""
    if not usable(head, hidden_states.shape[-1]):
        raise ValueError("linear_cross_entropy takes a frozen nn.Linear head without bias on CUDA (usable())")
    labels = labels.to(hidden_states.device)
    targets = shifted_targets(labels)
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    if rows is not None:
        rows = rows.to(hidden.device)
        targets = targets.index_select(0, rows)
    if num_items_in_batch is None:
        count = (targets != IGNORE_INDEX).sum()
    elif torch.is_tensor(num_items_in_batch):
        count = num_items_in_batch
    else:  # a number: filled on the device (a copy from the host could wait for the GPU's queue)
        count = torch.full((), float(num_items_in_batch), device=hidden.device)
    return _LinearCrossEntropy.apply(hidden.contiguous(), head.weight, targets.contiguous(), count, chunk, rows)
