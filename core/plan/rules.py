"""Known traps as rules: each returns findings with the reason, so the planner never hides why.

A *problem* rules a candidate out (it would fail or not fit); a *warning* is kept beside it.
"""

from __future__ import annotations

from typing import Any

from core.estimate import Estimate, TrainingPlan
from core.plan.candidates import Finding, finding
from core.plan.request import PlanRequest

GIB = 1024**3
# Host RAM a run may take for offloaded states before the box starts swapping.
HOST_RAM_USABLE_FRACTION = 0.9
# Bytes per parameter in a checkpoint: weights (bf16, 2) + AdamW moments (fp32, 8) + fp32 master (4)
# for full fine-tuning; adapters in fp32 (4) + moments (8) for LoRA methods.
CHECKPOINT_BYTES_FULL = 14
CHECKPOINT_BYTES_ADAPTER = 12
FINAL_BYTES_FULL = 2
SAVE_TOTAL_LIMIT = 2  # the run config's default


def checkpoint_disk_gib(plan: TrainingPlan, result: Estimate) -> float:
    """Disk for the kept checkpoints and the final output of ``plan`` (run config defaults)."""
    if plan.uses_lora:
        per_checkpoint = result.trainable_params * CHECKPOINT_BYTES_ADAPTER
        final = result.trainable_params * 4
    else:
        per_checkpoint = result.total_params * CHECKPOINT_BYTES_FULL
        final = result.total_params * FINAL_BYTES_FULL
    return (per_checkpoint * SAVE_TOTAL_LIMIT + final) / GIB


def rule_qlora_zero3(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    if plan.method == "qlora" and plan.zero_stage == 3:
        return [finding("plan.rule.qlora_zero3")]
    return []


def rule_precision(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    gpu = request.hardware.gpu
    if gpu is None:
        if plan.precision != "fp32":
            return [finding("plan.rule.cpu_precision", precision=plan.precision)]
        return []
    if not gpu.bf16 and plan.precision in ("bf16", "pure-bf16"):
        return [finding("plan.rule.no_bf16", gpu=gpu.name, precision=plan.precision)]
    return []


def rule_cpu_methods(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    if request.hardware.cpu_only and (plan.method == "qlora" or plan.zero_stage > 0):
        return [finding("plan.rule.cpu_only", method=plan.method, zero=plan.zero_stage)]
    return []


def rule_gpu_count(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    available = request.hardware.count if not request.hardware.cpu_only else 1
    if plan.num_gpus > available:
        return [finding("plan.rule.too_many_gpus", wanted=plan.num_gpus, available=available)]
    return []


def rule_memory(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    if result is None or result.fits:
        return []
    key = "plan.rule.memory_cpu" if request.hardware.cpu_only else "plan.rule.memory"  # host RAM, one process
    return [finding(key, peak=round(result.peak_gib, 1), capacity=round(result.capacity_gib, 1),
                    usable=round(result.capacity_gib - result.margin_gib, 1))]


def _uses_host_ram(plan: TrainingPlan) -> bool:
    """DeepSpeed's offload, or checkpointed block inputs parked in host memory."""
    return plan.offload != "none" or plan.offloads_activations


def rule_offload_ram(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    ram = request.hardware.host_ram_gib
    if result is None or not _uses_host_ram(plan) or ram is None:
        return []  # unknown RAM (planned hardware): warn_offload_ram_unknown says what is needed
    if result.cpu_ram_gib > ram * HOST_RAM_USABLE_FRACTION:
        return [finding("plan.rule.offload_ram", need=round(result.cpu_ram_gib, 1), ram=round(ram, 1))]
    return []


def _download_words(request: PlanRequest) -> dict[str, Any]:
    """The model's download (``request.download``) as the disk findings name it: model, size, hub, the folder it
    fills and the variable that moves it."""
    from core.hardware.host import cache_variable, download_caches
    from core.hub.download import human_bytes
    from core.hub.problems import HUB_NAMES

    download = request.download
    assert download is not None
    disk = request.hardware.cache_disk(download.hub)
    path = disk.path if disk is not None else str(dict(download_caches()).get(download.hub, "?"))
    return {"model": download.model_id, "size": human_bytes(download.size_bytes),
            "hub": HUB_NAMES.get(download.hub, download.hub), "path": path, "variable": cache_variable(download.hub)}


def _download_on_data_disk(request: PlanRequest) -> bool:
    """The model's download fills the data root's disk, where the checkpoints go (no cache on another disk)."""
    return request.download is not None and request.hardware.cache_disk(request.download.hub) is None


def rule_disk(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    """The checkpoints go under the data root (its runs); the model's download goes to its hub's cache, on the same
    disk unless the box says the cache is on another (``HardwareTarget.cache_disks``): on the same one, both count."""
    free = request.hardware.disk_free_gib
    if result is None or free is None:
        return []
    need = checkpoint_disk_gib(plan, result)
    if _download_on_data_disk(request):
        assert request.download is not None
        weights = request.download.size_bytes / GIB
        if need + weights > free:
            return [finding("plan.rule.disk_download", need=round(need, 1), weights=round(weights, 1),
                            total=round(need + weights, 1), free=round(free, 1), keep=SAVE_TOTAL_LIMIT,
                            **_download_words(request))]
        return []
    if need > free:
        return [finding("plan.rule.disk", need=round(need, 1), free=round(free, 1), keep=SAVE_TOTAL_LIMIT)]
    return []


def warn_download_disk(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    """The model's download does not fit its hub cache's disk, another than the data root's: the download would be
    refused there (``core.hub.download.check_disk``: with its spare), whatever the data root has free."""
    from core.hub.download import DISK_SLACK_BYTES, human_bytes

    download = request.download
    disk = request.hardware.cache_disk(download.hub) if download is not None else None
    if download is None or disk is None or disk.free_bytes is None:
        return []
    if download.size_bytes + DISK_SLACK_BYTES <= disk.free_bytes:
        return []
    return [finding("plan.warn.download_disk", free=human_bytes(disk.free_bytes), slack=human_bytes(DISK_SLACK_BYTES),
                    **_download_words(request))]


def download_reason(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> Finding | None:
    """Where the model's download goes, for the plan's reasons: its hub cache's disk, the checkpoints' or another
    (with what is free there); None with nothing to download or where the disks are not known (a typed target)."""
    download = request.download
    if download is None:
        return None
    from core.hub.download import human_bytes

    disk = request.hardware.cache_disk(download.hub)
    if disk is not None:
        return finding("plan.reason.download_other_disk", free=human_bytes(disk.free_bytes),
                       **_download_words(request))
    free = request.hardware.disk_free_gib
    if free is None or result is None:
        return None
    return finding("plan.reason.download_data_disk", need=round(checkpoint_disk_gib(plan, result), 1),
                   free=round(free, 1), **_download_words(request))


def warn_offload_ram_unknown(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    if result is not None and _uses_host_ram(plan) and request.hardware.host_ram_gib is None:
        return [finding("plan.warn.offload_ram_unknown", need=round(result.cpu_ram_gib, 1))]
    return []


def warn_launcher(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    if plan.num_gpus > 1:
        launcher = "deepspeed" if plan.zero_stage else "torchrun"
        return [finding("plan.warn.launcher", gpus=plan.num_gpus, launcher=launcher)]
    return []


def warn_ddp_replicas(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    if plan.num_gpus > 1 and plan.zero_stage == 0 and result is not None:
        return [finding("plan.warn.ddp_replicas", gpus=plan.num_gpus, weights=round(result.breakdown["weights"], 1))]
    return []


def warn_fp16(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    gpu = request.hardware.gpu
    if gpu is not None and plan.precision == "fp16":
        # pinned by the user on a GPU that has bf16, or forced by a GPU without it
        return [finding("plan.warn.fp16_pinned" if gpu.bf16 else "plan.warn.fp16", gpu=gpu.name)]
    return []


def warn_truncation(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    p95 = request.dataset_p95_tokens
    if request.overlong == "drop" and request.dataset_summary is not None:  # not cut: left out (warn_overlong_drop)
        return []
    if p95 and plan.seq_len < p95:
        return [finding("plan.warn.truncation", seq=plan.seq_len, p95=p95)]
    return []


def warn_overlong_drop(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    """With ``overlong: drop`` every sample longer than the sequence is left out of training, whole: said with
    the count (as ``data check --overlong drop`` says it) and the sequence length that keeps them all, from
    one sample on (a dropped sample trains nothing; the plan's tokens, time and cost leave it out)."""
    summary = request.dataset_summary
    if request.overlong != "drop":
        return []
    if summary is None or not summary.measured:
        # hub data, not downloaded to plan: nothing counted, and silence read as "none left out"
        return [finding("plan.warn.overlong_drop_unknown", seq=plan.seq_len)] if request.dataset else []
    longer, _ = summary.cut_records(plan.seq_len)
    if not longer:
        return []
    said = {"count": longer, "total": summary.records, "seq": plan.seq_len}
    # the length that keeps them all is no advice past the positions the model takes (its max_position_embeddings,
    # rope scaling counted): said with those, and how many samples no such length keeps
    positions = getattr(plan.architecture, "positions", None) or request.max_positions
    if positions and summary.max_length > positions:
        past = summary.cut_records(positions)[0]
        if past >= longer:
            return [finding("plan.warn.overlong_drop_past_positions", positions=positions, **said)]
        return [finding("plan.warn.overlong_drop_positions", positions=positions, past=past, **said)]
    return [finding("plan.warn.overlong_drop", need=summary.max_length, **said)]


def warn_past_positions(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    return past_positions(plan)


def past_positions(plan: TrainingPlan) -> list[Finding]:
    """A sequence longer than the model was trained on: training extends its context (RoPE positions past
    the trained ones), which the longest-context goal may choose; say so (``tunedeck estimate`` too, of the plan
    it is given: it reads the plan alone)."""
    positions = getattr(plan.architecture, "positions", None)
    if positions and plan.seq_len > positions:
        return [finding("plan.warn.past_positions", seq=plan.seq_len, positions=positions)]
    return []


def warn_busy_gpus(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> list[Finding]:
    """This box's GPUs hold memory of other processes now: a plan that fits the card but not what they leave
    (its peak and the margin) would run out of memory until they end. Such a plan ranks after every plan that
    fits now (``rank_key``); a typed target is the whole card."""
    hw = request.hardware
    if result is None or not hw.detected:
        return []
    busiest, free = hw.busy(plan.num_gpus), hw.free_gib(plan.num_gpus)
    if busiest is None or free is None or result.peak_gib + result.margin_gib <= free:
        return []
    return [finding("plan.warn.busy_gpu", index=busiest[0], free=round(free, 1),
                    capacity=round(result.capacity_gib, 1), used=round(busiest[1], 1), peak=round(result.peak_gib, 1))]


PROBLEM_RULES = (rule_qlora_zero3, rule_precision, rule_cpu_methods, rule_gpu_count, rule_memory,
                 rule_offload_ram)
# The findings of a plan short of disk for its checkpoints (and the download on their disk): ranked after the others
DISK_RULES = ("plan.rule.disk", "plan.rule.disk_download")
WARNING_RULES = (rule_disk, warn_download_disk, warn_offload_ram_unknown, warn_launcher, warn_ddp_replicas, warn_fp16, warn_truncation,
                 warn_overlong_drop, warn_past_positions, warn_busy_gpus)


def judge(plan: TrainingPlan, result: Estimate | None, request: PlanRequest) -> tuple[list[Finding], list[Finding]]:
    """(problems, warnings) of ``plan`` under every rule."""
    problems = [f for rule in PROBLEM_RULES for f in rule(plan, result, request)]
    warnings = [f for rule in WARNING_RULES for f in rule(plan, result, request)]
    return problems, warnings
