"""A chat template's default system prompt is counted where the model names the template: Llama 3.1/3.2/3.3 Instruct
write "Cutting Knowledge Date: ...\\nToday Date: ...\\n\\n" in a system turn on every row, Qwen2.5 and Qwen2 Instruct a
system turn of their own where a row has none. Before, neither was counted: a row without a system message was
priced below what train.py's apply_chat_template renders and trains on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from services.datacheck import check_dataset
from services.datacheck.training import (
    CHAT_DEFAULT_SYSTEM_PROMPTS,
    CHAT_TOKENS_PER_CONVERSATION,
    CHAT_TOKENS_PER_MESSAGE,
    chat_default,
)
from tests.export.helpers import train_module

LLAMA_DATES = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
QWEN25 = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Written here from the templates' text (see training.CHAT_DEFAULT_SYSTEM_PROMPTS for the sources), the system block
# and the message loop of each, tools and images left out: Llama 3.1 Instruct's ...
LLAMA31_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}{{- 'Today Date: ' + '26 Jul 2024' + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- message['content']|trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# ... and Qwen2.5 Instruct's (ChatML, no begin-of-text token).
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + QWEN25 + "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
SYSTEM = {"role": "system", "content": "Answer in one short sentence."}
TURNS = [
    {"role": "user", "content": "Where is my parcel?"},
    {"role": "assistant", "content": "It left the depot today, 3 days late."},
]


def _word_tokenizer() -> Any:
    """One token per word, number, punctuation run or newline run (WordLevel: every one is [UNK]), the templates'
    markers as special tokens: a piece counts the same alone as inside the rendered text."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "</s>": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex(r"\n+| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+| +"), behavior="isolated"
    )
    tokenizer.add_special_tokens(["</s>", *MARKERS])
    return tokenizer


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("model", "template", "bos"),
    [("meta-llama/Llama-3.1-8B-Instruct", LLAMA31_TEMPLATE, 1), ("Qwen/Qwen2.5-7B-Instruct", QWEN25_TEMPLATE, 0)],
)
def test_chat_rows_count_the_default_system_prompt_train_py_renders(
    model: str, template: str, bos: int, tmp_path: Path
) -> None:
    """The generated train.py's own encode() (apply_chat_template, then one EOS) against the check's count, with and
    without a system message: equal but for the begin-of-text token the check counts on every chat row
    (CHAT_TOKENS_PER_CONVERSATION), which ChatML does not write."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("jinja2")
    pytest.importorskip("datasets")
    pytest.importorskip("peft")
    tokenizer = _word_tokenizer()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|begin_of_text|>", eos_token="</s>"
    )
    tok.chat_template = template
    train = train_module("chat", tmp_path / "export", f"train_chat_default_{bos}")
    for name, messages in (("bare", TURNS), ("system", [SYSTEM, *TURNS])):
        row = {"messages": messages}
        encoded = len(train.encode(row, tok)["input_ids"])
        path = _write_jsonl(tmp_path / f"{name}.jsonl", [row])
        report = check_dataset(path, tokenizer_json=tmp_path / "tokenizer.json", model=model)
        assert report.tokens.method == "tokenizer_json"
        assert report.tokens.max_tokens == encoded + CHAT_TOKENS_PER_CONVERSATION - bos, name
        without = check_dataset(path, tokenizer_json=tmp_path / "tokenizer.json")  # no model: the default left out
        rendered = tok.apply_chat_template(messages, tokenize=False)
        default = QWEN25 if "Qwen" in model else LLAMA_DATES
        assert (default in rendered) == (name == "bare" or bos == 1)
        if name == "bare" or bos:
            assert report.tokens.max_tokens > without.tokens.max_tokens
        else:  # Qwen with a system message: the template writes that one only
            assert report.tokens.max_tokens == without.tokens.max_tokens


def _approx(text: str) -> int:
    return math.ceil(len(text) / 4)


def test_the_estimate_counts_the_default_and_the_note_names_it(tmp_path: Path) -> None:
    bare = _write_jsonl(tmp_path / "bare.jsonl", [{"messages": TURNS}])
    system = _write_jsonl(tmp_path / "system.jsonl", [{"messages": [SYSTEM, *TURNS]}])
    base_bare = check_dataset(bare).tokens.max_tokens
    base_system = check_dataset(system).tokens.max_tokens
    turn = CHAT_TOKENS_PER_MESSAGE
    qwen = check_dataset(bare, model="Qwen/Qwen2.5-0.5B-Instruct")
    assert qwen.tokens.max_tokens == base_bare + turn + _approx(QWEN25)
    assert check_dataset(system, model="Qwen/Qwen2.5-0.5B-Instruct").tokens.max_tokens == base_system
    qwen2 = check_dataset(bare, model="Qwen/Qwen2-7B-Instruct")
    assert qwen2.tokens.max_tokens == base_bare + turn + _approx("You are a helpful assistant.")
    llama = check_dataset(bare, model="meta-llama/Llama-3.2-3B-Instruct")
    assert llama.tokens.max_tokens == base_bare + turn + _approx(LLAMA_DATES)
    llama_system = check_dataset(system, model="meta-llama/Llama-3.3-70B-Instruct")
    content = str(SYSTEM["content"])
    assert llama_system.tokens.max_tokens == base_system - _approx(content) + _approx(LLAMA_DATES + content)
    for report in (qwen, llama):
        note = [n for n in report.notes if "default system prompt" in n]
        assert note and note == [n for n in report.tokens.notes if "default system prompt" in n]
        assert "counted" in note[0] and "not counted" not in note[0]
    assert repr(QWEN25) in next(n for n in qwen.notes if "default system prompt" in n)
    # Families whose templates add none, and unknown models: counted as before, and the note says which.
    for model, says in (
        ("mistralai/Mistral-7B-Instruct-v0.3", "adds no system prompt"),
        ("google/gemma-2-9b-it", "adds no system prompt"),
        ("microsoft/Phi-3-mini-4k-instruct", "adds no system prompt"),
        ("acme/my-finetune", "not one the check knows"),
        (None, "no model was given"),
    ):
        report = check_dataset(bare, model=model)
        assert report.tokens.max_tokens == base_bare, model
        assert any(says in n for n in report.notes), (model, report.notes)


def test_the_model_comes_from_the_tokenizer_the_check_was_given(tmp_path: Path) -> None:
    """The CLI's --model passes the Hub tokenizer's entry ("hub:owner/name", or "model" where it fell back to the
    estimate), not the name: the family is read from it."""
    bare = _write_jsonl(tmp_path / "bare.jsonl", [{"messages": TURNS}])
    base = check_dataset(bare).tokens.max_tokens
    fallback = {"source": "estimate: characters/4", "model": "Qwen/Qwen2.5-7B-Instruct", "reason": "offline"}
    for tokenizer in ({"source": "hub:Qwen/Qwen2.5-7B-Instruct", "revision": "abc"}, fallback):
        report = check_dataset(bare, tokenizer=tokenizer)
        assert report.tokens.max_tokens == base + CHAT_TOKENS_PER_MESSAGE + _approx(QWEN25)


def test_the_table_matches_families_by_name_only_where_the_template_is_known() -> None:
    found = {
        name: (d.family if d else None)
        for name in (
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Meta-Llama-3.1-70B-Instruct",
            "unsloth/Llama-3.2-1B-Instruct",
            "meta-llama/Meta-Llama-3-8B-Instruct",
            "meta-llama/Llama-3.1-8B",
            "Qwen/Qwen2.5-1.5B-Instruct",
            "Qwen/Qwen2.5-Math-7B-Instruct",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
            "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
            "Qwen/Qwen2-0.5B-Instruct",
        )
        for d in (chat_default(name),)
    }
    assert found == {
        "meta-llama/Llama-3.1-8B-Instruct": "Llama 3.1 / 3.2 / 3.3 Instruct",
        "meta-llama/Meta-Llama-3.1-70B-Instruct": "Llama 3.1 / 3.2 / 3.3 Instruct",
        "unsloth/Llama-3.2-1B-Instruct": "Llama 3.1 / 3.2 / 3.3 Instruct",
        "meta-llama/Meta-Llama-3-8B-Instruct": "Llama 3 Instruct",
        "meta-llama/Llama-3.1-8B": None,
        "Qwen/Qwen2.5-1.5B-Instruct": "Qwen2.5 Instruct",
        "Qwen/Qwen2.5-Math-7B-Instruct": None,
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": None,
        "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": None,
        "Qwen/Qwen2-0.5B-Instruct": "Qwen2 Instruct",
    }
    texts = {d.family: d.text for d in CHAT_DEFAULT_SYSTEM_PROMPTS}
    assert texts["Llama 3.1 / 3.2 / 3.3 Instruct"] == LLAMA_DATES and texts["Qwen2.5 Instruct"] == QWEN25
    assert all(d.source for d in CHAT_DEFAULT_SYSTEM_PROMPTS)
