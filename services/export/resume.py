"""Where an exported run keeps its checkpoints, and the generated ``resume.py`` that finds the newest complete one.

One folder per run: ``$GPUPLAN_CHECKPOINT_DIR``, which launch.sh sets to the export's default (``outputs``
beside the files) unless it is set already. It is the folder ``gpuplan agent --checkpoint-dir`` syncs and
``gpuplan restore --to`` fills (services/runs/restore.py puts ``<to>/<checkpoint name>`` there), so a
restored checkpoint lands where the trainer looks. ``resume.py`` (stdlib only, shipped in every export)
prints the arguments that resume from the newest *complete* checkpoint there, or none:

- Trainer formats and axolotl: the newest ``checkpoint-N`` holding ``trainer_state.json``, which the
  Trainer writes after the weights, optimizer, scheduler and RNG states (``Trainer._save_checkpoint``,
  transformers 5.24). transformers' ``get_last_checkpoint`` and axolotl 0.19's auto-resume
  (``axolotl/utils/train.py``) look at the folder name only, so a save cut by a preemption would be taken.
- torchtune 0.6.1: ``epoch_N`` (weights, adapter) is written first and ``recipe_state/recipe_state.pt``
  (optimizer, epochs run, data loader) after it, only when more epochs follow
  (``FullModelHFCheckpointer.save_checkpoint``); the state belongs to the newest ``epoch_N`` written
  before it. The recipe resumes with ``resume_from_checkpoint=True`` and reads the adapter
  (``checkpointer.adapter_checkpoint``) or, for full fine-tuning, the weights (``checkpoint_files``,
  relative to ``output_dir``: torchtune's ``get_model_checkpoint_path``) from that folder.
"""

from __future__ import annotations

from typing import Literal

RESUME_FILE = "resume.py"
CHECKPOINT_ENV = "GPUPLAN_CHECKPOINT_DIR"
DEFAULT_CHECKPOINT_DIR = "outputs"
ResumeKind = Literal["hf", "axolotl", "torchtune-lora", "torchtune-full"]

_SCRIPT = '''"""The run's checkpoint folder and the newest complete checkpoint in it (gpuplan export; stdlib only).

The folder is $GPUPLAN_CHECKPOINT_DIR, else DEFAULT_DIR: the folder `gpuplan agent --checkpoint-dir` syncs and
`gpuplan restore --to` fills. `python resume.py KIND` prints the arguments that resume from the newest complete
checkpoint there, one per line (none: start from the beginning); KIND is hf, axolotl, torchtune-lora or
torchtune-full. train.py imports it.
"""

import os
import re
import sys
from pathlib import Path

ENV = "GPUPLAN_CHECKPOINT_DIR"
DEFAULT_DIR = "outputs"
RECIPE_STATE = "recipe_state/recipe_state.pt"


def checkpoint_dir():
    return os.environ.get(ENV) or DEFAULT_DIR


def _numbered(folder, pattern):
    """The sub-folders whose name matches pattern (one number), newest first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = re.fullmatch(pattern, path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def last_hf_checkpoint(folder):
    """The newest checkpoint-N holding trainer_state.json, or None.

    The Trainer writes trainer_state.json after the weights, optimizer, scheduler and RNG states, so a folder
    without it was cut mid-save (transformers' get_last_checkpoint looks at the name only).
    """
    for path in _numbered(folder, r"checkpoint-(\\d+)"):
        if (path / "trainer_state.json").is_file():
            return str(path)
    return None


def torchtune_resume(folder, full):
    """tune run overrides resuming from the epoch_N that recipe_state.pt belongs to, or [].

    torchtune writes epoch_N, then recipe_state.pt when more epochs follow: the state belongs to the newest
    epoch_N written before it.
    """
    state = Path(folder) / RECIPE_STATE
    if not state.is_file():
        return []
    written = state.stat().st_mtime
    for path in _numbered(folder, r"epoch_(\\d+)"):
        files = [p for p in path.rglob("*") if p.is_file()]
        if not files or max(p.stat().st_mtime for p in files) > written:
            continue  # written after the state: an epoch that was not completed
        resume = ["resume_from_checkpoint=True", "checkpointer.recipe_checkpoint=" + RECIPE_STATE]
        if full:
            weights = sorted(p.name for p in files if re.fullmatch(r"model-\\d+-of-\\d+\\.(safetensors|bin)", p.name))
            if weights:
                listed = ",".join(path.name + "/" + name for name in weights)
                # ~ drops the config's list or filename_format form first (torchtune merges neither into the other).
                return resume + ["~checkpointer.checkpoint_files", "checkpointer.checkpoint_files=[" + listed + "]"]
        elif (path / "adapter_model.pt").is_file():
            return resume + ["checkpointer.adapter_checkpoint=" + path.name + "/adapter_model.pt"]
    return []


def resume_args(kind, folder):
    """(arguments for the launcher, the checkpoint they resume from or None)."""
    if kind in ("hf", "axolotl"):
        found = last_hf_checkpoint(folder)
        if kind == "hf":
            return ([found] if found else []), found
        # axolotl's own auto-resume would take the newest folder even when its save was cut.
        return (["--resume_from_checkpoint=" + found] if found else ["--auto_resume_from_checkpoints=False"]), found
    if kind in ("torchtune-lora", "torchtune-full"):
        args = torchtune_resume(folder, kind == "torchtune-full")
        return args, (args[-1].split("=", 1)[1] if args else None)
    raise SystemExit("usage: python resume.py hf|axolotl|torchtune-lora|torchtune-full")


def main(argv):
    folder = checkpoint_dir()
    args, found = resume_args(argv[1] if len(argv) > 1 else "", folder)
    if found:
        print(f"resume.py: resuming from {found} in {folder}", file=sys.stderr)
    else:
        print(f"resume.py: no complete checkpoint in {folder}: training from the start", file=sys.stderr)
    for arg in args:
        print(arg)


if __name__ == "__main__":
    main(sys.argv)
'''


def resume_script() -> str:
    """resume.py: stdlib only, imported by train.py and run by launch.sh before the launcher."""
    return _SCRIPT


def checkpoint_dir_line() -> str:
    """The launch.sh line that names the checkpoint folder (the caller's value wins)."""
    return f'export {CHECKPOINT_ENV}="${{{CHECKPOINT_ENV}:-{DEFAULT_CHECKPOINT_DIR}}}"'


def resume_line(kind: ResumeKind) -> str:
    """The launch.sh line that collects resume.py's arguments into the RESUME array."""
    return f"mapfile -t RESUME < <(python {RESUME_FILE} {kind})"


CHECKPOINT_COMMENT = (
    f"Checkpoints go to ${CHECKPOINT_ENV} (default {DEFAULT_CHECKPOINT_DIR}): give the same folder to "
    "`gpuplan agent --checkpoint-dir` and `gpuplan restore --to`; the run resumes from the newest complete "
    "checkpoint there."
)
