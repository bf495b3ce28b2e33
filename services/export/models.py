"""What an export produces: the files a user runs, the command that starts training, and notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

Format = Literal["hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"]
FORMATS: tuple[Format, ...] = ("hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl")


@dataclass(frozen=True)
class Built:
    """What one format's exporter returns; export_setup wraps it into an ExportBundle."""

    files: dict[str, str]
    command: str
    notes: list[str]


class ExportBundle(BaseModel):
    """Named files (file name -> text), the command that starts training, and what the user must still do."""

    model_config = ConfigDict(frozen=True)

    format: Format
    files: dict[str, str]
    command: str
    notes: list[str]
