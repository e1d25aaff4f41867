"""GPU proof of the after-training path: merge, logits check, evaluate and serve a random-initialised 7B
LoRA run, through the real CLI (``tunedeck train / merge / evaluate / serve``).

Steps, each timed: train a short LoRA run (Qwen2.5-7B config, random weights, tiny tokenizer — see
``bench/engine_gpu.py``), ``tunedeck merge`` it, compare the merged model's logits with base + adapter on
the GPU, ``tunedeck evaluate`` it, ``tunedeck serve`` it (our transformers server unless vLLM/LMDeploy is
installed), send one plain and one streaming chat completion (time to first token, pieces/s), and stop
the server. Results: ``--out X.md`` and ``X.json`` (rewritten after every step, so a timeout keeps what
was measured).

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


def log(text: str) -> None:
    print(f"[lifecycle_gpu {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def timed(results: dict[str, Any], name: str, fn: Any) -> Any:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        results["steps"][name] = {"ok": False, "seconds": round(time.monotonic() - started, 2), "error": str(exc)}
        raise
    results["steps"][name] = {"ok": True, "seconds": round(time.monotonic() - started, 2)}
    return value


def logits_check(home: Path, run_id: str, merged_dir: Path) -> dict[str, Any]:
    """Max |merged - (base + adapter)| logits difference on the GPU, same input."""
    os.environ["TUNEDECK_HOME"] = str(home)
    import torch

    from core.lifecycle.source import load_finetuned, load_model_dir, resolve_model_source
    from core.runs.run_dir import RunDirectory

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.randint(3, 900, (1, 64), generator=torch.Generator().manual_seed(0)).to(device)
    tuned = load_finetuned(resolve_model_source(RunDirectory(home / "runs" / run_id)), device)
    with torch.no_grad():
        a = tuned.model(input_ids=ids).logits.float()
        with tuned.model.disable_adapter():
            base = tuned.model(input_ids=ids).logits.float()
    del tuned
    if device == "cuda":
        torch.cuda.empty_cache()
    merged = load_model_dir(merged_dir, device)
    with torch.no_grad():
        b = merged.model(input_ids=ids).logits.float()
    del merged
    if device == "cuda":
        torch.cuda.empty_cache()
    scale = float(a.abs().max())
    return {"max_abs_diff": float((a - b).abs().max()), "mean_abs_diff": float((a - b).abs().mean()),
            "max_abs_logit": scale, "adapter_effect_max": float((a - base).abs().max()),
            "dtype": str(b.dtype), "device": device}


def chat_requests(url: str, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 128,
            "temperature": 0}
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=300) as response:
        reply = json.loads(response.read())
    plain_s = time.monotonic() - started
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.monotonic()
    first = None
    pieces = 0
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                pieces += 1
                if first is None:
                    first = time.monotonic() - started
    stream_s = time.monotonic() - started
    return {"plain_seconds": round(plain_s, 3), "completion_tokens": reply["usage"]["completion_tokens"],
            "plain_tokens_per_s": round(reply["usage"]["completion_tokens"] / plain_s, 1),
            "stream_seconds": round(stream_s, 3), "time_to_first_piece_s": round(first or 0.0, 3),
            "stream_pieces": pieces, "stream_pieces_per_s": round(pieces / stream_s, 1)}


def render(results: dict[str, Any]) -> str:
    lines = [f"# Lifecycle on {results.get('gpu') or 'CPU'} — model {results['model']}", "",
             "| step | ok | seconds | detail |", "|---|---|---|---|"]
    for name, step in results["steps"].items():
        detail = step.get("error") or json.dumps({k: v for k, v in step.items() if k not in ("ok", "seconds")})
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
    out_json = out_md.with_suffix(".json")
    home = Path(args.home or tempfile.mkdtemp(prefix="tunedeck-lifecycle-"))
    results: dict[str, Any] = {"model": args.model, "home": str(home), "steps": {}}
    try:
        import torch

        results["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        results["gpu"] = None

    def save() -> None:
        out_json.write_text(json.dumps(results, indent=2) + "\n")
        out_md.write_text(render(results))

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
        results["logits"] = timed(results, "logits_check", lambda: logits_check(home, run_id, Path(merged["out"])))
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
            results["serve"] = timed(results, "serve_requests", lambda: chat_requests(state["url"], run_id))
        finally:
            timed(results, "serve_stop", lambda: engine_gpu.tunedeck(home, "serve", "--stop", run_id))
        save()
    except Exception as exc:
        results["error"] = str(exc)
        save()
        log(f"failed: {exc}")
        return 1
    log(f"done: {out_md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
