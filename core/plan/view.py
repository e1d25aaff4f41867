"""What a recommendation says, in order: one list of lines that ``tunedeck plan`` prints as text and the
wizard draws with markup, so the two cannot tell a user different things.

Each line has a ``kind`` (what it is) and a ``tone`` (how a screen may colour it); the words come from
the catalogue. Renderers decide only the form: the CLI indents items with ``-``, the wizard draws the
memory line as its bar and joins speed and time on one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.i18n import t
from core.units import format_cost, format_rate


@dataclass(frozen=True)
class ViewLine:
    kind: str  # title | weights | infeasible | way_out | headline | memory | speed | eta | section | item | alternative
    text: str
    tone: str = ""  # "" | accent | warning | error; a speed: measured (by the probe) | scaled (by its ratio)
    section: str = ""  # for a section heading: reasons | problems | warnings | alternatives
    note: str = ""  # memory/speed: the error band or the not-measured note already in ``text``, on its own


def describe_plan(plan: dict[str, Any], cpu_only: bool = False) -> dict[str, Any]:
    """The fields ``plan.recommended`` / ``plan.alternative`` format (``gpus``: "2 GPUs", or "on the CPU";
    ``parallel``: ", ZeRO-2 offload optimizer", ", DDP" for several GPUs without ZeRO, nothing on one GPU
    without it or on the CPU, where "ZeRO-0 offload none" said nothing)."""
    from core.units import plural_key

    gpus = t("plan.on_cpu") if cpu_only else t(plural_key("plan.gpus", plan["num_gpus"]), count=plan["num_gpus"])
    if cpu_only or (plan["zero_stage"] == 0 and plan["offload"] == "none" and plan["num_gpus"] <= 1):
        parallel = ""
    elif plan["zero_stage"] == 0 and plan["offload"] == "none":
        parallel = t("plan.parallel_ddp")
    else:
        parallel = t("plan.parallel_zero", zero=plan["zero_stage"], offload=offload_words(plan["offload"]))
    return {
        "method": plan["method"], "precision": plan["precision"], "gpus": gpus, "parallel": parallel,
        "micro": plan["micro_batch_size"],
        "accum": plan["grad_accum_steps"], "seq": plan["seq_len"],
        "gc": t("plan.gc_on") if plan["gradient_checkpointing"] else t("plan.gc_off"),
        "rank": t("plan.rank_part", rank=plan["lora_rank"]) if plan.get("lora_rank") else "",
    }


def plain_number(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits as a plain number: ``58400``, ``2.5``, ``0.00123`` (never
    ``5.84e+04``, which a max_steps on small data made of its epochs)."""
    return f"{float(f'{value:.{digits}g}'):f}".rstrip("0").rstrip(".")


def epochs_words(epochs: float) -> str:
    """``3 epochs``, ``1 epoch``, ``1.5 epochs`` (a whole count without its ``.0``; a plain number, never ``1e+06``)."""
    from core.units import plural_key

    count = plain_number(epochs, 6)
    return t(plural_key("plan.epochs", 1 if count == "1" else 2), count=count)


def offload_words(offload: str) -> str:
    """An offload setting (none, optimizer, all) in the user's language."""
    return t(f"plan.offload_value.{offload}") if offload in ("none", "optimizer", "all") else offload


def format_hours(hours: float) -> str:
    """``12 min`` under an hour, ``3.4 h`` above, ``< 1 min`` under half a minute (it said "1 min" for any
    shorter plan). Words of a plan's precision, where ``tunedeck estimate`` reads its one plan like a clock."""
    if round(hours * 60.0) < 1:  # what "{minutes:.0f}" would write as "0 min" (exactly 30 s rounds to even)
        return t("plan.duration_under_a_minute")
    if hours < 1.0:
        return t("plan.duration_minutes", minutes=hours * 60.0)
    return t("plan.duration_hours", hours=hours)


def figure_notes(best: dict[str, Any]) -> tuple[str, str]:
    """What the memory and speed lines say of their footing: ``(memory note, speed note)``.

    Each figure has its own measured domain (``core.estimate.domain``: memory the calibration matrix's, speed
    the narrower one of the speed fit). Inside it the figure carries its error band: the *worst* |error|
    over the measured rows, not the median, because a user sizing a run needs what it can be off by (the
    JSON has both). Outside it the speed line says once, briefly, why it is not measured; the memory line
    says so only where the speed line does not (the speed domain holds the plan, the memory one not), and
    says nothing where both are outside (the speed line's reasons stand for both). A figure the probe
    measured on this box carries neither a band nor "not measured" (it is: ``probe_measured``), nor does a
    speed scaled by the probed plans' measured / estimated ratio (the box's own measure, the view's tone
    says which). A plan whose step waits on the CPU (a small model, few tokens a micro-step) carries that
    kind's wider band and says so: its speed is the box's CPU's more than its GPU's."""
    from core.estimate.calibration import MEASURED_GPU

    domain = best["domain"]
    memory_domain = domain["memory"]
    bands = domain["error_band"]

    def band(key: str) -> str:
        on_cpu = bands[key].get("waits_on") == "cpu"
        return t("plan.band_cpu" if on_cpu else "plan.band", worst=bands[key]["worst_pct"], rows=bands[key]["rows"],
                 gpu=MEASURED_GPU)

    def not_measured(key: str, gaps: list[dict[str, Any]]) -> str:
        return t(key, why=t("plan.domain.note_sep").join(gap["short"] for gap in gaps))

    speed_from_probe = bool((best.get("measured") or {}).get("tokens_per_s"))  # measured, or scaled by it
    if probe_measured(best, "peak_gib"):
        memory = ""
    elif memory_domain["inside"]:
        memory = band("peak_memory")
    elif domain["inside"] or speed_from_probe:  # else the speed line's reasons stand for both
        memory = not_measured("plan.domain.memory_note", memory_domain["outside"])
    else:
        memory = ""
    if speed_from_probe:
        return memory, ""
    if not domain["inside"]:
        return memory, not_measured("plan.domain.note", domain["outside"])
    return memory, t("plan.band_note", band=band("tokens_per_s"))


def probe_measured(best: dict[str, Any], figure: str) -> bool:
    """Whether the probe measured ``figure`` (``tokens_per_s``, ``peak_gib``) of this plan on this box: not a
    plan whose speed is only scaled by the probed plans' measured / estimated ratio."""
    measured = best.get("measured") or {}
    return bool(measured.get(figure)) and not measured.get("scaled")


def speed_tone(best: dict[str, Any]) -> str:
    """``measured``: the probe ran this plan; ``scaled``: its estimate scaled by the probed plans' ratio."""
    if probe_measured(best, "tokens_per_s"):
        return "measured"
    return "scaled" if (best.get("measured") or {}).get("scaled") else ""


def busy_words(hardware: Any, num_gpus: int) -> str:
    """``GPU 0: 80.2 GiB in use by other processes``: the busiest of the GPUs a plan of ``num_gpus`` takes on this
    box, when it holds more than an idle GPU does (``BUSY_FLOOR_GIB``); empty otherwise, and for a typed target."""
    busiest = hardware.held_by_others(num_gpus)
    if busiest is None:
        return ""
    return t("plan.in_use", index=busiest[0], used=busiest[1])


def recommendation_view(rec: Any) -> list[ViewLine]:
    """The recommendation as lines: headline, memory, speed and time, reasons, problems, warnings,
    alternatives; an infeasible one leads with why and the ways out."""
    request = rec.request
    hardware = request.hardware
    data = rec.to_json()
    best = data["recommendation"]
    lines = [ViewLine("title", t("plan.title", model=request.model, hardware=hardware.describe(),
                                 goal=t(f"plan.goal.{request.goal}"), considered=rec.considered))]
    if rec.best is not None:  # planned from a hub's config.json: the weights are not here, train fetches them
        from core.hub.config_cache import weights_not_here

        weights = weights_not_here(rec.best.plan.architecture.source)
        if weights:
            lines.append(ViewLine("weights", weights, "warning"))
    if not rec.feasible:
        lines.append(ViewLine("infeasible", t("plan.infeasible", model=request.model, hardware=hardware.describe()),
                              "error"))
        lines += [ViewLine("way_out", item["message"], "warning") for item in data["way_out"]]
    if best is None or best["plan"] is None:
        return lines
    lines.append(ViewLine("headline", t("plan.recommended" if rec.feasible else "plan.closest",
                                        **describe_plan(best["plan"], hardware.cpu_only))))
    # the memory line's verdict is the memory's: a plan refused for another reason (4 GPUs asked of 1, QLoRA
    # under ZeRO-3) read "3.2 of 79.6 GiB (does not fit)"; why it does not work is said under it
    verdict = t("plan.verdict_fits") if rec.best.estimate.fits else t("plan.verdict_does_not_fit")
    memory_note, speed_note = figure_notes(best)
    in_use = busy_words(hardware, rec.best.plan.num_gpus)
    if in_use:  # the memory the plan's GPUs hold for other processes now, beside its band
        memory_note = t("plan.verdict_band", verdict=memory_note, band=in_use) if memory_note else in_use
    # The figures themselves, not the JSON's (rounded to 2 places): 79.648 is 79.6 here as in the reasons,
    # where 79.65 would read 79.7.
    lines.append(ViewLine("memory", t("plan.memory_cpu" if hardware.cpu_only else "plan.memory",
                                      peak=rec.best.peak_gib, capacity=rec.best.estimate.capacity_gib,
                                      verdict=t("plan.verdict_band", verdict=verdict, band=memory_note)
                                      if memory_note else verdict), note=memory_note))
    # below 10 tokens/s with a decimal (a 72B's closest miss on a CPU read "0 tokens/s" beside a time of hours)
    speed = t("plan.speed", tps=format_rate(rec.best.tokens_per_s))
    lines.append(ViewLine("speed", t("plan.with_note", text=speed, note=speed_note) if speed_note else speed,
                          speed_tone(best), note=speed_note))
    if best["hours"] is not None:
        duration = format_hours(best["hours"])
        epochs = epochs_words(request.epochs) if request.max_steps is None else \
            t("plan.steps_at_most", steps=request.max_steps, seq_len=best["plan"]["seq_len"])
        # The cost itself, not the JSON's (rounded to the cent): a plan under a cent reads "< 0.01", not "0.00".
        cost = rec.best.cost(hardware.price_per_gpu_hour)
        lines.append(ViewLine("eta", t("plan.eta_cost", duration=duration, epochs=epochs, cost=format_cost(cost))
                              if cost is not None else t("plan.eta", duration=duration, epochs=epochs)))
    sections = (("reasons", "accent", data["reasons"]), ("problems", "error", best["problems"]),
                ("warnings", "warning", best["warnings"]))
    for name, tone, items in sections:
        if items or name == "reasons":
            lines.append(ViewLine("section", t(f"plan.{name}"), tone, name))
            lines += [ViewLine("item", item["message"]) for item in items]
    if data["alternatives"]:
        lines.append(ViewLine("section", t("plan.alternatives"), "accent", "alternatives"))
        pairs = zip(data["alternatives"], rec.alternatives, strict=True)
        for index, (alt, (candidate, _)) in enumerate(pairs, 1):
            lines.append(ViewLine("alternative", t("plan.alternative", index=index, peak=candidate.peak_gib,
                                                   tps=format_rate(candidate.tokens_per_s), trade=t("plan.trade_sep").join(alt["trade_off"]),
                                                   **describe_plan(alt["plan"], hardware.cpu_only))))
    return lines


def format_recommendation(rec: Any) -> str:
    """The text ``tunedeck plan`` prints."""
    out = []
    for line in recommendation_view(rec):
        if line.kind in ("way_out", "item"):
            out.append(f"  - {line.text}")
        elif line.kind == "alternative":
            out.append(f"  {line.text}")
        else:
            out.append(line.text)
    return "\n".join(out)
