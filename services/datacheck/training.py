"""What the exported trainer tokenizes for one row: the pieces it encodes and the tokens it adds around them.

The generated ``train.py`` (services/export/hf.py, ``segments`` and ``encode``) encodes each row as pieces, one
tokenizer call per piece: the first piece of a non-chat row with the tokenizer's special tokens (its post-processor's
BOS), the rest without, then appends one EOS token. Instruction rows are rendered with the Alpaca prompt below (the
one source of these templates: services/export imports them from here); prompt/completion rows are the prompt and
the completion; plain text is the text. Chat rows go through the model's chat template, which lives in
tokenizer_config.json, not in the tokenizer.json the check has: their messages are counted one by one, plus a
cited per-message overhead for the role header and end-of-turn markers (CHAT_TOKENS_PER_MESSAGE). Where the model's
name says which template renders them (CHAT_DEFAULT_SYSTEM_PROMPTS), the default system prompt that template writes
is counted too: apply_chat_template, which train.py calls, writes it on every row without a system message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .formats import ALPACA_INPUT_KEYS, ALPACA_KEYS, ROLE_ALIASES, alpaca_spelling, chat_messages

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
    f"begin-of-text token per row"
)


@dataclass(frozen=True)
class ChatDefault:
    """What a family's chat template writes as the system prompt when a conversation has none."""

    family: str
    # Matched in full against the model's Hub name after its owner, lower-cased: fine-tunes renamed otherwise and
    # other variants (Qwen2.5-Math, DeepSeek's Qwen and Llama distills, Mistral Small 3) have other templates.
    pattern: str
    text: str  # the default system message; "" where the template writes none
    # True: the template writes ``text`` in front of a row's own system message too (Llama 3.1's date lines), not
    # only in place of a missing one.
    always: bool
    source: str


# The one table of default system prompts, by model family. Where a row has no system message the template writes a
# system turn of its own: its text plus the CHAT_TOKENS_PER_MESSAGE markers around it ("<|start_header_id|>system
# <|end_header_id|>\n\n...<|eot_id|>", "<|im_start|>system\n...<|im_end|>\n": 5 each, as for any message).
CHAT_DEFAULT_SYSTEM_PROMPTS: tuple[ChatDefault, ...] = (
    ChatDefault(
        "Llama 3.1 / 3.2 / 3.3 Instruct",
        r"(meta-)?llama-3\.[123]-.*instruct.*",
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
        True,
        # ASSUMPTION, not checked against the Hub file itself (no copy of it is stored here): the template of
        # meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json "chat_template" always writes a system turn,
        # "Cutting Knowledge Date: December 2023\n" + "Today Date: " + date_string + "\n\n" + the row's system
        # message (trimmed), date_string "26 Jul 2024" unless the caller passes one. The same lines are in
        # axolotl's axolotl/utils/chat_templates/templates/llama3_2_vision.jinja (axolotl-ai-cloud/axolotl), in
        # public copies of the 3.1 and 3.2 templates; 3.2's writes strftime_now("%d %b %Y"), today's date, where
        # transformers provides it: the same format and length.
        "meta-llama/Llama-3.1-8B-Instruct tokenizer_config.json chat_template (as copied in axolotl's "
        "llama3_2_vision.jinja)",
    ),
    ChatDefault(
        "Qwen2.5 Instruct",
        r"qwen2\.5-\d+(\.\d+)?b-instruct.*",
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        False,
        # axolotl-ai-cloud/axolotl, axolotl/utils/chat_templates/templates/qwen_25.jinja: "<|im_start|>system\n"
        # + this + "<|im_end|>\n" when messages[0] is not a system message; as in huggingface.co/Qwen/
        # Qwen2.5-7B-Instruct/blob/main/tokenizer_config.json.
        "Qwen/Qwen2.5-7B-Instruct tokenizer_config.json chat_template (axolotl's qwen_25.jinja)",
    ),
    ChatDefault(
        "Qwen2 Instruct",
        r"qwen2-\d+(\.\d+)?b-instruct.*",
        "You are a helpful assistant.",
        False,
        # huggingface.co/Qwen/Qwen2-7B-Instruct/blob/main/tokenizer_config.json: "{% if loop.first and
        # messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
        # (public copies of the template; axolotl's qwen2_vl.jinja writes the same default).
        "Qwen/Qwen2-7B-Instruct tokenizer_config.json chat_template",
    ),
    # Templates that write no default system prompt: a row without one is counted as it is.
    ChatDefault(
        "Llama 3 Instruct",
        r"meta-llama-3-\d+b-instruct.*",
        "",
        False,
        "Meta-Llama-3-8B-Instruct tokenizer_config.json chat_template (axolotl's llama3.jinja): the messages only",
    ),
    ChatDefault(
        "Mistral Instruct v0.1-v0.3",
        r"(mistral-7b-instruct-v0\.[123]|mixtral-8x(7|22)b-instruct-v0\.1).*",
        "",
        False,
        "axolotl's mistral_v1.jinja and mistral_v2v3.jinja: a system message is put in a user turn, none is added",
    ),
    ChatDefault(
        "Gemma / Gemma 2 (-it)",
        r"gemma-(1\.1-|2-)?\d+b-it.*",
        "",
        False,
        "google/gemma-2-9b-it tokenizer_config.json chat_template (axolotl's gemma.jinja): no system role, none added",
    ),
    ChatDefault(
        "Phi-3 / Phi-3.5 Instruct",
        r"phi-3(\.5)?-.*instruct.*",
        "",
        False,
        "axolotl's phi_3.jinja and phi_35.jinja: a system message is written as given, none is added",
    ),
)


def chat_default(model: str | None) -> ChatDefault | None:
    """The CHAT_DEFAULT_SYSTEM_PROMPTS entry of a model name (a Hub id or a name without its owner), or None."""
    if not model:
        return None
    name = model.strip().rstrip("/").rsplit("/", 1)[-1].lower()
    return next((d for d in CHAT_DEFAULT_SYSTEM_PROMPTS if re.fullmatch(d.pattern, name)), None)


def chat_note(default: ChatDefault | None, model: str | None) -> str:
    """CHAT_NOTE and which default system prompt was counted (or that none was, and why)."""
    if default is None:
        who = "no model was given" if not model else f"the template of model {model!r} is not one the check knows"
        return (
            f"{CHAT_NOTE}; {who}, so a default system prompt the template may add on rows without a system message "
            f"(Llama 3.1's date lines, Qwen's) is not counted"
        )
    if not default.text:
        return (
            f"{CHAT_NOTE}; {default.family}'s chat template (model {model!r}) adds no system prompt ({default.source})"
        )
    where = (
        "written in front of each row's system message, and as a system turn of its own on rows without one"
        if default.always
        else "written as a system turn on rows without a system message"
    )
    return (
        f"{CHAT_NOTE}; {default.family}'s chat template (model {model!r}) has a default system prompt, counted: "
        f"{default.text!r}, {where} ({CHAT_TOKENS_PER_MESSAGE} template tokens and the text; {default.source})"
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


def training_text(row: Mapping[str, Any], fmt: str, default: ChatDefault | None = None) -> TrainingText:
    """What train.py encodes for a row that fits `fmt` (see the module docstring); for a chat row, with the default
    system prompt of its model's template (chat_default) where it writes one."""
    if fmt == "chat":
        messages, role_key, content_key = chat_messages(row) or ([], "role", "content")
        contents = [str(m[content_key]) for m in messages]
        if default is not None and default.text:
            role = messages[0].get(role_key) if messages else None
            if isinstance(role, str) and ROLE_ALIASES.get(role.lower()) == "system":
                if default.always:
                    contents[0] = default.text + contents[0]
            else:
                contents.insert(0, default.text)
        overhead = CHAT_TOKENS_PER_MESSAGE * len(contents) + CHAT_TOKENS_PER_CONVERSATION
        return TrainingText(tuple(contents), False, overhead + EOS_TOKENS_PER_ROW)
    if fmt == "alpaca":
        return TrainingText(alpaca_pieces(row), True, EOS_TOKENS_PER_ROW)
    if fmt == "prompt_completion":
        return TrainingText((row["prompt"], row["completion"]), True, EOS_TOKENS_PER_ROW)
    return TrainingText((row["text"],), True, EOS_TOKENS_PER_ROW)


def template_tokens(
    count: Callable[[Sequence[str], bool], list[int]], fmt: str | None, default: ChatDefault | None = None
) -> int:
    """The most tokens a row of ``fmt`` gets from its template beside its fields' own (the extra tokens apart): the
    Alpaca prompt with an input and its BOS for an instruction row, the BOS of a non-chat row's first piece; for
    chat (its markers are all extra tokens) the default system prompt its template writes, if any."""
    if fmt == "chat":
        return count([default.text], False)[0] if default is not None and default.text else 0
    first = ALPACA_PROMPT_WITH_INPUT.format(instruction="", input="") if fmt == "alpaca" else ""
    return count([first], True)[0]
