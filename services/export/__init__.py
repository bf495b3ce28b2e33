"""Export a planned setup as runnable training configs (HF Trainer, accelerate, DeepSpeed, torchtune, axolotl).

Pure core: no I/O beyond the bundled data files, no heavy imports.
"""

from services.export.errors import ExportError
from services.export.export import export_setup, read_back
from services.export.models import FORMATS, ExportBundle, Format

__all__ = ["FORMATS", "ExportBundle", "ExportError", "Format", "export_setup", "read_back"]
