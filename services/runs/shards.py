"""What a sharded save must hold besides its marker: every rank's file.

A save sharded over ranks is finished by one rank's marker (DeepSpeed's ``latest``, torch.distributed.checkpoint's
``.metadata``) once every rank has written its part. On one shared folder the parts sit beside the marker; a run on
several nodes that each save to their own disk leaves every node a marker with only its own ranks' parts, which no
resume can load. So a sharded checkpoint is complete only with every rank's part:

- DeepSpeed ZeRO: one ``[bf16_]zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt`` per data-parallel rank and model-
  parallel rank. Their number per model-parallel rank is the optimizer state's ``partition_count`` (the largest,
  where it is a list per parameter group): DeepSpeed's own ``utils/zero_to_fp32.py`` (``parse_optim_states``)
  refuses a tag with another count as "a checkpoint [that] didn't get saved by one or more processes".
- torch.distributed.checkpoint (HF FSDP's ``pytorch_model_fsdp_0/`` and ``optimizer_0/``, torchtune's
  ``dist_epoch_N/``, LitGPT's sharded ``lit_model.pth/``): ``.metadata`` (``FileSystemWriter.finish``, the
  coordinator, after every rank wrote) names each rank's data file in its ``storage_data``.

Both files are torch pickles, read here without torch and without running any of their code.
"""

from __future__ import annotations

import io
import pickle
import re
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

DCP_METADATA = ".metadata"
_ZERO_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MAX_METADATA_BYTES = 64 * 2**20  # a .metadata lists every tensor's chunks: megabytes for the largest models

# What was read of a shard file, by (kind, path, size, mtime_ns): a pending sharded checkpoint is checked again on
# every sync pass, and each pass read up to three ZeRO pickles and a .metadata of up to 64 MiB anew. A file of the
# same size and mtime is read once; one rewritten (another size or mtime) is read again. Only the small answer is
# kept (a partition count, the file names a .metadata lists), the least recently used dropped past the bound.
_READS: OrderedDict[tuple[str, str, int, int], object] = OrderedDict()
_READS_LIMIT = 1024
_READS_LOCK = threading.Lock()
_T = TypeVar("_T")


class _Stub:
    """Whatever a torch pickle builds (tensors, devices, dataclasses): only the state it is given is kept."""

    state: object = None  # a stub built without a state (NEWOBJ with no BUILD) has none

    def __new__(cls, *_args: object, **_kwargs: object) -> _Stub:
        return object.__new__(cls)

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        self.state = state


class NoCodeUnpickler(pickle.Unpickler):
    """Reads a torch pickle without torch and without running any of its code: every global but an OrderedDict
    becomes a stub, every tensor storage None."""

    def find_class(self, module: str, name: str) -> type:
        if (module, name) == ("collections", "OrderedDict"):
            import collections

            return collections.OrderedDict
        return _Stub

    def persistent_load(self, pid: object) -> None:
        return None


def torch_archive_state(path: Path) -> Any:
    """The object a ``torch.save`` archive (zip) holds, its tensors None. Raises on anything else."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
        return NoCodeUnpickler(io.BytesIO(archive.read(name))).load()


def _ranks(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _read_once(kind: str, path: Path, read: Callable[[Path], _T]) -> _T:
    """``read(path)``, or what it gave for this file at the same size and mtime. An answer is kept only when the
    file's size and mtime are the same after the read as before it (a file written meanwhile is read again)."""
    before = path.stat()
    key = (kind, str(path.resolve()), before.st_size, before.st_mtime_ns)
    with _READS_LOCK:
        if key in _READS:
            _READS.move_to_end(key)
            return _READS[key]  # type: ignore[return-value]
    value = read(path)
    after = path.stat()
    if (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
        with _READS_LOCK:
            _READS[key] = value
            while len(_READS) > _READS_LIMIT:
                _READS.popitem(last=False)
    return value


def _read_partition_count(path: Path) -> int | None:
    try:
        count = torch_archive_state(path)["optimizer_state_dict"]["partition_count"]
        count = max(count) if isinstance(count, list | tuple) else count
    except Exception:  # not DeepSpeed's layout, or not readable: any error means "cannot tell"
        return None
    return count if isinstance(count, int) and count > 0 else None


def _partition_count(path: Path) -> int | None:
    """The data-parallel ranks a ZeRO optimizer shard was saved among (None: the file does not say)."""
    try:
        return _read_once("zero", path, _read_partition_count)
    except OSError:  # removed or unreadable since the listing: cannot tell
        return None


def zero_shards_missing(tag: Path) -> str | None:
    """What a DeepSpeed tag folder lacks of its ZeRO optimizer shards (None: nothing, or no ZeRO shards). Without a
    readable ``partition_count`` the data-parallel ranks present must still run from 0 without a gap."""
    ranks: dict[int, dict[int, Path]] = {}
    for path in tag.iterdir():
        match = _ZERO_OPTIM.match(path.name)
        if match is not None and path.is_file():
            ranks.setdefault(int(match[2]), {})[int(match[1])] = path
    if not ranks:
        return None
    present = [path for by_dp in ranks.values() for _, path in sorted(by_dp.items())]
    count = next((c for c in map(_partition_count, present[:3]) if c is not None), None)
    for mp in range(max(ranks) + 1):
        by_dp = ranks.get(mp, {})
        expected = count if count is not None else max(max(d) for d in ranks.values()) + 1
        missing = sorted(set(range(expected)) - set(by_dp))
        if missing:
            return (
                f"{tag.name}/ lacks the ZeRO optimizer shards of data-parallel ranks {_ranks(missing)} of {expected}"
                f"{f' (model-parallel rank {mp})' if len(ranks) > 1 else ''}: {_ELSEWHERE}"
            )
    return None


def _storage_paths(obj: object, seen: set[int] | None = None) -> Iterator[str]:
    """Every ``relative_path`` in the state of the stubs a DCP ``.metadata`` pickle built (its ``_StorageInfo``)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, _Stub):
        state = obj.state
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of a class with __slots__
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            path = state.get("relative_path")
            if isinstance(path, str):
                yield path
            yield from _storage_paths(list(state.values()), seen)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _storage_paths(key, seen)
            yield from _storage_paths(value, seen)
    elif isinstance(obj, list | tuple | set | frozenset):
        for item in obj:
            yield from _storage_paths(item, seen)


def _read_dcp_names(metadata: Path) -> tuple[str, ...] | str:
    """The data files a ``.metadata`` names, sorted; or, for one that cannot be read, the name of the error."""
    try:
        with metadata.open("rb") as fh:
            state = NoCodeUnpickler(fh).load()
    except Exception as exc:  # a cut-short or foreign file: never complete on it
        return type(exc).__name__
    return tuple(sorted(set(_storage_paths(state))))


def dcp_missing(folder: Path) -> str | None:
    """What a torch.distributed.checkpoint folder lacks (None: nothing): its ``.metadata``, or a data file the
    metadata names."""
    metadata = folder / DCP_METADATA
    if not metadata.is_file():
        return f"{folder.name}/ has no {DCP_METADATA} yet"
    try:
        if metadata.stat().st_size > _MAX_METADATA_BYTES:
            return f"{folder.name}/{DCP_METADATA} is over {_MAX_METADATA_BYTES // 2**20} MiB: not read"
        names = _read_once("dcp", metadata, _read_dcp_names)
    except OSError as exc:  # removed since it was seen: never complete on it
        names = type(exc).__name__
    if isinstance(names, str):
        return f"{folder.name}/{DCP_METADATA} unreadable ({names})"
    named = list(names)
    missing = [name for name in named if not (folder / name).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        lacks = f"{len(missing)} of the {len(named)} files its {DCP_METADATA} names"
        return f"{folder.name}/ lacks {lacks} ({shown}): {_ELSEWHERE}"
    return None


_ELSEWHERE = (
    "other ranks saved them, on another node's disk if the nodes do not share the checkpoint folder "
    "(a multi-node run syncs only from a folder every node saves to)"
)
