"""Generated data sets with planted problems, and the exact counts a check must report."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "si", "ta", "vo", "ze", "pu", "da", "fe", "gi", "ho", "ju", "be")


def _vocabulary(rng: random.Random, size: int = 20_000) -> list[str]:
    words = {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(size * 2)}
    return sorted(words)[:size]


def tc_kimlik(rng: random.Random) -> str:
    """A TC Kimlik number with valid checksum digits."""
    d = [rng.randint(1, 9)] + [rng.randint(0, 9) for _ in range(8)]
    d10 = (7 * (d[0] + d[2] + d[4] + d[6] + d[8]) - (d[1] + d[3] + d[5] + d[7])) % 10
    d.append(d10)
    d.append(sum(d) % 10)
    return "".join(map(str, d))


def broken_tc_kimlik(rng: random.Random) -> str:
    """Eleven digits that look like a TC Kimlik number but fail its checksum."""
    good = tc_kimlik(rng)
    return good[:10] + str((int(good[10]) + rng.randint(1, 9)) % 10)


def tr_iban(rng: random.Random, valid: bool = True) -> str:
    bban = "".join(str(rng.randint(0, 9)) for _ in range(22))
    check = 98 - int("".join(str(int(c, 36)) for c in bban + "TR00")) % 97
    if not valid:
        check = (check + rng.randint(1, 50)) % 97 + 2
        if 98 - int("".join(str(int(c, 36)) for c in bban + "TR00")) % 97 == check:
            check = check % 97 + 2
    return f"TR{check:02d}{bban}"


def card(rng: random.Random, valid: bool = True) -> str:
    digits = [4] + [rng.randint(0, 9) for _ in range(14)]
    total = 0
    for index, digit in enumerate(reversed(digits)):
        if index % 2 == 0:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    check = (10 - total % 10) % 10
    if not valid:
        check = (check + rng.randint(1, 9)) % 10
    number = "".join(map(str, digits)) + str(check)
    return " ".join(number[i : i + 4] for i in range(0, 16, 4))


@dataclass
class Planted:
    """What was planted: row numbers (1-based lines) per problem, and personal data per kind."""

    rows_total: int = 0
    broken: list[int] = field(default_factory=list)
    encoding: list[int] = field(default_factory=list)
    mismatched: list[int] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)
    exact: dict[int, int] = field(default_factory=dict)
    near: dict[int, int] = field(default_factory=dict)
    overlong: list[int] = field(default_factory=list)
    pii: dict[str, int] = field(default_factory=dict)


def write_planted(path: Path, *, base_rows: int = 1000, filler_bytes: int = 0, seed: int = 7) -> Planted:
    """An Alpaca JSONL file: `base_rows` distinct rows of 120-160 words, then planted problems, then
    distinct filler rows (~1.5 kB) until the file has at least `filler_bytes` bytes."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    planted = Planted()
    lines: list[bytes] = []
    originals: list[tuple[int, dict[str, Any]]] = []

    def add(line: bytes) -> int:
        lines.append(line)
        return len(lines)

    def row(words: int) -> dict[str, Any]:
        return {
            "instruction": " ".join(rng.choice(vocab) for _ in range(12)),
            "input": "",
            "output": " ".join(rng.choice(vocab) for _ in range(words)),
        }

    def add_row(value: dict[str, Any]) -> int:
        return add(json.dumps(value, ensure_ascii=False).encode())

    for _ in range(base_rows):
        value = row(rng.randint(120, 160))
        originals.append((add_row(value), value))
    # Personal data: valid numbers counted, invalid look-alikes never.
    valid = {"tc_kimlik": 0, "iban": 0, "payment_card": 0}
    for i in range(30):
        value = row(130)
        kind = ("tc_kimlik", "iban", "payment_card")[i % 3]
        number = {"tc_kimlik": tc_kimlik, "iban": tr_iban, "payment_card": card}[kind](rng)
        value["input"] = f"musteri numarasi {number} kayitli"
        valid[kind] += 1
        add_row(value)
    for i in range(30):
        value = row(130)
        number = (broken_tc_kimlik(rng), tr_iban(rng, valid=False), card(rng, valid=False))[i % 3]
        value["input"] = f"siparis {number} tamam"
        add_row(value)
    planted.pii = valid
    for k in range(40):  # exact duplicates: case and whitespace changed
        number, value = originals[(k * 7) % len(originals)]
        copy = dict(value, output="  " + value["output"].upper().replace(" ", "   ") + " ")
        planted.exact[add_row(copy)] = number
    for k in range(40):  # near duplicates: one word changed in ~140
        number, value = originals[(k * 11 + 3) % len(originals)]
        words = value["output"].split()
        words[len(words) // 2] = "degisti"
        planted.near[add_row(dict(value, output=" ".join(words)))] = number
    for _ in range(6):
        planted.broken.append(add(b'{"instruction": "cut off", "output": '))
    for _ in range(3):
        planted.encoding.append(add(b'{"instruction": "bad bytes \xff\xfe here", "output": "x"}'))
    for _ in range(5):
        planted.mismatched.append(add_row({"text": " ".join(rng.choice(vocab) for _ in range(50))}))
    for _ in range(4):
        planted.empty.append(add_row(dict(row(20), output="")))
    for _ in range(5):  # ~40 kB rows: far over any bucket the rest needs
        planted.overlong.append(add_row(row(6000)))
    size = sum(len(line) + 1 for line in lines)
    while size < filler_bytes:
        # 180-195 words: under 512 tokens as trained, the Alpaca prompt and special tokens included.
        size += len(lines[add_row(row(rng.randint(180, 195))) - 1]) + 1
    planted.rows_total = len(lines)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return planted


# A tokenizer.json whose pattern Oniguruma gives up on (tokenizers then panics): (a|aa)+$ over 32 a's and a b.
BACKTRACKING_TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    # Oniguruma gives up on (a|aa)+$ over 32 a's and a b ("retry-limit-in-match over"): tokenizers panics.
    "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": False},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"},
}
