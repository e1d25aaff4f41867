"""Gradient checkpointing whose kept block inputs live in host memory (``offload_activations: true``).

With checkpointing a decoder keeps one tensor per block for backward: the block's input (tokens x
hidden in the compute dtype). At long sequences these dominate what stays on the GPU — 28 blocks x
32k tokens x 3584 x 2 bytes = 6.6 GB for a 7B model. Here each block's input is copied to pinned host
memory as the block starts, and copied back only for the block's recomputation in backward:

- the forward pass computes on the GPU tensor it was given (no copy back, no wait): the copy to the host
  runs on a side CUDA stream, overlapping the block's compute;
- in backward the blocks are recomputed last to first; while block k is recomputed, block k-1's input is
  already being copied back on the side stream (prefetch), so the recomputation rarely waits for PCIe;
- the input's gradient flows through the forward graph as in plain checkpointing: no gradient crosses
  PCIe. Two copies of each block input per step, both asynchronous.

The host copy is a list of pinned chunks of at most ``PIN_CHUNK_BYTES``: torch's pinned-memory allocator
rounds every request up to a power of two, so one 2.8 GB block input (393k tokens on a 7B) would pin
4 GiB, and 28 of them nearly all of a 125 GiB box; in chunks the rounding wastes at most one chunk.

The first version copied synchronously from pageable memory, back again for the forward, and sent the
gradient through the host (five blocking copies per block): at 32k tokens that, not the compute, set the
speed (1,940 tok/s on a 7B at 32k and 49k alike).

transformers' checkpointed layers call ``module._gradient_checkpointing_func(forward, hidden, ...)``;
``install_offloaded_checkpointing`` replaces that function on every checkpointed module after the
Trainer has enabled checkpointing (``OffloadedCheckpointingCallback``, at train begin).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger("tunedeck.train")

PIN_CHUNK_BYTES = 64 << 20  # a power of two: the pinned allocator keeps whole chunks, with no rounding


def chunk_bounds(numel: int, element_size: int, chunk_bytes: int = PIN_CHUNK_BYTES) -> list[tuple[int, int]]:
    """[start, end) element ranges of at most ``chunk_bytes`` each, covering ``numel`` elements."""
    step = max(1, chunk_bytes // max(1, element_size))
    return [(start, min(start + step, numel)) for start in range(0, numel, step)]


class ParkedInput:
    """One block input parked on the host: the copy there, and the way back (prefetched or not)."""

    def __init__(self, host: Any, copied: Any, device: Any, requires_grad: bool, index: int,
                 shape: Any = None, dtype: Any = None) -> None:
        self.index = index  # its place in the forward order
        self.host = host  # pinned CPU chunks of the flattened input (or one plain copy without CUDA)
        self.shape = shape
        self.dtype = dtype
        self.copied = copied  # CUDA event: the copy to the host is done (None without CUDA)
        self.device = device
        self.requires_grad = requires_grad
        self.prefetched: Any = None
        self.arrived: Any = None  # CUDA event: the prefetched copy is on the GPU

    def prefetch(self, stream: Any) -> None:
        """Start the copy back on ``stream`` (the side stream), if not started.

        The tensor comes from the current stream's memory pool, not the side stream's: the caching allocator keeps
        a pool per stream, and a block freed into the side stream's (each prefetched input, freed after its
        recompute) served only later prefetches there, while the main stream's pool grew on its own; on the H200
        the side stream held 4.4 GiB of the 7B LoRA 64k row's reserved memory (~10 block inputs of 448 MiB) and
        2.0 of the QLoRA 32k row's (engine-longctx-m's memory profiles). The side stream waits for the work
        queued on the current stream first: a block the pool just gave back may still be read by it."""
        import torch

        if self.prefetched is not None or self.host is None or stream is None:
            return
        current = torch.cuda.current_stream(self.device)
        tensor = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            stream.wait_event(self.copied)
            self.prefetched = self._to_device(tensor)
            self.arrived = torch.cuda.Event()
            self.arrived.record(stream)
        tensor.record_stream(stream)  # freed unfetched (a pass given up), not reused before the copy is done

    def fetch(self) -> Any:
        """The input on its device for the recomputation (a leaf, requiring grad as the original did)."""
        import torch

        if self.prefetched is not None:
            torch.cuda.current_stream(self.device).wait_event(self.arrived)
            tensor = self.prefetched  # (the current stream's own memory: prefetch)
        elif self.copied is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied)
            tensor = self._to_device()
        else:
            tensor = self.host.to(self.device, copy=True)
        self.host = self.prefetched = None  # the host copy is done with once back
        return tensor.detach().requires_grad_(self.requires_grad)

    def _to_device(self, tensor: Any = None) -> Any:
        """The chunks copied (asynchronously, on the current stream) into one tensor on the device (``tensor``,
        or a new one)."""
        import torch

        if tensor is None:
            tensor = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        flat = tensor.view(-1)
        start = 0
        for chunk in self.host:
            flat[start:start + chunk.numel()].copy_(chunk, non_blocking=True)
            start += chunk.numel()
        return tensor


class HostStash:
    """The parked inputs of the current forward/backward pass, in forward order, and the side stream.

    It holds them weakly: the autograd graph owns them, so a pass whose backward never runs (an error
    in the forward) frees its host copies with its graph."""

    def __init__(self) -> None:
        self.entries: list[Any] = []  # weak references to ParkedInput
        self.streams: dict[Any, Any] = {}
        self.parked = 0  # block inputs parked so far (the tests count them)

    def park(self, hidden: Any, park_device: str) -> ParkedInput:
        import weakref

        import torch

        last = self.entries[-1]() if self.entries else None
        if last is None or last.host is None:
            self.entries = []  # the last pass is gone or its backward has begun: a new pass starts
        cuda = hidden.is_cuda and park_device == "cpu"
        if cuda:
            stream = self.streams.get(hidden.device)
            if stream is None:
                stream = self.streams[hidden.device] = torch.cuda.Stream(hidden.device)
            flat = hidden.detach().reshape(-1)  # a view when contiguous, else a copy made before the wait
            stream.wait_stream(torch.cuda.current_stream(hidden.device))  # the input is computed
            host = [torch.empty(end - start, dtype=hidden.dtype, pin_memory=True)
                    for start, end in chunk_bounds(flat.numel(), flat.element_size())]
            with torch.cuda.stream(stream):
                start = 0
                for chunk in host:
                    chunk.copy_(flat[start:start + chunk.numel()], non_blocking=True)
                    start += chunk.numel()
                copied = torch.cuda.Event()
                copied.record(stream)
            flat.record_stream(stream)  # not reused by the allocator before the copy has read it
        else:
            host, copied = hidden.detach().to(park_device, copy=True), None
        entry = ParkedInput(host, copied, hidden.device, hidden.requires_grad, len(self.entries), hidden.shape,
                            hidden.dtype)
        self.entries.append(weakref.ref(entry))
        self.parked += 1
        return entry

    def fetch(self, entry: ParkedInput) -> Any:
        """``entry``'s input, and the prefetch of the block recomputed next (the one before it)."""
        tensor = entry.fetch()
        same_pass = entry.index < len(self.entries) and self.entries[entry.index]() is entry
        before = self.entries[entry.index - 1]() if same_pass and entry.index > 0 else None
        if before is not None:
            before.prefetch(self.streams.get(before.device))
        return tensor


_STASH = HostStash()


def offloaded_checkpoint(function: Any, *args: Any, park_device: str = "cpu", force: bool = False,
                         stash: HostStash | None = None) -> Any:
    """``torch.utils.checkpoint`` (non-reentrant) of ``function(*args)`` whose kept ``args[0]`` waits on
    ``park_device``; ``force`` takes the parking path even when the input is already there (tests)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if not args or not torch.is_tensor(args[0]) or (args[0].device.type == park_device and not force):
        return checkpoint(function, *args, use_reentrant=False)
    stash = stash or _STASH
    hidden, rest = args[0], args[1:]
    entry = stash.park(hidden, park_device)
    live = [hidden]  # the forward computes on the tensor it was given; the recomputation fetches

    def run(_anchor: Any, *more: Any) -> Any:
        tensor = live.pop() if live else stash.fetch(entry)
        return function(tensor, *more)

    # The gradient reaches ``hidden`` through the forward's graph (the recomputation only refills the
    # tensors it saved). checkpoint saves and restores the RNG state of the devices its tensor arguments
    # live on: the empty tensor on the input's device keeps the recomputation's dropout masks those of
    # the forward (the closure's input is no argument of checkpoint's).
    return checkpoint(run, hidden.new_empty(0), *rest, use_reentrant=False)


def install_offloaded_checkpointing(model: Any, **kwargs: Any) -> int:
    """Use ``offloaded_checkpoint`` in every checkpointed decoder block; returns how many."""
    from functools import partial

    try:
        from transformers.modeling_layers import GradientCheckpointingLayer as block_type
    except ImportError:  # an older transformers: every module that carries the flag
        block_type = object
    count = 0
    for module in model.modules():
        if (isinstance(module, block_type) and getattr(module, "gradient_checkpointing", False)
                and hasattr(module, "_gradient_checkpointing_func")):
            module._gradient_checkpointing_func = partial(offloaded_checkpoint, **kwargs) if kwargs else offloaded_checkpoint
            count += 1
    return count


class OffloadedCheckpointingCallback(TrainerCallback):
    """Installs the offloaded checkpoint once the Trainer has turned gradient checkpointing on."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        count = install_offloaded_checkpointing(model)
        log.info("offload_activations: %d checkpointed blocks keep their input in pinned host memory "
                 "(asynchronous copies, prefetched in backward)", count)
