"""When a checkpoint directory is complete: its framework says so, never because it went quiet.

Each framework writes one file (or a set of files) after everything else of a checkpoint; until that
file exists, is whole, and nothing in the directory is newer than it, the checkpoint is in progress:
never uploaded as durable, never the latest, and counted as unsynced. The rules, from the sources:

- HF Trainer (transformers ``Trainer._save_checkpoint``): weights, optimizer, scheduler, scaler, RNG
  state, then ``trainer_state.json`` last. Under DeepSpeed the optimizer step is the engine's
  ``save_checkpoint(checkpoint-N)``, which leaves ``global_stepN/`` and ``latest`` inside it, still
  before ``trainer_state.json``. What a save always leaves is checked too, so a checkpoint that lost a file
  after it was written (a rotation or a cleanup under way) is not complete, whoever looks at it: weights
  (``model.safetensors``, ``pytorch_model.bin``, their sharded indexes with every shard they name, PEFT's
  ``adapter_model.*`` with its ``adapter_config.json``, FSDP's ``pytorch_model_fsdp_*``, or DeepSpeed's
  tag), and the optimizer and scheduler states as a pair: ``Trainer._load_optimizer_and_scheduler`` loads
  them only when both files are there, so a resume from one without the other starts a fresh optimizer.
- DeepSpeed alone (``DeepSpeedEngine.save_checkpoint``): ``<dir>/global_stepN/`` holds the shards;
  ``<dir>/latest`` (the tag) is written after every shard. A tag older than the one ``latest`` names
  was finished before the newer save began.
- torchtune (``FullModelHFCheckpointer.save_checkpoint``, 0.6): ``epoch_N/`` gets the shards, their
  index, the adapter and the copied config files; an intermediate epoch then gets
  ``recipe_state/recipe_state.pt`` beside it (with ``epochs_run`` and ``total_epochs``). An epoch is
  complete when that file was written after it, or a later epoch was begun. The run's last epoch
  (``total_epochs - 1`` by the recipe state before it, or a run with no recipe state at all: a
  single epoch) has no marker after it: it counts when its index names only shards that are there,
  every weight file is whole (a safetensors header gives the file's exact length), an adapter has its
  adapter_config.json, and the directory settled (the config files copied last). ``dist_epoch_N/``
  (its DCP saver) is done when ``.metadata`` (written last by torch.distributed.checkpoint) exists.
- A save sharded over ranks also needs every rank's part beside its marker (services/runs/shards.py): DeepSpeed's
  ZeRO shards, the files a DCP ``.metadata`` names.
- LitGPT (``litgpt/finetune/*.py``, ``pretrain.py``): ``step-N/lit_model.pth`` (or ``.lora``,
  ``.adapter``, ``.adapter_v2``), then the config files, ``hyperparameters.yaml`` and
  ``model_config.yaml`` (the order differs between scripts; both come after the weights). The
  finetune scripts end with ``prompt_style.yaml``; it is required with the LoRA and adapter weights,
  which only they save (a full-weights ``lit_model.pth`` may come from pretrain.py, which writes none).
- Anything else (a user's own loop): write an empty ``.complete`` file into the directory after the
  last file. It also overrides the rules above for a framework directory.

Every file is also checked for being whole where its format tells: a ``.safetensors`` file's length
against its header, a torch zip archive (``torch.save``) for its central directory. A crash or a lost
write behind a marker that did reach the disk is caught there.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from services.runs.shards import DCP_METADATA, dcp_missing, torch_archive_state, zero_shards_missing

COMPLETE_MARKER = ".complete"
HF_STATE = "trainer_state.json"
DEEPSPEED_LATEST = "latest"
TORCHTUNE_RECIPE_STATE = Path("recipe_state") / "recipe_state.pt"
LITGPT_WEIGHTS = ("lit_model.pth", "lit_model.pth.lora", "lit_model.pth.adapter", "lit_model.pth.adapter_v2")
LITGPT_LAST = ("hyperparameters.yaml", "model_config.yaml")
LITGPT_AFTER = ("prompt_style.yaml",)
# gpuplan's own files a training script may add after the framework's save: the evaluation metric ({"metric": x}).
METRIC_FILE = "gpuplan_metric.json"
OWN_FILES = (METRIC_FILE,)

_GLOBAL_STEP = re.compile(r"^global_step(\d+)$")
_EPOCH = re.compile(r"^epoch_(\d+)$")
_DIST_EPOCH = re.compile(r"^dist_epoch_(\d+)$")
_ZIP_MAGIC = b"PK\x03\x04"
_MAX_SAFETENSORS_HEADER = 100 * 2**20  # the format's own limit


@dataclass(frozen=True)
class Completeness:
    complete: bool
    framework: str  # which rule decided: "hf-trainer", "deepspeed", "torchtune", "litgpt", "marker", "unknown"
    reason: str  # what made it complete, or what it still waits for
    needs_settle: bool = False  # complete only if also quiet (torchtune's last epoch has no marker)
    # Files the framework keeps beside the checkpoint folder that a resume from it needs, relative to the
    # run's checkpoint root: torchtune's recipe state (epochs run, optimizer, seed) is one file for the run.
    beside: tuple[str, ...] = ()


def checkpoint_files(directory: Path) -> list[Path]:
    """The files of a checkpoint as its trainer reads them: a link to a file counts as that file (its bytes are
    synced under the link's name, and a restore puts back a plain file); links that name no file are refused by
    ``completeness`` (``_unfollowed_link``)."""
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _unfollowed_link(directory: Path) -> str | None:
    """A link in the checkpoint that names no file (None: none). Left out, it would make a checkpoint durable without
    what the link stands for (weights behind a link, say); a folder behind a link is not walked (a link to '.' or
    '/' would never end)."""
    for path in sorted(directory.rglob("*")):
        if path.is_symlink() and not path.is_file():
            relative = path.relative_to(directory).as_posix()
            if path.is_dir():
                return f"{relative} is a link to a folder, which is not synced: copy the folder in, or remove the link"
            if path.exists():
                return f"{relative} is a link to something that is not a file"
            return f"{relative} is a link to a missing file"
    return None


def _newest_ns(paths: list[Path]) -> int:
    # A link's own time: when the save put it in the folder (its target may be an older or a shared file).
    return max((p.lstat().st_mtime_ns for p in paths), default=0)


def whole_file_problem(path: Path) -> str | None:
    """Why a file is visibly cut short (None: whole, or a format that does not tell)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if path.name.endswith(".safetensors"):
                # safetensors: u64 little-endian header length, a JSON header, then the tensors, whose
                # data_offsets end exactly at the end of the file.
                if len(head) < 8:
                    return "shorter than a safetensors header"
                (length,) = struct.unpack("<Q", head)
                if length > min(_MAX_SAFETENSORS_HEADER, size - 8):
                    return "safetensors header longer than the file"
                header = json.loads(fh.read(length))
                ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
                expected = 8 + length + max(ends, default=0)
                if size != expected:
                    return f"{size} bytes, its safetensors header says {expected}"
                return None
        if head.startswith(_ZIP_MAGIC):  # torch.save's archive (zip) format
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
    except (OSError, ValueError, KeyError, TypeError, IndexError, zipfile.BadZipFile) as exc:
        return f"not whole ({type(exc).__name__}: {str(exc)[:80]})"
    return None


def _written_last(directory: Path, last: list[Path], allowed_after: tuple[str, ...] = ()) -> str | None:
    """None if no file of the checkpoint is newer than the newest of ``last``; else the newer file."""
    exempt = {p.resolve() for p in last} | {(directory / n).resolve() for n in (*allowed_after, *OWN_FILES)}
    marker_ns = _newest_ns(last)
    for path in checkpoint_files(directory):
        if path.resolve() not in exempt and _newest_ns([path]) > marker_ns:
            return path.relative_to(directory).as_posix()
    return None


def _whole(directory: Path) -> str | None:
    for path in checkpoint_files(directory):
        problem = whole_file_problem(path)
        if problem is not None:
            return f"{path.relative_to(directory).as_posix()}: {problem}"
    return None


def _latest_tag(directory: Path) -> str | None:
    try:
        return (directory / DEEPSPEED_LATEST).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _marker_rule(
    directory: Path, names: list[str], framework: str, allowed_after: tuple[str, ...] = ()
) -> Completeness:
    newer = _written_last(directory, [directory / n for n in names], allowed_after)
    if newer is not None:
        return Completeness(False, framework, f"{newer} is newer than {' / '.join(names)}: being rewritten")
    return Completeness(True, framework, f"{' and '.join(names)} written last")


def _hf_trainer(directory: Path) -> Completeness:
    try:
        state = json.loads((directory / HF_STATE).read_text())
        if not isinstance(state, dict):
            raise ValueError("not an object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return Completeness(False, "hf-trainer", f"{HF_STATE} unreadable ({exc})")
    if any(_GLOBAL_STEP.match(p.name) for p in directory.iterdir() if p.is_dir()):
        tag = _latest_tag(directory)  # the Trainer under DeepSpeed: the engine's tag file came before
        if tag is None or not (directory / tag).is_dir():
            return Completeness(False, "hf-trainer", f"DeepSpeed shards without a '{DEEPSPEED_LATEST}' naming them")
        missing = zero_shards_missing(directory / tag)
        if missing is not None:
            return Completeness(False, "hf-trainer", missing)
    missing = _hf_missing(directory)
    if missing is not None:
        return Completeness(False, "hf-trainer", missing)
    return _marker_rule(directory, [HF_STATE], "hf-trainer")


# transformers' file names (utils/__init__.py, trainer.py; peft's utils/constants.py).
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
HF_OPTIMIZER = ("optimizer.pt", "optimizer.bin")  # the second: FSDP's full optimizer state (save_fsdp_optimizer)
HF_SCHEDULER = "scheduler.pt"
_FSDP_SHARDED = re.compile(r"^(pytorch_model|optimizer)_fsdp_\d+$|^optimizer_\d+$")


def _hf_missing(directory: Path) -> str | None:
    """What a Trainer checkpoint lacks of what every save writes (None: nothing): the weights, the shards its index
    names, the adapter's config, or one of the optimizer and scheduler states without the other."""
    names = {p.name for p in directory.iterdir()}
    deepspeed = any(_GLOBAL_STEP.match(n) for n in names)
    sharded = any(_FSDP_SHARDED.match(n) for n in names)
    for index in HF_INDEXES:
        if index in names:
            try:
                shards = set(json.loads((directory / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
                return f"{index} unreadable ({exc})"
            missing = sorted(str(s) for s in shards if not (directory / str(s)).is_file())
            if missing:
                return f"shards {index} names are missing: {missing[:3]}"
    for name in sorted(names):
        folder = directory / name
        lacks = dcp_missing(folder) if _FSDP_SHARDED.match(name) and folder.is_dir() else None
        if lacks is not None:  # FSDP's sharded save (SHARDED_STATE_DICT): a DCP folder per state
            return lacks
    if not (deepspeed or sharded or names & {*HF_WEIGHTS, *HF_INDEXES}):
        return f"no model weights ({', '.join(HF_WEIGHTS)} or a sharded index): the Trainer writes them first"
    if names & {"adapter_model.safetensors", "adapter_model.bin"} and "adapter_config.json" not in names:
        return "adapter_config.json (PEFT writes it with the adapter) missing"
    optimizer = deepspeed or sharded or bool(names & set(HF_OPTIMIZER))
    if HF_SCHEDULER in names and not optimizer:
        return f"{HF_SCHEDULER} without {HF_OPTIMIZER[0]}: the Trainer loads them together or not at all"
    if names & set(HF_OPTIMIZER) and HF_SCHEDULER not in names and not deepspeed:
        return f"{HF_OPTIMIZER[0]} without {HF_SCHEDULER}: the Trainer loads them together or not at all"
    return None


def _deepspeed(directory: Path, step: int) -> Completeness:
    tag = _latest_tag(directory.parent)
    match = _GLOBAL_STEP.match(tag or "")
    if match is None:
        return Completeness(False, "deepspeed", f"no '{DEEPSPEED_LATEST}' beside it names a global_stepN tag")
    latest = int(match.group(1))
    missing = zero_shards_missing(directory)
    if missing is not None:
        return Completeness(False, "deepspeed", missing)
    if latest > step:
        return Completeness(True, "deepspeed", f"'{DEEPSPEED_LATEST}' names a newer tag ({tag})")
    if latest < step:
        return Completeness(False, "deepspeed", f"'{DEEPSPEED_LATEST}' still names {tag}")
    marker = directory.parent / DEEPSPEED_LATEST
    newer = _written_last(directory, [marker])
    if newer is not None:
        return Completeness(False, "deepspeed", f"{newer} is newer than '{DEEPSPEED_LATEST}': being rewritten")
    return Completeness(True, "deepspeed", f"'{DEEPSPEED_LATEST}' names it and was written after its shards")


def recipe_epochs(path: Path) -> tuple[int, int] | None:
    """(epochs_run, total_epochs) from torchtune's recipe_state.pt; None if unreadable."""
    try:
        state = torch_archive_state(path)
        return int(state["epochs_run"]), int(state["total_epochs"])
    except Exception:  # a file that is not torchtune's recipe state: any error means "cannot tell"
        return None


def _torchtune(directory: Path, step: int) -> Completeness:
    later = [p for p in directory.parent.iterdir() if p.is_dir() and (m := _EPOCH.match(p.name)) and int(m[1]) > step]
    if later:
        return Completeness(True, "torchtune", f"a later epoch ({later[0].name}) was started after it")
    recipe = directory.parent / TORCHTUNE_RECIPE_STATE
    if recipe.is_file():
        if whole_file_problem(recipe) is not None:
            return Completeness(False, "torchtune", f"{TORCHTUNE_RECIPE_STATE.as_posix()} being written")
        if _written_last(directory, [recipe]) is None:
            return Completeness(
                True,
                "torchtune",
                f"{TORCHTUNE_RECIPE_STATE.as_posix()} written after it",
                beside=(TORCHTUNE_RECIPE_STATE.as_posix(),),
            )
        epochs = recipe_epochs(recipe)
        if epochs is None or step < epochs[1] - 1:
            return Completeness(
                False, "torchtune", f"waits for {TORCHTUNE_RECIPE_STATE.as_posix()} (an intermediate epoch)"
            )
    # The run's last epoch: torchtune writes no recipe state after it. Complete when every weight file
    # is whole and the index (full weights) names only files that are there; the settle time guards
    # the config files it copies last.
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            return Completeness(False, "torchtune", f"{index.name} unreadable ({exc})")
        missing = sorted(s for s in shards if not (directory / s).is_file())
        if missing:
            return Completeness(False, "torchtune", f"shards its index names are missing: {missing[:3]}")
    elif not any(p.name.startswith("adapter_model.") for p in directory.iterdir()):
        return Completeness(False, "torchtune", "neither a weights index nor an adapter yet")
    if (
        any(p.name.startswith("adapter_model.") for p in directory.iterdir())
        and not (directory / "adapter_config.json").is_file()
    ):
        return Completeness(False, "torchtune", "adapter_config.json (written after the adapter) missing")
    return Completeness(True, "torchtune", "last epoch: every weight file whole", needs_settle=True)


def _litgpt(directory: Path) -> Completeness:
    finetuned = any((directory / n).exists() for n in LITGPT_WEIGHTS[1:])
    required = [*LITGPT_LAST, *(LITGPT_AFTER if finetuned else ())]
    missing = [n for n in required if not (directory / n).is_file()]
    if missing:
        return Completeness(False, "litgpt", f"{', '.join(missing)} not written yet (they follow the weights)")
    if finetuned:
        return _marker_rule(directory, list(LITGPT_AFTER), "litgpt")
    for name in LITGPT_WEIGHTS:
        sharded = directory / name
        lacks = dcp_missing(sharded) if sharded.is_dir() else None  # FSDP's sharded save
        if lacks is not None:
            return Completeness(False, "litgpt", lacks)
    return _marker_rule(directory, list(LITGPT_LAST), "litgpt", LITGPT_AFTER)


def completeness(directory: Path, step: int) -> Completeness:
    """Whether the checkpoint in ``directory`` (at training step ``step``) is complete, and why."""
    if (directory / COMPLETE_MARKER).is_file():
        decided = _marker_rule(directory, [COMPLETE_MARKER], "marker")
    elif (directory / HF_STATE).exists():
        decided = _hf_trainer(directory)
    elif any((directory / n).exists() for n in LITGPT_WEIGHTS):
        decided = _litgpt(directory)
    elif _GLOBAL_STEP.match(directory.name):
        decided = _deepspeed(directory, step)
    elif _EPOCH.match(directory.name):
        decided = _torchtune(directory, step)
    elif _DIST_EPOCH.match(directory.name):
        missing = dcp_missing(directory)
        decided = (
            Completeness(True, "torchtune", f"{DCP_METADATA} written last, with every file it names")
            if missing is None
            else Completeness(False, "torchtune", missing)
        )
    else:
        return Completeness(
            False,
            "unknown",
            f"no completion marker yet ({HF_STATE}, DeepSpeed '{DEEPSPEED_LATEST}', torchtune "
            f"{TORCHTUNE_RECIPE_STATE.as_posix()}, LitGPT {LITGPT_LAST[0]}, or {COMPLETE_MARKER} for your own loop)",
        )
    if not decided.complete:
        return decided
    problem = _unfollowed_link(directory) or _whole(directory)
    if problem is not None:
        return Completeness(False, decided.framework, problem)
    return decided
