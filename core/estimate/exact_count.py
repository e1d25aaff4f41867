"""Exact parameter counts: build the model from its config on PyTorch's meta device.

The meta device allocates no memory and runs no initialisation, so even a 72B model is built in well
under a second once transformers is imported. It needs torch and transformers; callers fall back to
the analytic count of ``core.estimate.architecture`` when they are not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def exact_counting_available() -> bool:
    """True when torch and transformers can be imported."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def count_parameters_exact(config: Mapping[str, Any]) -> int:
    """Number of distinct parameters of ``AutoModelForCausalLM.from_config(config)``.

    Tied weights are counted once, as ``model.parameters()`` yields a shared tensor once.
    Raises ``ImportError`` without torch/transformers and ``ValueError`` for an unknown model_type.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config)
    model_type = values.pop("model_type", None)
    if not model_type:
        raise ValueError("config has no model_type")
    hf_config = AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(parameter.numel() for parameter in model.parameters())
