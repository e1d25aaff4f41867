"""The machine-learning libraries' own chatter, kept off the after-training commands' stderr and the
server's log: their warnings and notes, never ours nor the user's, and never their errors."""

from __future__ import annotations

import logging
import re
import warnings

# The libraries a merge, chat, evaluation, export or server imports (directly or through another): their
# deprecation notes (torch.jit's, transformers' is_gradient_checkpointing …) are theirs to fix, not the user's.
NOISY_LIBRARIES = ("torch", "transformers", "peft", "accelerate", "deepspeed", "bitsandbytes", "huggingface_hub",
                   "safetensors", "tokenizers")
LIBRARY_MODULES = "(?:" + "|".join(re.escape(name) for name in NOISY_LIBRARIES) + r")(?:\.|$)"


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def quiet_libraries() -> None:
    """Keep the libraries' warnings and notes off stderr (their errors still show).

    Python warnings are ignored by the module they are raised in (one of ``NOISY_LIBRARIES``), so a warning of
    tunedeck's or of the user's own code still shows. Both chatty loggers speak while they are imported,
    after this runs: DeepSpeed's "Setting accelerator to CPU" (its ``create_logger`` sets the ``DeepSpeed``
    logger's level back to WARNING then, undoing a level set here, so a filter on the logger object does it)
    and bitsandbytes' CPU kernel notice (a module logger: with no handler Python's last-resort handler prints
    it to stderr; under the server's ``basicConfig`` it reached its log)."""
    warnings.filterwarnings("ignore", module=LIBRARY_MODULES)
    deepspeed = logging.getLogger("DeepSpeed")
    if _errors_only not in deepspeed.filters:
        deepspeed.addFilter(_errors_only)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
