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
# Run keys a plan follows and saves without weighing them (``plan --set overlong=drop``, ``thinking=false``): not
# the planner's fields.
RUN_KEYS = ("overlong", "thinking")
# With overlong: drop, the planner's own sequence covers the longest record while it is at most this many times
# the 95th percentile (``PlanRequest.covered_tokens``); a longer tail is left out, warned.
DROP_TAIL_FACTOR = 2
DEFAULT_EFFECTIVE_BATCH = 16
DEFAULT_SEQ_LEN = 2048
MIN_SEQ_LEN = 128
# The longest sequence planned: the longest-context goal doubles up to it (past the model's positions: warned), and
# a default sequence length stops there when the model's config gives no positions.
MAX_CONTEXT = 524288


def read_epochs(text: str) -> float:
    """The number of epochs ``text`` says, held to the run config's limits for ``epochs`` (finite, above 0,
    at most a million: the tokens seen stay a number). The one check of ``plan --epochs`` and the wizard's
    field; raises argparse.ArgumentTypeError with what is wrong (``got 0.0; must be more than 0``)."""
    from core.config.checks import cli_value

    return float(cli_value("epochs", float)(text))


@dataclass(frozen=True)
class ModelDownload:
    """The weights a run of the planned model downloads at its start (it was sized from a hub's config.json kept
    here, ``core.hub.config_cache``): from ``hub`` into that hub's download cache, ``size_bytes`` as listed."""

    hub: str
    model_id: str
    size_bytes: int


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
    # The positions the model takes (``ModelArchitecture.positions``, its rope scaling counted): the default
    # sequence length stops there (``with_positions``). None: not known (``MAX_CONTEXT``).
    max_positions: int | None = None
    # What a run does with a record longer than its sequence length (the run key ``overlong``): ``cut`` keeps
    # its first tokens, ``drop`` leaves it out, which its tokens, steps, time and cost then do not count.
    overlong: str = "cut"
    # The chat template's enable_thinking (the run key ``thinking``; None: the template's default): the data's
    # tokens are counted with it (``summarise_dataset``), as the run renders its samples; saved with the plan.
    thinking: bool | None = None
    # The model's download, where its weights are not on this box (``with_download``): it fills the hub cache's
    # disk, which may be another than the checkpoints' (the data root's). None: nothing to download, or not known.
    download: ModelDownload | None = None
    # A run that ends at this many optimizer steps, its data not measured (hub data, ``plan --config`` of a file with
    # max_steps): its tokens are these steps' samples, each counted at the full sequence length, an upper bound (exact
    # with packing). None: the run is as long as ``epochs`` of the data.
    max_steps: int | None = None

    def with_download(self, source: str) -> PlanRequest:
        """This request for a model sized from ``source`` (a ``ModelConfig.source``): where that is a hub's
        config.json kept here with its download's size listed, the download it makes (``download``)."""
        from core.hub.config_cache import hub_config_origin

        kept = hub_config_origin(source)
        download = None if kept is None or not kept.download_bytes else \
            ModelDownload(kept.hub, kept.model_id, kept.download_bytes)
        return self if download == self.download else replace(self, download=download)

    def with_dataset(self, summary: DatasetSummary | None) -> PlanRequest:
        """This request with what ``summary`` measured of the data (unchanged without one)."""
        if summary is None or not summary.measured:
            return self
        measured = replace(self, dataset_records=summary.records, dataset_tokens=summary.total_tokens,
                           dataset_p95_tokens=summary.p95, dataset_summary=summary)
        return replace(measured, dataset_target_share=summary.target_share(measured.seq_len, self.overlong))

    def with_positions(self, positions: int | None) -> PlanRequest:
        """This request for a model that takes ``positions`` (its default sequence length held to them, and the
        data's target share measured at that length)."""
        if positions == self.max_positions:
            return self
        capped = replace(self, max_positions=positions)
        if self.dataset_summary is None:
            return capped
        return replace(capped, dataset_target_share=self.dataset_summary.target_share(capped.seq_len, self.overlong))

    @property
    def seq_len_cap(self) -> int:
        """The longest default sequence length: the model's positions, else ``MAX_CONTEXT``."""
        return self.max_positions or MAX_CONTEXT

    def covered_tokens(self) -> int | None:
        """The record length the default sequence length covers: the data's 95th percentile (the longer 5% are
        cut), or with ``overlong: drop`` its longest record, so that the planner's own choice leaves none out
        (a dropped record trains nothing at all), unless that record is more than ``DROP_TAIL_FACTOR`` times the
        95th percentile: one outlier would then size every plan's activations for itself (a 30k-token record
        among 2k ones: 16x), and the 95th percentile is covered, the records left out warned with their count
        and the length that keeps them (``warn_overlong_drop``). None: the data is not measured."""
        p95 = self.dataset_p95_tokens or None
        if self.overlong == "drop" and self.dataset_summary is not None and self.dataset_summary.lengths:
            longest = self.dataset_summary.max_length
            if p95 is None or longest <= DROP_TAIL_FACTOR * p95:
                return longest
        return p95

    def default_seq_len(self) -> int:
        """The next power of two covering 95% of the samples (``covered_tokens``: all of them with ``overlong:
        drop``; at least 128), else 2048; never past the positions the model takes (``seq_len_cap``): longer
        records are cut (or dropped) there (a pinned ``seq_len`` may go past them, warned)."""
        covered = self.covered_tokens()
        wanted = _next_power_of_two(covered) if covered else DEFAULT_SEQ_LEN
        return min(wanted, self.seq_len_cap)

    def seq_len_capped(self) -> bool:
        """The default sequence length stops at ``seq_len_cap``, short of ``covered_tokens`` rounded up."""
        covered = self.covered_tokens()
        return bool(covered) and self.seq_len_cap < _next_power_of_two(covered)

    @property
    def seq_len(self) -> int:
        return int(self.overrides.get("seq_len") or self.default_seq_len())

    @property
    def training_tokens(self) -> int | None:
        """Tokens read over all epochs at the request's sequence length (``training_tokens_at``)."""
        return self.training_tokens_at(self.seq_len)

    def training_tokens_at(self, seq_len: int) -> int | None:
        """Tokens a run at ``seq_len`` reads over all epochs (padding aside), when the data size is known: each
        record cut to ``seq_len`` as the engine cuts it, or left out with ``overlong: drop``
        (``DatasetSummary.trained_tokens``), not its full length."""
        if self.dataset_summary is not None:
            return int(self.dataset_summary.trained_tokens(seq_len, self.overlong) * self.epochs)
        if self.dataset_tokens is None and self.max_steps:
            return int(self.max_steps) * self.effective_batch * seq_len
        if self.dataset_tokens is None:
            return None
        return int(self.dataset_tokens * self.epochs)


def _next_power_of_two(n: int) -> int:
    """The smallest power of two of at least ``MIN_SEQ_LEN`` that is ``n`` or more."""
    seq = MIN_SEQ_LEN
    while seq < n:
        seq *= 2
    return seq
