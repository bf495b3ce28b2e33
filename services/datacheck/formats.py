"""Recognise the row format of a fine-tuning set and pull out the text each row trains on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The order breaks ties in the majority vote: the more specific format first.
FORMATS = ("chat", "alpaca", "prompt_completion", "text")

# Role spellings seen in OpenAI, ShareGPT/FastChat, Vicuna and Gemini exports, mapped to the canonical three.
ROLE_ALIASES: Mapping[str, str] = {
    "user": "user",
    "human": "user",
    "system": "system",
    "assistant": "assistant",
    "gpt": "assistant",
    "bot": "assistant",
    "model": "assistant",
}
# Alpaca's instruction/input/output, Dolly's instruction/context/response, and the prompt/response
# spelling several datasets use for the same thing.
ALPACA_KEYS = (("instruction", "output"), ("instruction", "response"), ("prompt", "response"))
ALPACA_INPUT_KEYS = ("input", "context")


def _alpaca_pair(row: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (instruction, answer) keys of a row: the first spelling with both present, else the first
    whose instruction is present (so the problem names the missing answer field)."""
    complete = next((pair for pair in ALPACA_KEYS if pair[0] in row and pair[1] in row), None)
    return complete or next((pair for pair in ALPACA_KEYS if pair[0] in row), None)


def alpaca_spelling(row: Any) -> str | None:
    """Which instruction/answer field names an instruction row uses ('instruction/output', ...), or None.

    A trainer's instruction template reads one pair of field names, so within one file every row must
    use the same spelling: a 'prompt'/'response' row in an Alpaca 'instruction'/'output' file would be
    dropped or fail at training time (Alpaca: github.com/tatsu-lab/stanford_alpaca, data format section;
    Dolly: huggingface.co/datasets/databricks/databricks-dolly-15k, field list)."""
    if not isinstance(row, dict):
        return None
    pair = next((pair for pair in ALPACA_KEYS if pair[0] in row and pair[1] in row), None)
    return None if pair is None else "/".join(pair)


def detect_spelling(votes: Mapping[str, int]) -> str | None:
    """The instruction-field spelling most instruction rows use (ties go to the earlier in ALPACA_KEYS)."""
    spellings = ["/".join(pair) for pair in ALPACA_KEYS]
    best = max(spellings, key=lambda name: (votes.get(name, 0), -spellings.index(name)))
    return best if votes.get(best, 0) > 0 else None


def spelling_problem(row: Mapping[str, Any], spelling: str) -> str | None:
    """Why an instruction row does not use the file's field names, or None when it does."""
    own = alpaca_spelling(row)
    if own is None or own == spelling:
        return None
    used, expected = (" / ".join(repr(k) for k in name.split("/")) for name in (own, spelling))
    return f"fields {used} where the file's instruction rows use {expected}"


@dataclass(frozen=True)
class RowText:
    """The text a row trains on, and its target (answer) part; `target` is None for plain text."""

    text: str
    target: str | None


def chat_messages(row: Mapping[str, Any]) -> tuple[list[Any], str, str] | None:
    """(messages, role key, content key) of a chat row: OpenAI's messages or ShareGPT's conversations."""
    if "messages" in row:
        return row["messages"], "role", "content"
    if "conversations" in row:
        return row["conversations"], "from", "value"
    return None


def _chat_problem(row: Mapping[str, Any]) -> str | None:
    found = chat_messages(row)
    if found is None:
        return "no 'messages' (role/content) or 'conversations' (from/value) list"
    messages, role_key, content_key = found
    if not isinstance(messages, list) or not messages:
        return "the message list is empty or not a list"
    roles = set()
    for index, message in enumerate(messages, start=1):
        if not isinstance(message, dict):
            return f"message {index} is not an object"
        role = message.get(role_key)
        canonical = ROLE_ALIASES.get(role.lower()) if isinstance(role, str) else None
        if canonical is None:
            return f"message {index}: unknown {role_key} {role!r}; allowed: {', '.join(sorted(ROLE_ALIASES))}"
        if not isinstance(message.get(content_key), str):
            return f"message {index}: {content_key!r} is missing or not a string"
        roles.add(canonical)
    if "assistant" not in roles:
        return "no assistant message to learn from"
    return None


def _string_fields_problem(row: Mapping[str, Any], keys: Iterable[str]) -> str | None:
    missing = [k for k in keys if not isinstance(row.get(k), str)]
    if missing:
        return f"missing or non-string field(s): {', '.join(missing)}"
    return None


def _alpaca_problem(row: Mapping[str, Any]) -> str | None:
    pair = _alpaca_pair(row)
    if pair is None:
        return "no 'instruction'/'output' (or 'instruction'/'response', 'prompt'/'response') fields"
    problem = _string_fields_problem(row, pair)
    if problem is None:
        for key in ALPACA_INPUT_KEYS:
            if not isinstance(row.get(key, ""), str | None):
                return f"field {key!r} is not a string"
    return problem


def _prompt_completion_problem(row: Mapping[str, Any]) -> str | None:
    return _string_fields_problem(row, ("prompt", "completion"))


def _text_problem(row: Mapping[str, Any]) -> str | None:
    return _string_fields_problem(row, ("text",))


_CHECKS: Mapping[str, Callable[[Mapping[str, Any]], str | None]] = {
    "chat": _chat_problem,
    "alpaca": _alpaca_problem,
    "prompt_completion": _prompt_completion_problem,
    "text": _text_problem,
}


def format_problem(row: Any, fmt: str) -> str | None:
    """Why `row` does not fit format `fmt`, or None when it does."""
    if fmt not in _CHECKS:
        raise ValueError(f"fmt: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if not isinstance(row, dict):
        return f"row is a JSON {type(row).__name__}, not an object"
    return _CHECKS[fmt](row)


def format_votes(rows: Iterable[Any]) -> dict[str, int]:
    """How many rows fit each format (a row may fit several)."""
    votes: Counter[str] = Counter({fmt: 0 for fmt in FORMATS})
    for row in rows:
        for fmt in FORMATS:
            if format_problem(row, fmt) is None:
                votes[fmt] += 1
    return dict(votes)


def detect_format(votes: Mapping[str, int]) -> str | None:
    """The format most rows fit (ties go to the earlier one in FORMATS); None when no row fits any."""
    best = max(FORMATS, key=lambda fmt: (votes.get(fmt, 0), -FORMATS.index(fmt)))
    return best if votes.get(best, 0) > 0 else None


def row_text(row: Mapping[str, Any], fmt: str) -> RowText:
    """The text of a row that fits `fmt`, its fields joined by newlines: what the duplicate and empty checks read.
    What the trainer tokenizes (templates, special tokens) is training.training_text."""
    if fmt == "chat":
        found = chat_messages(row)
        messages, role_key, content_key = found if found is not None else ([], "role", "content")
        contents = [str(m[content_key]) for m in messages]
        answers = [str(m[content_key]) for m in messages if ROLE_ALIASES.get(str(m[role_key]).lower()) == "assistant"]
        return RowText("\n".join(contents), "\n".join(answers))
    if fmt == "alpaca":
        pair = _alpaca_pair(row)
        if pair is None:
            raise ValueError("row_text: the row has no instruction/answer fields")
        instruction, output = pair
        parts = [row[instruction], *(row.get(k) or "" for k in ALPACA_INPUT_KEYS), row[output]]
        return RowText("\n".join(p for p in parts if p), row[output])
    if fmt == "prompt_completion":
        return RowText(f"{row['prompt']}\n{row['completion']}", row["completion"])
    return RowText(row["text"], None)
