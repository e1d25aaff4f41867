"""bench/refit_speed.py writes the speed fit's and matrix_terms_fit's constants into core/estimate/calibration.py:
each of its patterns finds its one constant in the real file, writing the value it holds changes nothing, and a new
value lands where the estimator reads it."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _tool(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("refit_speed", ROOT / "bench" / "refit_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.CALIBRATION = tmp_path / "calibration.py"
    shutil.copy(ROOT / "core" / "estimate" / "calibration.py", module.CALIBRATION)
    return module


def _namespace(path: Path, monkeypatch) -> dict:
    """The rewritten copy, imported as a module of its own (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("calibration_copy", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "calibration_copy", module)
    spec.loader.exec_module(module)
    return vars(module)


def test_each_constant_is_found_once_and_rewritten_where_the_estimator_reads_it(tmp_path, monkeypatch):
    from core.estimate.calibration import (
        HIDDEN_HALF_EFFICIENCY,
        HOPPER_ATTENTION_EFFICIENCY,
        HOPPER_LORA_EFFICIENCY,
        Calibration,
    )

    tool = _tool(tmp_path)
    before = tool.CALIBRATION.read_text(encoding="utf-8")
    cal = Calibration()
    tool._set(r"(HOPPER_LORA_EFFICIENCY = )[0-9.]+", repr(HOPPER_LORA_EFFICIENCY))
    tool._set(r"(HIDDEN_HALF_EFFICIENCY = )[0-9.]+", repr(HIDDEN_HALF_EFFICIENCY))
    tool._set(r"(HOPPER_ATTENTION_EFFICIENCY = )[0-9.]+", repr(HOPPER_ATTENTION_EFFICIENCY))
    tool._by_method("_default_dispatch", {m: repr(v) for m, v in cal.dispatch_s_per_layer_pass.items()})
    tool._by_method("_default_mlp_tile", {m: repr(v) for m, v in cal.mlp_tile_s.items()})
    tool._set(r"(dispatch_recompute_passes: float = )[0-9.]+", repr(cal.dispatch_recompute_passes))
    tool._set(r"(dora_output_bytes_per_element: float = )[0-9.e-]+", repr(cal.dora_output_bytes_per_element))
    tool._set(r"(fp32_model_s_per_element: float = )[0-9.e-]+", repr(cal.fp32_model_s_per_element))
    assert tool.CALIBRATION.read_text(encoding="utf-8") == before  # the values it holds: nothing moves

    tool._by_method("_default_mlp_tile", {"full": "0.001", "lora": "0.002", "dora": "0.003", "qlora": "0.004"})
    tool._set(r"(HOPPER_ATTENTION_EFFICIENCY = )[0-9.]+", "0.5")
    changed = _namespace(tool.CALIBRATION, monkeypatch)
    assert changed["HOPPER_ATTENTION_EFFICIENCY"] == 0.5
    assert changed["Calibration"]().mlp_tile_s == {"full": 0.001, "lora": 0.002, "dora": 0.003, "qlora": 0.004}
    assert changed["Calibration"]().dispatch_s_per_layer_pass == cal.dispatch_s_per_layer_pass
