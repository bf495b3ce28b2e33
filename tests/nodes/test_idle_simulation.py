"""A day of synthetic heartbeats for many nodes through the real heartbeat service and idle sweep.

Each node follows a script of segments (training, a long setup with the GPU idle, uploading, an
interactive session, idle with checkpoints not yet durable, truly idle, hung). The script is the ground
truth of when a node is busy; the sweep only sees heartbeats. A stopped node stays off until its
script has work again (its user starts it). Checked: no busy node is ever stopped, every idle stretch
ends in a stop within the idle threshold plus one sweep interval of the first idle heartbeat, hung
nodes are marked lost and never stopped, and each decision in the log names its reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.nodes.drivers import NodeTarget
from services.nodes.lifecycle import sweep
from services.nodes.schemas import GpuStatus, Heartbeat, NodeRegistration
from services.nodes.service import heartbeat, register_node
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.service import Principal, create_organization
from services.runs.service import record_heartbeat_progress
from tests.databases import migrate

START = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
DAY_MIN = 24 * 60
HEARTBEAT_MIN = 1
SWEEP_MIN = 2
IDLE_MIN = 15
LOST_AFTER_S = 300

# (state, busy per the ground truth)
STATES = {
    "train": True,
    "setup": True,  # a job is running, the GPU is idle (downloading, tokenising, compiling)
    "upload": True,  # the job ended, checkpoints are uploading
    "interactive": True,  # someone is working in a shell or notebook
    "unsynced": True,  # idle, but checkpoints are not durable: a final sync first
    "idle": False,
    "hung": False,  # the machine stops answering: no more heartbeats
}


@dataclass
class SimNode:
    name: str
    script: list[tuple[int, str]]  # (start minute, state), sorted
    id: str = ""
    on: bool = True
    unsynced: int = 0
    sync_requested: bool = False
    synced_at: int | None = None  # the minute the final sync finished
    heartbeats: list[tuple[int, str]] = field(default_factory=list)  # (minute, state reported)

    def busy(self, minute: int) -> bool:
        """The ground truth: busy by the script; idle-but-unsynced is busy until its sync finished."""
        state = self.state(minute)
        if state == "unsynced":
            return self.synced_at is None or minute <= self.synced_at
        return STATES[state]

    def state(self, minute: int) -> str:
        current = self.script[0][1]
        for start, state in self.script:
            if start <= minute:
                current = state
        return current


class RecordingDriver:
    name = "recording"

    def __init__(self) -> None:
        self.stops: list[tuple[str, datetime]] = []

    def stop(self, node: NodeTarget) -> str:
        self.stops.append((node.id, self.now))
        return "stopped"

    def start(self, node: NodeTarget) -> str:
        return "started"

    now: datetime = START


def _scripts(rng: random.Random) -> list[SimNode]:
    nodes = []
    for i in range(8):  # training with pauses, some long enough to stop the node
        script, t = [], 0
        while t < DAY_MIN:
            script.append((t, "train"))
            t += rng.randint(60, 240)
            script.append((t, "idle"))
            t += rng.choice([5, 10, 14, 40, 90])
        nodes.append(SimNode(f"train-{i}", script))
    for i in range(6):  # a long setup with the GPU idle, then training, then idle
        setup = rng.randint(30, 120)
        nodes.append(SimNode(f"setup-{i}", [(0, "setup"), (setup, "train"), (setup + 300, "idle")]))
    for i in range(6):  # training, a long upload, then idle
        end = rng.randint(100, 600)
        nodes.append(SimNode(f"upload-{i}", [(0, "train"), (end, "upload"), (end + rng.randint(20, 90), "idle")]))
    for i in range(5):  # interactive sessions with gaps
        script, t = [], 0
        while t < DAY_MIN:
            script.append((t, "interactive"))
            t += rng.randint(30, 120)
            script.append((t, "idle"))
            t += rng.randint(5, 60)
        nodes.append(SimNode(f"interactive-{i}", script))
    for i in range(5):  # idle with checkpoints not yet durable
        end = rng.randint(60, 400)
        nodes.append(SimNode(f"unsynced-{i}", [(0, "train"), (end, "unsynced")]))
    for i in range(5):  # truly idle from the start
        nodes.append(SimNode(f"idle-{i}", [(0, "idle")]))
    for i in range(5):  # hung: heartbeats stop
        nodes.append(SimNode(f"hung-{i}", [(0, "train"), (rng.randint(60, 1200), "hung")]))
    return nodes


def _heartbeat_body(node: SimNode, state: str, rng: random.Random) -> Heartbeat:
    utilisation = rng.uniform(85, 99) if state == "train" else rng.uniform(0, 3)
    return Heartbeat(
        gpus=[GpuStatus(index=0, utilisation_pct=utilisation, memory_used_gib=1.0, memory_total_gib=80.0)],
        job_running=state in ("train", "setup"),
        uploading=state == "upload",
        interactive_idle_s=rng.uniform(0, 120) if state == "interactive" else None,
        unsynced_checkpoints=node.unsynced,
    )


def test_a_day_of_heartbeats_stops_every_idle_node_and_no_busy_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sim.db'}"
    migrate(url)
    factory = make_sessionmaker(make_engine(url))
    rng = random.Random(42)
    nodes = _scripts(rng)
    driver = RecordingDriver()
    with unit_of_work(factory) as session:
        org = create_organization(session, "sim")
        principal = Principal(org.id, org.name, False)
        tokens = {}
        for node in nodes:
            row, tokens[node.name] = register_node(
                session, principal, NodeRegistration(name=node.name, gpu="A100 80GB")
            )
            node.id = row.id
    by_id = {n.id: n for n in nodes}
    stopped_at: dict[str, list[int]] = {n.id: [] for n in nodes}

    for minute in range(DAY_MIN):
        now = START + timedelta(minutes=minute)
        with unit_of_work(factory) as session:
            for node in nodes:
                state = node.state(minute)
                if state == "unsynced" and node.unsynced == 0 and not node.sync_requested:
                    node.unsynced = 2  # the trainer just saved; the agent has not synced yet
                    node.sync_requested = True
                if not node.on:
                    if STATES[state]:
                        node.on = True  # the user starts the machine again for new work
                    else:
                        continue
                if state == "hung" or minute % HEARTBEAT_MIN:
                    continue
                _, commands = heartbeat(
                    session,
                    principal,
                    node.id,
                    _heartbeat_body(node, state, rng),
                    LOST_AFTER_S,
                    now,
                    token=tokens[node.name],
                    record_progress=record_heartbeat_progress,
                )
                node.heartbeats.append((minute, state))
                if "sync" in commands:
                    node.unsynced = 0  # the agent ran the final sync; the next heartbeat says so
                    node.synced_at = minute
            if minute % SWEEP_MIN == 1:
                driver.now = now
                summary = sweep(session, now, driver, LOST_AFTER_S)
                for node_id in summary.stopped:
                    by_id[node_id].on = False
                    stopped_at[node_id].append(minute)

    with unit_of_work(factory) as session:
        events = session.scalars(select(NodeEventRow).order_by(NodeEventRow.created_at)).all()
        rows = {r.id: r for r in session.scalars(select(NodeRow)).all()}

    stops = stretches = 0
    for node in nodes:
        for minute in stopped_at[node.id]:
            stops += 1
            # Never a busy node: the ground truth at the moment of the stop (and the heartbeat it
            # rested on) says idle, with every checkpoint durable.
            assert not node.busy(minute), f"{node.name} stopped while {node.state(minute)} at {minute}"
            last = max(m for m, _ in node.heartbeats if m <= minute)
            assert not node.busy(last)
        # Every idle stretch with heartbeats ends in a stop within threshold + one sweep interval.
        for start, state in node.script:
            if state != "idle":
                continue
            end = next((s for s, _ in node.script if s > start), DAY_MIN)
            first_idle_hb = next((m for m, st in node.heartbeats if start <= m < end and st == "idle"), None)
            if first_idle_hb is None:
                continue  # the node was already off when this stretch began
            deadline = first_idle_hb + IDLE_MIN + SWEEP_MIN
            if deadline >= min(end, DAY_MIN):
                continue  # work came back (or the day ended) before the stop was due
            stretches += 1
            stop = next((m for m in stopped_at[node.id] if start <= m), None)
            assert stop is not None and stop <= deadline, f"{node.name}: idle from {first_idle_hb}, stop {stop}"
        if node.name.startswith("hung"):
            hung_at = next(s for s, st in node.script if st == "hung")
            assert rows[node.id].status == "lost" and not stopped_at[node.id]
            lost = next(e for e in events if e.node_id == node.id and e.kind == "lost")
            delay = (lost.created_at - (START + timedelta(minutes=hung_at))).total_seconds()
            assert delay <= LOST_AFTER_S + SWEEP_MIN * 60 + HEARTBEAT_MIN * 60
        if node.name.startswith("unsynced"):
            kinds = [e.kind for e in events if e.node_id == node.id]
            assert "sync_requested" in kinds and kinds.index("sync_requested") < kinds.index("stop")
            # Idle from the first heartbeat after the sync: stopped within threshold + one sweep.
            assert node.synced_at is not None
            first_idle_hb = min(m for m, _ in node.heartbeats if m > node.synced_at)
            assert stopped_at[node.id] and stopped_at[node.id][0] <= first_idle_hb + IDLE_MIN + SWEEP_MIN
    assert stops >= 40 and stretches >= 30, (stops, stretches)

    # The log explains every decision: stops give the idle time against the threshold, keep-alives
    # name what keeps the node busy, and each kind of busy node has its reason on record.
    for event in events:
        assert event.reason
        if event.kind == "stop":
            assert ">= 15 min" in event.reason and event.details["driver"] == "recording"
        if event.kind == "keep" and event.details["code"].startswith("busy"):
            assert event.reason.startswith("busy: ")
    reasons = {(by_id[e.node_id].name.split("-")[0], e.details.get("code")) for e in events}
    for expected in [
        ("setup", "busy:job"),
        ("upload", "busy:upload"),
        ("interactive", "busy:interactive"),
        ("unsynced", "busy:unsynced"),
        ("train", "busy:job+gpu"),
        ("hung", "lost"),
    ]:
        assert expected in reasons, expected
