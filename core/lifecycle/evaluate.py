"""Evaluate a finished run: loss and perplexity, fine-tuned vs base, and fixed prompts before/after.

The held-out split is rebuilt exactly as the trainer made it (same records, tokenisation, fraction and
seed). A run without one is measured on a seeded sample of its training data, and the result says so
(``"split": "train_sample"``). Data changed since the run last trained on it is named (``data_changed``,
the files): the split rebuilt from it is not the one the run held out. Results go to ``RUN_DIR/eval/eval-<step>-<time>.json`` and ``latest.json``.
Benchmarks (EvalScope or lm-eval) are optional and run detached, like training.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from core.i18n import Message
from core.lifecycle.source import LifecycleError, LoadedModel
from core.runs.run_dir import RunDirectory, utc_now_iso

FIXED_PROMPTS = (
    "Introduce yourself in one sentence.",
    "What is 17 + 25?",
    "Give me three tips for writing clear code.",
)
TRAIN_SAMPLE_SIZE = 64
PROMPT_MAX_TOKENS = 48


def eval_dir(run: RunDirectory) -> Path:
    from core.paths import ensure_private_dir

    return ensure_private_dir(run.path / "eval")


def writable_eval_dir(run: RunDirectory) -> Path:
    """``eval_dir``, made and written to once (a file created and removed): a run folder that cannot take
    the result (read-only, another user's) is the ``OSError`` naming it, which the CLI and the app say in
    one line. Found only when the result was saved, it came after the whole evaluation, which was lost."""
    import tempfile

    directory = run.path / "eval"
    try:
        directory = eval_dir(run)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(directory)) from None
    return directory


def run_records(run: RunDirectory) -> list[Any]:
    """Every record of the run's datasets, checked (``DataError`` naming the file and line of each problem)."""
    from core.train.data_adapter import load_records

    cfg = run.config()
    datasets = cfg.get("dataset")
    return load_records([datasets] if isinstance(datasets, str) else list(datasets or []),
                        str(cfg.get("hub", "modelscope")), cfg)


def evaluation_examples(run: RunDirectory, tokenizer: Any, records: list[Any] | None = None
                        ) -> tuple[str, list[dict[str, list[int]]]]:
    """("held_out" | "train_sample", examples with input_ids/labels) as the trainer split them;
    ``records``: the run's, read already (``run_records``)."""
    from core.train.data_adapter import split_eval, tokenize_records

    cfg = run.config()
    records = run_records(run) if records is None else records
    examples = tokenize_records(records, tokenizer, int(cfg.get("max_seq_len", 2048)),
                                str(cfg.get("loss_on", "assistant")), str(cfg.get("overlong", "cut")),
                                cfg.get("thinking"))
    seed = int(cfg.get("seed", 42))
    examples = split_eval(examples, float(cfg.get("eval_split", 0.0) or 0.0), seed)
    if examples.eval:
        return "held_out", examples.eval
    rows = list(examples.train)
    random.Random(seed).shuffle(rows)
    return "train_sample", rows[:TRAIN_SAMPLE_SIZE]


def mean_loss(loaded: LoadedModel, examples: list[dict[str, list[int]]], variant: str) -> dict[str, Any]:
    """Token-weighted cross-entropy over the examples' labelled tokens, and its perplexity."""
    import torch

    from core.lifecycle.chat import _adapter_context

    total, tokens = 0.0, 0
    with torch.no_grad(), _adapter_context(loaded, variant):
        for example in examples:
            ids = torch.tensor([example["input_ids"]], device=loaded.device)
            labels = torch.tensor([example["labels"]], device=loaded.device)
            logits = loaded.model(input_ids=ids).logits[:, :-1, :].float()
            target = labels[:, 1:]
            n = int((target != -100).sum())
            if n == 0:
                continue
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                     ignore_index=-100, reduction="sum")
            total += float(loss)
            tokens += n
    mean = total / tokens if tokens else float("nan")
    return {"loss": mean, "perplexity": math.exp(min(mean, 50.0)) if tokens else float("nan"), "tokens": tokens}


def _fixed_prompts(records: list[Any]) -> list[str]:
    """The standard prompts plus the first user turn of the first record (the task the run learned)."""
    prompts = list(FIXED_PROMPTS)
    try:
        messages = getattr(records[0], "messages", None) or []
        first_user = next((m for m in messages if getattr(m, "role", None) == "user"), None)
        if first_user is not None:
            prompts.insert(0, str(getattr(first_user, "content", "")))
    except Exception:  # the prompts are a courtesy; the loss is the measurement
        pass
    return prompts


def data_changed_since_training(run: RunDirectory) -> list[str]:
    """The dataset files that changed (or came, or went) since the run last started or resumed, by its
    ``fingerprint.json``: the split rebuilt from them is not the one the run held out, and may hold records
    it trained on. Empty when nothing changed, or when the run recorded no fingerprint."""
    from core.runs.fingerprint import compare_fingerprint

    report = compare_fingerprint(run.path, run.config())
    return [str(data["path"]) for kind, data in report.events if kind == "data_changed"]


def evaluation_summary(result: dict[str, Any]) -> str:
    """The one line the CLI and the TUI say about an evaluation: the checkpoint, the tuned figures, and the base's when
    there is one (a full fine-tune has no adapter to switch off, so ``result["base"]`` is None); and, when
    the data changed since training, that the split is not the run's own."""
    from core.i18n import t

    split = t("lifecycle.eval_split_held_out" if result["split"] == "held_out"
              else "lifecycle.eval_split_train_sample")
    tuned, base = result["tuned"], result.get("base")
    # The checkpoint measured is said: on a run still training, or stopped mid-way, it is the newest sound one
    # at the time, which only the saved file's name told.
    if not base:
        line = t("lifecycle.evaluated_no_base", step=result["step"], split=split, loss=tuned["loss"],
                 ppl=tuned["perplexity"], tokens=tuned["tokens"], path=result["path"])
    else:
        line = t("lifecycle.evaluated", step=result["step"], split=split, loss=tuned["loss"], ppl=tuned["perplexity"],
                 tokens=tuned["tokens"], base_loss=base["loss"], base_ppl=base["perplexity"], path=result["path"])
    changed = result.get("data_changed") or []
    if changed:
        line += "\n" + t("lifecycle.eval_data_changed", files=", ".join(changed))
    return line


def no_examples_message(run: RunDirectory, model: str) -> Message:
    """Why there is nothing to evaluate on (every record of the run's data was left out once tokenized: longer
    than max_seq_len with ``overlong: drop``, or nothing of the assistant's to score), with the ``data check``
    that shows what each record becomes. It was an English-only line that said neither."""
    cfg = run.config()
    datasets = cfg.get("dataset")
    dataset = datasets if isinstance(datasets, str) else ",".join(str(d) for d in datasets or [])
    return Message("lifecycle.eval_no_examples", run=run.id, dataset=dataset, model=model,
                   max_seq_len=int(cfg.get("max_seq_len", 2048)), overlong=str(cfg.get("overlong", "cut")))


def evaluate_run(run: RunDirectory, checkpoint: int | None = None, prompts: list[str] | None = None,
                 device: str | None = None) -> dict[str, Any]:
    """Measure the run's result (fine-tuned vs base) and save it; returns what was saved (+ ``path``).

    ``base`` (the loss with the adapter switched off, and each prompt's base answer) is None when the
    model has no adapter: a full fine-tune's base is not at hand, and its own figures are no base."""
    from core.atomic_file import write_json_atomic
    from core.lifecycle.chat import GenerationSettings, complete_chat
    from core.lifecycle.source import held, load_finetuned, load_source_tokenizer, resolve_model_source

    started = time.monotonic()
    source = resolve_model_source(run, checkpoint)
    directory = writable_eval_dir(run)  # before minutes of loading and generating, not after them
    # The data is read, checked and tokenized before the model loads: a bad line is said in seconds, not
    # after minutes of loading.
    records = run_records(run)
    # The checkpoint held from its tokenizer to its weights: a live run's rotation removed it while the data
    # was tokenized (or torch imported), and the evaluation failed on a checkpoint "no longer there".
    with held(run, source, checkpoint) as source:
        tokenizer = load_source_tokenizer(source)
        split, examples = evaluation_examples(run, tokenizer, records)
        changed = data_changed_since_training(run)
        if not examples:  # every record left out once tokenized (overlong: drop, no assistant turn): in words
            raise LifecycleError(no_examples_message(run, source.base_model))
        loaded = load_finetuned(source, device, tokenizer=tokenizer)
    tuned = mean_loss(loaded, examples, "tuned")
    base = mean_loss(loaded, examples, "base") if loaded.has_adapter else None
    greedy = GenerationSettings(temperature=0.0, max_tokens=PROMPT_MAX_TOKENS)
    answers = []
    for prompt in prompts if prompts is not None else _fixed_prompts(records):
        messages = [{"role": "user", "content": prompt}]
        answers.append({
            "prompt": prompt,
            "base": complete_chat(loaded, messages, greedy, "base")[0] if loaded.has_adapter else None,
            "tuned": complete_chat(loaded, messages, greedy, "tuned")[0],
        })
    result = {
        "schema": 1, "time": utc_now_iso(), "run_id": run.id, "checkpoint": str(source.checkpoint),
        "step": source.step, "split": split, "data_changed": changed, "examples": len(examples), "tuned": tuned,
        "base": base, "prompts": answers, "seconds": round(time.monotonic() - started, 3),
    }
    path = _new_result_path(directory, f"eval-{source.step}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        write_json_atomic(path, result)
    except BaseException:
        path.unlink(missing_ok=True)  # the name claimed, empty: no result file that reads as a broken one
        raise
    write_json_atomic(directory / "latest.json", result)
    run.record_event("evaluated", path=str(path), split=split, loss=tuned["loss"])
    return {**result, "path": str(path)}


def _new_result_path(directory: Path, stem: str) -> Path:
    """``directory/stem.json``, or ``stem-2.json``, ``-3`` … where taken: claimed (created empty, O_EXCL) so that
    two evaluations of one checkpoint ending in the same second (the app's and the CLI's) keep both results; the
    second replaced the first."""
    for number in range(1, 1000):
        path = directory / (f"{stem}.json" if number == 1 else f"{stem}-{number}.json")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            continue
        return path
    return directory / f"{stem}-{os.getpid()}.json"


def benchmark_tool() -> str | None:
    """``evalscope`` or ``lm_eval`` when installed, else None."""
    for name in ("evalscope", "lm_eval"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def start_benchmarks(run: RunDirectory, names: list[str], checkpoint: int | None = None) -> dict[str, Any]:
    """Launch EvalScope / lm-eval on the merged model, detached; progress goes to ``eval/bench.log``."""
    from core.i18n import t
    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import OutputExists

    tool = benchmark_tool()
    if tool is None:
        raise LifecycleError(t("lifecycle.no_benchmark_tool"))
    # The run's merge of this very checkpoint, merged again unless whole and newer than it: any folder of
    # that name was taken as it was, so a checkpoint-N saved again since (a resume that went back) was
    # benchmarked through the merge of the checkpoint-N it replaced. Another earlier merge in the way is
    # replaced (only tunedeck's own results are); a folder of the user's there is refused, never benchmarked.
    # ``checkpoint`` as asked (None: the newest, chosen by the merge): the step chosen here and passed on was
    # "asked for", and a live run's rotation of it in the merge's seconds ended the benchmarks on a
    # checkpoint "no longer there" the user never named.
    try:
        merged = merge_run(run, checkpoint, reuse=True)
    except OutputExists:
        merged = merge_run(run, checkpoint, force=True)
    model_dir = merged.out
    out = eval_dir(run) / f"bench-{merged.step}"
    if tool == "evalscope":
        cmd = [sys.executable, "-m", "evalscope.cli.cli", "eval", "--model", str(model_dir),
               "--datasets", *names, "--work-dir", str(out)]
    else:
        cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model_dir}",
               "--tasks", ",".join(names), "--output_path", str(out)]
    log_path = eval_dir(run) / "bench.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    run.record_event("benchmark_started", tool=tool, benchmarks=names, pid=proc.pid, log=str(log_path))
    return {"tool": tool, "benchmarks": names, "pid": proc.pid, "log": str(log_path), "out": str(out)}
