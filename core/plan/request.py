"""A planning request: model, data size, goal, hardware and the fields the user pinned."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from core.plan.hardware import HardwareTarget

if TYPE_CHECKING:
    from core.plan.dataset import DatasetSummary

GOALS = ("fastest", "largest_batch", "longest_context", "lowest_cost")
# Fields a user may pin (the wizard's overrides, the CLI's options); everything else the planner picks.
OVERRIDABLE = ("method", "precision", "zero_stage", "offload", "micro_batch_size", "grad_accum_steps",
               "seq_len", "gradient_checkpointing", "lora_rank", "num_gpus")
DEFAULT_EFFECTIVE_BATCH = 16
DEFAULT_SEQ_LEN = 2048
MIN_SEQ_LEN = 128


def read_epochs(text: str) -> float:
    """The number of epochs ``text`` says, held to the run config's limits for ``epochs`` (finite, above 0,
    at most a million: the tokens seen stay a number). The one check of ``plan --epochs`` and the wizard's
    field; raises argparse.ArgumentTypeError with what is wrong (``got 0.0; must be more than 0``)."""
    from core.config.checks import cli_value

    return float(cli_value("epochs", float)(text))


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
    # The share of the data's tokens that have a target at the request's sequence length (DatasetSummary.
    # target_share): the rows the engine's LM head reads. None: not known (every row counted).
    dataset_target_share: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    # The overrides that came with an alternative the user took (the wizard's 1-3), not typed: the reasons say so.
    chosen: frozenset[str] = frozenset()
    # What was measured of the data, record by record: the tokens a run reads at each plan's sequence length
    # (``training_tokens_at``). None: only ``dataset_tokens`` is known (taken as they are).
    dataset_summary: DatasetSummary | None = field(default=None, repr=False, compare=False)

    def with_dataset(self, summary: DatasetSummary | None) -> PlanRequest:
        """This request with what ``summary`` measured of the data (unchanged without one)."""
        if summary is None or not summary.measured:
            return self
        measured = replace(self, dataset_records=summary.records, dataset_tokens=summary.total_tokens,
                           dataset_p95_tokens=summary.p95, dataset_summary=summary)
        return replace(measured, dataset_target_share=summary.target_share(measured.seq_len))

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
        """Tokens read over all epochs at the request's sequence length (``training_tokens_at``)."""
        return self.training_tokens_at(self.seq_len)

    def training_tokens_at(self, seq_len: int) -> int | None:
        """Tokens a run at ``seq_len`` reads over all epochs (padding aside), when the data size is known: each
        record cut to ``seq_len`` as the engine cuts it (``DatasetSummary.trained_tokens``), not its full length."""
        if self.dataset_summary is not None:
            return int(self.dataset_summary.trained_tokens(seq_len) * self.epochs)
        if self.dataset_tokens is None:
            return None
        return int(self.dataset_tokens * self.epochs)
