"""The simpler-first rule over priced entries (constraints.prefer_simpler_within): a setup with more GPUs, more nodes,
spot or CPU offload ranks above a simpler one only when it is cheaper by more than the tolerance, with notes naming
the setups the rule weighed, and cautions on offload setups (services.planner.ranking prices what it ranks)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Callable

import numpy as np

from services.core.money import usd
from services.estimator.memory import GIB
from services.planner.context import Entry
from services.planner.host_ram import host_ram_available_bytes

# An offload setup slower than this share of the first GPU-only setup says so first.
SLOW_SHARE = 0.25

# What makes a setup harder to rent and run: GPUs, nodes, spot, CPU offload (``complexity``).
Complexity = tuple[int, int, int, int]
# One GPU on one node, on demand, without offload: no setup is simpler.
SIMPLEST: Complexity = (1, 1, 0, 0)


def complexity(e: Entry) -> Complexity:
    """What makes a setup harder to rent and run: GPUs, nodes, spot, CPU offload (larger is more complex)."""
    c = e.candidate
    return (c.layout.gpus, c.layout.nodes, int(e.cost.pricing == "spot"), int(c.cfg.cpu_offload))


def is_simpler(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether complexity ``a`` is simpler than ``b``: no larger in any respect and smaller in one."""
    return a != b and all(map(operator.le, a, b))


def setup_label(e: Entry) -> str:
    """The setup in a few words: '8 x A100 40GB spot at aws'."""
    c = e.candidate
    nodes = f" on {c.layout.nodes} nodes" if c.layout.nodes > 1 else ""
    pricing = "spot" if e.cost.pricing == "spot" else "on demand"
    offload = " with CPU offload" if c.cfg.cpu_offload else ""
    return f"{c.layout.gpus} x {c.spec.name}{nodes} {pricing}{offload} at {c.offer.provider}"


def prefer_simpler(entries: list[Entry], tolerance: float, top_n: int | None = None) -> list[Entry]:
    """``ranking``'s entries."""
    return ranking(entries, tolerance, top_n).shown


@dataclasses.dataclass
class Ranked:
    """A ranking's entries with their notes; per entry, the cost of the simpler setup its note names (infinity:
    none); and the first entry without CPU offload, which an offload entry's caution compares with."""

    shown: list[Entry]
    named: list[float]
    plain: Entry | None


def ranking(entries: list[Entry], tolerance: float, top_n: int | None = None) -> Ranked:
    """``entries`` (in cost order) reordered so that one ranks above a simpler one only when its expected cost is
    lower by more than ``tolerance``, with a note on each entry the rule concerns. With ``top_n``, only the first
    ``top_n`` of the whole order (the offload cautions still measure against the first entry without CPU offload,
    wherever it ranks).

    Returns them as a ``Ranked``: with each entry the cost of the cheapest simpler entry left when it ranked, the one
    its note names, and the first entry without offload.

    Each step takes the cheapest entry left that is cheaper by more than the tolerance than every simpler entry
    left; a simplest entry always qualifies, so every step takes one. Of a pair of which neither is simpler (2 GPUs
    on demand, 1 GPU spot) the cheaper comes first unless a simpler entry holds it back. Entries are grouped by
    complexity (a few distinct ones), so each check compares with the cheapest entry left of each simpler group.
    """
    keys = [complexity(e) for e in entries]
    costs = [e.cost.expected_cost_usd for e in entries]
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)  # each group in cost order
    simpler_groups, complex_groups = _simpler_pairs(list(groups))
    head = dict.fromkeys(groups, 0)  # per group, the position of its cheapest entry left
    taken = [False] * len(entries)

    def cheapest_left(group: tuple[int, int, int, int]) -> int | None:
        members, at = groups[group], head[group]
        while at < len(members) and taken[members[at]]:
            at += 1
        head[group] = at
        return members[at] if at < len(members) else None

    # Per group, the cost its entries must stay under to be cheaper by more than the tolerance than the cheapest
    # entry left of every simpler group: the least of those limits (with finite numbers, each check's verdict is
    # the one against every limit), and which simpler group sets it. Taking a group's cheapest entry moves only
    # that group's limit: a more complex group recomputes its own only where that group set it.
    exact = math.isfinite(tolerance) and all(math.isfinite(c) for c in costs)
    limits: dict[tuple[int, int, int, int], tuple[float, tuple[int, int, int, int] | None]] = {}

    def limit(key: tuple[int, int, int, int]) -> float:
        found = limits.get(key)
        if found is None:
            least, by = math.inf, None
            for g in simpler_groups[key]:
                j = cheapest_left(g)
                if j is not None and (1.0 - tolerance) * costs[j] < least:
                    least, by = (1.0 - tolerance) * costs[j], g
            found = limits[key] = (least, by)
        return found[0]

    def admissible(i: int) -> bool:
        if exact:
            return costs[i] < limit(keys[i])
        for g in simpler_groups[keys[i]]:
            j = cheapest_left(g)
            if j is not None and costs[i] >= (1.0 - tolerance) * costs[j]:
                return False
        return True

    left = list(range(len(entries)))
    out: list[Entry] = []
    named: list[float] = []
    plain: Entry | None = None  # the first entry without CPU offload (_caveats)
    plain_to_come = any(not e.candidate.cfg.cpu_offload for e in entries)
    while left:
        if top_n is not None and len(out) >= top_n and not plain_to_come:
            break
        pos = next(p for p, i in enumerate(left) if admissible(i))
        i = left.pop(pos)
        taken[i] = True
        group = keys[i]
        j = cheapest_left(group)
        moved = None if j is None else (1.0 - tolerance) * costs[j]
        for g in complex_groups[group]:
            known = limits.get(g)
            if known is None:
                continue
            if known[1] == group:
                del limits[g]
            elif moved is not None and moved < known[0]:
                limits[g] = (moved, group)
        if top_n is None or len(out) < top_n:
            noted, cost = _simpler_notes(entries, costs, i, simpler_groups, complex_groups, cheapest_left, tolerance)
            out.append(noted)
            named.append(cost)
        if plain_to_come and not entries[i].candidate.cfg.cpu_offload:
            plain, plain_to_come = entries[i], False
    return Ranked(_caveats(out, plain), named, plain)


# Groups from which the pairs of ``_simpler_pairs`` are one array comparison: below it, numpy's fixed cost per call
# is more than comparing the pairs one by one (instructions counted, benchmarks.planner.instructions).
ARRAY_GROUPS = 16


def _simpler_pairs(
    order: list[Complexity],
) -> tuple[dict[Complexity, list[Complexity]], dict[Complexity, list[Complexity]]]:
    """Per group, the groups simpler than it and the groups it is simpler than (``is_simpler``), each list in the
    order of ``order``. The whole catalog's ranking has dozens of groups, a card's a few."""
    if len(order) < ARRAY_GROUPS:
        simpler_groups = {
            k: [g for g in order if g[0] <= k[0] and g[1] <= k[1] and g[2] <= k[2] and g[3] <= k[3] and g != k]
            for k in order
        }
        complex_groups: dict[Complexity, list[Complexity]] = {k: [] for k in order}
        for k in order:  # the same pairs the other way round, each list in the groups' order
            for g in simpler_groups[k]:
                complex_groups[g].append(k)
        return simpler_groups, complex_groups
    table = np.array(order, dtype=np.int64)
    simpler: np.ndarray = np.all(table[:, None, :] <= table[None, :, :], axis=2)  # [g, k]: g simpler than k
    np.fill_diagonal(simpler, False)  # the groups are distinct: no larger in any respect and not equal
    columns = (list(itertools.compress(order, col)) for col in simpler.T.tolist())
    rows = (list(itertools.compress(order, row)) for row in simpler.tolist())
    return dict(zip(order, columns, strict=True)), dict(zip(order, rows, strict=True))


def _simpler_notes(
    entries: list[Entry],
    costs: list[float],
    i: int,
    simpler_groups: dict[tuple[int, int, int, int], list[tuple[int, int, int, int]]],
    complex_groups: dict[tuple[int, int, int, int], list[tuple[int, int, int, int]]],
    cheapest_left: Callable[[tuple[int, int, int, int]], int | None],
    tolerance: float,
) -> tuple[Entry, float]:
    """Entry ``i``, just ranked, with a note naming the simpler setup it passed (ranked below it), or the cheaper
    complex one within the tolerance it was preferred to; and the cost of the first (infinity: none)."""
    e, cost, key = entries[i], costs[i], complexity(entries[i])
    notes: list[str] = []
    named = math.inf
    below = [j for g in simpler_groups[key] if (j := cheapest_left(g)) is not None]
    if below:
        q = min(below, key=lambda j: costs[j])
        named = costs[q]
        notes.append(
            f"the simpler {setup_label(entries[q])} costs {usd(costs[q])}: this setup is {1 - cost / costs[q]:.0%} "
            f"cheaper, more than constraints.prefer_simpler_within ({tolerance:.0%})"
        )
    passed = [
        j
        for g in complex_groups[key]
        if (j := cheapest_left(g)) is not None and (1.0 - tolerance) * cost <= costs[j] < cost
    ]
    if passed:
        q = min(passed, key=lambda j: costs[j])
        notes.append(
            f"ranked above {setup_label(entries[q])} at {usd(costs[q])}: that is only {1 - costs[q] / cost:.0%} "
            f"cheaper, within constraints.prefer_simpler_within ({tolerance:.0%}) of this simpler setup at "
            f"{usd(cost)}"
        )
    return (dataclasses.replace(e, tail=(*e.tail, *notes)) if notes else e), named


def _caveats(out: list[Entry], gpu_only: Entry | None) -> list[Entry]:
    """A first note on each offload setup whose host RAM is unverified, or that runs at under SLOW_SHARE of
    ``gpu_only``, the first-ranked setup without offload."""
    result = []
    for e in out:
        c = e.candidate
        if not c.cfg.cpu_offload:
            result.append(e)
            continue
        parts = []
        if host_ram_available_bytes(c.offer, c.layout) is None:
            parts.append(
                f"host RAM unverified ({c.offer.provider} does not say how much CPU memory its nodes have; the "
                f"offloaded states need about {c.setup.host_ram_bytes_per_node / GIB:,.0f} GiB per node)"
            )
        speed = c.throughput.data_tokens_per_s
        if gpu_only is not None and speed < SLOW_SHARE * gpu_only.candidate.throughput.data_tokens_per_s:
            fast = gpu_only.candidate.throughput.data_tokens_per_s
            parts.append(
                f"slow: {speed:,.0f} tokens/s, under a quarter of the {fast:,.0f} tokens/s of "
                f"{setup_label(gpu_only)} without offload ({usd(gpu_only.cost.expected_cost_usd)})"
            )
        result.append(
            dataclasses.replace(e, lead=("caution, CPU offload: " + "; ".join(parts), *e.lead)) if parts else e
        )
    return result
