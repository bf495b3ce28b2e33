"""The generated code run for real: check_versions.py against this environment, and train.py's row handling
(chat template with assistant-only loss, Alpaca prompt with answer-only loss, packing) with a real tokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.export.helpers import export, llama_plan, train_module


def _write(files: dict[str, str], where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (where / name).write_text(text)
    return where


def _check(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "check_versions.py"], cwd=where, capture_output=True, text=True, timeout=60)


def test_requirements_are_pinned_and_name_what_the_files_need() -> None:
    hf = export(llama_plan("deepspeed", "qlora", gpus=2, sharding="zero2"), "deepspeed").files["requirements.txt"]
    pins = [line for line in hf.splitlines() if line and not line.startswith("#")]
    assert all("==" in pin for pin in pins)
    assert {p.split("==")[0] for p in pins} == {
        "transformers",
        "accelerate",
        "datasets",
        "peft",
        "bitsandbytes",
        "deepspeed",
    }
    tune = export(llama_plan("torchtune", "lora"), "torchtune").files
    assert "torchtune==0.6.1" in tune["requirements.txt"] and "torchao==0.14.1" in tune["requirements.txt"]
    assert "('torchao', '0.12', '0.15'," in tune["check_versions.py"]


def test_the_version_check_passes_here_and_names_what_is_missing(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    pytest.importorskip("datasets")
    hf = _write(export(llama_plan("hf-trainer", "lora"), "hf-trainer").files, tmp_path / "hf")
    result = _check(hf)
    assert result.returncode == 0, result.stderr
    assert "match" in result.stdout
    # axolotl is not installed here (its pins conflict with this environment).
    axolotl = _write(export(llama_plan("axolotl", "lora"), "axolotl").files, tmp_path / "axolotl")
    result = _check(axolotl)
    assert result.returncode == 1
    assert "axolotl is not installed; needs >= 0.19" in result.stderr
    assert "pip install -r requirements.txt" in result.stderr


def test_an_old_library_is_named_with_the_reason(tmp_path: Path) -> None:
    files = export(llama_plan("hf-trainer", "lora"), "hf-trainer").files
    # The check as a user with an older transformers meets it: the needed range above what is installed.
    files["check_versions.py"] = files["check_versions.py"].replace(
        "('transformers', '5.23'", "('transformers', '99.0'"
    )
    result = _check(_write(files, tmp_path))
    assert result.returncode == 1
    assert "transformers" in result.stderr and "needs >= 99.0: activation_checkpointing" in result.stderr


def _train_module(kind: str, where: Path) -> ModuleType:
    return train_module(kind, where, f"train_{kind}")


WORDS = [
    "<s>",
    "</s>",
    "[UNK]",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "what",
    "is",
    "two",
    "plus",
    "two",
    "four",
    "it",
    "is",
    "below",
    "an",
    "instruction",
]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def _tokenizer() -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {w: i for i, w in enumerate(dict.fromkeys(WORDS))}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="[UNK]"
    )
    tok.chat_template = TEMPLATE
    return tok


def _trained(module: ModuleType, row: dict[str, Any], tok: Any) -> tuple[str, str]:
    encoded = module.encode(row, tok)
    ids, labels = encoded["input_ids"], encoded["labels"]
    assert len(ids) == len(labels)
    kept = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    masked = [i for i, label in zip(ids, labels, strict=True) if label == -100]
    return tok.decode(kept), tok.decode(masked)


@pytest.mark.parametrize("kind", ["chat", "sharegpt"])
def test_chat_rows_train_on_the_assistant_turns_only(kind: str, tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    tok = _tokenizer()
    train = _train_module(kind, tmp_path)
    if kind == "chat":
        row = {
            "messages": [
                {"role": "user", "content": "what is two plus two"},
                {"role": "assistant", "content": "it is four"},
            ]
        }
    else:
        row = {
            "conversations": [
                {"from": "human", "value": "what is two plus two"},
                {"from": "gpt", "value": "it is four"},
            ]
        }
    trained, masked = _trained(train, row, tok)
    assert trained.split() == ["it", "is", "four", "</s>", "</s>"]  # the turn, its end, and the row's end
    assert masked.split() == ["<s>", "<|user|>", "what", "is", "two", "plus", "two", "</s>", "<|assistant|>"]


@pytest.mark.parametrize(
    ("kind", "row"),
    [
        ("alpaca", {"instruction": "what is two plus two", "input": "", "output": "four"}),
        ("dolly", {"instruction": "what is two plus two", "context": "below", "response": "four"}),
        ("prompt_completion", {"prompt": "what is two plus two", "completion": "four"}),
    ],
)
def test_instruction_rows_train_on_the_answer_only(kind: str, row: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    tok = _tokenizer()
    train = _train_module(kind, tmp_path)
    trained, masked = _trained(train, row, tok)
    assert trained.split() == ["four", "</s>"]
    assert "what is two plus two" in masked
    if kind != "prompt_completion":  # the Alpaca prompt around the instruction (and the Dolly context)
        assert "instruction" in masked.lower() and (kind == "alpaca" or "below" in masked)


def test_packing_cuts_full_blocks_with_their_labels(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    train = _train_module("text", tmp_path)
    batch = {"input_ids": [list(range(10)), list(range(10, 34))], "labels": [[-100] * 10, list(range(10, 34))]}
    packed = train.pack(batch)  # 34 tokens: two blocks of 16, the last 2 tokens dropped
    assert packed["input_ids"] == [list(range(16)), list(range(16, 32))]
    assert packed["labels"] == [[-100] * 10 + list(range(10, 16)), list(range(16, 32))]
    assert packed["attention_mask"] == [[1] * 16, [1] * 16]
