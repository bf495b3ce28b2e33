"""The check counts the tokens the exported train.py trains on: the Alpaca prompt around instruction rows, the
tokenizer's BOS and train.py's EOS on every row, and a cited template overhead per chat message. Before, a row was
its fields joined by newlines without special tokens: Alpaca rows priced at a third of their trained tokens."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from services.datacheck import check_dataset
from services.datacheck.training import CHAT_TOKENS_PER_CONVERSATION, CHAT_TOKENS_PER_MESSAGE
from tests.export.helpers import train_module

ENGLISH = [
    "Summarise the customer's complaint in one sentence.",
    "The parcel arrived two weeks late and the box was damaged.",
    "Translate the greeting into French and keep it polite.",
    "Write a short reply that apologises and offers a refund.",
]
ROWS: dict[str, list[dict[str, Any]]] = {
    "alpaca": [
        {"instruction": ENGLISH[0], "input": ENGLISH[1], "output": "A late, damaged parcel."},
        {"instruction": ENGLISH[2], "input": "", "output": "Bonjour, enchanté."},
        {"instruction": ENGLISH[3], "output": "We are sorry; a refund is on its way."},
    ],
    "dolly": [
        {"instruction": ENGLISH[0], "context": ENGLISH[1], "response": "A late, damaged parcel."},
        {"instruction": ENGLISH[2], "context": "", "response": "Bonjour, enchanté."},
    ],
    "prompt_completion": [
        {"prompt": ENGLISH[0], "completion": ENGLISH[1]},
        {"prompt": ENGLISH[2], "completion": "Oui"},
    ],
    "text": [{"text": t} for t in ENGLISH],
}


def _bpe(bos: bool) -> Any:
    """A small byte-level BPE trained here, with "<s>" and "</s>"; with `bos`, its post-processor adds "<s>" in front
    of a sequence (as Llama's tokenizer.json does with <|begin_of_text|>)."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["[UNK]", "<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(ENGLISH * 20, trainer=trainer)
    if bos:
        tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
    return tokenizer


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _train_module(kind: str, where: Path) -> ModuleType:
    """train.py of an hf-trainer export reading ``kind`` rows, imported (its version check runs)."""
    pytest.importorskip("datasets")
    pytest.importorskip("peft")
    return train_module(kind, where, f"train_{kind}_counted")


@pytest.mark.parametrize("kind", ["alpaca", "dolly", "prompt_completion", "text"])
def test_each_row_counts_what_train_py_encodes(kind: str, tmp_path: Path) -> None:
    """The generated train.py's own encode() with the same tokenizer.json gives each row's count: the Alpaca prompt
    (with the input block only when the input is set), the BOS its post-processor adds and the EOS it appends."""
    transformers = pytest.importorskip("transformers")
    tokenizer = _bpe(bos=True)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    train = _train_module(kind, tmp_path / "export")
    rows = ROWS[kind]
    encoded = [len(train.encode(row, tok)["input_ids"]) for row in rows]
    # The exact strings train.py feeds the tokenizer, counted by the tokenizers package itself.
    pieces = [[text for text, _ in train.segments(row, tok)] for row in rows]
    by_string = [
        len(tokenizer.encode(p[0]).ids) + sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in p[1:]) + 1
        for p in pieces
    ]
    assert by_string == encoded
    report = check_dataset(_write_jsonl(tmp_path / "d.jsonl", rows), tokenizer_json=tmp_path / "tokenizer.json")
    assert report.tokens.method == "tokenizer_json" and report.rows_kept == len(rows)
    assert report.tokens.tokens_per_epoch == sum(encoded)
    assert report.tokens.max_tokens == max(encoded)
    if kind in ("alpaca", "dolly"):
        assert "Below is an instruction" in pieces[0][0] and "### Input:" in pieces[0][0]
        assert "### Input:" not in pieces[1][0]  # an empty input renders the prompt without it


def test_alpaca_rows_count_the_prompt_not_only_their_fields(tmp_path: Path) -> None:
    """The under-count a probe found: the fields alone are a fraction of what the rendered prompt trains on."""
    tokenizer = _bpe(bos=True)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    rows = ROWS["alpaca"]
    report = check_dataset(_write_jsonl(tmp_path / "d.jsonl", rows), tokenizer_json=tmp_path / "tokenizer.json")
    fields_only = sum(
        len(tokenizer.encode("\n".join(v for v in r.values() if v), add_special_tokens=False).ids) for r in rows
    )
    assert report.tokens.tokens_per_epoch is not None
    assert report.tokens.tokens_per_epoch > 2 * fields_only


@pytest.mark.parametrize("bos", [True, False])
def test_bos_and_eos_are_counted_as_the_tokenizer_adds_them(bos: bool, tmp_path: Path) -> None:
    tokenizer = _bpe(bos=bos)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS["text"])
    report = check_dataset(path, tokenizer_json=tmp_path / "tokenizer.json")
    plain = [len(tokenizer.encode(t, add_special_tokens=False).ids) for t in ENGLISH]
    assert report.tokens.tokens_per_epoch == sum(plain) + len(plain) * (int(bos) + 1)


def test_the_estimate_adds_one_bos_and_one_eos_per_row(tmp_path: Path) -> None:
    rows = [{"prompt": "abcd" * 5, "completion": "abcd" * 3}, {"text": "abcd" * 10}]
    report = check_dataset(_write_jsonl(tmp_path / "d.jsonl", rows[:1]))
    assert report.tokens.max_tokens == 5 + 3 + 2  # prompt and completion counted apart, as train.py encodes them
    report = check_dataset(_write_jsonl(tmp_path / "t.jsonl", rows[1:]))
    assert report.tokens.max_tokens == 10 + 2
    assert "1 BOS" in report.tokens.notes[0]


def test_chat_rows_count_a_cited_overhead_per_message(tmp_path: Path) -> None:
    tokenizer = _bpe(bos=True)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    messages = [
        {"role": "system", "content": ENGLISH[3]},
        {"role": "user", "content": ENGLISH[0]},
        {"role": "assistant", "content": ENGLISH[1]},
    ]
    path = _write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages}])
    report = check_dataset(path, tokenizer_json=tmp_path / "tokenizer.json")
    contents = sum(len(tokenizer.encode(m["content"], add_special_tokens=False).ids) for m in messages)
    # Llama 3 / ChatML / Gemma: 5 tokens around each message, one begin-of-text, then train.py's EOS.
    assert (CHAT_TOKENS_PER_MESSAGE, CHAT_TOKENS_PER_CONVERSATION) == (5, 1)
    assert report.tokens.max_tokens == contents + 3 * 5 + 1 + 1
    assert any("5 tokens per message" in n for n in report.notes)
    assert any("5 tokens per message" in n for n in report.tokens.notes)
    estimate = check_dataset(path)
    assert estimate.tokens.max_tokens == sum(-(-len(m["content"]) // 4) for m in messages) + 3 * 5 + 1 + 1


@pytest.mark.parametrize("bos", [True, False])
def test_very_short_is_judged_on_the_rows_own_text_not_its_prompt(bos: bool, tmp_path: Path) -> None:
    # The Alpaca prompt puts every instruction row far above 8 trained tokens: "very short" reads the fields alone.
    rows = [{"instruction": "Hi", "input": "", "output": "Ok"}, {"instruction": "Hi", "input": "x", "output": "Ok"}]
    rows += [
        {"instruction": f"Explain topic number {i} in detail", "input": "", "output": "word " * 30} for i in range(40)
    ]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(_bpe(bos).to_str(), encoding="utf-8")
    for counted in (check_dataset(data), check_dataset(data, tokenizer_json=tokenizer)):
        assert counted.detected_format == "alpaca"
        assert counted.tokens.max_tokens > 40  # the prompt is counted
        assert counted.short_rows == (1, 2), counted.short_rows
