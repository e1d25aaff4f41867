"""The plain fine-tuning recipe, as tutorials write it: the baseline of ``bench/engine_speed.py``.

transformers ``Trainer`` + peft LoRA (QLoRA: bitsandbytes NF4 + ``prepare_model_for_kbit_training``),
the model's own loss over materialised logits, ``DataCollatorForSeq2Seq`` padding to the batch's
longest, ``adamw_torch``, SDPA attention, bf16 on a GPU. Only two things are not tutorial code, so that
the comparison with tunedeck is fair: the data are tokenised by tunedeck's own tokeniser (the same
token ids and loss labels for both engines) and random weights come from the same seeded
initialisation (``materialize_random_weights``: the same base model). A callback records the wall time
and the non-padding tokens seen at each step; the result is one JSON file (``--out``)::

    python bench/plain_recipe.py --model-dir DIR --dataset data.jsonl --method lora --micro-batch 4 \\
        --seq-len 2048 --steps 12 --out plain.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_model(args: argparse.Namespace, cuda: bool) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.train.model_setup import has_weights, materialize_random_weights

    model_dir = Path(args.model_dir)
    dtype = torch.bfloat16 if cuda else torch.float32
    if args.method == "qlora":
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        source = model_dir if has_weights(model_dir) else materialize_random_weights(model_dir, args.seed, dtype)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=dtype)
        model = AutoModelForCausalLM.from_pretrained(str(source), quantization_config=quant, dtype=dtype,
                                                     device_map={"": 0 if cuda else "cpu"},
                                                     attn_implementation="sdpa")
        if args.qlora_upcast:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
        else:  # every base weight frozen, none cast: the residual stream stays bf16 (tunedeck's default)
            for param in model.parameters():
                param.requires_grad = False
    elif has_weights(model_dir):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
    else:
        config = AutoConfig.from_pretrained(str(model_dir))
        torch.manual_seed(args.seed)
        if cuda:
            torch.cuda.manual_seed_all(args.seed)
            with torch.device("cuda"):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    if args.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(args.seed)  # the adapters' draws from the seed alone, as tunedeck's load_model makes them
        model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=args.lora_dropout,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--method", choices=("lora", "qlora", "full"), default="lora")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-dropout", type=float, default=0.05)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-qlora-upcast", dest="qlora_upcast", action="store_false",
                        help="QLoRA without prepare_model_for_kbit_training's fp32 upcast of the non-4-bit weights")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback, TrainingArguments

    from core.train.data_adapter import load_records, tokenize_records
    from core.train.model_setup import load_tokenizer

    cuda = torch.cuda.is_available() and not args.cpu
    out: dict[str, Any] = {"engine": "plain", "method": args.method, "status": "failed"}
    tokenizer = load_tokenizer(Path(args.model_dir))
    examples = tokenize_records(load_records([args.dataset]), tokenizer, args.seq_len, "assistant").train
    model = build_model(args, cuda)
    steps: list[dict[str, Any]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, _args: Any, state: Any, _control: Any, **_kw: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            steps.append({"step": state.global_step, "t": time.perf_counter(),
                          "tokens": int(getattr(state, "num_input_tokens_seen", 0) or 0)})

        def on_log(self, _args: Any, state: Any, _control: Any, logs: Any = None, **_kw: Any) -> None:
            if logs and "loss" in logs and steps:
                steps[-1]["loss"] = float(logs["loss"])

    training_args = TrainingArguments(
        output_dir=str(Path(args.out).with_suffix(".trainer")),
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        optim="adamw_torch",
        bf16=cuda,
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        data_seed=args.seed,
        remove_unused_columns=False,
        include_num_input_tokens_seen="non_padding",
        use_cpu=not cuda,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=examples,
                      data_collator=DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100),
                      callbacks=[StepClock()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        trainer.train()
        out["status"] = "finished"
    except torch.OutOfMemoryError as exc:
        out.update(status="oom", reason=str(exc)[:300])
    out.update(
        wall_s=round(time.perf_counter() - started, 2),
        steps=steps,
        optimizer="adamw_torch",
        peak_allocated_gib=[round(torch.cuda.max_memory_allocated() / 2**30, 3)] if cuda else None,
        peak_reserved_gib=[round(torch.cuda.max_memory_reserved() / 2**30, 3)] if cuda else None,
    )
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["status"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
