"""GPU specifications (a versioned data file) and forgiving GPU-name matching."""

from __future__ import annotations

import csv
import difflib
import functools
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

from services.core.errors import EstimatorError

# An unknown card's name is quoted in its error up to this many characters.
ECHOED_NAME_CHARS = 80


@dataclass(frozen=True)
class GpuSpec:
    name: str
    aliases: tuple[str, ...]
    memory_gib: float
    memory_gb_vendor: float
    bf16_tflops: float | None
    fp16_tflops: float
    fp8_tflops: float | None
    hbm_bandwidth_gb_per_s: float
    nvlink_gb_per_s: float
    pcie_gb_per_s: float
    gpu_class: str
    source: str

    def dense_tflops(self, precision: str) -> float:
        """Peak dense tensor TFLOPs for the plan's compute dtype (fp16 where a card lacks bf16)."""
        if precision.startswith("bf16") and self.bf16_tflops:
            return self.bf16_tflops
        if precision == "fp32":
            # Training in fp32 uses TF32 tensor cores where available: half the 16-bit rate.
            return (self.bf16_tflops or self.fp16_tflops) / 2
        return self.fp16_tflops

    @property
    def interconnect_gb_per_s(self) -> float:
        return self.nvlink_gb_per_s or self.pcie_gb_per_s


def parse_gpu_specs(text: str) -> tuple[GpuSpec, ...]:
    """Parse the GPU spec CSV (lines starting with '#' are comments)."""
    rows = csv.DictReader(io.StringIO("".join(line for line in text.splitlines(True) if not line.startswith("#"))))

    def opt(value: str) -> float | None:
        return float(value) if value.strip() else None

    specs = []
    for row in rows:
        specs.append(
            GpuSpec(
                name=row["name"],
                aliases=tuple(a.strip() for a in row["aliases"].split(";") if a.strip()),
                memory_gib=float(row["memory_gib"]),
                memory_gb_vendor=float(row["memory_gb_vendor"]),
                bf16_tflops=opt(row["bf16_tflops"]),
                fp16_tflops=float(row["fp16_tflops"]),
                fp8_tflops=opt(row["fp8_tflops"]),
                hbm_bandwidth_gb_per_s=float(row["hbm_bandwidth_gb_per_s"]),
                nvlink_gb_per_s=float(row["nvlink_gb_per_s"]),
                pcie_gb_per_s=float(row["pcie_gb_per_s"]),
                gpu_class=row["class"],
                source=row["source"],
            )
        )
    return tuple(specs)


@functools.cache
def gpu_specs() -> tuple[GpuSpec, ...]:
    """The bundled GPU specs (read once, on first use)."""
    text = resources.files("services.catalog").joinpath("data/gpus.csv").read_text(encoding="utf-8")
    return parse_gpu_specs(text)


_NOISE = re.compile(r"\b(nvidia|geforce|tesla|gpu|hbm\d?e?|gddr\d?x?)\b")
# A memory size in a name: "80GB", "80 GB", "80G", "24GiB" (not the "10G" inside "A10G").
_MEMORY = re.compile(r"\b(\d+)\s*g(?:i?b)?\b")
# What may follow a card's model in a name and still mean that card: form factors and editions, not variants
# ("D", "Ti", "Max-Q", "NVL" are other cards).
_FORM_WORDS = re.compile(r"(?:sxm\d*|pcie\d*|oam|server|workstation|edition|generation|blackwell|gen\d)*")


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _NOISE.sub("", name.lower()))


@functools.lru_cache(maxsize=8)
def exact_gpu_names(specs: tuple[GpuSpec, ...]) -> Mapping[str, GpuSpec]:
    """``find_gpu``'s exact pass as one read-only table: each normalised name or alias to the first card that has
    it (a caller matching many names calls ``find_gpu`` only for names not in it). Built once per card list (the
    bundled one, or a caller's): normalising every card's names cost more than the rest of a look-up."""
    table: dict[str, GpuSpec] = {}
    for spec in specs:
        for known in (spec.name, *spec.aliases):
            table.setdefault(_normalize(known), spec)
    return MappingProxyType(table)


def larger_of_its_model(name: str, spec: GpuSpec, specs: tuple[GpuSpec, ...] | None = None) -> GpuSpec | None:
    """Where ``name`` gives no memory and ``spec`` (what ``find_gpu`` made of it) is not the smallest-memory card
    of its model, that smallest card: "A100" reads as the A100 80GB, which a price list meaning the 40 GB card must
    not be planned on. None otherwise (a memory given, or the smallest card already)."""
    if _model_and_memory(name)[1]:
        return None
    spec_model = _model_and_memory(spec.name)[0]
    smaller = [
        other
        for other in (specs if specs is not None else gpu_specs())
        if _model_and_memory(other.name)[0] == spec_model and other.memory_gib < spec.memory_gib
    ]
    return min(smaller, key=lambda other: other.memory_gib) if smaller else None


def gpu_name_key(name: str) -> str:
    """The normalised name ``find_gpu`` and ``exact_gpu_names`` match on."""
    return _normalize(name)


def _model_and_memory(name: str) -> tuple[str, frozenset[int]]:
    """A name's model (noise words, memory sizes and punctuation taken out) and the memory sizes it names, in GB."""
    lowered = _NOISE.sub("", name.lower())
    memory = frozenset(int(found) for found in _MEMORY.findall(lowered))
    return re.sub(r"[^a-z0-9]", "", _MEMORY.sub("", lowered)), memory


def find_gpu(name: str, specs: tuple[GpuSpec, ...] | None = None) -> GpuSpec:
    """Match a GPU name forgivingly: 'A100 80GB', 'a100-80gb', 'A100-SXM4-80GB', 'NVIDIA H100'."""
    specs = specs if specs is not None else gpu_specs()
    wanted = _normalize(name)
    if not wanted:
        raise EstimatorError("gpu", "empty GPU name")
    exact = exact_gpu_names(specs).get(wanted)
    if exact is not None:
        return exact
    # Same model and memory, ignoring form-factor and edition words (sxm4, pcie, server edition, ...) after the model.
    # Only those: a name's prefix matched either way, and "H20" (96 GB, a sixth of the compute) was taken for the
    # H200, "RTX 4090 D" for the RTX 4090, "RTX 4090 48GB" for the 24 GB card (a probe of stop 53).
    # The card whose name matches most of the model wins ("H100 PCIe" over "H100" + "pcie").
    model, memory = _model_and_memory(name)
    matched: dict[str, tuple[int, GpuSpec]] = {}
    for spec in specs:
        for known in (spec.name, *spec.aliases):
            k_model, k_memory = _model_and_memory(known)
            if len(k_model) < 2 or not model.startswith(k_model) or not _FORM_WORDS.fullmatch(model[len(k_model) :]):
                continue
            same_memory = not memory or memory == (k_memory or {round(spec.memory_gb_vendor)})
            if same_memory and len(k_model) > matched.get(spec.name, (0, spec))[0]:
                matched[spec.name] = (len(k_model), spec)
    longest = max((length for length, _ in matched.values()), default=0)
    best = [spec for length, spec in matched.values() if length == longest]
    if len(best) == 1:
        return best[0]
    names = [s.name for s in specs]
    if len(name) > ECHOED_NAME_CHARS:  # a name thousands long was echoed whole (and compared with every card's)
        raise EstimatorError("gpu", f"unknown GPU {name[: ECHOED_NAME_CHARS - 1] + '…'!r} Known: {', '.join(names)}")
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise EstimatorError("gpu", f"unknown GPU {name!r}{hint} Known: {', '.join(names)}")
