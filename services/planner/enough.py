"""When the search over more nodes may stop: setups that are enough (one fits without offload or an 8-bit optimizer and,
with a deadline, meets it on demand and on spot), and whether offload is walked over more nodes for a deadline."""

from __future__ import annotations

from collections.abc import Sequence

from services.planner.context import PlanContext, Setup
from services.planner.costs import RunShape, run_cost


def enough(ctx: PlanContext, found: list[Setup]) -> bool:
    """Whether setups make more nodes pointless: one fits without offload or an 8-bit optimizer (those
    only fit, slowly) and, with a deadline, meets it."""
    return verdicts(ctx, found)[0]


def verdicts(ctx: PlanContext, found: list[Setup]) -> tuple[bool, bool]:
    """Whether setups are ``enough``, and whether one of them offloads, in one pass (a walk reads both of each
    step)."""
    deadline, offload = ctx.constraints.deadline_hours, ctx.plan.cpu_offload
    done = offloads = False
    for s in found:
        cfg = s.cfg
        offloads = offloads or cfg.cpu_offload
        if not done and cfg.optimizer is None and cfg.cpu_offload == offload:
            done = deadline is None or meets_deadline(ctx, s, deadline)
    return done, offloads


def meets_deadline(ctx: PlanContext, s: Setup, deadline: float) -> bool:
    """Whether the setup meets the deadline on every offer of its shape: its whole run on demand (start-up, download,
    training, checkpoints, rework: what the deadline is checked against, costs.run_cost) on the catalog's offer
    slowest to start and, where spot is allowed, its spot run under each of the catalog's spot risks. Training alone
    under the deadline was taken for enough, and setups on more nodes that would have met it were never searched (a
    planner probe of stop 49); so was on demand alone, and a spot run on one more node, cheaper than any on demand,
    was missed (a probe of stop 56: 62 of 792 constrained plans)."""
    if s.training_s / 3600.0 > deadline:
        return False
    offer = ctx.memo.slowest_start
    if offer is None:
        return True
    key = (s.layout, s.training_s)
    hours = ctx.memo.deadline_hours.get(key)
    if hours is None:
        sizes = ctx.sizes
        shape = RunShape(
            s.layout.gpus,
            s.layout.nodes,
            s.training_s,
            sizes.model_download_bytes,
            sizes.checkpoint_bytes,
            sizes.final_upload_bytes,
            sizes.checkpoint_write_s,
        )
        c = ctx.constraints
        hours = run_cost(offer, shape, "on_demand", restart_s=c.restart_s).hours
        for spot in ctx.memo.spot_risks:  # spot adds rework and waits for capacity
            rate = c.preemptions_per_hour
            hours = max(
                hours, run_cost(spot, shape, "spot", preemptions_per_node_hour=rate, restart_s=c.restart_s).hours
            )
        ctx.memo.deadline_hours[key] = hours
    return bool(ctx.constraints.meets_deadline(hours))


def meets_any(ctx: PlanContext, found: Sequence[Setup]) -> bool:
    """Whether one of the setups, offload or not, meets the deadline (``meets_deadline``)."""
    deadline = ctx.constraints.deadline_hours
    return deadline is not None and any(meets_deadline(ctx, s, deadline) for s in found)


def offload_for_deadline(ctx: PlanContext, found: list[Setup]) -> bool:
    """Whether a walk without offload leaves the deadline unmet by every setup found, so offload is walked over more
    nodes too: sharded over more nodes it offloads less per node and can meet it (a probe of stop 56: 70B full on
    aws 8 x A10G took 22.35 h on one node, 11.70 h on four with offload, and was rejected as the fastest)."""
    c = ctx.constraints
    if c.deadline_hours is None or not c.allow_cpu_offload or ctx.plan.cpu_offload:
        return False
    return not meets_any(ctx, found)
