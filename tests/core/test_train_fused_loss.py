"""The chunked cross-entropy equals transformers' causal-LM loss, in value and gradients, and keeps no logits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.train.fused_loss import (  # noqa: E402
    chunk_tokens_for,
    chunked_causal_lm_loss,
    forward_chunked_loss,
    resolve_fused_ce,
    supports_chunked_loss,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def _tiny_model(seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(TINY))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    return model


def _batch(vocab: int):
    """Two rows of different lengths (right padding) with prompt tokens masked out of the loss."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 23), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 15:] = 0
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt
    labels[1, 15:] = -100  # padding
    labels[0, 9:12] = -100  # a second masked span
    ids[1, 15:] = 0
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def _standard(model, batch, num_items=None):
    model.zero_grad(set_to_none=True)
    kwargs = {"num_items_in_batch": num_items} if num_items is not None else {}
    loss = model(**batch, **kwargs).loss
    loss.backward()
    return loss.detach(), _grads(model)


def _chunked(model, batch, num_items=None, chunk_tokens=7):
    model.zero_grad(set_to_none=True)
    loss = forward_chunked_loss(model, model, batch, num_items_in_batch=num_items, chunk_tokens=chunk_tokens)
    loss.backward()
    return loss.detach(), _grads(model)


def _assert_same(a, b) -> None:
    loss_a, grads_a = a
    loss_b, grads_b = b
    assert torch.allclose(loss_a, loss_b, rtol=1e-6, atol=1e-6), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("chunk_tokens", [1, 7, 4096])
def test_full_model_loss_and_gradients_match_the_standard_path(chunk_tokens):
    model = _tiny_model()
    batch = _batch(model.config.vocab_size)
    _assert_same(_standard(model, batch), _chunked(model, batch, chunk_tokens=chunk_tokens))


def test_gradient_accumulation_normaliser_is_used():
    """With num_items_in_batch (tokens of all micro-batches of the step) the sum is divided by it."""
    model = _tiny_model()
    batch = _batch(model.config.vocab_size)
    num_items = torch.tensor(57)  # as if other micro-batches of the step had more tokens
    standard = _standard(model, batch, num_items)
    chunked = _chunked(model, batch, num_items)
    _assert_same(standard, chunked)
    mean = _chunked(model, batch)[0]
    valid = int((batch["labels"][:, 1:] != -100).sum())
    assert torch.allclose(chunked[0] * 57, mean * valid, rtol=1e-5)


def test_lora_wrapped_model_matches_and_only_adapters_get_gradients():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny_model(), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                      target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():  # a non-zero B so that the adapters change the output
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    batch = _batch(model.config.vocab_size)
    standard = _standard(model, batch)
    chunked = _chunked(model, batch)
    _assert_same(standard, chunked)
    assert all("lora_" in name for name in chunked[1])


def test_no_valid_token_gives_zero_not_nan():
    model = _tiny_model()
    batch = _batch(model.config.vocab_size)
    batch["labels"] = torch.full_like(batch["labels"], -100)
    loss = forward_chunked_loss(model, model, batch)
    assert loss.item() == 0.0
    loss.backward()  # the graph is whole


def test_logits_of_the_whole_batch_are_never_kept_for_backward():
    """Saved tensors of the loss: the standard path keeps [tokens x vocab] logits, the chunked one none."""
    model = _tiny_model()
    vocab = model.config.vocab_size
    batch = _batch(vocab)
    tokens = batch["input_ids"].numel()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def biggest_vocab_tensor(fn) -> int:
        seen = [0]

        def pack(t):
            if t.dim() >= 1 and t.shape[-1] == vocab and t.untyped_storage().data_ptr() not in weights:
                seen[0] = max(seen[0], t.numel() // vocab)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return seen[0]

    standard_rows = biggest_vocab_tensor(lambda: model(**batch).loss)
    chunked_rows = biggest_vocab_tensor(lambda: forward_chunked_loss(model, model, batch, chunk_tokens=4))
    assert standard_rows >= tokens - 1
    assert chunked_rows == 0  # the model's own head makes no position's logits (an empty logits_to_keep)


def test_direct_function_matches_cross_entropy_on_random_tensors():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 11, 16, generator=g, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False)
    labels = torch.randint(0, 50, (3, 11), generator=g)
    labels[0, :4] = -100
    expected = torch.nn.functional.cross_entropy(head(hidden[:, :-1]).reshape(-1, 50), labels[:, 1:].reshape(-1))
    got = chunked_causal_lm_loss(hidden, labels, head, chunk_tokens=5)
    assert torch.allclose(expected, got, atol=1e-6)
    (g1,) = torch.autograd.grad(expected, hidden)
    (g2,) = torch.autograd.grad(got, hidden)
    assert torch.allclose(g1, g2, atol=1e-7)


def test_the_collators_target_rows_are_the_positions_with_a_target_and_give_the_same_loss():
    """``PaddingCollator(target_rows=True)``: the flat positions whose next label counts, found on the host; the
    chunked loss over them alone equals the loss that finds them itself (and the model's own)."""
    from core.train.data_adapter import PaddingCollator
    from core.train.fused_loss import TARGET_ROWS

    examples = [{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}, {"input_ids": [9, 10], "labels": [9, 10]}]
    batch = PaddingCollator(pad_token_id=0, multiple_of=8, target_rows=True)(examples)
    assert batch[TARGET_ROWS].tolist() == [1, 2, 8]  # row 0 predicts 7 and 8; row 1 (from 8 on) predicts 10
    assert TARGET_ROWS not in PaddingCollator(pad_token_id=0)(examples)

    model = _tiny_model()
    batch = _batch(model.config.vocab_size)
    from core.train.fused_loss import target_rows

    rows = target_rows(batch["labels"])
    model.zero_grad(set_to_none=True)
    loss = forward_chunked_loss(model, model, batch, chunk_tokens=7, rows=rows)
    loss.backward()
    _assert_same((loss.detach(), _grads(model)), _chunked(model, batch))
    _assert_same((loss.detach(), _grads(model)), _standard(model, batch))


def test_chunk_size_follows_the_vocabulary():
    assert chunk_tokens_for(152064) == 512 and chunk_tokens_for(32000) == 4096 and chunk_tokens_for(400000) == 256


def test_resolution_of_the_config_values():
    assert resolve_fused_ce("false", cuda=True, liger_installed=True) == "none"
    assert resolve_fused_ce(False, cuda=True, liger_installed=True) == "none"
    assert resolve_fused_ce("chunked", cuda=True, liger_installed=True) == "chunked"
    assert resolve_fused_ce("auto", cuda=True, liger_installed=True) == "triton"  # with Liger's other kernels
    assert resolve_fused_ce(True, cuda=True, liger_installed=True) == "triton"
    assert resolve_fused_ce("liger", cuda=True, liger_installed=True) == "liger"
    assert resolve_fused_ce("auto", cuda=False, liger_installed=True) == "chunked"
    assert resolve_fused_ce("auto", cuda=True, liger_installed=False) == "chunked"
    assert resolve_fused_ce("liger", cuda=False, liger_installed=True) == "chunked"
    assert supports_chunked_loss(_tiny_model())


def test_models_that_scale_their_logits_keep_their_own_loss():
    """Granite divides the logits by ``logits_scaling``, Falcon-H1 multiplies them by ``lm_head_multiplier``:
    the chunked loss (plain ``lm_head(hidden)``) would be wrong for them, so they keep their own."""
    model = _tiny_model()
    assert supports_chunked_loss(model)
    for name, value in (("logits_scaling", 8.0), ("lm_head_multiplier", 0.03), ("output_multiplier", 2.0)):
        setattr(model.config, name, 1.0)  # a neutral factor changes nothing
        assert supports_chunked_loss(model), name
        setattr(model.config, name, value)
        assert not supports_chunked_loss(model), name
        delattr(model.config, name)
    assert supports_chunked_loss(model)


def test_real_runs_with_each_value_reach_the_same_losses(tmp_path):
    """`tunedeck train` with fused_ce false / chunked / liger (chunked on a CPU), gradient accumulation,
    packing and gradient checkpointing: the same loss at every step."""
    import json

    from tests.core.test_train_engine import _config, _tunedeck, _wait_final

    home = tmp_path / "home"
    values = ("false", "chunked", "liger")
    ids = {}
    for value in values:  # started together: three detached runs share the two cores
        work = tmp_path / value
        work.mkdir()
        extra = ["offload_activations=true"] if value == "liger" else []  # exact too: same losses expected
        out = _tunedeck(home, "train", str(_config(work)), f"fused_ce={value}", "max_steps=4", "micro_batch_size=2",
                        "gradient_accumulation=2", "packing=true", "gradient_checkpointing=true", "save_steps=100",
                        *extra)
        assert out.returncode == 0, out.stderr
        ids[value] = out.stdout.strip()
    curves, impl = {}, {}
    for value, run_id in ids.items():
        status = _wait_final(home, run_id)
        run_dir = home / "runs" / run_id
        assert status["status"] == "finished", (run_dir / "train.log").read_text()[-2000:]
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        impl[value] = records[0]["fused_ce"]
        assert records[0]["offload_activations"] is (value == "liger")
        if value == "liger":
            installed = re.search(r"offload_activations: (\d+) checkpointed blocks keep their input in (?:pinned )?host memory",
                                  (run_dir / "train.log").read_text())
            assert installed and int(installed.group(1)) > 0  # 0 would mean the switch did nothing
        assert records[0]["optimizer"] == "adamw_torch" and records[0]["packing"] is True
        curves[value] = [r["loss"] for r in records if r.get("kind") == "train"]
    assert impl == {"false": "none", "chunked": "chunked", "liger": "chunked"}
    assert len(curves["false"]) == 4
    for value in ("chunked", "liger"):
        assert curves[value] == pytest.approx(curves["false"], rel=1e-4), curves
