"""Training data: formats, loading, validation, tokenization, statistics, bundled samples.

Public interface::

    read_dataset(path, max_issues=50) -> LoadedDataset      # records + issues, never raises for bad rows
    load_records(path) -> list[Record]                     # raises DataError(issues)
    load_training_records(dataset, hub="modelscope", dataset_info=, dataset_dir=, split=, seed=) -> list[Record]
        # a run's dataset value: files, dirs, hub ids, dataset_info.json names, :split, #N (core.data.registry)
    tokenize_dataset(records, tokenizer, max_seq_len, loss_on="assistant") -> Tokenized
    check_data(path, tokenizer_or_model=None, max_seq_len=None) -> DataReport
    sample_dataset_path() -> Path                          # the bundled demo data (core/data/samples)

Records are ``Conversation`` (messages, system, tools; per-turn ``trainable``) or ``TextRecord`` (plain
text, with an untrained ``prompt`` for TRL prompt/completion). Preference, KTO and multimodal data are
refused by name (``core.data.formats.refusal_of_row``).
Heavy libraries (transformers, pyarrow, datasets) are imported only by the functions that need them.
"""

from __future__ import annotations

from core.data.issues import DataError, DataIssue
from core.data.loading import LoadedDataset, load_records, load_training_records, read_any, read_dataset
from core.data.records import Conversation, Message, Record, TextRecord, ToolCall
from core.data.samples import sample_dataset_path
from core.data.stats import DataReport, LengthStats, check_data, load_tokenizer
from core.data.tokenize import IGNORE_INDEX, Tokenized, tokenize_dataset

__all__ = [
    "IGNORE_INDEX",
    "Conversation",
    "DataError",
    "DataIssue",
    "DataReport",
    "LengthStats",
    "LoadedDataset",
    "Message",
    "Record",
    "TextRecord",
    "Tokenized",
    "ToolCall",
    "check_data",
    "load_records",
    "load_tokenizer",
    "load_training_records",
    "read_any",
    "read_dataset",
    "sample_dataset_path",
    "tokenize_dataset",
]
