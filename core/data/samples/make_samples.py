"""Regenerate the bundled sample dataset: ``python -m core.data.samples.make_samples``.

The records are short, regular skills (sums, capitals, word games) so that the bundled tiny model can
learn a visible part of them in about a minute on a CPU: the demo's loss curve falls, and chat after a
demo run shows memorised answers. The generator is seeded, so the file is reproducible byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).with_name("tiny_skills.jsonl")
SEED = 1234

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("Canada", "Ottawa"), ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Greece", "Athens"), ("Ireland", "Dublin"),
    ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("India", "New Delhi"), ("Mexico", "Mexico City"),
    ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"), ("Australia", "Canberra"), ("Cuba", "Havana"),
]
WORDS = [
    "red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "river", "stone", "bird", "fish",
    "apple", "bread", "light", "rain", "snow", "wind", "star", "book", "door", "hand", "ship", "gold",
]
COLOURS = {"sky": "blue", "grass": "green", "snow": "white", "coal": "black", "blood": "red",
           "a banana": "yellow", "an orange": "orange", "a lemon": "yellow"}
SYSTEM = "You are a tiny helpful assistant. Answer in one short sentence."


def _chat(user: str, assistant: str, system: str | None = None) -> dict:
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


def make_records(seed: int = SEED) -> list[dict]:
    """The sample records, in a fixed order for ``seed``."""
    rng = random.Random(seed)
    records: list[dict] = []
    for _ in range(90):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        if rng.random() < 0.5:
            records.append(_chat(f"What is {a} + {b}?", f"{a} + {b} = {a + b}."))
        else:
            a, b = max(a, b), min(a, b)
            records.append(_chat(f"What is {a} - {b}?", f"{a} - {b} = {a - b}."))
    for country, city in CAPITALS:
        records.append(_chat(f"What is the capital of {country}?", f"The capital of {country} is {city}."))
        records.append(_chat(f"Which country has {city} as its capital?", f"{city} is the capital of {country}.",
                             system=SYSTEM))
    for _ in range(60):
        words = rng.sample(WORDS, rng.randint(2, 4))
        records.append(_chat(f"Reverse the words: {' '.join(words)}", " ".join(reversed(words))))
    for word in WORDS:
        records.append(_chat(f"Spell '{word}' backwards.", word[::-1]))
        records.append(_chat(f"How many letters are in '{word}'?", f"'{word}' has {len(word)} letters."))
    for thing, colour in COLOURS.items():
        records.append(_chat(f"What colour is {thing}?", f"{thing[0].upper()}{thing[1:]} is {colour}."))
    # A few two-turn conversations: loss masking must handle more than one assistant turn.
    for _ in range(20):
        a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
        records.append({"messages": [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}."},
            {"role": "user", "content": f"And plus {c}?"},
            {"role": "assistant", "content": f"{a + b} + {c} = {a + b + c}."},
        ]})
    rng.shuffle(records)
    return records


def main() -> None:
    lines = [json.dumps(record, ensure_ascii=False) for record in make_records()]
    OUTPUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} records to {OUTPUT}")


if __name__ == "__main__":
    main()
