"""Padding-free packing: a packed row trains exactly like its examples one by one (no cross-attention)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.train.data_adapter import PaddingCollator, pack_examples  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def _model(attn: str = "sdpa"):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(str(TINY))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)
    model.config.use_cache = False
    return model.eval()


def _examples():
    g = torch.Generator().manual_seed(4)
    out = []
    for n, prompt in ((9, 3), (14, 5), (6, 2), (11, 4)):
        ids = torch.randint(3, 900, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return out


def _separate_token_weighted_mean(model, examples) -> float:
    total, count = 0.0, 0
    for ex in examples:
        ids = torch.tensor([ex["input_ids"]])
        labels = torch.tensor([ex["labels"]])
        n = int((labels[:, 1:] != -100).sum())
        with torch.no_grad():
            total += model(input_ids=ids, labels=labels).loss.item() * n
        count += n
    return total / count


def _loss(model, batch) -> float:
    with torch.no_grad():
        return model(**batch).loss.item()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_equal_the_separate_examples(attn):
    model = _model(attn)
    examples = _examples()
    expected = _separate_token_weighted_mean(model, examples)
    rows = pack_examples(examples, max_seq_len=24)  # -> rows [9+14], [6+11]: two examples each
    assert [len(r["input_ids"]) for r in rows] == [23, 17]
    collate = PaddingCollator(pad_token_id=0, multiple_of=8)
    batch = collate(rows)
    assert abs(_loss(model, batch) - expected) < 1e-5
    flat = PaddingCollator(pad_token_id=0, flatten=True)(rows)
    assert flat["input_ids"].shape == (1, 40)
    assert abs(_loss(model, flat) - expected) < 1e-5

    # The old behaviour (an all-ones attention mask over the packed row) lets examples see each other.
    leaky = dict(batch)
    leaky["attention_mask"] = (batch["labels"] != -100).long() | 1
    leaky["attention_mask"][1, 17:] = 0
    assert abs(_loss(model, leaky) - expected) > 1e-3
