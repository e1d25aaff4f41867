"""Starting a saved plan as a detached run: the same checks and launch path as ``tunedeck train``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def launch_config_file(path: str | Path, overrides: list[str] | None = None) -> Any:
    """Validate the run YAML at ``path``, start its supervisor and return the ``RunDirectory``.

    Goes through ``core.runs.commands``' own steps (config, model, data checks, GPU resolution,
    supervisor start), so a wizard launch and ``tunedeck train path`` behave the same. Raises
    ``core.cli.CliError`` with the message ``tunedeck train`` would print.
    """
    from core.cli import CliError, cannot_write_message
    from core.config import ConfigError, load_run_config
    from core.runs import commands as train
    from core.runs.disk_space import is_unwritable

    overrides = list(overrides or [])
    try:
        config = load_run_config(str(path), overrides, gpu_caps=train._gpu_caps())
    except ConfigError as exc:
        raise CliError(str(exc), 2) from exc
    train._absolute_local_paths(config, Path(path).resolve().parent)
    train._check_model(config)
    train._check_data(config)
    try:  # the disk-space check is in _launch_config; a disk that cannot be written is a CliError too
        run = train._launch_config(config, ["tunedeck", "train", str(path), *overrides], "train")
        train._start(run)
    except OSError as exc:
        if not is_unwritable(exc):
            raise
        raise CliError(cannot_write_message(exc), 1) from exc
    return run
