"""A planning request: model, data size, goal, hardware and the fields the user pinned."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.plan.hardware import HardwareTarget

GOALS = ("fastest", "largest_batch", "longest_context", "lowest_cost")
# Fields a user may pin (the wizard's overrides, the CLI's options); everything else the planner picks.
OVERRIDABLE = ("method", "precision", "zero_stage", "offload", "micro_batch_size", "grad_accum_steps",
               "seq_len", "gradient_checkpointing", "lora_rank", "num_gpus")
DEFAULT_EFFECTIVE_BATCH = 16
DEFAULT_SEQ_LEN = 2048
MIN_SEQ_LEN = 128


@dataclass(frozen=True)
class PlanRequest:
    """Everything the planner is asked. ``overrides`` maps OVERRIDABLE names to pinned values."""

    model: str
    hardware: HardwareTarget
    goal: str = "fastest"
    epochs: float = 3.0
    effective_batch: int = DEFAULT_EFFECTIVE_BATCH
    dataset: str | None = None
    dataset_records: int | None = None
    dataset_tokens: int | None = None
    dataset_p95_tokens: int | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def default_seq_len(self) -> int:
        """The next power of two covering 95% of the samples (at least 128), else 2048."""
        if self.dataset_p95_tokens:
            seq = MIN_SEQ_LEN
            while seq < self.dataset_p95_tokens:
                seq *= 2
            return seq
        return DEFAULT_SEQ_LEN

    @property
    def seq_len(self) -> int:
        return int(self.overrides.get("seq_len") or self.default_seq_len())

    @property
    def training_tokens(self) -> int | None:
        """Tokens seen over all epochs (padding aside), when the data size is known."""
        if self.dataset_tokens is None:
            return None
        return int(self.dataset_tokens * self.epochs)
