"""Memory and throughput of candidate setups, each computed once per plan.

Peak memory per GPU does not depend on the card, so one memory estimate serves every offer; throughput
depends on the card and its links, so it is kept per (card, link) and shared by offers of the same card.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from services.catalog.gpus import GpuSpec
from services.estimator.architecture import Architecture
from services.estimator.communication import Links
from services.estimator.fit import headroom_ratio
from services.estimator.memory import MemoryBreakdown, ModelStates, model_states, peak_memory
from services.estimator.padding import pads_to_longest_of_known_mean
from services.estimator.plan import Optimizer, Plan, Sharding
from services.estimator.recipe import Recipe, resolve_recipe
from services.estimator.throughput import (
    CardStep,
    FlopsPerToken,
    StepWork,
    Throughput,
    card_step,
    default_links,
    flops_per_token,
    step_work,
)
from services.estimator.uncertainty import memory_band


class Config(NamedTuple):
    """Everything about a setup that changes memory or speed, besides the card (a named tuple: every estimate
    of the search is memoised on it, and a tuple hashes and compares in C, a dataclass in Python)."""

    gpus: int
    sharding: Sharding
    micro_batch_size: int
    accumulation_steps: int
    checkpointing: bool
    cpu_offload: bool = False
    optimizer: Optimizer | None = None  # None: the plan's


# A setup but for its micro-batch: GPUs, samples per GPU, sharding, checkpointing, CPU offload, optimizer.
SeriesKey = tuple[int, int, Sharding, bool, bool, Optimizer | None]


class Evaluator:
    """Memoised estimator calls for variants of one base plan (same method, precision, optimizer).

    Mutable only in its caches and probe counter; it lives for one planning call.
    """

    def __init__(
        self,
        base: Plan,
        arch: Architecture,
        utilisation: Mapping[str, tuple[float, str]] | None = None,
        *,
        recipe: Recipe | None = None,
    ) -> None:
        """``recipe``: the base plan's, where the caller resolved it already (else resolved here)."""
        self.base = base
        self.arch = arch
        # Calibrated hardware utilisation by GPU name (value, source); other cards use the priors.
        self.utilisation = dict(utilisation or {})
        self.memory_probes = 0  # micro-batch sizes compared with a card (batching.largest_fitting_micro_batch)
        self._plans: dict[Config, Plan] = {}
        self._recipes: dict[tuple[Sharding, bool, bool, Optimizer | None], Recipe] = {}
        self._states: dict[tuple[int, Sharding, bool, bool, Optimizer | None], ModelStates] = {}
        self._memory: dict[Config, MemoryBreakdown] = {}
        self._throughput: dict[tuple[str, Links | None, Config, bool], Throughput] = {}
        self._flops: dict[tuple[bool, Sharding, bool, bool, Optimizer | None, int], FlopsPerToken] = {}
        self._work: dict[Config, StepWork] = {}
        self._card_steps: dict[tuple[str, Config, bool], CardStep] = {}
        self._default_links: dict[tuple[str, int], Links] = {}
        self._headroom: dict[tuple[Sharding, int], float] = {}
        self._sized_series: dict[SeriesKey, list[float | None]] = {}
        self.recipe = recipe if recipe is not None else resolve_recipe(base)  # the base plan's
        # Whether the micro-batch changes the rows a step processes (padding to the longest sample of a data
        # set of known mean length): then a smaller micro-batch can be the faster one.
        self.padding_varies = pads_to_longest_of_known_mean(base, self.recipe)

    def plan(self, cfg: Config) -> Plan:
        """The base plan with the setup's GPUs, sharding, batch split and checkpointing (not revalidated:
        every field takes a value the schema allows)."""
        found = self._plans.get(cfg)
        if found is None:
            found = self.base.model_copy(
                update={
                    "gpus": cfg.gpus,
                    "sharding": cfg.sharding,
                    "micro_batch_size": cfg.micro_batch_size,
                    "gradient_accumulation_steps": cfg.accumulation_steps,
                    "gradient_checkpointing": cfg.checkpointing,
                    "cpu_offload": cfg.cpu_offload,
                    "optimizer": cfg.optimizer or self.base.optimizer,
                }
            )
            self._plans[cfg] = found
        return found

    def _recipe(self, cfg: Config) -> Recipe:
        # The recipe depends on the variant only through sharding and whether gradients accumulate.
        key = (cfg.sharding, cfg.accumulation_steps > 1, cfg.cpu_offload, cfg.optimizer)
        found = self._recipes.get(key)
        if found is None:
            found = resolve_recipe(self.plan(cfg))
            self._recipes[key] = found
        return found

    def _model_states(self, cfg: Config) -> ModelStates:
        key = (cfg.gpus, cfg.sharding, cfg.accumulation_steps > 1, cfg.cpu_offload, cfg.optimizer)
        found = self._states.get(key)
        if found is None:
            found = model_states(self.plan(cfg), self.arch, self._recipe(cfg))
            self._states[key] = found
        return found

    def memory(self, cfg: Config) -> MemoryBreakdown:
        """Peak memory per GPU of the setup."""
        found = self._memory.get(cfg)
        if found is None:
            found = peak_memory(self.plan(cfg), self.arch, self._recipe(cfg), self._model_states(cfg))
            self._memory[cfg] = found
        return found

    def headroom(self, cfg: Config) -> float:
        """The headroom ratio of the setup's category (services.estimator.fit.headroom_ratio)."""
        key = (cfg.sharding, cfg.gpus)
        found = self._headroom.get(key)
        if found is None:
            b = self.base
            found = headroom_ratio(b.framework, b.method, cfg.sharding, cfg.gpus, b.mode, self.arch.low_confidence)
            self._headroom[key] = found
        return found

    def sized_bytes(self, cfg: Config) -> float:
        """The bytes per GPU a setup is sized on: its predicted device peak times the headroom ratio."""
        return self.memory(cfg).peak_device * self.headroom(cfg)

    def band_high_bytes(self, cfg: Config) -> float:
        """The upper end (p90) of the setup's device band: above the usable card, the setup is tight."""
        b = self.base
        band = memory_band(b.framework, b.method, cfg.sharding, cfg.gpus, "device", b.mode, self.arch.low_confidence)
        return max(self.memory(cfg).peak_device * band.high_ratio, self.sized_bytes(cfg))

    def sized_by_micro_batch(self, key: SeriesKey, sizes: int) -> list[float | None]:
        """The ``sized_bytes`` of a batch split's ``sizes`` micro-batch sizes in ascending order, the rest of the
        setup fixed by ``key``, each None until a probe fills it in (services.planner.batching.
        largest_fitting_micro_batch): every card's search reads one list, and a probe is one comparison with the
        card's usable bytes (services.estimator.fit.fits_card's)."""
        found = self._sized_series.get(key)
        if found is None:
            found = self._sized_series[key] = [None] * sizes
        return found

    def _flops_per_token(self, cfg: Config) -> FlopsPerToken:
        # FLOPs per token depend on the recipe and on checkpointing, not on the GPU; on the micro-batch only
        # through the row length that padding to the longest sample gives it (services.estimator.padding).
        key = (
            cfg.checkpointing,
            cfg.sharding,
            cfg.accumulation_steps > 1,
            cfg.cpu_offload,
            cfg.optimizer,
            cfg.micro_batch_size if self.padding_varies else 0,
        )
        found = self._flops.get(key)
        if found is None:
            found = flops_per_token(self.plan(cfg), self.arch, self._recipe(cfg))
            self._flops[key] = found
        return found

    def _step_work(self, cfg: Config) -> StepWork:
        # What a step costs that no card changes (throughput.step.step_work): one per configuration, priced on
        # every card and link that configuration is searched on.
        found = self._work.get(cfg)
        if found is None:
            found = step_work(
                self.plan(cfg), self.arch, self._recipe(cfg), self._model_states(cfg), self._flops_per_token(cfg)
            )
            self._work[cfg] = found
        return found

    def model_states(self, cfg: Config) -> ModelStates:
        """Weights, gradients and optimizer states per GPU of the setup."""
        return self._model_states(cfg)

    def throughput(self, cfg: Config, spec: GpuSpec, links: Links | None = None, spill: bool = True) -> Throughput:
        """Tokens/s of the setup on ``spec`` connected by ``links``; ``spill`` charges paged optimizer states
        that do not fit beside the predicted peak their trip over PCIe (off for the one-GPU reference)."""
        # Keyed on the links the estimate uses: one GPU moves nothing between GPUs, whatever its links
        # (throughput.step.data_parallel_communication), and no links means the card's default ones.
        if cfg.gpus <= 1:
            links = None
        elif links is None:
            links = self._default_links.get((spec.name, cfg.gpus))
            if links is None:
                links = self._default_links[(spec.name, cfg.gpus)] = default_links(cfg.gpus, spec)
        key = (spec.name, links, cfg, spill)
        found = self._throughput.get(key)
        if found is None:
            found = self._card_step(cfg, spec, spill).over_links(links)
            self._throughput[key] = found
        return found

    def data_tokens_per_s_ceiling(self, cfg: Config, spec: GpuSpec) -> float:
        """An upper bound of ``throughput(cfg, spec, links).data_tokens_per_s`` on any links, from the step on the
        card alone (throughput.step.CardStep.data_tokens_per_s_ceiling)."""
        return self._card_step(cfg, spec, True).data_tokens_per_s_ceiling()

    def _card_step(self, cfg: Config, spec: GpuSpec, spill: bool) -> CardStep:
        # The step on the card before its links: one per card, shared by the offers' link kinds and networks.
        key = (spec.name, cfg, spill)
        found = self._card_steps.get(key)
        if found is None:
            util, source = self.utilisation.get(spec.name, (None, None))
            states = self._model_states(cfg)
            found = card_step(
                self.plan(cfg),
                self.arch,
                self._recipe(cfg),
                states,
                spec,
                utilisation=util,
                utilisation_source=source,
                # Only paged optimizer states read the peak (what spills): the rest spares a memory estimate.
                peak_device_bytes=self.memory(cfg).peak_device if spill and states.optimizer_states_paged else None,
                work=self._step_work(cfg),
            )
            self._card_steps[key] = found
        return found
