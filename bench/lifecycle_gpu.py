"""GPU proof of the after-training path: merge, logits check, evaluate and serve a random-initialised 7B
LoRA run, through the real CLI (``tunedeck train / merge / evaluate / serve``).

Steps, each timed: train a short LoRA run (Qwen2.5-7B config, random weights, tiny tokenizer — see
``bench/engine_gpu.py``), ``tunedeck merge`` it, compare the merged model's logits with base + adapter on
the GPU, ``tunedeck evaluate`` it, ``tunedeck serve`` it (our transformers server unless vLLM/LMDeploy is
installed), send one plain and one streaming chat completion (time to first token, pieces/s), and stop
the server. Results: ``--out X.md`` and ``X.json`` (rewritten after every step, so a timeout keeps what
was measured).

Each step is checked, not only timed; a failed check marks the step NO with its numbers and the script
exits 1: the merged logits must equal base + adapter within the rounding of the merge (measured: the
same adapter merged in fp32, then rounded to the merged dtype; see ``logits_check``), and the served
replies must report >= 1 completion token, the same usage streamed and not, and the prompt length,
token count and finish reason that ``generate`` gives on the same weights (``check_serve``).

One H200::

    python bench/lifecycle_gpu.py --out bench/results/lifecycle-7b.md --model 7b

CPU smoke test of this script (minutes): ``python bench/lifecycle_gpu.py --out /tmp/lc.md --model tiny``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import engine_gpu  # noqa: E402  (the same model/data helpers as the engine benchmark)
from results_files import write_results  # noqa: E402  (bench/ is not a package)


def log(text: str) -> None:
    print(f"[lifecycle_gpu {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def timed(results: dict[str, Any], name: str, fn: Any, check: Any = None) -> Any:
    """Run one step; it is "ok" only when it raised nothing and ``check(value)`` found no problem."""
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        results["steps"][name] = {"ok": False, "seconds": round(time.monotonic() - started, 2), "error": str(exc)}
        raise
    problems = list(check(value)) if check is not None else []
    results["steps"][name] = {"ok": not problems, "seconds": round(time.monotonic() - started, 2)}
    if problems:
        results["steps"][name]["failed_checks"] = problems
        log(f"{name} FAILED: " + "; ".join(problems))
    return value


def _logits(model: Any, ids: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def weight_error_in_ulps(merged: Any, exact: Any, base: Any) -> dict[str, Any]:
    """How far each merged weight is from the exact (fp32) merge, in units in the last place (ulp) of the
    merged dtype at max(|exact|, |base|).

    A merge stored in bf16 rounds twice at most: the update Δ = exact - base (peft may round it to bf16
    before adding it: half an ulp of Δ, and |Δ| <= |exact| + |base|, so at most one ulp of the larger) and
    the sum (half an ulp of exact). A right merge is within 1.5 ulp; a lost adapter is off by Δ itself.
    """
    import torch

    exact_params = dict(exact.named_parameters())
    base_params = dict(base.named_parameters())
    worst, worst_name, compared = 0.0, None, 0
    for name, param in merged.named_parameters():
        reference, before = exact_params.get(name), base_params.get(name)
        if reference is None or before is None or reference.shape != param.shape or before.shape != param.shape:
            continue
        reference = reference.detach().float()
        scale = torch.maximum(reference.abs(), before.detach().float().abs())
        ulp = torch.ldexp(torch.tensor(torch.finfo(param.dtype).eps, device=reference.device),
                          torch.frexp(scale).exponent - 1).clamp_min(torch.finfo(param.dtype).tiny)
        ratio = float(((param.detach().float() - reference).abs() / ulp).max())
        if ratio > worst:
            worst, worst_name = ratio, name
        compared += 1
    return {"weights_max_ulp": worst, "weights_worst": worst_name, "weights_compared": compared}


def logits_check(home: Path, run_id: str, merged_dir: Path) -> dict[str, Any]:
    """Merged model against base + adapter, with the rounding a merge in the merged dtype must cost.

    ``a``: base + adapter, unmerged, as the run trained (base in the run's dtype). ``b``: the merged folder
    that ``tunedeck merge`` wrote. The reference: the same base upcast to fp32 with the adapter merged in
    fp32 (``exact``), and that exact merge rounded to the merged folder's dtype (``rounded``).

    Logits: |b - a| <= |b - rounded| + |rounded - exact| + |exact - a|. The middle term is the measured
    rounding of the merge; |b - rounded| comes from weights at most one unit apart, so it is bounded by
    the rounding again; |exact - a| is measured. Tolerance: 2 x rounding + unmerged-vs-exact (+ 1e-5 of
    the logits' scale for fp32). Weights: every merged weight within 2 units in the last place of the exact
    merge (1.5 is the bound: ``weight_error_in_ulps``), which catches a lost adapter even where the
    logits' rounding is as large as the adapter's effect.
    """
    os.environ["TUNEDECK_HOME"] = str(home)
    import torch
    from peft import PeftModel

    from core.lifecycle.source import load_base_model, load_finetuned, load_model_dir, resolve_model_source
    from core.runs.run_dir import RunDirectory

    device = "cuda" if torch.cuda.is_available() else "cpu"
    source = resolve_model_source(RunDirectory(home / "runs" / run_id))
    tuned = load_finetuned(source, device)
    vocab = int(getattr(tuned.model.config, "vocab_size", 1000) or 1000)
    ids = torch.randint(3, min(900, vocab - 1), (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    a = _logits(tuned.model, ids)
    with tuned.model.disable_adapter():
        base = _logits(tuned.model, ids)
    del tuned

    def free() -> None:
        if device == "cuda":
            torch.cuda.empty_cache()

    free()
    exact_model = PeftModel.from_pretrained(load_base_model(source, device).float(), str(source.checkpoint))
    exact_model = exact_model.float().merge_and_unload()
    exact = _logits(exact_model, ids)
    merged = load_model_dir(merged_dir, device)
    merged_dtype = next(merged.model.parameters()).dtype
    b = _logits(merged.model, ids)
    base_model = load_base_model(source, device)
    weights = weight_error_in_ulps(merged.model, exact_model, base_model)
    del merged, base_model
    free()
    rounded = _logits(exact_model.to(merged_dtype), ids)
    del exact_model
    free()
    rounding = float((rounded - exact).abs().max())
    unmerged_vs_exact = float((a - exact).abs().max())
    scale = float(a.abs().max())
    tolerance = 2.0 * rounding + unmerged_vs_exact + 1e-5 * max(1.0, scale)
    return {"max_abs_diff": float((a - b).abs().max()), "mean_abs_diff": float((a - b).abs().mean()),
            "merge_rounding_max": rounding, "unmerged_vs_exact_max": unmerged_vs_exact,
            "tolerance": tolerance, "max_abs_logit": scale,
            "adapter_effect_max": float((a - base).abs().max()),
            "merged_vs_base_max": float((b - base).abs().max()),
            **weights, "dtype": str(merged_dtype), "device": device}


MAX_WEIGHT_ULPS = 2.0  # the bound is 1.5 (weight_error_in_ulps)


def check_logits(numbers: dict[str, Any]) -> list[str]:
    """The problems of a merge, with their numbers (empty when the merge is right)."""
    problems = []
    if not numbers["adapter_effect_max"] > 0:
        problems.append(f"the adapter changes no logit (effect {numbers['adapter_effect_max']:.3g}): "
                        "it was not trained or not loaded")
    if not numbers["max_abs_diff"] <= numbers["tolerance"]:
        problems.append(
            f"merged logits differ from base + adapter by {numbers['max_abs_diff']:.4g}, more than the "
            f"{numbers['dtype']} rounding of the merge allows ({numbers['tolerance']:.4g} = 2 x rounding "
            f"{numbers['merge_rounding_max']:.4g} + unmerged vs exact {numbers['unmerged_vs_exact_max']:.4g}); "
            f"the adapter's own effect is {numbers['adapter_effect_max']:.4g}")
    if numbers.get("weights_compared") and not numbers["weights_max_ulp"] <= MAX_WEIGHT_ULPS:
        problems.append(
            f"merged weight {numbers['weights_worst']} is {numbers['weights_max_ulp']:.3g} units in the last "
            f"place of {numbers['dtype']} away from the exact (fp32) merge; a right merge is within "
            f"{MAX_WEIGHT_ULPS:g}")
    return problems


def expected_reply(home: Path, run_id: str, prompt: str, max_tokens: int, merged_dir: Path | None) -> dict[str, Any]:
    """What the served model must answer, greedy: prompt length and generated ids from plain ``generate``.

    ``merged_dir``: a vLLM/LMDeploy server serves the merged folder, so the reference is that folder."""
    os.environ["TUNEDECK_HOME"] = str(home)
    import torch

    from core.lifecycle.source import load_finetuned, load_model_dir, resolve_model_source
    from core.runs.run_dir import RunDirectory

    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = (load_model_dir(merged_dir, device) if merged_dir is not None
              else load_finetuned(resolve_model_source(RunDirectory(home / "runs" / run_id)), device))
    tokenizer = loaded.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"].to(device)
    with torch.no_grad():
        out = loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                    do_sample=False, temperature=None, top_p=None, top_k=None,
                                    pad_token_id=tokenizer.pad_token_id)
    generated = [int(v) for v in out[0, ids.shape[-1]:].tolist()]
    eos = loaded.model.generation_config.eos_token_id
    ends = set(eos if isinstance(eos, list) else [eos] if eos is not None else []) | {tokenizer.eos_token_id}
    del loaded
    if device == "cuda":
        torch.cuda.empty_cache()
    hit_eos = bool(generated) and generated[-1] in ends
    return {"prompt_tokens": int(ids.shape[-1]), "completion_tokens": len(generated),
            "finish_reason": "length" if len(generated) >= max_tokens and not hit_eos else "stop"}


PROMPT = "Hello there"
MAX_TOKENS = 128


def chat_requests(url: str, model: str, api_key: str | None = None) -> dict[str, Any]:
    """One plain and one streaming completion (greedy, usage asked for in the stream); their numbers."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
            "temperature": 0}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(), headers=headers)
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.loads(response.read())
    plain_s = time.monotonic() - started
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(streamed).encode(), headers=headers)
    started = time.monotonic()
    first = None
    pieces = 0
    stream_usage = None
    stream_finish = None
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                stream_usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                stream_finish = choice.get("finish_reason") or stream_finish
                if choice.get("delta", {}).get("content"):
                    pieces += 1
                    if first is None:
                        first = time.monotonic() - started
    stream_s = time.monotonic() - started
    usage = reply.get("usage") or {}
    completion = int(usage.get("completion_tokens") or 0)
    return {"plain_seconds": round(plain_s, 3), "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": completion, "finish_reason": reply["choices"][0].get("finish_reason"),
            "reply_chars": len(reply["choices"][0]["message"].get("content") or ""),
            "plain_tokens_per_s": round(completion / plain_s, 1) if plain_s > 0 else None,
            "stream_seconds": round(stream_s, 3), "time_to_first_piece_s": round(first or 0.0, 3),
            "stream_pieces": pieces, "stream_pieces_per_s": round(pieces / stream_s, 1),
            "stream_usage": stream_usage, "stream_finish_reason": stream_finish}


def check_serve(numbers: dict[str, Any], expected: dict[str, Any] | None) -> list[str]:
    """The problems of the served replies: no tokens, a usage that is not the generated ids' count."""
    problems = []
    if numbers["completion_tokens"] < 1:
        problems.append(f"the plain reply reports {numbers['completion_tokens']} completion tokens "
                        f"after {numbers['plain_seconds']} s")
    stream_usage = numbers.get("stream_usage") or {}
    if int(stream_usage.get("completion_tokens") or 0) < 1:
        problems.append(f"the streamed reply reports usage {stream_usage or 'none'}")
    elif stream_usage.get("completion_tokens") != numbers["completion_tokens"]:
        problems.append(f"greedy replies disagree: {numbers['completion_tokens']} tokens plain, "
                        f"{stream_usage.get('completion_tokens')} streamed")
    if numbers["finish_reason"] != numbers.get("stream_finish_reason"):
        problems.append(f"finish_reason {numbers['finish_reason']} plain, {numbers.get('stream_finish_reason')} "
                        "streamed")
    if expected is not None:
        for key in ("prompt_tokens", "completion_tokens", "finish_reason"):
            if numbers.get(key) != expected[key]:
                problems.append(f"{key} is {numbers.get(key)}, but generate() on the same weights gives "
                                f"{expected[key]}")
    return problems


def render(results: dict[str, Any]) -> str:
    lines = [f"# Lifecycle on {results.get('gpu') or 'CPU'} — model {results['model']}", "",
             "| step | ok | seconds | detail |", "|---|---|---|---|"]
    for name, step in results["steps"].items():
        detail = step.get("error") or "; ".join(step.get("failed_checks") or []) or json.dumps(
            {k: v for k, v in step.items() if k not in ("ok", "seconds", "failed_checks")})
        lines.append(f"| {name} | {'yes' if step['ok'] else 'NO'} | {step['seconds']} | {detail} |")
    for key in ("logits", "serve", "evaluate"):
        if key in results:
            lines += ["", f"## {key}", "", "```json", json.dumps(results[key], indent=2), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="7b", choices=["7b", "0.5b", "tiny"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--home", default=None)
    args = parser.parse_args()
    out_md = Path(args.out)
    home = Path(args.home or tempfile.mkdtemp(prefix="tunedeck-lifecycle-"))
    results: dict[str, Any] = {"model": args.model, "home": str(home), "steps": {}}
    try:
        import torch

        results["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        results["gpu"] = None

    def save() -> None:
        write_results(out_md, results, render(results))

    try:
        model_dir = engine_gpu.make_model_dir(home, args.model)
        data = engine_gpu.make_dataset(home, records=200)
        cuda = results["gpu"] is not None
        values = {"model": str(model_dir), "dataset": str(data), "method": "lora", "lora_rank": 16,
                  "precision": "bf16" if cuda else "fp32", "max_seq_len": args.seq_len, "packing": True,
                  "micro_batch_size": 4 if cuda else 2, "gradient_accumulation": 1, "max_steps": args.steps,
                  "save_steps": args.steps, "logging_steps": 1, "learning_rate": 2e-4,
                  "gradient_checkpointing": args.model == "7b", "seed": 11}
        yaml_path = engine_gpu.write_run_yaml(home / "run.yaml", values)
        run_id = timed(results, "train_start", lambda: engine_gpu.tunedeck(home, "train", str(yaml_path)).stdout.strip())
        from core.runs.liveness import effective_status
        from core.runs.run_dir import RunDirectory

        run = RunDirectory(home / "runs" / run_id)
        timed(results, "train_wait", lambda: engine_gpu.wait_for(run, lambda: not effective_status(run).active, 560))
        if run.status().status != "finished":
            raise RuntimeError(f"training ended {run.status()}: {run.log_path.read_text()[-2000:]}")
        save()
        merged = timed(results, "merge", lambda: json.loads(
            engine_gpu.tunedeck(home, "merge", run_id, "--json").stdout))
        results["steps"]["merge"].update(bytes=merged["bytes"], out=merged["out"])
        save()
        results["logits"] = timed(results, "logits_check", lambda: logits_check(home, run_id, Path(merged["out"])),
                                  check_logits)
        save()
        evaluated = timed(results, "evaluate", lambda: json.loads(
            engine_gpu.tunedeck(home, "evaluate", run_id, "--json").stdout))
        results["evaluate"] = {k: evaluated[k] for k in ("split", "examples", "tuned", "base", "seconds")}
        save()
        state = timed(results, "serve_start", lambda: json.loads(
            engine_gpu.tunedeck(home, "serve", run_id, "--json").stdout))
        results["steps"]["serve_start"].update(url=state["url"], backend=state["backend"])
        save()
        try:
            served = timed(results, "serve_requests", lambda: chat_requests(state["url"], run_id))
        finally:
            timed(results, "serve_stop", lambda: engine_gpu.tunedeck(home, "serve", "--stop", run_id))
        merged_dir = Path(merged["out"]) if state["backend"] != "transformers" else None
        expected = timed(results, "serve_reference",
                         lambda: expected_reply(home, run_id, PROMPT, MAX_TOKENS, merged_dir))
        results["serve"] = {**served, "expected": expected}
        problems = check_serve(served, expected)
        if problems:  # the requests' step is judged once the reference is known
            results["steps"]["serve_requests"].update(ok=False, failed_checks=problems)
            log("serve_requests FAILED: " + "; ".join(problems))
        save()
    except Exception as exc:
        results["error"] = str(exc)
        save()
        log(f"failed: {exc}")
        return 1
    failed = [name for name, step in results["steps"].items() if not step["ok"]]
    results["failed_steps"] = failed
    save()
    if failed:
        log(f"checks failed in {', '.join(failed)}: {out_md}")
        return 1
    log(f"done: {out_md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
