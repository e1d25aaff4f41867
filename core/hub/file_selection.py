"""Which files of a repository to fetch: one weight format, or what ``--include`` patterns name."""

from __future__ import annotations

from fnmatch import fnmatch

from core.hub.records import RepoFile

SAFETENSORS = (".safetensors",)
# Other weight formats: skipped when safetensors exist (transformers loads those first anyway).
OTHER_WEIGHTS = (".bin", ".pth", ".pt", ".gguf", ".onnx", ".h5", ".msgpack", ".ckpt", ".ot")
# Skipped even without safetensors: formats transformers training does not load.
NEVER_FOR_TRAINING = (".gguf", ".onnx", ".h5", ".msgpack", ".ot")


def select_files(files: tuple[RepoFile, ...] | list[RepoFile],
                 include: list[str] | None = None) -> tuple[list[RepoFile], list[RepoFile]]:
    """(chosen, skipped). With ``include`` patterns (fnmatch, on the path or the file name) exactly
    those; otherwise everything but the duplicate weight formats."""
    chosen: list[RepoFile] = []
    skipped: list[RepoFile] = []
    if include:
        for item in files:
            name = item.path.rsplit("/", 1)[-1]
            (chosen if any(fnmatch(item.path, p) or fnmatch(name, p) for p in include) else skipped).append(item)
        return chosen, skipped
    lower = [(item, item.path.lower()) for item in files]
    has_safetensors = any(path.endswith(SAFETENSORS) for _, path in lower)
    drop = OTHER_WEIGHTS if has_safetensors else NEVER_FOR_TRAINING
    for item, path in lower:
        (skipped if path.endswith(drop) else chosen).append(item)
    return chosen, skipped
