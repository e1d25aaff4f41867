"""``lora_grouped: true`` (default): the LoRA linears that read the same input run as one autograd node.

peft runs every adapted linear on its own: the frozen base matmul, a dropout copy of the input, ``lora_A``,
``lora_B``, a scale and an add, each a separate autograd node. In backward, autograd then sums the input's
gradient over the base matmul and the adapter of every linear that read it: for q/k/v six full-size
gradients and five element-wise adds a block, for gate/up four and three, one more each for o and down.

Here one ``torch.autograd.Function`` computes a whole group: the linears that read one tensor (q/k/v,
gate/up; o and down alone). Forward: each LoRA update, then its base output added into it inside the base matmul's
epilogue, in place (``addmm_``: no copy of the output, no separate scale or add; ``B_FIRST``). Backward: the
input's gradient is accumulated in the epilogues of the matmuls that make it (``addmm_`` into one buffer)
instead of in separate adds; without dropout the group's ``lora_A`` matmuls are one matmul over the concatenated
adapters, reading the input once. The maths is peft's: the same products and sums, the same
dropout (``native_dropout``, one independent mask per linear, kept as peft keeps it), the adapters kept
in their own dtype (fp32) and cast for the matmuls as autocast does; only the order of the roundings in
the sums differs. Saved for backward: what peft saves (the dropped-out inputs and their masks, or the
input once without dropout, and each ``lora_A`` output), so the memory is peft's.

With dropout on a GPU, ``lora_dropout_fused`` (default) hands the group's dropout and ``lora_A`` work to
``core.train.lora_dropout_kernel``'s Triton kernels instead: masks drawn from a hash and drawn again in
backward, so only the input is kept (no copies, no masks).

With ``qlora_reuse_dequantised`` a QLoRA group in a checkpointed decoder block keeps the bf16 weights it
dequantises for its base matmuls, for the backward's input gradient, instead of dequantising them again there.
The first forward's saved tensors are dropped by the checkpoint as it goes, so what is kept is the
recompute's, until the block's backward uses it: one dequantisation of every NF4 weight less a step, and one
block's weights in bf16 more at the peak (0.47 GB on a 7B). Outside checkpointed blocks nothing changes (kept
there, every block's weights would stay until its backward).

With ``recompute_skip_down`` the ``down_proj`` group of a block whose MLP output only feeds the block's
output (``core.estimate.plan.MLP_ENDS_BLOCK``: Llama, Mistral, Qwen2, Qwen3) skips its frozen matmul when it
runs inside a backward pass: a checkpointed block's recomputation there only refills the tensors the block
saved, and the recomputed block output is thrown away (torch stops the recomputation at the down node's
saves, the last of such a block), as is a tiled MLP's recomputed output (``core.train.tiled_mlp``). The
node saves what it always saves, so its backward is unchanged; its output there is uninitialised memory that
nothing reads. On a 7B that is one of the seven frozen matmuls of each recomputed block (1.1 TFLOP a block
at 8,192 tokens; +7.3% tokens/s on the H200's 7B rows, engine-speed-g).

With ``recompute_keep_lora_a`` a group in a checkpointed block keeps what the fused dropout kernels made in its
first forward (the ``lora_A`` products of the dropped-out input: tokens x the group's ranks, 1.8 MB a 7B block
at 8,192 tokens) until the block's recompute, which takes them instead of running the kernel again: the
recompute replays the generator, so it draws the same seed, and the kept products are the ones it would make.

With ``lora_swiglu_down`` (default) the ``down_proj`` group of an MLP whose SwiGLU is fused takes its ``lora_A``
product from the SwiGLU kernels (``lora_swiglu_kernel.LoRASwiGLUDown``), which make its input tile by tile and
run its dropout (the same hash masks, from a seed drawn where this group would draw it) and ``lora_A`` on it;
their backward adds the adapter's input term to the product's gradient and sums ``lora_A``'s gradient from the
product it recomputes. The down node (``_GivenLoRA``) then keeps lora_A's output and B only: the product, the
widest tensor of a block (tokens x 18,944 on a 7B), is kept by nobody, and the dropout kernels never read it
(H200: 7B LoRA +2.4%, QLoRA +3.5%; the wizard's 7B plan at 8 x 2048 without checkpointing 68 GiB instead of 84).
With ``lora_swiglu_db`` (default) that backward also sums the gate/up adapters' ``lora_B`` gradients from the
gradients it writes, and the gate/up node, given B detached, runs no dB matmuls (which read d gate and d up
again): the wizard's 7B plan 0.2% faster on the H200 (engine-speed-y), the kernel's dots costing most of what
the matmuls took.

With ``lora_fold_dh`` (default on GPUs) the adapters' ``dh = g (s B)`` of q/k/v, gate/up and a down projection
inside the SwiGLU kernels are made by the base's input-gradient matmul: each base weight (out x in) lives in the
first ``in`` columns of a buffer ``[W | slots]`` (``home_lora_bases``, at train begin), one rank-wide slot per
linear of its group, zero columns after them to a whole 128 bytes a row; backward writes ``s B`` into the
linear's own slot (zeros in its siblings') and ``g @ [W | slots]`` gives ``[dx | dh_1 | dh_2 ...]`` in one
matmul (the group's accumulated in its epilogue as before). The separate skinny matmuls each read the output
gradient once more, the widest tensors of a block for gate/up: 22 ms of the wizard's 7B plan step on the H200
(engine-speed-r's profile). The products and the roundings are the same; the input gradient is then rows of a
wider tensor, which the norms' row kernels and the SwiGLU kernels read in place (o's, whose gradient goes to
attention, is not folded). The forward reads only ``W``.

The model calls q, k and v one after the other with the same tensor: the first call computes the group
and hands the others their outputs when they are called with that tensor. Anything else (DoRA, several
active adapters, merged or disabled adapters, an fp32 input under autocast, an 8-bit base, ZeRO-3's
partitioned weights) runs the layer's own forward.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from core.estimate.plan import LORA_SIBLINGS
from core.train.engine_switches import decoder_layers, in_backward, mlp_ends_block, plain_lora_adapters

GROUPS = LORA_SIBLINGS  # siblings that read one input (the estimator's plan counts the same groups)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _base_weight(base: Any, dtype: torch.dtype) -> torch.Tensor:
    """The frozen base weight (out x in) in ``dtype``: dequantised for a 4-bit base."""
    weight = base.weight
    state = getattr(weight, "quant_state", None)
    if state is not None:
        import bitsandbytes.functional as bnbf

        weight = bnbf.dequantize_4bit(weight.data, state)
    return weight if weight.dtype == dtype else weight.to(dtype)


# An adapted output starts as ``s h B^T`` (plus the bias) and the frozen matmul adds into it in its epilogue (beta 1):
# one write of the output, where the frozen matmul's output first would be read and written again by the lora_B matmul
# (TUNEDECK_LORA_B_FIRST=0, as before). The same products; the update is rounded before the sum rather than the base
# output (peft rounds both). The wizard's 7B plan on an H100, A B A B: +0.24% and +0.33% (bench/results/lora-b-first).
B_FIRST = os.environ.get("TUNEDECK_LORA_B_FIRST", "1") != "0"


def _frozen(base: Any, flat: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``base(flat)``; where ``weight`` (a 4-bit base's, dequantised) is given, bitsandbytes' own forward: F.linear
    over it, the bias in its dtype."""
    if weight is None:
        return base(flat)
    return torch.nn.functional.linear(flat, weight, None if base.bias is None else base.bias.to(weight.dtype))


def _adapted(base: Any, flat: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scaling: float,
             weight: torch.Tensor | None = None) -> torch.Tensor:
    """``base(flat) + scaling h b^T`` (``_frozen``'s output). With ``B_FIRST``, where the weight and bias are in
    ``flat``'s dtype, the update first and the frozen matmul into it; a base with forward hooks (accelerate's
    offload, a profiler's, a test's) is called as a module."""
    dtype, bias = flat.dtype, base.bias
    plain = type(base) is torch.nn.Linear and not (base._forward_hooks or base._forward_pre_hooks)
    frozen = weight if weight is not None else base.weight if plain else None
    if B_FIRST and frozen is not None and frozen.dtype == dtype and (bias is None or bias.dtype == dtype):
        h, b = h.to(dtype), b.to(dtype)
        if bias is None:
            out = flat.new_empty(flat.shape[0], frozen.shape[0]).addmm_(h, b.t(), beta=0, alpha=scaling)
        else:
            out = torch.addmm(bias, h, b.t(), alpha=scaling)
        return out.addmm_(flat, frozen.t())
    out = _frozen(base, flat, weight)
    return out.addmm_(h.to(out.dtype), b.t().to(out.dtype), alpha=scaling)


def _is_4bit(base: Any) -> bool:
    return getattr(base.weight, "quant_state", None) is not None


def _dropout_p(layer: Any, adapter: str) -> float | None:
    module = layer.lora_dropout[adapter]
    if isinstance(module, torch.nn.Identity):
        return 0.0
    if isinstance(module, torch.nn.Dropout):
        return float(module.p) if module.training else 0.0
    return None  # some other module: not ours to reproduce


def _spec(layer: Any, x: torch.Tensor) -> tuple[Any, str, float, float] | None:
    """(layer, adapter, scaling, dropout p) when the grouped path can run ``layer`` on ``x``: one plain
    adapter (``plain_lora_adapters``) over a frozen bf16/fp32 or 4-bit base with a frozen bias; else None."""
    adapters = plain_lora_adapters(layer, x)
    if len(adapters) != 1:
        return None
    adapter = adapters[0]
    base = layer.get_base_layer()
    weight = getattr(base, "weight", None)
    if weight is None or weight.requires_grad or hasattr(weight, "ds_id"):  # trained, or ZeRO-3 partitioned
        return None
    if not (type(base) is torch.nn.Linear or getattr(weight, "quant_state", None) is not None):
        return None
    if getattr(base, "bias", None) is not None and base.bias.requires_grad:
        return None
    p = _dropout_p(layer, adapter)
    return None if p is None else (layer, adapter, float(layer.scaling[adapter]), p)


@functools.cache
def _kernel_module() -> Any:
    """``core.train.lora_dropout_kernel``, or None without Triton (looked up once, not at every forward)."""
    try:
        from core.train import lora_dropout_kernel
    except ImportError:
        return None
    return lora_dropout_kernel


def _dropout_kernels(x: torch.Tensor) -> Any:
    """``core.train.lora_dropout_kernel`` where its Triton kernels can run on ``x``'s device, else None."""
    if not (x.is_cuda or os.environ.get("TUNEDECK_TRITON_INTERPRET") == "1"):
        return None  # (the kernels' own check, ``usable``, tells the interpreter case apart)
    return _kernel_module()


def _fold(specs: list[tuple[Any, str, float, float]], grads: list[torch.Tensor], b_weights: list[torch.Tensor],
          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``lora_fold_dh``: (dx, [dh_1 | dh_2 ...]) of a group from its base matmuls, both views of one
    tokens x (in + G r + padding) tensor, where every layer's base weight lives in its ``home_lora_bases`` buffer
    (slot i for the group's i-th layer, this group's width) in ``dtype``; else None (the caller runs the separate
    matmuls)."""
    homes = [getattr(layer, "_tunedeck_fold", None) for layer, *_ in specs]
    if any(home is None for home in homes):
        return None
    width = homes[0][0].shape[1]
    for i, ((layer, _, _, _), (home, col, rank)) in enumerate(zip(specs, homes, strict=True)):
        weight = layer.get_base_layer().weight
        if home.dtype != dtype or home.shape[1] != width or col != weight.shape[1] + i * rank \
                or weight.data_ptr() != home.data_ptr() or weight.stride() != home.stride():
            return None  # not this group's layout any more (a weight moved since, another grouping)
    out = None
    for (_, _, scaling, _), grad, b, (home, col, rank) in zip(specs, grads, b_weights, homes, strict=True):
        g = grad.reshape(-1, grad.shape[-1]).to(dtype)
        home[:, col:col + rank].copy_(b * scaling)  # (the siblings' slots stay zero)
        out = torch.mm(g, home) if out is None else out.addmm_(g, home)
    inputs = homes[0][1]
    return out[:, :inputs], out[:, inputs:inputs + sum(rank for *_, rank in homes)]


FOLD_ROW_BYTES = 128  # a fold buffer's rows (and its matmul's [dx | dh] rows) start this many bytes apart


def _aligned(columns: int, element_size: int) -> int:
    """``columns`` rounded up so that a row of them is a whole number of ``FOLD_ROW_BYTES``: the kernels that
    read ``dx`` and ``dh`` in place read whole 128-byte lines a row (7B's down projection: 18,944 + 16 columns
    left each row 32 bytes off, the SwiGLU backward 2 ms a step slower than on a dense gradient,
    engine-speed-t); the padding columns stay zero and fit the matmul's last column tile."""
    per_line = max(1, FOLD_ROW_BYTES // element_size)
    return -(-columns // per_line) * per_line


def home_lora_bases(model: Any) -> int:
    """``lora_fold_dh``: move the frozen base weight of every grouped q/k/v and gate/up linear, and of a down
    projection whose LoRA input work runs in the SwiGLU kernels, into the first columns of a buffer with a
    rank-wide slot per linear of its group (zeros), the weight a view of it (see the module docstring): where
    the group's layers share one rank and have plain frozen 16/32-bit weights. Run it with the model on its
    device (a ``.to()`` after makes a copy the backward no longer recognises: it then runs the separate
    matmuls). Returns how many weights live in such buffers; idempotent."""
    groups = {id(g): g for g in (getattr(m, "_tunedeck_group", None) for m in model.modules()) if g is not None}
    count = 0
    for group in groups.values():
        layers = group.layers
        if len(layers) == 1 and not group.fuse_in_swiglu:
            continue  # o_proj (its gradient goes to attention, which would copy the rows) and the rest alone
        adapters = [list(layer.lora_A.keys()) for layer in layers]
        if any(len(names) != 1 for names in adapters):
            continue
        ranks = {layer.lora_A[names[0]].weight.shape[0] for layer, names in zip(layers, adapters, strict=True)}
        bases = [layer.get_base_layer() for layer in layers]
        weights = [getattr(base, "weight", None) for base in bases]
        if len(ranks) != 1 or any(type(base) is not torch.nn.Linear or weight is None or weight.requires_grad
                                  or hasattr(weight, "ds_id") or weight.dim() != 2
                                  or weight.dtype not in (torch.bfloat16, torch.float16, torch.float32)
                                  for base, weight in zip(bases, weights, strict=True)):
            continue
        if len({weight.shape[1] for weight in weights}) != 1:
            continue
        rank = ranks.pop()
        inputs = weights[0].shape[1]
        width = _aligned(inputs + len(layers) * rank, weights[0].element_size())
        for slot, (layer, weight) in enumerate(zip(layers, weights, strict=True)):
            fold = getattr(layer, "_tunedeck_fold", None)
            if fold is not None and weight.data_ptr() == fold[0].data_ptr() and fold[0].shape[1] == width:
                count += 1
                continue
            home = weight.new_zeros(weight.shape[0], width)
            home[:, :inputs].copy_(weight.detach())
            weight.data = home[:, :inputs]
            layer._tunedeck_fold = (home, inputs + slot * rank, rank)
            count += 1
    return count


_FIRST_WEIGHT = 5  # where the adapters' weights start among _GroupedLoRA.forward's inputs
RUN, REUSE, SKIP = "run", "reuse", "skip"  # the base matmuls: run, run and keep 4-bit weights dequantised, skip


class _GroupedLoRA(torch.autograd.Function):
    """Outputs of the ``specs``' layers on one input (``_spec`` of each, as the forward found them: the
    backward uses the same); the adapters' weights are the inputs after ``specs``, ``fused`` (whether
    dropout may run in ``lora_dropout_kernel``'s kernels), ``defer`` (the LoRA adds left to the consumer)
    and ``mode`` (``LoRAGroup._mode``: the base matmuls' ``RUN``, ``REUSE`` (4-bit bases' dequantised weights
    kept for backward) or ``SKIP`` (none, the outputs left uninitialised for a caller that reads none); the group
    that keeps the fused kernels' ``lora_A`` products for the recompute, or None; whether this is the recompute),
    A and B of each."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, specs: list[tuple[Any, str, float, float]], fused: bool, defer: bool,
                mode: tuple[str, Any, bool], *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base_mode, keeper, recomputing = mode
        dtype = _compute_dtype(x)
        flat = x.reshape(-1, x.shape[-1])
        a_weights = [w.to(dtype) for w in weights[0::2]]
        b_weights = [w.to(dtype) for w in weights[1::2]]
        ps = [p for *_, p in specs]
        ranks = [a.shape[0] for a in a_weights]
        dropped = any(p > 0 for p in ps)
        kernels = _dropout_kernels(x) if dropped and fused else None
        ctx.seed = None
        joined = None  # the h's side by side, where a path makes them so
        if kernels is not None and kernels.usable(flat, ranks, ps, *flat.shape):
            # dropout inside lora_A, the masks drawn again in backward from this seed: only the input is kept
            flat = flat.contiguous()
            a_cat = torch.cat(a_weights) if len(a_weights) > 1 else a_weights[0].contiguous()
            ctx.seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # the CPU generator: no device sync
            joined = keeper.take_lora_a(ctx.seed, flat.shape[0]) if keeper is not None and recomputing else None
            if joined is None:
                joined = kernels.dropout_lora_a(flat, a_cat, len(specs), ctx.seed, ps[0])
                if keeper is not None and not recomputing:
                    keeper.keep_lora_a(ctx.seed, joined)
            hidden = list(joined.split(ranks, dim=1))
            kept = [flat, joined, a_cat]
        elif dropped:  # one independent mask per linear, as peft draws them
            pairs = [torch.native_dropout(flat, p, True) if p > 0 else (flat, None) for p in ps]
            hidden = [torch.mm(inputs, a.t()) for (inputs, _), a in zip(pairs, a_weights, strict=True)]
            kept = [t for pair in pairs for t in pair if t is not None] + hidden + a_weights
        else:  # one matmul over the concatenated adapters: the input is read once
            joined = torch.mm(flat, torch.cat(a_weights).t()) if len(specs) > 1 else torch.mm(flat, a_weights[0].t())
            hidden = list(joined.split(ranks, dim=1))
            kept = [flat, joined, *a_weights]
        outputs = []
        reuse = base_mode == REUSE and all(_is_4bit(layer.get_base_layer()) for layer, *_ in specs)
        skip = base_mode == SKIP and not defer
        dequantised = []
        for (layer, _, scaling, _), h, b in zip(specs, hidden, b_weights, strict=True):
            base = layer.get_base_layer()
            if skip:  # nothing reads it (LoRAGroup._mode)
                outputs.append(flat.new_empty(*x.shape[:-1], base.out_features))
                continue
            if reuse:
                dequantised.append(_base_weight(base, dtype))
            weight = dequantised[-1] if reuse else None
            out = _frozen(base, flat, weight) if defer else _adapted(base, flat, h, b, scaling, weight)
            outputs.append(out.view(*x.shape[:-1], out.shape[-1]))
        if defer:  # the consumer adds the updates (lora_swiglu_kernel): the h's, side by side, go with them
            joined = torch.cat(hidden, dim=1) if joined is None else joined
            ctx.mark_non_differentiable(joined)
            outputs.append(joined)
        ctx.specs = specs
        ctx.ranks = ranks
        ctx.weight_dtypes = [w.dtype for w in weights]
        ctx.dtype = dtype
        ctx.dropped = dropped
        ctx.x_shape = x.shape
        ctx.reused = reuse
        ctx.save_for_backward(*kept, *b_weights, *dequantised)
        return tuple(outputs)

    @staticmethod
    def _unpack(ctx: Any) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]:
        """(inputs, masks, hidden, a_weights, b_weights, dequantised) as forward kept them; in the fused case
        the one input and the stacked A (``a_weights`` = [a_cat]) and no masks; ``dequantised`` is empty
        unless the base weights were kept (``reuse``)."""
        specs, n = ctx.specs, len(ctx.specs)
        saved = list(ctx.saved_tensors)
        dequantised = saved[-n:] if ctx.reused else []
        if ctx.reused:
            saved = saved[:-n]
        b_weights = saved[-n:]
        if ctx.seed is not None:
            flat, joined, a_cat = saved[:3]
            return [flat] * n, [None] * n, list(joined.split(ctx.ranks, dim=1)), [a_cat], b_weights, dequantised
        if not ctx.dropped:
            flat, joined = saved[:2]
            return ([flat] * n, [None] * n, list(joined.split(ctx.ranks, dim=1)), saved[2:2 + n], b_weights,
                    dequantised)
        inputs, masks, at = [], [], 0
        for *_, p in specs:
            inputs.append(saved[at])
            masks.append(saved[at + 1] if p > 0 else None)
            at += 2 if p > 0 else 1
        return inputs, masks, saved[at:at + n], saved[at + n:at + 2 * n], b_weights, dequantised

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        specs = ctx.specs
        grads = grads[:len(specs)]  # deferred: the h's (no gradient) came last
        inputs, masks, hidden, a_weights, b_weights, dequantised = _GroupedLoRA._unpack(ctx)
        first = _FIRST_WEIGHT
        fused = ctx.seed is not None
        need_x = ctx.needs_input_grad[0]
        grad_x = None
        grad_hidden: list[torch.Tensor | None] = []
        weight_grads: list[torch.Tensor | None] = []
        folded = None
        if need_x and not ctx.reused and all(grad is not None for grad in grads):
            folded = _fold(specs, grads, b_weights, ctx.dtype)  # lora_fold_dh (the module docstring)
        if folded is not None:
            grad_x, joined_dh = folded
            folded_dh = list(joined_dh.split(ctx.ranks, dim=1))
        for i, ((layer, _, scaling, _), grad) in enumerate(zip(specs, grads, strict=True)):
            if grad is None:
                grad_hidden.append(None)
                weight_grads += [None, None]
                continue
            g = grad.reshape(-1, grad.shape[-1]).to(ctx.dtype)
            if folded is not None:
                dh = folded_dh[i]
            else:
                if need_x:
                    base = dequantised[i] if dequantised else _base_weight(layer.get_base_layer(), ctx.dtype)
                    grad_x = torch.mm(g, base) if grad_x is None else grad_x.addmm_(g, base)
                dh = torch.mm(g, b_weights[i] * scaling)  # (tokens, r): scaling folded into the small factor
            grad_hidden.append(dh)
            weight_grads.append(torch.mm(dh.t(), inputs[i]) if ctx.needs_input_grad[first + 2 * i] and not fused
                                else None)
            weight_grads.append(torch.mm(g.t(), hidden[i] * scaling) if ctx.needs_input_grad[first + 1 + 2 * i] else None)
        live = [i for i, dh in enumerate(grad_hidden) if dh is not None]
        if need_x and grad_x is None:
            grad_x = torch.zeros(inputs[0].shape, dtype=ctx.dtype, device=inputs[0].device)
        if fused and live:
            kernels = _dropout_kernels(inputs[0])
            p, groups, rank = specs[0][3], len(specs), ctx.ranks[0]
            if folded is not None:  # side by side already, rows of the wider gradient: the kernels read them dense
                dh_all = joined_dh.contiguous()
            else:
                dh_all = torch.cat([dh if dh is not None else hidden[i].new_zeros(hidden[i].shape)
                                    for i, dh in enumerate(grad_hidden)], dim=1) if groups > 1 else grad_hidden[0]
            want_a = any(ctx.needs_input_grad[first + 2 * i] for i in live)
            if need_x and want_a and inputs[0].shape[-1] <= kernels.BACKWARD_MAX_WIDTH:  # each mask drawn once
                a_grads = kernels.backward(inputs[0], dh_all, a_weights[0], grad_x, groups, ctx.seed, p).split(rank)
            else:
                if need_x:
                    kernels.add_input_grad(grad_x, dh_all, a_weights[0], groups, ctx.seed, p)
                if want_a:
                    a_grads = kernels.adapter_grads(inputs[0], dh_all, groups, rank, ctx.seed, p).split(rank)
            if want_a:
                for i in live:
                    if ctx.needs_input_grad[first + 2 * i]:
                        weight_grads[2 * i] = a_grads[i]
        elif need_x and ctx.dropped:
            for i in live:
                part = torch.mm(grad_hidden[i], a_weights[i])
                p = specs[i][3]
                # dropout's own backward, then the sum: one fused ``addcmul_`` over the bool mask ran the
                # slow type-promoting kernel on the H200 (47 ms a 7B step against 22 for these two)
                grad_x.add_(torch.ops.aten.native_dropout_backward(part, masks[i], 1.0 / (1.0 - p))
                            if p > 0 else part)
        elif need_x and live:
            grad_x.addmm_(torch.cat([grad_hidden[i] for i in live], dim=1),
                          torch.cat([a_weights[i] for i in live]))
        if need_x:
            grad_x = grad_x.view(ctx.x_shape)
        weight_grads = [g if g is None else g.to(d) for g, d in zip(weight_grads, ctx.weight_dtypes, strict=True)]
        return (grad_x, None, None, None, None, *weight_grads)  # the input's dtype is the compute dtype (LoRAGroup.forward)


class _GivenLoRA(torch.autograd.Function):
    """A lone adapted linear whose ``lora_A`` product ``h`` (dropout included) was made by the node before it
    (``lora_swiglu_kernel.LoRASwiGLUDown`` for ``down_proj``): ``base(x) + s h B^T``, the base matmul skipped
    where ``skip`` (as ``_GroupedLoRA``'s ``SKIP``). Kept for backward: h and B, not x. Backward: x's gradient
    through the frozen base only, h's (``g B s``: the node before adds its adapter term and A's gradient) and
    B's, the products ``_GroupedLoRA`` computes."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, h: torch.Tensor, spec: tuple[Any, str, float, float], skip: bool,
                b_weight: torch.Tensor) -> torch.Tensor:
        layer, _, scaling, _ = spec
        base = layer.get_base_layer()
        flat = x.reshape(-1, x.shape[-1])
        b = b_weight.to(x.dtype)
        if skip:
            out = flat.new_empty(flat.shape[0], base.out_features)
        else:
            out = _adapted(base, flat, h, b, scaling)
        ctx.spec, ctx.x_shape, ctx.dtype, ctx.b_dtype = spec, x.shape, x.dtype, b_weight.dtype
        ctx.save_for_backward(h, b)
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, b = ctx.saved_tensors
        layer, _, scaling, _ = ctx.spec
        g = grad.reshape(-1, grad.shape[-1]).to(ctx.dtype)
        folded = _fold([ctx.spec], [grad], [b], ctx.dtype) if ctx.needs_input_grad[0] and ctx.needs_input_grad[1] \
            else None
        if folded is not None:  # lora_fold_dh: [dx | dh] from one matmul
            grad_x, grad_h = folded[0].view(ctx.x_shape), folded[1]
        else:
            grad_x = torch.mm(g, _base_weight(layer.get_base_layer(), ctx.dtype)).view(ctx.x_shape) \
                if ctx.needs_input_grad[0] else None
            grad_h = torch.mm(g, b * scaling) if ctx.needs_input_grad[1] else None
        grad_b = torch.mm(g.t(), h * scaling).to(ctx.b_dtype) if ctx.needs_input_grad[4] else None
        return grad_x, grad_h, None, None, grad_b


class LoRAGroup:
    """Peft LoRA linears that read the same input, run together (see the module docstring)."""

    def __init__(self, layers: list[Any], fused_dropout: bool = True, block: Any = None,
                 reuse_dequantised: bool = False) -> None:
        self.layers = layers
        self.fused_dropout = fused_dropout
        self.block = block  # the decoder block the group is in: whether it is checkpointed, at each forward
        self.reuse_dequantised = reuse_dequantised
        self.skip_in_backward = False  # (group_lora_layers: a down_proj whose output ends its block)
        self.keeps_lora_a = False  # (group_lora_layers: recompute_keep_lora_a)
        self.fuse_in_swiglu = False  # (group_lora_layers: lora_swiglu_down, a down_proj after a fused SwiGLU)
        self.sums_b_in_swiglu = False  # (group_lora_layers: lora_swiglu_db, the B gradients in that SwiGLU's kernel)
        self._kept_a: tuple[int, torch.Tensor] | None = None  # (seed, lora_A products) of the first forward
        self._handed: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None

    def _checkpointed(self) -> bool:
        """Whether the group's block is checkpointed now (training, its recompute to come in backward)."""
        block = self.block
        return block is not None and block.training and bool(getattr(block, "gradient_checkpointing", False))

    def _reuse(self) -> bool:
        """Whether this forward keeps 4-bit bases' dequantised weights for backward: asked for, and the group's
        block is checkpointed now (what the checkpoint's first forward saves is dropped as it goes)."""
        return self.reuse_dequantised and self._checkpointed()

    def _mode(self) -> tuple[str, LoRAGroup | None, bool]:
        """``_GroupedLoRA``'s ``mode`` for this call. The base matmuls: ``SKIP`` for a group whose outputs nothing
        reads inside a backward pass (``skip_in_backward``, see the module docstring) when it runs in one, else
        ``REUSE`` or ``RUN``; such a group never keeps dequantised weights (its first forward must save what its
        recompute saves: the checkpoint counts them; its backward dequantises the one weight itself)."""
        recomputing = torch.is_grad_enabled() and in_backward()
        if self.skip_in_backward:
            base = SKIP if recomputing else RUN
        else:
            base = REUSE if self._reuse() else RUN
        keeper = self if self.keeps_lora_a and torch.is_grad_enabled() and self._checkpointed() else None
        return base, keeper, recomputing

    def keep_lora_a(self, seed: int, products: torch.Tensor) -> None:
        self._kept_a = (seed, products)

    def take_lora_a(self, seed: int, rows: int) -> torch.Tensor | None:
        """The first forward's ``lora_A`` products if they were drawn with ``seed`` for ``rows`` rows (what the
        recompute would make), else None; nothing stays kept either way."""
        kept, self._kept_a = self._kept_a, None
        return kept[1] if kept is not None and kept[0] == seed and kept[1].shape[0] == rows else None

    def _specs(self, x: torch.Tensor) -> list[tuple[Any, str, float, float]] | None:
        """Every layer's ``_spec`` on ``x``, or None if one cannot run grouped; an fp32 input under autocast
        (qlora_upcast) is left to peft's casts."""
        if x.dtype != _compute_dtype(x):
            return None
        specs = [_spec(other, x) for other in self.layers]
        return None if any(spec is None for spec in specs) else specs  # type: ignore[return-value]

    @staticmethod
    def _weights(specs: list[tuple[Any, str, float, float]]) -> list[torch.Tensor]:
        return [w for other, adapter, *_ in specs for w in (other.lora_A[adapter].weight, other.lora_B[adapter].weight)]

    def forward(self, layer: Any, original: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        handed = self._handed
        if handed is not None and handed[0] is x and id(layer) in handed[1] and not args and not kwargs:
            out = handed[1].pop(id(layer))
            if not handed[1]:
                self._handed = None
            return out
        self._handed = None
        specs = self._specs(x) if not args and not kwargs else None
        if specs is None:
            return original(x, *args, **kwargs)
        outputs = _GroupedLoRA.apply(x, specs, self.fused_dropout, False, self._mode(), *self._weights(specs))
        others = {id(other): out for other, out in zip(self.layers, outputs, strict=True) if other is not layer}
        self._handed = (x, others) if others else None
        return outputs[self.layers.index(layer)]

    def swiglu(self, x: torch.Tensor, down_proj: Any) -> torch.Tensor | None:
        """The MLP's output ``down_proj(silu(gate(x)) * up(x))`` for a gate/up group (layers in that order), the
        LoRA updates added inside the SwiGLU kernel (``core.train.lora_swiglu_kernel``); None where that cannot
        run (the caller runs the module's own forward). Where ``down_proj``'s group allows (``given_spec``:
        ``lora_swiglu_down``), its LoRA input work runs inside the same kernels and its input is not kept."""
        self._handed = None
        specs = self._specs(x)
        kernels = _swiglu_kernels()
        if specs is None or kernels is None:
            return None
        weights = self._weights(specs)  # A, B of gate, A, B of up: one rank for both (the kernel's h is [hg | hu])
        elements = x.numel() // x.shape[-1] * weights[1].shape[0]
        if weights[0].shape[0] != weights[2].shape[0] or not kernels.usable(x, elements, weights[0].shape[0]):
            return None
        down = getattr(down_proj, "_tunedeck_group", None)
        spec = down.given_spec(x, elements) if down is not None else None
        # with the down projection inside, the SwiGLU kernel can sum the B gradients: the grouped node gets B detached
        in_kernel = spec is not None and self.sums_b_in_swiglu
        grouped = [w.detach() if i % 2 else w for i, w in enumerate(weights)] if in_kernel else weights
        gate, up, hidden = _GroupedLoRA.apply(x, specs, self.fused_dropout, True, self._mode(), *grouped)
        dtype = gate.dtype
        b = torch.cat([weights[1].to(dtype), weights[3].to(dtype)], dim=1)  # [Bg | Bu], n x 2r
        if spec is None:
            return down_proj(kernels.LoRASwiGLU.apply(gate, up, hidden.to(dtype), b, specs[0][2], specs[1][2]))
        layer, adapter, _, p = spec
        base_mode, _, _ = down._mode()
        skip = base_mode == SKIP
        product, hd = kernels.LoRASwiGLUDown.apply(gate, up, hidden.to(dtype), b if in_kernel else b.detach(),
                                                   layer.lora_A[adapter].weight,
                                                   specs[0][2], specs[1][2], p, not skip)
        return _GivenLoRA.apply(product, hd, spec, skip, layer.lora_B[adapter].weight)

    def given_spec(self, x: torch.Tensor, elements: int) -> tuple[Any, str, float, float] | None:
        """This lone layer's ``_spec`` where ``lora_swiglu_kernel.LoRASwiGLUDown`` can make its ``lora_A`` product
        from a product of ``elements`` elements in ``x``'s dtype: asked for (``fuse_in_swiglu``), one rank up to
        the kernels', and dropout either none or the fused kernels' (the masks it would draw itself)."""
        if not self.fuse_in_swiglu or len(self.layers) != 1:
            return None
        specs = self._specs(x)
        if specs is None:
            return None
        layer, adapter, _, p = specs[0]
        width = layer.get_base_layer().in_features
        if layer.lora_A[adapter].weight.shape[0] > _swiglu_kernels().MAX_RANK:
            return None
        if p > 0:
            kernels = _dropout_kernels(x) if self.fused_dropout else None
            rank = layer.lora_A[adapter].weight.shape[0]
            if kernels is None or not kernels.usable(x, [rank], [p], elements // width, width):
                return None
        return specs[0]


@functools.cache
def _swiglu_kernels() -> Any:
    """``core.train.lora_swiglu_kernel``, or None without Triton."""
    try:
        from core.train import lora_swiglu_kernel
    except ImportError:
        return None
    return lora_swiglu_kernel


GROUPABLE = ("Linear", "Linear4bit")  # peft's LoRA layers over a bf16/fp32 or 4-bit linear


def group_lora_layers(model: Any, fused_dropout: bool = True, fused_swiglu: bool = True,
                      reuse_dequantised: bool = False, skip_down: bool = False, keep_lora_a: bool = False,
                      swiglu_down: bool = False, swiglu_db: bool = False) -> int:
    """Give every peft LoRA linear the grouped forward (siblings in ``GROUPS`` together, the rest alone),
    its dropout in ``lora_dropout_kernel``'s kernels where they run if ``fused_dropout``, a SiLU MLP
    over a gate/up group its SwiGLU with the LoRA updates inside (``lora_swiglu_kernel``) if
    ``fused_swiglu``, and 4-bit bases in checkpointed blocks their dequantised weights kept for backward if
    ``reuse_dequantised``, and the ``down_proj`` of a block whose MLP ends it no matmul inside a backward pass if
    ``skip_down``, and in checkpointed blocks the fused kernels' ``lora_A`` products kept for the recompute if
    ``keep_lora_a``, and a ``down_proj`` after such a SwiGLU its LoRA input work inside it if ``swiglu_down``, the
    gate/up adapters' B gradients summed there too if ``swiglu_db`` (see the module docstring); returns how many
    groups. Idempotent."""
    blocks = decoder_layers(model)
    block_of = {id(module): block for block in blocks for module in block.modules()}
    ending_mlps = {id(block.mlp) for block in blocks if hasattr(block, "mlp")} \
        if skip_down and mlp_ends_block(model) else set()
    by_parent: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        if type(module).__name__ in GROUPABLE and hasattr(module, "lora_A") and hasattr(module, "lora_variant") \
                and getattr(module, "_tunedeck_group", None) is None:
            parent, _, leaf = name.rpartition(".")
            by_parent.setdefault(parent, {})[leaf] = module
    groups = 0
    for parent, children in by_parent.items():
        remaining = dict(children)
        sets = [[remaining.pop(n) for n in names if n in remaining] for names in GROUPS]
        sets += [[module] for module in remaining.values()]
        for layers in sets:
            if not layers:
                continue
            group = LoRAGroup(layers, fused_dropout, block_of.get(id(layers[0])), reuse_dequantised)
            for layer in layers:
                layer.forward = _grouped_forward(group, layer, layer.forward)
                layer._tunedeck_group = group
            groups += 1
            group.skip_in_backward = (layers == [children.get("down_proj")]
                                      and id(model.get_submodule(parent)) in ending_mlps)
            group.keeps_lora_a = keep_lora_a
            group.sums_b_in_swiglu = swiglu_db
            group.fuse_in_swiglu = fused_swiglu and swiglu_down and layers == [children.get("down_proj")]
            if fused_swiglu and [children.get("gate_proj"), children.get("up_proj")] == layers:
                _fuse_swiglu(model.get_submodule(parent), group)
    return groups


def skips_down(model: Any) -> bool:
    """Whether a down projection of ``model`` skips its matmul in the recompute (``group_lora_layers``' ``skip_down``
    took, its block ending with its MLP)."""
    return any(getattr(getattr(m, "_tunedeck_group", None), "skip_in_backward", False) for m in model.modules())


def _fuse_swiglu(mlp: Any, group: LoRAGroup) -> bool:
    """``mlp.forward`` = ``down(silu(gate(x)) * up(x))`` through ``group.swiglu`` where ``mlp`` is such an MLP
    (a ``down_proj``, ``config.hidden_act`` SiLU), falling back to the forward it had per call; whether it is.
    Idempotent, and again over a forward put there since (Liger's, which the Trainer applies in ``train``)."""
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if act not in ("silu", "swish") or not hasattr(mlp, "down_proj"):
        return False
    if mlp.forward is getattr(mlp, "_tunedeck_swiglu_forward", None):
        return True
    original = mlp.forward

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        out = None if args or kwargs else group.swiglu(x, mlp.down_proj)
        return original(x, *args, **kwargs) if out is None else out

    mlp.forward = mlp._tunedeck_swiglu_forward = forward
    mlp._tunedeck_swiglu = group
    return True


def fuse_lora_swiglu(model: Any) -> int:
    """Puts the fused SwiGLU (``_fuse_swiglu``) back on every MLP ``group_lora_layers`` gave it whose forward
    was replaced since (the Trainer applies Liger's kernels in ``train``); returns how many MLPs have it."""
    return sum(_fuse_swiglu(module, module._tunedeck_swiglu) for module in model.modules()
               if getattr(module, "_tunedeck_swiglu", None) is not None)


def _grouped_forward(group: LoRAGroup, layer: Any, original: Any) -> Any:
    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        return group.forward(layer, original, x, *args, **kwargs)

    return forward
