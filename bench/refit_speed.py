"""The speed constants refitted as a whole: ``estimate_calibrate.py`` and ``matrix_terms_fit.py`` in turn, each
one's constants written into ``core/estimate/calibration.py`` before the other runs, until neither moves.

``matrix_terms_fit`` solves its four terms (the tiled MLP's cost per tile, mixed precision's fp32 cost, DoRA's
rescaling, the QLoRA upcast's fp32 outputs) against the estimate made with the fitted constants, and ``estimate_calibrate`` fits those constants
with the terms in the estimate: refitting one alone leaves the other solved against constants that are gone
(by session 27 DoRA's term was 165 B where a fresh solve gave 184). Writes both reports.

    python bench/refit_speed.py [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "core" / "estimate" / "calibration.py"
TERMS = ROOT / "bench" / "results" / "estimate_matrix" / "matrix-terms-fit.json"


def _set(pattern: str, value: str) -> None:
    """Replace the one match of ``pattern`` (its group 1 kept, the number after it replaced) in calibration.py."""
    text = CALIBRATION.read_text(encoding="utf-8")
    new, count = re.subn(pattern, lambda m: m.group(1) + value, text)
    if count != 1:
        raise SystemExit(f"{CALIBRATION}: {count} matches of {pattern!r}; expected one")
    CALIBRATION.write_text(new, encoding="utf-8")


def _by_method(function: str, values: dict[str, str]) -> None:
    """The ``return {...}`` dict of ``function`` in calibration.py, by method."""
    body = ", ".join(f'"{m}": {values[m]}' for m in ("full", "lora", "dora", "qlora"))
    _set(rf"(def {function}\(\) -> dict\[str, float\]:\n(?:    #.*\n)*    return )\{{[^}}]*\}}", "{" + body + "}")


def _run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    return done.stdout


def terms_round() -> dict[str, object]:
    _run("matrix_terms_fit.py")
    fitted = json.loads(TERMS.read_text(encoding="utf-8"))
    _by_method("_default_mlp_tile", {m: repr(v) for m, v in fitted["mlp_tile_s"].items()})
    _set(r"(dora_output_bytes_per_element: float = )[0-9.e-]+", repr(fitted["dora_output_bytes_per_element"]))
    _set(r"(fp32_model_s_per_element: float = )[0-9.e-]+", repr(fitted["fp32_model_s_per_element"]))
    _set(r"(qlora_upcast_bytes_per_element: float = )[0-9.e-]+", repr(fitted["qlora_upcast_bytes_per_element"]))
    return {k: fitted[k] for k in ("mlp_tile_s", "dora_output_bytes_per_element", "fp32_model_s_per_element",
                                   "qlora_upcast_bytes_per_element")}


def speed_round() -> dict[str, str]:
    out = _run("estimate_calibrate.py", "--write").split("# calibration.py values:")[1]
    values = dict(re.findall(r"^(\w+) = ([0-9.e-]+)$", out, re.M))
    _set(r"(HOPPER_LORA_EFFICIENCY = )[0-9.]+", values["eff_lora"])
    _set(r"(HIDDEN_HALF_EFFICIENCY = )[0-9.]+", values["hidden_half"])
    _set(r"(HOPPER_ATTENTION_EFFICIENCY = )[0-9.]+", values["attn"])
    _by_method("_default_dispatch", {m: values[f"disp_{m}"] for m in ("full", "lora", "dora", "qlora")})
    _set(r"(dispatch_recompute_passes: float = )[0-9.]+", values["disp_recompute"])
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    last = None
    for number in range(1, args.rounds + 1):
        now = (terms_round(), speed_round())
        print(f"round {number}: {now}", flush=True)
        if now == last:
            print("fixed point: nothing moved this round")
            return 0
        last = now
    print(f"still moving after {args.rounds} rounds", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
