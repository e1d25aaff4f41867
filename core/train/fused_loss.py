"""Causal-LM cross-entropy that never holds the logits of the whole batch.

A 150k vocabulary makes the logits of 4k tokens several GiB (bf16 logits, their fp32 upcast, the
log-softmax and its gradient). ``chunked_causal_lm_loss`` computes the loss from the final hidden states
and the LM head chunk by chunk (``chunk_tokens_for``: 512 tokens for a 152k vocabulary): each chunk's logits are made, reduced to a summed loss and freed; the
chunk runs under non-reentrant activation checkpointing, so backward recomputes one chunk's logits at a
time instead of keeping them all. Only positions with a label take part (prompt tokens of ``loss_on:
assistant`` cost no LM-head work at all). The LM head is called as a module, so a LoRA-wrapped head, a
DeepSpeed ZeRO-3 partitioned one (its gather hooks run on each call) and autocast all behave as in the
model's own forward.

Semantics follow transformers' ``ForCausalLMLoss``: labels shift left by one, ``-100`` is ignored, the
summed loss is divided by ``num_items_in_batch`` when the Trainer passes it (gradient accumulation), else
by the number of valid tokens of this batch; logits are upcast to fp32 before the softmax.

``fused_ce`` values (run config): ``auto``/``true`` = ``triton`` on CUDA when Liger is installed, else
chunked; ``liger`` (Liger's fused loss too); ``triton`` = ``core.train.linear_ce_kernel`` (the LM head and the loss fused like Liger's,
without its host synchronisations; Liger's other kernels still run where installed) for a frozen LM head,
else the model's own (Liger's) loss; ``chunked``; ``false`` = the model's own loss over materialised logits.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger("tunedeck.train")

IGNORE_INDEX = -100
# A chunk holds about this many fp32 logits (512 MiB); its tokens are a power of two in [256, 4096]:
# 512 tokens for a 152k vocabulary (Qwen), 4096 for 32k (Llama-2, Mistral).
CHUNK_LOGITS = 2**27
FUSED_CE_CHOICES = ("auto", "liger", "triton", "chunked", "false")


def chunk_tokens_for(vocab_size: int) -> int:
    """Tokens per chunk for a vocabulary (the estimator's ``core.estimate.memory`` uses it too: keep this module's
    top-level imports light)."""
    tokens = 256
    while tokens < 4096 and 2 * tokens * vocab_size <= CHUNK_LOGITS:
        tokens *= 2
    return tokens


def fused_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Tokens a chunk of the fused linear cross-entropy (Liger's rule, ``core.train.linear_ce_kernel``'s too, and
    the estimator's): the next power of two of tokens / ceil(vocab / hidden), so that a chunk's logits are about
    the size of the hidden states."""
    per_chunk = -(-vocab // max(1, hidden))
    wanted = max(1, -(-tokens // per_chunk))
    return min(tokens, 1 << (wanted - 1).bit_length())


def liger_available() -> bool:
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_fused_ce(wanted: Any, cuda: bool, liger_installed: bool | None = None) -> str:
    """Which loss a run uses: ``"liger"``, ``"triton"``, ``"chunked"`` or ``"none"`` (the model's own loss)."""
    installed = liger_available() if liger_installed is None else liger_installed
    value = str(wanted).strip().lower() if not isinstance(wanted, bool) else ("true" if wanted else "false")
    if value == "false":
        return "none"
    if value == "chunked":
        return "chunked"
    if value == "triton":
        if cuda:
            return "triton"
        log.warning("fused_ce: triton needs a GPU; using the chunked loss (same maths)")
        return "chunked"
    if value == "liger":
        if installed and cuda:
            return "liger"
        log.warning("fused_ce: liger but liger-kernel %s; using the chunked loss (same maths)",
                    "is not installed" if not installed else "needs a GPU")
        return "chunked"
    # auto / true: the best available. On a GPU with Liger installed, Liger's RMSNorm, SwiGLU and RoPE kernels and
    # tunedeck's loss kernel (the same work as Liger's loss without its host synchronisations); else chunked.
    return "triton" if installed and cuda else "chunked"


TARGET_ROWS = "target_rows"  # the batch key of ``target_rows`` (``core.train.data_adapter.PaddingCollator``)


def target_rows(labels: Any) -> Any:
    """The flat indices (row x width + position) of ``labels``' positions whose next label is counted: the rows
    of the decoder's output that the loss reads (int64; for a batch on the host, before it moves)."""
    import torch

    return torch.nonzero(shifted_targets(labels) != IGNORE_INDEX).squeeze(1)


def shifted_targets(labels: Any) -> Any:
    """Each position's target, flat: the next label, ``IGNORE_INDEX`` after a row's last position."""
    import torch

    return torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX).reshape(-1)


def _chunk_loss_sum(head: Any, hidden: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    logits = head(hidden).float()
    return F.cross_entropy(logits, targets, reduction="sum")


def chunked_causal_lm_loss(
    hidden_states: Any,
    labels: Any,
    head: Any,
    num_items_in_batch: Any = None,
    chunk_tokens: int | None = None,
    ignore_index: int = IGNORE_INDEX,
    rows: Any = None,
) -> Any:
    """Mean next-token cross-entropy of ``head(hidden_states)`` against ``labels`` (see module docstring).

    ``hidden_states``: [batch, seq, hidden] (the decoder's output after its final norm); ``labels``:
    [batch, seq] with ``ignore_index`` where no loss is wanted; ``head``: the LM head module;
    ``chunk_tokens``: default ``chunk_tokens_for(vocabulary)``; ``rows``: ``target_rows(labels)`` where the
    collator counted them (else found here, a device synchronisation).
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    if rows is not None:  # only positions with a target, their number known to the host
        rows = rows.to(hidden_states.device)
        hidden = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, rows)
        targets = shifted_targets(labels.to(hidden_states.device)).index_select(0, rows)
    else:
        shift_labels = labels[..., 1:].to(hidden_states.device)
        valid = shift_labels != ignore_index
        hidden = hidden_states[..., :-1, :][valid]  # [n_valid, hidden]: only positions with a target
        targets = shift_labels[valid]
    n_valid = targets.numel()
    if n_valid == 0:
        total = hidden_states.sum() * 0.0  # keeps the graph (and DDP) whole; transformers would give NaN
    else:
        vocab = int(getattr(head, "out_features", 0) or getattr(getattr(head, "weight", None), "shape", [0])[0])
        step = max(1, int(chunk_tokens or chunk_tokens_for(vocab)))
        fn = functools.partial(_chunk_loss_sum, head)
        parts = []
        for start in range(0, n_valid, step):
            h = hidden[start:start + step]
            y = targets[start:start + step]
            if torch.is_grad_enabled() and h.requires_grad:
                parts.append(checkpoint(fn, h, y, use_reentrant=False))
            else:
                parts.append(fn(h, y))
        total = torch.stack(parts).sum()
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch
    return total / max(1, n_valid)


def causal_lm_of(model: Any) -> Any:
    """The ``*ForCausalLM`` module inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


# Config fields that scale the logits after the LM head (Granite divides by ``logits_scaling``, Falcon-H1
# multiplies by ``lm_head_multiplier``, others by ``output_multiplier``); 1 (or absent) leaves them exact.
_LOGIT_SCALE_FIELDS = ("logit_scale", "logits_scaling", "lm_head_multiplier", "output_multiplier")


def supports_chunked_loss(causal_lm: Any) -> bool:
    """Whether the model's logits are exactly ``lm_head(decoder(x))`` (no soft-capping or scaling)."""
    config = getattr(causal_lm, "config", None)
    if config is None or getattr(config, "final_logit_softcapping", None):
        return False
    if getattr(causal_lm, "logit_scale", None) is not None:
        return False
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_SCALE_FIELDS):
        return False
    return callable(getattr(causal_lm, "get_decoder", None)) and causal_lm.get_output_embeddings() is not None


def forward_chunked_loss(model: Any, unwrapped: Any, inputs: dict[str, Any], num_items_in_batch: Any = None,
                         chunk_tokens: int | None = None, kernel: bool = False, rows: Any = None) -> Any:
    """Run ``model`` (possibly DDP/DeepSpeed/peft-wrapped) and return the chunked loss.

    The wrapper's own forward runs (so DDP and DeepSpeed see a normal step) with an empty ``logits_to_keep``
    (no position): the LM head makes no logits (with ``logits_to_keep=1`` it read its whole weight for one
    position a row: 1 ms a step of a 7B on the H200, engine-speed-ce-a's profile). The decoder's output is caught by a forward hook and the
    loss is computed from it chunk by chunk: by ``core.train.linear_ce_kernel`` with ``kernel`` (the head
    must be ``usable`` by it), else by ``chunked_causal_lm_loss``; over ``rows`` only where given
    (``target_rows``).
    """
    causal_lm = causal_lm_of(unwrapped)
    decoder = causal_lm.get_decoder()
    caught: dict[str, Any] = {}

    def hook(_module: Any, _args: Any, output: Any) -> None:
        caught["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    inputs = dict(inputs)
    labels = inputs.pop("labels")
    handle = decoder.register_forward_hook(hook)
    try:
        import torch

        device = next((v.device for v in inputs.values() if hasattr(v, "device")), None)
        model(**inputs, logits_to_keep=torch.empty(0, dtype=torch.long, device=device), use_cache=False)
    finally:
        handle.remove()
    if kernel:
        from core.train.linear_ce_kernel import linear_cross_entropy

        return linear_cross_entropy(caught["hidden"], labels, causal_lm.get_output_embeddings(),
                                    num_items_in_batch=num_items_in_batch, chunk=chunk_tokens, rows=rows)
    return chunked_causal_lm_loss(caught["hidden"], labels, causal_lm.get_output_embeddings(),
                                  num_items_in_batch=num_items_in_batch, chunk_tokens=chunk_tokens, rows=rows)
