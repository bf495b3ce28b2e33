"""What the exported trainer tokenizes for one row: the pieces it encodes and the tokens it adds around them.

The generated ``train.py`` (services/export/hf.py, ``segments`` and ``encode``) encodes each row as pieces, one
tokenizer call per piece: the first piece of a non-chat row with the tokenizer's special tokens (its post-processor's
BOS), the rest without, then appends one EOS token. Instruction rows are rendered with the Alpaca prompt below (the
one source of these templates: services/export imports them from here); prompt/completion rows are the prompt and
the completion; plain text is the text. Chat rows go through the model's chat template, which lives in
tokenizer_config.json, not in the tokenizer.json the check has: their messages are counted one by one, plus a
cited per-message overhead for the role header and end-of-turn markers (CHAT_TOKENS_PER_MESSAGE).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .formats import ALPACA_INPUT_KEYS, ALPACA_KEYS, alpaca_spelling, chat_messages

# The Alpaca prompt (github.com/tatsu-lab/stanford_alpaca, train.py PROMPT_DICT; torchtune's AlpacaToMessages and
# axolotl's ``alpaca`` type use the same), with and without the input field.
ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
# train.py appends tokenizer.eos_token_id to every row, chat rows included (services/export/hf.py, encode).
EOS_TOKENS_PER_ROW = 1
# Cited, not fitted: the tokens a chat template writes around each message. Llama 3's template is
# "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>" = 5 tokens besides the content (the role and
# "\n\n" are one token each; huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct/blob/main/tokenizer_config.json,
# "chat_template"); ChatML's "<|im_start|>{role}\n{content}<|im_end|>\n" = 5 (huggingface.co/Qwen/
# Qwen2.5-7B-Instruct/blob/main/tokenizer_config.json); Gemma's "<start_of_turn>{role}\n{content}<end_of_turn>\n"
# = 5 (huggingface.co/google/gemma-2-9b-it/blob/main/tokenizer_config.json). 5 is the largest of the three.
CHAT_TOKENS_PER_MESSAGE = 5
# Cited, not fitted: the begin-of-text token a chat template writes once per conversation (Llama 3's
# "<|begin_of_text|>", Gemma's "<bos>"; ChatML writes none), from the same tokenizer_config.json files.
CHAT_TOKENS_PER_CONVERSATION = 1
CHAT_NOTE = (
    f"chat rows: the chat template lives in the model's tokenizer_config.json, not in tokenizer.json, so the counts "
    f"include an estimated template overhead of {CHAT_TOKENS_PER_MESSAGE} tokens per message (role header and "
    f"end-of-turn markers, as in Llama 3's, ChatML's and Gemma's templates) and {CHAT_TOKENS_PER_CONVERSATION} "
    f"begin-of-text token per row; a default system prompt some templates add (Llama 3.1's date lines, Qwen's) is "
    f"not counted"
)
TRAINING_NOTE = (
    "counts are what the exported train.py trains on: instruction rows rendered with the Alpaca prompt, the "
    "tokenizer's special tokens (BOS) on a non-chat row's first piece and one EOS token per row"
)


@dataclass(frozen=True)
class TrainingText:
    """The pieces train.py encodes for one row, whether its first piece gets the tokenizer's special tokens,
    and the tokens it adds that no piece holds (the EOS, a chat template's markers)."""

    pieces: tuple[str, ...]
    special_first: bool
    extra_tokens: int


def _input_field(row: Mapping[str, Any]) -> str:
    """The input train.py renders: Alpaca's 'input', Dolly's 'context'; prompt/response rows (no export reads
    them) either one, the first that is set."""
    spelling = alpaca_spelling(row) or ""
    if spelling == "instruction/output":
        return row.get("input") or ""
    if spelling == "instruction/response":
        return row.get("context") or ""
    return next((row[k] for k in ALPACA_INPUT_KEYS if row.get(k)), "")


def alpaca_pieces(row: Mapping[str, Any]) -> tuple[str, str]:
    """(rendered prompt, answer) of an instruction row, as train.py's segments(): the input prompt when the input
    field is non-empty, else the prompt without it."""
    pair = next((pair for pair in ALPACA_KEYS if pair[0] in row and pair[1] in row), None)
    if pair is None:
        raise ValueError("alpaca_pieces: the row has no instruction/answer fields")
    instruction, answer = pair
    extra = _input_field(row)
    if extra:
        return ALPACA_PROMPT_WITH_INPUT.format(instruction=row[instruction], input=extra), row[answer]
    return ALPACA_PROMPT.format(instruction=row[instruction]), row[answer]


def training_text(row: Mapping[str, Any], fmt: str) -> TrainingText:
    """What train.py encodes for a row that fits `fmt` (see the module docstring)."""
    if fmt == "chat":
        messages, _, content_key = chat_messages(row) or ([], "role", "content")
        contents = tuple(str(m[content_key]) for m in messages)
        overhead = CHAT_TOKENS_PER_MESSAGE * len(contents) + CHAT_TOKENS_PER_CONVERSATION
        return TrainingText(contents, False, overhead + EOS_TOKENS_PER_ROW)
    if fmt == "alpaca":
        return TrainingText(alpaca_pieces(row), True, EOS_TOKENS_PER_ROW)
    if fmt == "prompt_completion":
        return TrainingText((row["prompt"], row["completion"]), True, EOS_TOKENS_PER_ROW)
    return TrainingText((row["text"],), True, EOS_TOKENS_PER_ROW)


def template_tokens(count: Callable[[Sequence[str], bool], list[int]], fmt: str | None) -> int:
    """The most tokens a row of ``fmt`` gets from its template beside its fields' own (the extra tokens apart): the
    Alpaca prompt with an input and its BOS for an instruction row, the BOS of a non-chat row's first piece, none
    for chat (its markers are all extra tokens)."""
    if fmt == "chat":
        return 0
    first = ALPACA_PROMPT_WITH_INPUT.format(instruction="", input="") if fmt == "alpaca" else ""
    return count([first], True)[0]
