"""The row format of the training data an export reads: which fields, and how a row becomes tokens.

The formats are the data check's (services/datacheck/formats.py), with the two spellings a trainer must be
told apart: OpenAI-style ``messages`` (role/content) and ShareGPT ``conversations`` (from/value) are both
chat; Alpaca (instruction/input/output) and Dolly (instruction/context/response) are both instructions.

Every format trains the same way: chat rows through the tokenizer's chat template with the loss on the
assistant turns only; instruction rows through the Alpaca prompt (github.com/tatsu-lab/stanford_alpaca,
"prompt" templates; torchtune's AlpacaToMessages and axolotl's ``alpaca`` type use the same one) with the
loss on the answer only; prompt/completion rows with the loss on the completion; plain text on every token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# The Alpaca templates are the data check's (services/datacheck/training.py), so the tokens it counts are the tokens
# the exported trainers render; re-exported here for hf.py and axolotl.py.
from services.datacheck.training import ALPACA_PROMPT as ALPACA_PROMPT
from services.datacheck.training import ALPACA_PROMPT_WITH_INPUT as ALPACA_PROMPT_WITH_INPUT
from services.export.errors import ExportError

DataKind = Literal["chat", "sharegpt", "alpaca", "dolly", "prompt_completion", "text"]
DATA_KINDS: tuple[DataKind, ...] = ("chat", "sharegpt", "alpaca", "dolly", "prompt_completion", "text")
# The data check's detected_format -> the kind an export writes; the report's chat_field and instruction_spelling
# then tell ShareGPT from OpenAI-style chat and Dolly from Alpaca (data_format_of_report).
_FROM_CHECK: dict[str, DataKind] = {
    "chat": "chat",
    "alpaca": "alpaca",
    "prompt_completion": "prompt_completion",
    "text": "text",
}


@dataclass(frozen=True)
class DataFormat:
    """The row format the exported files read, and where that was decided."""

    kind: DataKind
    source: str

    @property
    def chat(self) -> bool:
        return self.kind in ("chat", "sharegpt")

    @property
    def messages_field(self) -> str:
        return "conversations" if self.kind == "sharegpt" else "messages"

    @property
    def role_key(self) -> str:
        return "from" if self.kind == "sharegpt" else "role"

    @property
    def content_key(self) -> str:
        return "value" if self.kind == "sharegpt" else "content"

    @property
    def instruction_fields(self) -> tuple[str, str, str]:
        """(instruction, input, answer) field names of an instruction format."""
        if self.kind == "dolly":
            return "instruction", "context", "response"
        if self.kind == "prompt_completion":
            return "prompt", "", "completion"
        return "instruction", "input", "output"

    def describe(self) -> str:
        """Which fields the exported files read, and how (one line for the headers and notes)."""
        if self.chat:
            return (
                f"Data ({self.source}): JSON lines with a '{self.messages_field}' list of "
                f"{{'{self.role_key}', '{self.content_key}'}} turns, rendered with the tokenizer's chat template; "
                "the loss covers the assistant turns only"
            )
        if self.kind == "text":
            return f"Data ({self.source}): JSON lines with a 'text' field; the loss covers every token"
        instruction, extra, answer = self.instruction_fields
        if self.kind == "prompt_completion":
            return (
                f"Data ({self.source}): JSON lines with 'prompt' and 'completion' fields; the loss covers the "
                "completion only"
            )
        return (
            f"Data ({self.source}): JSON lines with '{instruction}', optional '{extra}' and '{answer}' fields, "
            f"rendered with the Alpaca prompt; the loss covers the '{answer}' only"
        )


DEFAULT_DATA = DataFormat("text", "default: no data set or --data-format given")


def data_format(kind: str | None, source: str) -> DataFormat:
    """A --data-format value (or None: plain text) as a DataFormat; an unknown name lists the allowed ones."""
    if kind is None:
        return DEFAULT_DATA
    for known in DATA_KINDS:
        if kind == known:
            return DataFormat(known, source)
    raise ExportError("data_format", f"unknown data format {kind!r}; allowed: {', '.join(DATA_KINDS)}")


def data_format_of_report(report: Mapping[str, Any], name: str) -> DataFormat:
    """The format the data check found in data set ``name`` (its stored report's ``detected_format``)."""
    detected = report.get("detected_format")
    kind = _FROM_CHECK.get(str(detected)) if detected is not None else None
    spelling = report.get("instruction_spelling")
    if kind == "chat" and report.get("chat_field") == "conversations":
        kind = "sharegpt"  # read as 'messages', every ShareGPT row lacked them
    elif kind == "alpaca" and spelling == "instruction/response":
        kind = "dolly"  # Dolly's instruction/context/response: read as Alpaca's, every row lacked 'output'
    elif kind == "alpaca" and spelling == "prompt/response":
        raise ExportError(
            "dataset_id",
            f"data set {name} names its instruction fields 'prompt'/'response', which no export reads: rename them "
            "'instruction'/'output' (Alpaca) or 'instruction'/'response' (Dolly), or give data_format",
        )
    if kind is None:
        raise ExportError(
            "dataset_id",
            f"the data check found no row format in data set {name} ({detected!r}); give data_format, one of "
            f"{', '.join(DATA_KINDS)}",
        )
    return DataFormat(kind, f"the data check of data set {name}")
