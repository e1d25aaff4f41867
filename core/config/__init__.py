"""Run configuration: one YAML file per run, checked before anything starts.

Public interface::

    load_run_config(path, overrides=(), gpu_caps=None) -> RunConfig   # raises ConfigError
    RunConfig(...).to_dict() / RunConfig.from_dict(d) / .save(path)
    validate(config, gpu_caps=None) -> list[ConfigIssue]               # errors and warnings
    default_demo_config() -> RunConfig
    ConfigIssue(file, line, key, message, severity), ConfigError(errors)

The keys are documented in ``core/config/schema.py`` and ``core/config/REFERENCE.md``.
"""

from __future__ import annotations

from core.config.checks import validate
from core.config.demo import default_demo_config
from core.config.issues import ConfigError, ConfigIssue
from core.config.loader import load_run_config, parse_override
from core.config.schema import KEY_SPECS, RunConfig

__all__ = [
    "KEY_SPECS",
    "ConfigError",
    "ConfigIssue",
    "RunConfig",
    "default_demo_config",
    "load_run_config",
    "parse_override",
    "validate",
]
