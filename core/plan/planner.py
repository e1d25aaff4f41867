"""``recommend(request)``: weigh every candidate, rank by the goal, explain the choice, offer alternatives."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from core.estimate import TrainingPlan, plan_for_model
from core.i18n import t
from core.plan.candidates import Candidate, Finding, candidate_plans, estimate_plan, finding, hours_for
from core.plan.request import PlanRequest
from core.plan.rules import DISK_RULES, download_reason, judge
from core.plan.view import offload_words
from core.units import format_cost, format_magnitude, json_cost, json_hours, plural_key

MAX_ALTERNATIVES = 3
# Tokens a chunk of the fused loss where the GPU has room for their logits (``ce_chunk_tokens``): the LM head's
# input-gradient matmul no longer runs split-K (Liger's rule gives a 7B's 32,768-token micro-batch 1,024-token chunks:
# 114.1 ms of LM head and loss on an H100 against 105.7 at 8,192, and the wizard's 7B plan there, 16,384-token
# micro-batches in 512-token chunks, ran 1.2-1.4% faster; bench/results/lm-head/h100), for 2.3 GiB of bf16 logits
# at the peak where 1,024 tokens hold 0.3.
WIDE_CE_CHUNK = 8192
# Speeds within 2% of each other are "about as fast" (inside any estimate's error).
SAME_SPEED = 0.02


@dataclass
class Recommendation:
    """The planner's answer. ``best`` is None only when nothing could be estimated at all."""

    request: PlanRequest
    best: Candidate | None
    alternatives: list[tuple[Candidate, list[Finding]]] = field(default_factory=list)
    reasons: list[tuple[str, Finding]] = field(default_factory=list)
    way_out: list[Finding] = field(default_factory=list)
    considered: int = 0

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible

    def to_json(self) -> dict[str, Any]:
        price = self.request.hardware.price_per_gpu_hour
        gpu = self.request.hardware.gpu
        from core.hub.config_cache import source_json

        return {
            "model": self.request.model,
            # a hub's config.json kept here (the weights not downloaded yet) says so
            "model_source": None if self.best is None else source_json(self.best.plan.architecture.source),
            "dataset": self.request.dataset,
            "goal": self.request.goal,
            "epochs": self.request.epochs,
            "hardware": self.request.hardware.to_json(),
            "feasible": self.feasible,
            "considered": self.considered,
            "recommendation": None if self.best is None else candidate_json(self.best, price, gpu),
            "reasons": [{"field": name, "message": f.text()} for name, f in self.reasons],
            "alternatives": [{**candidate_json(c, price, gpu), "trade_off": [f.text() for f in trade]}
                             for c, trade in self.alternatives],
            "way_out": [f.to_json() for f in self.way_out],
            "overrides": dict(self.request.overrides),
            "overlong": self.request.overlong,
            "thinking": self.request.thinking,
            "data": None if self.best is None else data_json(self.request, self.best),
        }


def data_json(request: PlanRequest, best: Candidate) -> dict[str, Any] | None:
    """What the plan ``best`` trains of the measured data: the samples it keeps and leaves out at its seq_len
    (with ``overlong: drop`` a longer one counts nothing), the tokens one epoch reads, and the optimizer steps of
    an epoch at the plan's effective batch (the one asked for may differ: 3 GPUs, a pinned micro-batch). The
    whole data, eval split included. None: the data is not measured."""
    summary = request.dataset_summary
    if summary is None or not summary.measured:
        return None
    seq_len = best.plan.seq_len
    longer, no_answer = summary.cut_records(seq_len)
    drop = request.overlong == "drop"
    # cut: a cut that leaves a sample without its answer drops it too (``cut_records``)
    samples = summary.records - (longer if drop else no_answer)
    return {"samples": samples, "overlong_dropped": longer if drop else 0, "cut": 0 if drop else longer - no_answer,
            "no_answer_dropped": 0 if drop else no_answer,
            "tokens_per_epoch": summary.trained_tokens(seq_len, request.overlong),
            "steps_per_epoch": -(-samples // max(1, best.effective_batch))}


def candidate_json(candidate: Candidate, price: float | None, gpu: Any = None) -> dict[str, Any]:
    """One plan's figures; ``domain`` says whether the estimate is inside what was measured (and the error
    there), for ``gpu`` (None: the CPU)."""
    from core.estimate.domain import domain_json

    est = candidate.estimate
    cost = candidate.cost(price)
    return {
        "plan": est.plan if est else None,
        "feasible": candidate.feasible,
        "peak_gib": None if est is None else round(candidate.peak_gib, 2),
        "capacity_gib": None if est is None else round(est.capacity_gib, 2),
        "breakdown": None if est is None else {k: round(v, 3) for k, v in est.breakdown.items()},
        "cpu_ram_gib": None if est is None else round(est.cpu_ram_gib, 2),
        "tokens_per_s": round(candidate.tokens_per_s, 1),
        "effective_batch": candidate.effective_batch,
        "hours": json_hours(candidate.hours),
        "cost": json_cost(cost),
        "measured": candidate.measured,
        "problems": [f.to_json() for f in candidate.problems],
        "warnings": [f.to_json() for f in candidate.warnings],
        "domain": domain_json(candidate.plan, gpu, bool(est and est.waits_on_cpu)),
    }


# --- ranking ------------------------------------------------------------------------------------------
def short_of_free_memory(candidate: Candidate) -> bool:
    """Fits the card, not what other processes leave free on this box's GPUs now (``warn_busy_gpus``)."""
    return any(w.key == "plan.warn.busy_gpu" for w in candidate.warnings)


def rank_key(candidate: Candidate, goal: str) -> tuple[Any, ...]:
    """Smaller is better. A plan whose checkpoints would not fit on the disk, or that does not fit in the memory
    other processes leave on this box's GPUs now, comes after every plan that does (it stays as an alternative:
    the user may free space). Ties go to fewer GPUs, then less memory."""
    p = candidate.plan
    # short of the memory other processes leave on this box's GPUs now (out of memory at once), or of disk for
    # its checkpoints (later)
    disk_short = (short_of_free_memory(candidate), any(w.key in DISK_RULES for w in candidate.warnings))
    speed = -candidate.tokens_per_s
    tie = (p.num_gpus, candidate.peak_gib)
    if goal == "largest_batch":
        return (disk_short, -p.micro_batch_size, speed, *tie)
    if goal == "longest_context":
        return (disk_short, -p.seq_len, speed, *tie)
    if goal == "lowest_cost":
        gpu_seconds_per_token = p.num_gpus / max(candidate.tokens_per_s, 1e-9)
        return (disk_short, round(gpu_seconds_per_token, 12), speed, *tie)
    return (disk_short, speed, *tie)


def rank(candidates: list[Candidate], goal: str) -> list[Candidate]:
    return sorted(candidates, key=lambda c: rank_key(c, goal))


# --- evaluation ---------------------------------------------------------------------------------------
def evaluate(plan: TrainingPlan, request: PlanRequest, measured: dict[str, Any] | None = None) -> Candidate:
    """Estimate ``plan`` and judge it under every rule."""
    result, invalid = estimate_plan(plan, request)
    problems, warnings = judge(plan, result, request)
    if invalid is not None:
        problems.insert(0, invalid)
    hours = hours_for(result, request) if result is not None else None
    candidate = Candidate(plan, result, tuple(problems), tuple(warnings), hours, measured)
    tokens = request.training_tokens_at(plan.seq_len)
    if measured and measured.get("tokens_per_s") and tokens:
        candidate = replace(candidate, hours=tokens / float(measured["tokens_per_s"]) / 3600.0)
    return candidate


def base_plan(request: PlanRequest, fetch: bool = False) -> TrainingPlan:
    """The model's architecture in a default plan (raises ModelNotFoundError / ArchitectureError), from a
    config.json on this box or one read from a hub before (``core.hub.config_cache``); ``fetch`` reads a hub
    id's from the hub when there is none (``tunedeck plan``; never on the wizard's UI thread)."""
    from core.assets import resolve_model_name

    return plan_for_model(resolve_model_name(request.model), exact_count=False, hub_cache=True, fetch=fetch)


def evaluate_all(request: PlanRequest, base: TrainingPlan,
                 measured: dict[tuple[Any, ...], dict[str, Any]] | None = None) -> list[Candidate]:
    measured = measured or {}
    candidates = [evaluate(plan, request, measured.get(plan_key(plan))) for plan in candidate_plans(request, base)]
    scale = measured_speed_scale(candidates)
    if scale is None:
        return candidates
    # Plans not measured themselves take the box's measured/estimated speed ratio, so that measured and
    # estimated plans rank on the same footing (the estimator learns from the box).
    return [c if c.measured or c.estimate is None else
            evaluate(c.plan, request, {"tokens_per_s": c.estimate.tokens_per_s * scale, "scaled": round(scale, 4)})
            for c in candidates]


def measured_speed_scale(candidates: list[Candidate]) -> float | None:
    """Median of measured / estimated tokens/s over the measured candidates (None without any)."""
    import statistics

    ratios = [float(c.measured["tokens_per_s"]) / c.estimate.tokens_per_s for c in candidates
              if c.measured and c.measured.get("tokens_per_s") and not c.measured.get("scaled")
              and c.estimate is not None and c.estimate.tokens_per_s > 0]
    return statistics.median(ratios) if ratios else None


def plan_key(plan: TrainingPlan) -> tuple[Any, ...]:
    """What identifies a plan's configuration (for probe results)."""
    return (plan.method, plan.precision, plan.num_gpus, plan.zero_stage, plan.offload, plan.seq_len,
            plan.micro_batch_size, plan.gradient_checkpointing, plan.lora_rank if plan.uses_lora else None)


def recommend(request: PlanRequest, base: TrainingPlan | None = None,
              measured: dict[tuple[Any, ...], dict[str, Any]] | None = None) -> Recommendation:
    """The best plan for ``request`` with reasons, alternatives, and a way out when nothing fits."""
    base = base or base_plan(request)
    # the default sequence length stops at the positions the model takes (its rope scaling counted)
    request = request.with_positions(base.architecture.positions).with_download(base.architecture.source)
    candidates = evaluate_all(request, base, measured)
    feasible = rank([c for c in candidates if c.feasible], request.goal)
    rec = Recommendation(request, None, considered=len(candidates))
    if feasible:
        rec.best = widened_ce_chunk(feasible[0], request)
        rec.alternatives = alternatives(rec.best, feasible, request)
    else:
        estimated = [c for c in candidates if c.estimate is not None]
        if estimated:  # the closest miss, honestly marked as not fitting
            rec.best = min(estimated, key=lambda c: c.peak_gib)
        elif candidates:
            rec.best = candidates[0]
        rec.way_out = way_out(request, base)
    if rec.best is not None:
        summary = request.dataset_summary
        lost = summary.no_answer_left(request.dataset or summary.path, rec.best.plan.seq_len, request.max_positions,
                                      request.overlong) if summary is not None else None
        if lost is not None:  # as an empty dataset is refused: a run of it would only drop every record
            from core.plan.dataset import NothingToTrain

            raise NothingToTrain(lost)
        rec.reasons = reasons(rec.best, candidates, request)
    return rec


def widened_ce_chunk(best: Candidate, request: PlanRequest) -> Candidate:
    """``best`` with its fused loss's chunks widened to ``WIDE_CE_CHUNK`` tokens where the plan still fits (every
    rule, the memory margin included), else ``best`` as it is: on a GPU, under tunedeck's loss kernel, when its rule
    gives smaller chunks."""
    p = best.plan
    if request.hardware.cpu_only or not p.triton_ce or p.ce_chunk_tokens:
        return best
    if p.ce_chunk >= min(WIDE_CE_CHUNK, p.tokens_per_micro_batch):
        return best
    wide = evaluate(replace(p, ce_chunk_tokens=WIDE_CE_CHUNK), request, best.measured)
    return wide if wide.feasible else best


# --- alternatives -------------------------------------------------------------------------------------
def alternatives(best: Candidate, ranked: list[Candidate], request: PlanRequest) -> list[tuple[Candidate, list[Finding]]]:
    """The best candidate of each other kind of plan (method, GPUs, ZeRO, offload), with its trade-off."""
    seen = {best.shape()}
    out: list[tuple[Candidate, list[Finding]]] = []
    for candidate in ranked:
        if candidate.shape() in seen:
            continue
        seen.add(candidate.shape())
        # as it is planned once taken (its fields pinned, ``widened_ce_chunk`` applied to the plan that wins):
        # listed at 19.6 GiB, it was 19.8 when taken
        taken = widened_ce_chunk(candidate, request)
        out.append((taken, trade_off(taken, best, request)))
        if len(out) == MAX_ALTERNATIVES:
            break
    return out


def alternative_overrides(plan: TrainingPlan) -> dict[str, Any]:
    """The fields that pin ``plan``, an alternative, when it is taken (the wizard's 1-3): planned again with them,
    it is the plan listed (``alternatives`` lists each as it would be planned then)."""
    return {"method": plan.method, "num_gpus": plan.num_gpus, "zero_stage": plan.zero_stage,
            "offload": plan.offload, "micro_batch_size": plan.micro_batch_size,
            "gradient_checkpointing": plan.gradient_checkpointing}


def trade_off(other: Candidate, best: Candidate, request: PlanRequest) -> list[Finding]:
    """How ``other`` differs from ``best``: speed, memory, cost, and what the method change means."""
    out: list[Finding] = []
    if best.tokens_per_s > 0 and other.tokens_per_s > 0:
        ratio = other.tokens_per_s / best.tokens_per_s
        if abs(ratio - 1.0) < SAME_SPEED:  # "1.0x slower" said nothing
            out.append(finding("plan.trade.same_speed"))
        else:
            key = "plan.trade.faster" if ratio >= 1 else "plan.trade.slower"
            out.append(finding(key, ratio=round(ratio if ratio >= 1 else 1 / ratio, 2)))
    if other.plan.seq_len != best.plan.seq_len:
        out.append(finding("plan.trade.seq_len", seq=other.plan.seq_len, best=best.plan.seq_len))
    if other.estimate is not None and (other.plan.offload != "none" or other.plan.offloads_activations):
        ram = request.hardware.host_ram_gib
        need = round(other.estimate.cpu_ram_gib, 1)
        out.append(finding("plan.trade.host_ram_unknown", need=need) if ram is None else
                   finding("plan.trade.host_ram", need=need, ram=round(ram, 1)))
    delta = round(other.peak_gib - best.peak_gib, 1)
    memory_key = ("plan.trade.memory_same" if delta == 0 else
                  "plan.trade.memory_more" if delta > 0 else "plan.trade.memory_less")
    out.append(finding(memory_key + ("_cpu" if request.hardware.cpu_only else ""), gib=abs(delta)))
    price = request.hardware.price_per_gpu_hour
    cost_other, cost_best = other.cost(price), best.cost(price)
    # said only where the two read differently ("costs < 0.01 instead of < 0.01" told nothing)
    if cost_other is not None and cost_best is not None and format_cost(cost_other) != format_cost(cost_best):
        out.append(finding("plan.trade.cost", cost=format_cost(cost_other), best=format_cost(cost_best)))
    if other.plan.method != best.plan.method:
        out.append(finding(f"plan.trade.method_{other.plan.method}"))
    if other.plan.num_gpus != best.plan.num_gpus:
        out.append(finding(plural_key("plan.trade.gpus", other.plan.num_gpus), gpus=other.plan.num_gpus))
    return out


# --- reasons ------------------------------------------------------------------------------------------
def _lowest_peak(candidates: list[Candidate], **match: Any) -> Candidate | None:
    pool = [c for c in candidates if c.estimate is not None
            and all(getattr(c.plan, k) == v for k, v in match.items())]
    return min(pool, key=lambda c: c.peak_gib) if pool else None


def reasons(best: Candidate, candidates: list[Candidate], request: PlanRequest) -> list[tuple[str, Finding]]:
    """One line per choice of ``best``: method, precision, parallelism, batch, sequence, checkpointing,
    LoRA rank and GPU count, each saying why."""
    p = best.plan
    est = best.estimate
    capacity = est.capacity_gib if est else 0.0
    usable = (est.capacity_gib - est.margin_gib) if est else 0.0
    # on this box, with other processes' memory on its GPUs (as the memory line says it: ``busy_words``): what
    # they leave is the room the plan has, in every reason that sizes against it
    free = request.hardware.free_gib(p.num_gpus)
    room = request.hardware.usable_now_gib(p.num_gpus, est.margin_gib if est else 0.0)
    held = room is not None
    if room is not None and est:
        usable = min(usable, room)
    pinned = request.overrides

    def pinned_reason(name: str, value: Any) -> Finding:
        """A field the user set, or one that came with an alternative they took (``request.chosen``)."""
        key = "plan.reason.chosen" if name in request.chosen else "plan.reason.pinned"
        return finding(key, field=name, value=value)

    out: list[tuple[str, Finding]] = []

    if not best.feasible:
        problem = best.problems[0].text() if best.problems else "?"
        out.append(("method", finding("plan.reason.closest", method=p.method, problem=problem)))
    elif "method" in pinned:
        out.append(("method", pinned_reason("method", p.method)))
    else:
        lighter = {"full": ("lora",), "lora": ("full",), "qlora": ("lora", "full"), "dora": ()}
        missed = []
        offloaded: Candidate | None = None  # LoRA that fits only with its weights in host RAM (ZeRO-3 offload)
        for other in lighter.get(p.method, ()):
            low = _lowest_peak(candidates, method=other, num_gpus=p.num_gpus)
            if p.method == "qlora" and other == "lora" and low is not None and low.feasible and low.plan.offload != "none":
                # what QLoRA spares is the offload: the reason is LoRA's miss on the GPU, and the offloaded one's speed
                # (only where LoRA misses without it: "LoRA fits with ZeRO-0 offload none" was said of one that fits)
                low = _lowest_peak(candidates, method=other, num_gpus=p.num_gpus, offload="none")
                if low is not None and not low.feasible:  # the best-ranked LoRA for the goal (offloaded, all of them)
                    offloaded = next(c for c in rank([c for c in candidates if c.feasible], request.goal)
                                     if c.plan.method == other and c.plan.num_gpus == p.num_gpus)
            if low is not None and not low.feasible and low.estimate is not None:
                key = "plan.reason.method_missed_cpu" if request.hardware.cpu_only else "plan.reason.method_missed"
                missed.append((other, _missed(key, low, usable, method=other)))
        # the best plan of another method that fits too, when QLoRA or full fine-tuning ranks before it: why, in
        # the numbers the goal ranks by (they read "qlora: the best for this goal")
        runner = next((c for c in rank([c for c in candidates if c.feasible], request.goal)
                       if c.plan.method != p.method), None) if p.method in ("qlora", "full") else None
        # full fine-tuning's miss is no reason for QLoRA where LoRA fits: the comparison with LoRA is
        if p.method == "qlora" and missed and (missed[0][0] == "lora" or runner is None):
            detail = missed[0][1].text()
            if offloaded is not None:
                ratio = best.tokens_per_s / offloaded.tokens_per_s if offloaded.tokens_per_s > 0 else 0.0
                by_speed = request.goal in ("fastest", "lowest_cost") or \
                    rank_key(best, request.goal)[1] == rank_key(offloaded, request.goal)[1]
                words = {"detail": detail, "zero": offloaded.plan.zero_stage,
                         "offload": offload_words(offloaded.plan.offload)}
                # ranked on speed and faster: "N× slower"; else (it said "0.28× slower" of a longer sequence) what
                # the goal ranks first, against the LoRA plan it ranks best
                detail = t("plan.reason.method_qlora_offload", ratio=round(ratio, 2), **words) \
                    if by_speed and ratio >= 1 + SAME_SPEED else \
                    t("plan.reason.method_qlora_offload_won", won=_won_over(best, offloaded, request), **words)
            out.append(("method", finding("plan.reason.method_qlora", detail=detail)))
        elif p.method == "qlora" and runner is not None:
            detail = _won_over(best, runner, request)
            if missed:  # and full fine-tuning's miss, after it
                detail = t("plan.reason.method_qlora_and", won=detail, missed=missed[0][1].text())
            out.append(("method", finding("plan.reason.method_qlora", detail=detail)))
        elif p.method == "full" and runner is not None:
            key = "plan.reason.method_full_won" + ("_free" if held else "")
            out.append(("method", finding(key, peak=round(best.peak_gib, 1), capacity=round(capacity, 1),
                                          free=round(free or 0.0, 1), usable=round(usable, 1),
                                          detail=_won_over(best, runner, request))))
        elif p.method in ("lora", "full"):
            key = f"plan.reason.method_{p.method}" + ("_free" if held else "")
            out.append(("method", finding(key, peak=round(best.peak_gib, 1), capacity=round(capacity, 1),
                                          free=round(free or 0.0, 1), usable=round(usable, 1))))
        else:
            out.append(("method", finding("plan.reason.method_other", method=p.method)))

    gpu = request.hardware.gpu
    if gpu is None:
        out.append(("precision", finding("plan.reason.precision_cpu")))
    elif "precision" in pinned:
        out.append(("precision", pinned_reason("precision", p.precision)))
    elif p.precision == "bf16":
        out.append(("precision", finding("plan.reason.precision_bf16", gpu=gpu.name)))
    else:
        out.append(("precision", finding("plan.reason.precision_fp16", gpu=gpu.name)))

    if request.hardware.cpu_only:
        out.append(("zero", finding("plan.reason.single_cpu")))
    elif p.num_gpus == 1:
        if p.zero_stage == 0:
            out.append(("zero", finding("plan.reason.single_gpu")))
        elif p.offload == "none" and ("zero_stage" in pinned or "offload" in pinned):
            # ZeRO on one GPU without offload shards nothing and moves nothing: only asked for, never weighed
            name = "zero_stage" if "zero_stage" in pinned else "offload"
            out.append(("zero", pinned_reason(name, getattr(p, name))))
        else:
            out.append(("zero", finding("plan.reason.single_offload", zero=p.zero_stage, offload=offload_words(p.offload),
                                        ram=round(est.cpu_ram_gib if est else 0, 1))))
    elif p.zero_stage == 0:
        out.append(("zero", finding("plan.reason.ddp", gpus=p.num_gpus,
                                    weights=round(est.breakdown["weights"] if est else 0, 1))))
    else:
        ddp = _lowest_peak(candidates, method=p.method, num_gpus=p.num_gpus, zero_stage=0)
        if ddp is None and ("zero_stage" in pinned or "offload" in pinned):
            # DDP was not weighed (the stage or the offload is pinned): no "DDP would need ? GiB"
            name = "zero_stage" if "zero_stage" in pinned else "offload"
            out.append(("zero", pinned_reason(name, getattr(p, name))))
        else:
            ddp_peak = round(ddp.peak_gib, 1) if ddp else "?"
            out.append(("zero", finding("plan.reason.zero", zero=p.zero_stage, offload=offload_words(p.offload),
                                        ddp=ddp_peak, peak=round(best.peak_gib, 1))))

    batch_key = "plan.reason.batch_cpu" if request.hardware.cpu_only else plural_key("plan.reason.batch", p.num_gpus)
    out.append(("batch", finding(batch_key, micro=p.micro_batch_size, accum=p.grad_accum_steps,
                                 gpus=p.num_gpus, effective=best.effective_batch, target=request.effective_batch)))

    if "seq_len" in pinned:
        out.append(("seq_len", pinned_reason("seq_len", p.seq_len)))
    elif request.seq_len_capped() and p.seq_len == request.seq_len:  # the records past it are cut (said below)
        key = "plan.reason.seq_positions" if request.max_positions else "plan.reason.seq_positions_unknown"
        if request.overlong == "drop":  # left out, not cut: the warnings say how many
            key += "_drop"
        out.append(("seq_len", finding(key, seq=p.seq_len, p95=request.covered_tokens())))
    elif request.overlong == "drop" and request.covered_tokens() and p.seq_len == request.seq_len:
        out.append(("seq_len", finding("plan.reason.seq_data_drop", seq=p.seq_len, longest=request.covered_tokens())))
    elif request.dataset_p95_tokens and p.seq_len == request.seq_len:
        out.append(("seq_len", finding("plan.reason.seq_data", seq=p.seq_len, p95=request.dataset_p95_tokens)))
    elif p.seq_len > request.seq_len:
        out.append(("seq_len", finding("plan.reason.seq_longest", seq=p.seq_len)))
    else:
        out.append(("seq_len", finding("plan.reason.seq_default", seq=p.seq_len)))
    # what the sequence length does to the data: cut, or left out (with overlong: drop the warnings say it)
    if request.dataset_summary is not None and request.overlong != "drop":
        longer, dropped = request.dataset_summary.cut_records(p.seq_len)
        if longer:
            key = plural_key("plan.reason.seq_cut_dropped" if dropped else "plan.reason.seq_cut", longer)
            out.append(("seq_len", finding(key, count=longer, seq=p.seq_len, dropped=dropped,
                                           longest=request.dataset_summary.max_length)))
    if request.overlong == "drop":  # the run key set (``plan --set overlong=drop``, the wizard's d): the choice said
        out.append(("overlong", finding("plan.reason.overlong_drop")))

    twin = _lowest_peak(candidates, method=p.method, num_gpus=p.num_gpus, zero_stage=p.zero_stage,
                        offload=p.offload, micro_batch_size=p.micro_batch_size, seq_len=p.seq_len,
                        gradient_checkpointing=not p.gradient_checkpointing)
    if p.gradient_checkpointing and twin is not None and (not twin.feasible or short_of_free_memory(twin)):
        out.append(("checkpointing", _missed("plan.reason.gc_on", twin, usable)))
    elif p.gradient_checkpointing and "gradient_checkpointing" in pinned:
        # not chosen for a larger micro-batch: asked for (or taken with an alternative)
        out.append(("checkpointing", pinned_reason("gradient_checkpointing", t("plan.gc_on"))))
    elif p.gradient_checkpointing:
        out.append(("checkpointing", finding("plan.reason.gc_on_chosen")))
    else:
        out.append(("checkpointing", finding("plan.reason.gc_off")))
    if p.offloads_activations:
        out.append(("offload_activations", finding("plan.reason.offload_activations",
                                                   ram=round(est.cpu_ram_gib if est else 0, 1), seq=p.seq_len)))
    tiled = _tiled_mlp_reason(best, request, usable)
    if tiled is not None:
        out.append(("tiled_mlp", tiled))
    chunk = _ce_chunk_reason(best, request, usable)
    if chunk is not None:
        out.append(("ce_chunk_tokens", chunk))

    if p.uses_lora:
        trainable = est.trainable_params if est else 0
        out.append(("lora_rank", finding("plan.reason.lora_rank", rank=p.lora_rank,
                                         trainable=format_magnitude(trainable))))
        dropout = _dropout_cost(best, request)
        if dropout is not None:
            out.append(("lora_dropout", dropout))
    available = 1 if request.hardware.cpu_only else request.hardware.count
    gpus_key = "plan.reason.gpus_cpu" if request.hardware.cpu_only else plural_key("plan.reason.gpus", available)
    out.append(("gpus", finding(gpus_key, used=p.num_gpus, available=available)))
    download = download_reason(p, est, request)
    if download is not None:  # the disk the weights fill, the checkpoints' or another
        out.append(("download", download))
    return out


def _won_over(best: Candidate, other: Candidate, request: PlanRequest) -> str:
    """Why ``best`` ranks before ``other``, a plan of another method that fits too: the first thing the goal's
    ranking (``rank_key``) weighs where the two differ, with its numbers."""
    b, o = best.plan, other.plan
    name = o.method
    if rank_key(other, request.goal)[0] > rank_key(best, request.goal)[0]:  # short of free memory or of disk
        short = next(w for w in other.warnings if w.key == "plan.warn.busy_gpu" or w.key in DISK_RULES)
        return t("plan.reason.won_short", other=name, problem=short.text())
    if request.goal == "largest_batch" and b.micro_batch_size != o.micro_batch_size:
        return t("plan.reason.won_batch", micro=b.micro_batch_size, other=name, other_micro=o.micro_batch_size)
    if request.goal == "longest_context" and b.seq_len != o.seq_len:
        return t("plan.reason.won_seq", seq=b.seq_len, other=name, other_seq=o.seq_len)
    speeds = {"tps": best.tokens_per_s, "other_tps": other.tokens_per_s}
    if request.goal == "lowest_cost" and other.tokens_per_s > 0 and best.tokens_per_s > 0:
        ratio = (o.num_gpus / other.tokens_per_s) / (b.num_gpus / best.tokens_per_s)
        if ratio >= 1 + SAME_SPEED:
            return t("plan.reason.won_cost", ratio=round(ratio, 2), other=name, **speeds)
        if other.tokens_per_s > best.tokens_per_s * (1 + SAME_SPEED):  # slower on fewer GPUs: as cheap, not as fast
            return t(plural_key("plan.reason.won_cost_same", b.num_gpus), other=name, gpus=b.num_gpus,
                     other_gpus=o.num_gpus, **speeds)
    if other.tokens_per_s > 0 and best.tokens_per_s > other.tokens_per_s:
        ratio = best.tokens_per_s / other.tokens_per_s
        key = "plan.reason.won_speed" if ratio >= 1 + SAME_SPEED else "plan.reason.won_speed_close"
        return t(key, ratio=round(ratio, 2), other=name, **speeds)
    if b.num_gpus < o.num_gpus:
        return t(plural_key("plan.reason.won_gpus", b.num_gpus), other=name, gpus=b.num_gpus, other_gpus=o.num_gpus)
    key = "plan.reason.won_memory_cpu" if request.hardware.cpu_only else "plan.reason.won_memory"
    return t(key, other=name, peak=round(best.peak_gib, 1), other_peak=round(other.peak_gib, 1))


def _missed(key: str, other: Candidate, usable: float, **params: Any) -> Finding:
    """Why ``other`` (an infeasible candidate) was passed over, naming the limit it missed: the GPU's
    usable memory (``key``), else the host RAM its offload needs (``key + "_ram"``), else its first
    problem (``key + "_other"``)."""
    from core.plan.rules import HOST_RAM_USABLE_FRACTION

    est = other.estimate
    capacity = est.capacity_gib if est else 0.0
    if other.peak_gib > usable:
        return finding(key, **params, peak=round(other.peak_gib, 1), need=round(other.peak_gib, 1),
                       capacity=round(capacity, 1), usable=round(usable, 1))
    ram_problem = next((f for f in other.problems if f.key == "plan.rule.offload_ram"), None)
    if ram_problem is not None and est is not None:
        ram = dict(ram_problem.params)["ram"]
        return finding(key + "_ram", **params, need=round(est.cpu_ram_gib, 1),
                       usable=round(ram * HOST_RAM_USABLE_FRACTION, 1), ram=ram)
    problem = other.problems[0].text() if other.problems else "?"
    return finding(key + "_other", **params, problem=problem)


def _tiled_mlp_reason(best: Candidate, request: PlanRequest, usable: float) -> Finding | None:
    """Why the MLP runs in tiles, when it does (``tiled_mlp: auto`` tiles only where untiled does not fit):
    the untiled peak against the usable memory, and the speed the tiles cost by the estimate."""
    est = best.estimate
    if est is None or est.plan.get("mlp_tiles", 1) <= 1:
        return None
    untiled, _ = estimate_plan(replace(best.plan, tiled_mlp="false"), request)
    if untiled is None or untiled.tokens_per_s <= 0:
        return None
    cost = round(100 * max(0.0, 1.0 - est.tokens_per_s / untiled.tokens_per_s))
    return finding("plan.reason.tiled_mlp" if cost >= 1 else "plan.reason.tiled_mlp_free", tiles=est.plan["mlp_tiles"],
                   need=round(untiled.peak_gib, 1), usable=round(usable, 1), cost=cost)


def _ce_chunk_reason(best: Candidate, request: PlanRequest, usable: float) -> Finding | None:
    """Why the LM head takes wider chunks, when ``widened_ce_chunk`` gave it them: the peak against the rule's."""
    p = best.plan
    if best.estimate is None or not p.ce_chunk_tokens:
        return None
    plain = replace(p, ce_chunk_tokens=None)
    rule, _ = estimate_plan(plain, request)
    if rule is None:
        return None
    more = round(best.peak_gib - rule.peak_gib, 1)
    return finding("plan.reason.ce_chunk" if more > 0 else "plan.reason.ce_chunk_free", chunk=p.ce_chunk,
                   default=plain.ce_chunk, more=more, peak=round(best.peak_gib, 1), usable=round(usable, 1))


def _dropout_cost(best: Candidate, request: PlanRequest) -> Finding | None:
    """What LoRA dropout costs in speed on a GPU: peft draws a mask and copies every adapted linear's input
    (forward, backward and recompute), which the estimator counts as memory traffic; the fused kernels
    (``dropout_fused``) hash the masks inside lora_A's work instead; the same plan without dropout,
    estimated, gives the share. Nothing when the plan has none, on a CPU, or when it is under 1%."""
    p = best.plan
    if best.estimate is None or request.hardware.gpu is None or p.lora_dropout <= 0:
        return None
    without, _ = estimate_plan(replace(p, lora_dropout=0.0), request)
    if without is None or without.tokens_per_s <= 0:
        return None
    share = 1.0 - best.estimate.tokens_per_s / without.tokens_per_s
    if share < 0.01:
        return None
    return finding("plan.reason.lora_dropout_fused" if p.dropout_fused else "plan.reason.lora_dropout",
                   dropout=p.lora_dropout, pct=round(100 * share),
                   tps=without.tokens_per_s)


# --- a way out when nothing fits ---------------------------------------------------------------------


def _shorter_way_out(request: PlanRequest, seq: int, shorter: Candidate) -> Finding:
    """"Shorter sequences fit": under ``overlong: drop`` with the data measured, a shorter sequence leaves out every
    sample longer than it, whole: how many of the data's (``cut_records``, as the drop warning counts them), how many
    more than at the sequence asked for, and that ``overlong: cut`` keeps their first tokens instead."""
    summary = request.dataset_summary
    figures = {"seq": seq, "method": shorter.plan.method, "peak": round(shorter.peak_gib, 1)}
    cpu = "_cpu" if request.hardware.cpu_only else ""  # host RAM of one process, not a GPU's memory
    if request.overlong == "drop" and summary is not None and summary.measured:
        left_out = summary.cut_records(seq)[0]
        now = summary.cut_records(request.seq_len)[0]
        if left_out > now:
            return finding("plan.way_out.shorter_drop" + cpu, count=left_out, total=summary.records,
                           more=left_out - now, current=request.seq_len, **figures)
    return finding("plan.way_out.shorter" + cpu, **figures)
WAY_OUT_GPU_COUNTS = (2, 4, 8, 16, 32, 64)


def way_out(request: PlanRequest, base: TrainingPlan) -> list[Finding]:
    """The nearest changes that make the model fit: more GPUs, QLoRA, shorter sequences, offload. A method the
    user set (or took with an alternative) is kept in each: more GPUs, shorter sequences and offload are
    weighed with it, and QLoRA is said as a change of it (they read "2×H100 fits with qlora" and "full fine-tuning
    with ZeRO-3 offload" for ``method=lora``)."""
    out: list[Finding] = []
    hw = request.hardware
    kept = {k: v for k, v in request.overrides.items() if k in ("method", "lora_rank")}
    method = kept.get("method")
    free = {**kept, **{k: v for k, v in request.overrides.items() if k in ("seq_len",)}}
    available = 1 if hw.cpu_only else hw.count
    wanted = int(request.overrides.get("num_gpus") or 0)
    if wanted > available:
        # the pin is what does not fit, not the model: more GPUs, QLoRA or offload (with the pin dropped) said
        # "2×H100 fits" of a 7B that fits the one H100 there is
        return [finding("plan.way_out.pinned_gpus", wanted=wanted, available=available,
                        gpu=hw.gpu.name if hw.gpu is not None else "H200")]

    def first_feasible(req: PlanRequest) -> Candidate | None:
        found = rank([c for c in evaluate_all(req, base) if c.feasible], req.goal)
        return found[0] if found else None

    if hw.cpu_only:
        from core.estimate import find_gpu

        for count in (1, *WAY_OUT_GPU_COUNTS):
            gpu_box = replace(hw, gpu=find_gpu("H200"), count=count, gpu_indices=None, detected=False)
            hit = first_feasible(replace(request, hardware=gpu_box, overrides=free))
            if hit is not None:
                # not "more GPUs" (this box has none), nor a ZeRO stage for one GPU: "one H200 instead of the CPU"
                peak = round(hit.peak_gib, 1)
                out.append(finding("plan.way_out.gpu_instead", gpu="H200", method=hit.plan.method, peak=peak)
                           if count == 1 else
                           finding("plan.way_out.gpus_instead", count=count, gpu="H200", method=hit.plan.method,
                                   zero=hit.plan.zero_stage, peak=peak))
                break
    if not hw.cpu_only:
        for count in WAY_OUT_GPU_COUNTS:
            if count <= hw.count:
                continue
            bigger = replace(request, hardware=replace(hw, count=count, gpu_indices=None), overrides=free)
            hit = first_feasible(bigger)
            if hit is not None:
                out.append(finding("plan.way_out.more_gpus", count=count, gpu=hw.gpu.name, method=hit.plan.method,
                                   zero=hit.plan.zero_stage, peak=round(hit.peak_gib, 1)))
                break
        if method != "qlora":
            qlora = first_feasible(replace(request, overrides={**free, "method": "qlora"}))
            if qlora is not None:
                peak = round(qlora.peak_gib, 1)
                out.append(finding("plan.way_out.qlora", peak=peak) if method is None else
                           finding("plan.way_out.qlora_method", peak=peak, method=method))
    seq = request.seq_len
    while seq > 128:
        seq //= 2
        shorter = first_feasible(replace(request, overrides={**kept, "seq_len": seq}))
        if shorter is not None:
            out.append(_shorter_way_out(request, seq, shorter))
            break
    if not hw.cpu_only and method != "qlora":  # 4-bit layers are not sharded (``plan.rule.qlora_zero3``)
        offload_plan = replace(base, method=method or "full", precision="bf16" if hw.gpu.bf16 else "fp16",
                               num_gpus=max(1, hw.count), zero_stage=3, offload="all", seq_len=request.seq_len,
                               micro_batch_size=1, gradient_checkpointing=True,
                               lora_rank=int(kept.get("lora_rank") or base.lora_rank))
        result, _ = estimate_plan(offload_plan, request)
        if result is not None:
            ram = hw.host_ram_gib
            sizes = {"gpu_peak": round(result.peak_gib, 1), "ram": round(result.cpu_ram_gib, 1),
                     "have": "?" if ram is None else round(ram, 1)}
            out.append(finding("plan.way_out.offload", **sizes) if method in (None, "full") else
                       finding("plan.way_out.offload_method", method=method, **sizes))
    if not out:
        out.append(finding("plan.way_out.none"))
    return out
