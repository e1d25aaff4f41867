"""GPU check of the wizard's probe: plan on this box, probe the top plans, compare with the estimates.

Run on a GPU box (the lead's H200)::

    TUNEDECK_HOME=/tmp/probe-home .venv/bin/python bench/plan_probe.py --model PATH_TO_LOCAL_MODEL \
        --dataset core/data/samples/tiny_skills.jsonl --top 2 --steps 6

Writes ``bench/results/plan_probe.json``: per probed plan, the estimated and measured peak GiB and
tokens/s (measured tokens/s counts real tokens, the estimate padded ones), and the re-ranked best plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from core.hardware.monitor import open_monitor
    from core.plan import PlanRequest, recommend, summarise_dataset, target_from_snapshot
    from core.plan.planner import plan_key
    from core.plan.probe import probe_candidates

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dataset", default=str(ROOT / "core/data/samples/tiny_skills.jsonl"))
    parser.add_argument("--gpus", default=None, help="indices, e.g. 0 or 0,1")
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=str(ROOT / "bench/results/plan_probe.json"))
    args = parser.parse_args()

    monitor = open_monitor(interval_s=3600.0)
    indices = [int(i) for i in args.gpus.split(",")] if args.gpus else None
    target = target_from_snapshot(monitor.snapshot(), indices)
    summary = summarise_dataset(args.dataset, args.model)
    request = PlanRequest(args.model, target, dataset=args.dataset).with_dataset(summary)
    rec = recommend(request)
    measured = probe_candidates(rec, request, top=args.top, steps=args.steps,
                                progress=lambda text: print(text, file=sys.stderr))
    rows = []
    for candidate in [rec.best, *(c for c, _ in rec.alternatives)]:
        key = plan_key(candidate.plan)
        if key in measured:
            rows.append({"plan": candidate.estimate.plan, "estimated_peak_gib": round(candidate.peak_gib, 2),
                         "estimated_tokens_per_s": round(candidate.tokens_per_s, 1), "measured": measured[key]})
    again = recommend(request, measured=measured)
    result = {"hardware": target.to_json(), "model": args.model, "probed": rows,
              "best_before": rec.best.estimate.plan, "best_after": again.best.estimate.plan}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
