"""The training engine: the code that runs inside the trainer process a run's supervisor starts.

Entry point: ``python -m core.train.worker RUN_DIR [--resume CHECKPOINT]`` (one process per rank).
Nothing here is imported by the CLI at start-up; torch and transformers load in the trainer only.
"""

from __future__ import annotations
