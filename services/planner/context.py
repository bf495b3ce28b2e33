"""What one planning request holds while it searches: the plan's sizes, a card's setups and priced candidates."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from services.catalog.gpus import GpuSpec
from services.catalog.offers import Offer
from services.estimator.architecture import Architecture
from services.estimator.budget import CpuBudget, unlimited
from services.estimator.communication import Links, intra_node_kind
from services.estimator.fit import usable_card_bytes
from services.estimator.memo import quick_init
from services.estimator.plan import Method, Optimizer, Plan
from services.estimator.throughput import Throughput
from services.planner.constraints import Constraints
from services.planner.costs import RunCost
from services.planner.evaluator import Config, Evaluator
from services.planner.layouts import Layout, offer_links
from services.planner.models import PricingMode

# Optimizers the planner may switch AdamW to when the user allows it, least change first.
EIGHT_BIT_OPTIMIZERS: tuple[Optimizer, ...] = ("adamw-8bit", "paged-adamw-8bit")

# (card, gpus_per_node, whole_nodes_only, intra-node link kind, inter-node Gbit/s: None in a single-node key).
ShapeKey = tuple[str, int, bool, str, float | None]
# (shape key of one node, inter-node Gbit/s, which single-node setups the host RAM holds, and where offload
# first fits it on more nodes: see _ram_key).
RamKey = tuple[ShapeKey, float | None, tuple[bool, ...], object]
# A multi-node step's setups, whether they are enough to stop growing and whether one offloads.
StepSetups = tuple["Sequence[Setup]", bool, bool]


class SingleNode(NamedTuple):
    """The setups on one node of a shape: all of them, the fastest per GPU count, whether they are enough to stop
    there (services.planner.enough.enough) and whether one of them offloads."""

    found: list[Setup]
    fastest: list[Setup]
    enough: bool
    offloads: bool


@quick_init
@dataclass(frozen=True)
class ConfigNeeds:
    """The fitting configurations of a card on a layout, the host RAM per node each needs (0 without offload),
    and each as a configuration that a node's RAM cannot hold (to explain a rejection); ``plain``: whether one
    fits without offload; ``least``: the least need (infinite without configurations), so a RAM below it holds
    none."""

    configs: tuple[Config, ...]
    needs: tuple[float, ...]
    blocked: tuple[RamBlocked, ...]
    plain: bool
    least: float


@dataclass(slots=True)
class NodeStep:
    """One multi-node layout of an offer shape (``offer``: the first offer of that shape met), and what the
    node-count walks of services.planner.search read of it, each worked out on first use (most walks stop after
    a few steps): its links, and without and with offload its setups, whether they are enough to stop growing and
    whether one offloads. A cache of one planning call."""

    layout: Layout
    offer: Offer
    links: Links | None = None
    plain: StepSetups | None = None
    offloaded: StepSetups | None = None


@dataclass
class NodeWalk:
    """The multi-node layouts of one card, link kind, node size and network, in order, and what the node-count
    walks of services.planner.search found on them, each worked out on first use. Whole nodes or not, an offer
    shape has the same multi-node layouts and links, so its shapes share one walk; and a walk adds only GPU
    counts above one node, so a shape's setups are its own single-node ones followed by the walk's."""

    layouts: tuple[Layout, ...]
    offer: Offer  # the first offer of the walk met (its links)
    # The steps made so far, one per layout from the first (``steps``).
    made: list[NodeStep] = field(default_factory=list)
    # The setups without offload per step, growing until they are enough (then the shared empty tuple).
    plain: list[Sequence[Setup]] | None = None
    # Without a host RAM limit, per offload flag and whether it walks for a deadline: the fastest setup per GPU count
    # the walk keeps.
    grown: dict[tuple[bool, bool], list[Setup]] = field(default_factory=dict)
    # Under a host RAM, per (offload flag, what the RAM decides: RamKey's last part): the fastest setups per GPU
    # count and the configurations the RAM cannot hold.
    ram: dict[tuple[bool, object, bool], tuple[list[Setup], list[HostRamBlocked]]] = field(default_factory=dict)

    def steps(self) -> Iterator[NodeStep]:
        """The steps in order, each made on first use: most walks stop after a few."""
        made = self.made
        for index, layout in enumerate(self.layouts):
            if index == len(made):
                made.append(NodeStep(layout, self.offer))
            yield made[index]


@dataclass
class SearchMemo:
    """What the search of one planning call works out once (services.planner.search and host_ram), each keyed by the
    values it reads, never by identity: thousands of offers share a few shapes."""

    # Per single-node shape: its setups (search._single_node).
    single: dict[ShapeKey, SingleNode] = field(default_factory=dict)
    # Per single-node shape and which of its setups a host RAM holds: those held (the fastest per GPU count), those
    # not (as blocked by the RAM), and whether the held ones are enough.
    held_single: dict[tuple[ShapeKey, tuple[bool, ...]], tuple[list[Setup], list[HostRamBlocked], bool]] = field(
        default_factory=dict
    )
    # Per (usable bytes per GPU, GPUs, offload allowed): the configurations that fit.
    configs: dict[tuple[float, int, bool], tuple[Config, ...]] = field(default_factory=dict)
    # The same per card, each with the micro-batch that consumes the data fastest under padding.
    card_configs: dict[tuple[str, int, bool], tuple[Config, ...]] = field(default_factory=dict)
    # Per largest fitting configuration: the same with each smaller micro-batch.
    smaller: dict[Config, tuple[Config, ...]] = field(default_factory=dict)
    # Host RAM per node a configuration offloads, by (configuration, GPUs per node).
    host_ram_needs: dict[tuple[Config, int], float] = field(default_factory=dict)
    # Per (card, layout, links, offload allowed): the fitting setups.
    layouts: dict[tuple[str, Layout, Links, bool], list[Setup]] = field(default_factory=dict)
    # Per card and layout: the fitting configurations, the host RAM each needs, and each as blocked by the RAM.
    needs: dict[tuple[str, Layout, bool], ConfigNeeds] = field(default_factory=dict)
    # Per (card, link kind, node size, network): the multi-node layouts in order and the walks over them.
    walks: dict[tuple[str, str, int, float | None], NodeWalk] = field(default_factory=dict)
    # Usable host RAM per node by (RAM GiB per node, the offer's node size, the layout's GPUs per node).
    usable_ram: dict[tuple[float | None, int, int], float | None] = field(default_factory=dict)
    # Per (card, node size, whole nodes only, host RAM GiB per node): which single-node setups the RAM holds.
    held: dict[tuple[str, int, bool, float | None], tuple[bool, ...]] = field(default_factory=dict)
    # Per (card, node size, networked, host RAM GiB per node): where offload first fits that RAM on more nodes.
    beyond: dict[tuple[str, int, bool, float | None], object] = field(default_factory=dict)
    # With a deadline: the offer of the catalog slowest to start (start-up and model download), on which a setup
    # must meet the deadline for more nodes to be pointless (enough.verdicts), and its hours per (layout, training
    # seconds) on demand (the most of those and the spot_risks' hours on spot).
    slowest_start: Offer | None = None
    # With spot allowed too: an offer per spot risk of the catalog, starting as slowly; a setup must meet the deadline
    # on spot on each (a walk that stopped where only on demand met it missed spot runs on more nodes that meet it).
    spot_risks: tuple[Offer, ...] = ()
    deadline_hours: dict[tuple[Layout, float], float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSizes:
    """Bytes a run moves besides training: the model it downloads, what it checkpoints and uploads."""

    model_download_bytes: float
    checkpoint_bytes: float
    final_upload_bytes: float
    checkpoint_write_s: float


@dataclass(frozen=True)
class PlanContext:
    """What every step of one planning call shares: the plan, its numbers, and the memoised estimators."""

    plan: Plan
    arch: Architecture
    constraints: Constraints
    total_tokens: float
    effective_batch_size: int
    sizes: RunSizes
    evaluator: Evaluator
    budget: CpuBudget = field(default_factory=unlimited)
    memo: SearchMemo = field(default_factory=SearchMemo)
    _variants: dict[Method, Evaluator] = field(default_factory=dict)
    _links: dict[tuple[str, str, Layout, float | None], Links] = field(default_factory=dict)
    _link_kinds: dict[tuple[str, str], str] = field(default_factory=dict)

    def link_kind(self, spec: GpuSpec, interconnect: str) -> str:
        """``intra_node_kind`` of the card under an offer's interconnect string (memoised: a few of each)."""
        key = (spec.name, interconnect)
        found = self._link_kinds.get(key)
        if found is None:
            found = self._link_kinds[key] = intra_node_kind(spec, interconnect)
        return found

    def links(self, spec: GpuSpec, offer: Offer, layout: Layout) -> Links:
        """The links of a layout of this offer (memoised: thousands of offers share a few shapes)."""
        inter = offer.inter_node_gbit_per_s if layout.nodes > 1 else None
        # The links read the interconnect string only through the link kind it gives the card.
        key = (spec.name, self.link_kind(spec, offer.interconnect), layout, inter)
        found = self._links.get(key)
        if found is None:
            found = self._links[key] = offer_links(spec, offer, layout)
        return found

    def variant(self, method: Method) -> Evaluator:
        """An evaluator for the plan with another fine-tuning method (for suggestions)."""
        if method == self.plan.method:
            return self.evaluator
        found = self._variants.get(method)
        if found is None:
            found = Evaluator(self.plan.model_copy(update={"method": method}), self.arch)
            self._variants[method] = found
        return found

    def usable_bytes(self, spec: GpuSpec) -> float:
        """Memory per GPU a setup may use: the card's memory less the user's extra safety margin."""
        return usable_card_bytes(spec.memory_gib, self.constraints.safety_margin)


@quick_init
@dataclass(frozen=True)
class Setup:
    """A configuration that fits a card on a layout, with its speed (independent of any price)."""

    spec: GpuSpec
    layout: Layout
    links: Links
    cfg: Config
    peak_device_bytes: float
    throughput: Throughput
    training_s: float
    host_ram_bytes_per_node: float  # offloaded states in CPU memory (0 without offload)


class _OnSetup:
    """What a priced setup reads from its setup: the card, the layout and the device peak."""

    setup: Setup

    @property
    def spec(self) -> GpuSpec:
        return self.setup.spec

    @property
    def layout(self) -> Layout:
        return self.setup.layout

    @property
    def peak_device_bytes(self) -> float:
        return self.setup.peak_device_bytes


@quick_init
@dataclass(frozen=True)
class Candidate(_OnSetup):
    """A setup on one offer, priced on demand and (where the offer has spot and spot is allowed) on spot."""

    offer: Offer
    offer_index: int
    setup: Setup
    on_demand: RunCost
    spot: RunCost | None
    qualifies_with: PricingMode | None  # None: breaks the budget or the deadline under every pricing

    @property
    def cfg(self) -> Config:
        return self.setup.cfg

    @property
    def throughput(self) -> Throughput:
        return self.setup.throughput

    @property
    def hours(self) -> float:
        return self.on_demand.hours

    @property
    def cost_usd(self) -> float:
        return self.on_demand.expected_cost_usd

    @property
    def spot_cost_usd(self) -> float | None:
        return None if self.spot is None else self.spot.expected_cost_usd

    @property
    def spot_hours(self) -> float | None:
        return None if self.spot is None else self.spot.hours

    def pricings(self) -> tuple[RunCost, ...]:
        return (self.on_demand,) if self.spot is None else (self.on_demand, self.spot)


@dataclass(frozen=True)
class PricedSetup(_OnSetup):
    """A setup on one offer with only what a budget or deadline rejection reports: its expected cost and hours on
    demand and (where priced) on spot."""

    offer: Offer
    setup: Setup
    cost_usd: float
    hours: float
    spot_cost_usd: float | None
    spot_hours: float | None


@dataclass(frozen=True)
class Entry:
    """One line of the ranking: a candidate under one pricing."""

    candidate: Candidate
    cost: RunCost
    # Notes the ranking adds (services.planner.simpler.prefer_simpler): ``lead`` goes first, ``tail`` last.
    lead: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()

    def rank_key(self) -> tuple[float, int, int, float, float, int]:
        """Expected cost; ties (to the cent) go to fewer GPUs, then fewer nodes, then shorter time, then the cost
        before rounding (a price a hundredth of a cent lower), and only then the catalog's order."""
        c, cost = self.candidate, self.cost.expected_cost_usd
        return (round(cost, 2), c.layout.gpus, c.layout.nodes, self.cost.hours, cost, c.offer_index)


@quick_init
@dataclass(frozen=True)
class RamBlocked:
    """A configuration that fits the GPUs of a layout but not its nodes' host RAM (what it offloads is more)."""

    spec: GpuSpec
    layout: Layout
    cfg: Config
    host_ram_bytes_per_node: float


# What a host RAM rejection reads of a configuration the RAM cannot hold: a setup, or (where the RAM holds none of
# its layout's configurations, so no speed was worked out) a RamBlocked; both give the same four fields.
HostRamBlocked = RamBlocked | Setup
