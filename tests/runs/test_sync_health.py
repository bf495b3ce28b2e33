"""Failed syncs someone sees: the agent reports its sync's health with every heartbeat (last error, bytes
not durable, since when); the node stores it, raises one alert per streak when passes keep failing or
checkpoints stay not durable past the thresholds, and shows both on the nodes page and in /metrics."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from services.agent.node import RunSync, Syncer
from services.core.db import make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.nodes.idle import SyncAlertPolicy
from services.nodes.lifecycle import record_sync_health, sync_alert_reason
from services.nodes.schemas import SyncHealth
from services.nodes.tables import NodeEventRow, NodeRow
from services.orgs.tables import AuditEvent
from services.runs.sync import SyncOptions
from services.storage.s3 import make_s3_client
from tests.dashboard.conftest import sign_in
from tests.runs.conftest import RunEnv, make_checkpoint

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
POLICY = SyncAlertPolicy(failing_s=600, unsynced_s=3600)


class _Session:
    """Collects what record_sync_health adds (events and audit rows) without a database."""

    def __init__(self) -> None:
        self.added: list[Any] = []

    def add(self, row: Any) -> None:
        self.added.append(row)

    def flush(self) -> None:
        pass


def _node() -> NodeRow:
    return NodeRow(
        id="n1",
        organization_id="o1",
        run_id=None,
        unsynced_checkpoints=0,
        sync_pending_bytes=0,
        sync_error=None,
        sync_failing_since=None,
        unsynced_since=None,
        sync_alert=None,
    )


def _kinds(session: _Session) -> list[str]:
    return [getattr(r, "kind", None) or getattr(r, "action", "") for r in session.added]


def test_a_failing_sync_alerts_once_per_streak_and_says_when_it_recovers() -> None:
    node, session = _node(), _Session()
    failing = SyncHealth(last_error="EndpointConnectionError: s3 down", pending_bytes=2**30, failing_since=T0)
    node.unsynced_checkpoints = 1
    record_sync_health(session, node, failing, T0 + timedelta(minutes=5), POLICY)  # type: ignore[arg-type]
    assert node.sync_alert is None and node.sync_failing_since == T0 and session.added == []
    record_sync_health(session, node, failing, T0 + timedelta(minutes=11), POLICY)  # type: ignore[arg-type]
    assert node.sync_alert is not None and "failing for 11 min" in node.sync_alert and "1.00 GiB" in node.sync_alert
    assert _kinds(session) == ["sync_alert", "node.sync_alert"]
    record_sync_health(session, node, failing, T0 + timedelta(minutes=30), POLICY)  # type: ignore[arg-type]
    assert len(session.added) == 2 and "failing for 30 min" in node.sync_alert  # the same streak: no new alert
    node.unsynced_checkpoints = 0
    record_sync_health(session, node, SyncHealth(), T0 + timedelta(minutes=31), POLICY)  # type: ignore[arg-type]
    assert node.sync_alert is None and node.sync_error is None and node.sync_failing_since is None
    assert _kinds(session)[-1] == "sync_ok"


def test_checkpoints_not_durable_for_too_long_alert_even_when_no_pass_fails() -> None:
    node, session = _node(), _Session()
    node.unsynced_checkpoints = 2  # e.g. a save that never completes: no pass fails, nothing is durable
    pending = SyncHealth(pending_bytes=5 * 2**30)
    record_sync_health(session, node, pending, T0, POLICY)  # type: ignore[arg-type]
    assert node.unsynced_since == T0 and node.sync_alert is None
    record_sync_health(session, node, pending, T0 + timedelta(minutes=59), POLICY)  # type: ignore[arg-type]
    assert node.sync_alert is None
    record_sync_health(session, node, pending, T0 + timedelta(minutes=61), POLICY)  # type: ignore[arg-type]
    assert node.sync_alert is not None and "2 checkpoint(s), 5.00 GiB, not durable for 61 min" in node.sync_alert
    assert sync_alert_reason(node, T0 + timedelta(minutes=61), POLICY) is not None


def test_an_agent_clock_ahead_of_the_server_cannot_postpone_or_invent_a_streak() -> None:
    node, session = _node(), _Session()
    future = SyncHealth(last_error="boom", failing_since=T0 + timedelta(days=1))
    record_sync_health(session, node, future, T0, POLICY)  # type: ignore[arg-type]
    assert node.sync_failing_since == T0  # clamped to the server's clock


def test_an_agent_clock_behind_the_server_cannot_date_a_streak_before_its_last_heartbeat() -> None:
    """A fuzzing pass (stop 49): a first failing report dated 3 h back raised the alert at once."""
    node, session = _node(), _Session()
    node.unsynced_checkpoints = 1
    node.last_heartbeat_at = T0 - timedelta(seconds=15)  # it reported no failure then
    behind = SyncHealth(last_error="boom", pending_bytes=1000, failing_since=T0 - timedelta(hours=3))
    record_sync_health(session, node, behind, T0, POLICY)  # type: ignore[arg-type]
    assert node.sync_failing_since == T0 - timedelta(seconds=15) and node.sync_alert is None
    # A streak that began while the service was unreachable still counts from the last heartbeat before it.
    node, session = _node(), _Session()
    node.unsynced_checkpoints = 1
    node.last_heartbeat_at = T0 - timedelta(hours=1)
    record_sync_health(session, node, behind, T0, POLICY)  # type: ignore[arg-type]
    assert node.sync_failing_since == T0 - timedelta(hours=1) and node.sync_alert is not None


def test_later_reports_of_a_streak_cannot_move_its_start_back_by_the_agents_clock() -> None:
    """A lifecycle probe (stop 50): with the agent 10 min behind, the second failing report dated the streak by the
    agent's clock and raised the alert 15 s after the failures began."""
    node, session = _node(), _Session()
    node.unsynced_checkpoints = 1
    node.last_heartbeat_at = T0 - timedelta(seconds=15)
    behind = SyncHealth(last_error="boom", pending_bytes=1000, failing_since=T0 - timedelta(minutes=10))
    record_sync_health(session, node, behind, T0, POLICY)  # type: ignore[arg-type]
    node.last_heartbeat_at = T0
    record_sync_health(session, node, behind, T0 + timedelta(seconds=15), POLICY)  # type: ignore[arg-type]
    assert node.sync_failing_since == T0 - timedelta(seconds=15) and node.sync_alert is None


def test_a_heartbeat_without_a_sync_report_clears_the_stale_sync_figures() -> None:
    """A lifecycle probe (stop 50): bytes once reported pending stayed on the node after its run was detached, and
    raised 'not durable for 61 min' with nothing to sync (and, now that pending bytes keep a node, would keep it)."""
    node, session = _node(), _Session()
    record_sync_health(session, node, SyncHealth(pending_bytes=5 * 2**30), T0, POLICY)  # type: ignore[arg-type]
    record_sync_health(session, node, None, T0 + timedelta(minutes=61), POLICY)  # type: ignore[arg-type]
    assert node.sync_pending_bytes == 0 and node.unsynced_since is None and node.sync_alert is None


def test_the_agent_says_uploading_only_while_a_pass_has_checkpoints_to_upload(run_env: RunEnv, tmp_path: Path) -> None:
    """A lifecycle probe (stop 50): every pass said uploading, and with a slow bucket each pass outlasted a heartbeat,
    so an idle node with nothing to sync was never stopped."""
    env, root = run_env, tmp_path / "out"
    root.mkdir()
    run = env.run()
    sync = RunSync(env.api, make_s3_client(env.s3), run["bucket"], run["prefix"], root, SyncOptions(settle_s=0), 3600)
    syncer = Syncer(sync)
    assert syncer.start(env.api) and not syncer.uploading  # nothing local to upload
    syncer.wait(60)
    make_checkpoint(root, 100, 2 * 2**20, seed=1)
    assert syncer.start(env.api) and syncer.uploading
    syncer.wait(60)
    assert not syncer.uploading and sync.unsynced() == 0


def _dead_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_an_agent_whose_uploads_fail_is_seen_on_the_nodes_page_and_in_metrics(run_env: RunEnv, tmp_path: Path) -> None:
    env = run_env
    root = tmp_path / "out"
    make_checkpoint(root, 100, 2 * 2**20, seed=1)
    agent = env.joined_agent("sync-node")
    run = env.run()
    dead = make_s3_client(
        env.s3.model_copy(update={"s3_endpoint_url": _dead_endpoint()}),
        max_attempts=1,
        connect_timeout_s=2,
        read_timeout_s=2,
    )
    sync = RunSync(env.api, dead, run["bucket"], run["prefix"], root, SyncOptions(settle_s=0), 3600)
    agent.attach_run(sync)
    assert agent.syncer is not None and agent.syncer.start(env.api)
    agent.syncer.wait(60)
    assert sync.last_error is not None and "Connect" in sync.last_error
    assert agent.heartbeat()
    node = env.client.get(f"/v1/nodes/{agent.node_id}", headers=env.headers).json()
    assert node["sync_error"] == sync.last_error and node["sync_pending_bytes"] >= 2 * 2**20
    assert node["sync_failing_since"] is not None and node["sync_alert"] is None

    # Eleven minutes of failed passes: the streak the service dated (once, at its first report) began that long
    # ago, so the next heartbeat raises the alert.
    app: Any = env.client.app
    factory = make_sessionmaker(app.state.engine)
    with unit_of_work(factory) as session:
        row = session.get(NodeRow, agent.node_id)
        assert row is not None and row.sync_failing_since is not None
        row.sync_failing_since = datetime.now(UTC) - timedelta(minutes=11)
    assert agent.heartbeat()
    node = env.client.get(f"/v1/nodes/{agent.node_id}", headers=env.headers).json()
    assert node["sync_alert"].startswith("checkpoint sync failing for 11 min")
    sign_in(env.client, env.key)
    page = env.client.get("/dashboard/nodes").text
    assert "checkpoint sync failing for 11 min" in page and "alert</span>" in page
    metrics = env.client.get("/metrics").text
    assert "gpuplan_nodes_sync_alert 1.0" in metrics and "gpuplan_nodes_sync_failing 1.0" in metrics
    assert 'gpuplan_node_sync_alerts_total{cause="failing"}' in metrics
    with unit_of_work(factory) as session:
        audits = session.scalars(select(AuditEvent).where(AuditEvent.action == "node.sync_alert")).all()
        assert [a.target for a in audits] == [f"node:{agent.node_id}"]

    # The store is back: the pass makes the checkpoint durable and the alert ends, with an event.
    sync.s3 = make_s3_client(env.s3)
    assert agent.syncer.start(env.api)
    agent.syncer.wait(60)
    assert sync.last_error is None and sync.failing_since is None and sync.unsynced() == 0
    assert agent.heartbeat()
    node = env.client.get(f"/v1/nodes/{agent.node_id}", headers=env.headers).json()
    assert node["sync_alert"] is None and node["sync_error"] is None and node["sync_pending_bytes"] == 0
    assert "gpuplan_unsynced_bytes 0.0" in env.client.get("/metrics").text
    with unit_of_work(factory) as session:
        kinds = session.scalars(
            select(NodeEventRow.kind).where(NodeEventRow.node_id == agent.node_id).order_by(NodeEventRow.created_at)
        ).all()
    assert kinds.count("sync_alert") == 1 and kinds[-1] == "sync_ok"


def test_sync_alert_thresholds_are_settings() -> None:
    from services.nodes.lifecycle import sync_alert_policy

    policy = sync_alert_policy(Settings(node_sync_alert_s=120, node_unsynced_alert_s=900))
    assert policy == SyncAlertPolicy(failing_s=120, unsynced_s=900)


def test_a_durable_checkpoint_the_bucket_lost_for_good_is_the_agents_sync_error(
    run_env: RunEnv, tmp_path: Path
) -> None:
    """The bucket lost the newest durable step and the node no longer has it: the pass cannot put it back, and the
    agent reports it as its sync error (an alert once it lasts) instead of a clean pass."""
    env = run_env
    root = tmp_path / "out"
    directory = make_checkpoint(root, 100, 2 * 2**20, seed=1)
    run = env.run()
    s3 = make_s3_client(env.s3)
    sync = RunSync(env.api, s3, run["bucket"], run["prefix"], root, SyncOptions(settle_s=0), 3600)
    assert [u.manifest.step for u in sync.pass_once(env.api).uploaded] == [100]
    sync.succeeded()
    assert sync.last_error is None
    for item in s3.list_objects_v2(Bucket=run["bucket"], Prefix=run["prefix"])["Contents"]:
        if item["Key"].endswith("/model.safetensors"):
            s3.delete_object(Bucket=run["bucket"], Key=item["Key"])
    (directory / "model.safetensors").unlink()
    result = sync.pass_once(env.api)
    assert result.lost and not result.repaired
    sync.succeeded()
    assert sync.last_error is not None and "the bucket lost model.safetensors of durable step 100" in sync.last_error
    assert sync.failing_since is not None


def test_a_complete_step_the_bucket_cannot_hold_is_the_agents_sync_error(run_env: RunEnv, tmp_path: Path) -> None:
    """A pass refuses a complete step whose file name no object key can hold (and syncs the others): only a person
    can rename it, and the node keeps it unsynced, so the agent reports it as its sync error (an alert once it
    lasts) instead of a clean pass, until a newer step is durable."""
    env = run_env
    root = tmp_path / "out"
    make_checkpoint(root, 100, 2**20, seed=1)
    bad = make_checkpoint(root, 200, 2**20, seed=2)
    odd = bad / "notes\x07.txt"  # a control character: no object key holds it
    odd.write_bytes(b"a bell in the name")
    written = (bad / "trainer_state.json").stat().st_mtime - 10  # written with the save, before its last file
    os.utime(odd, (written, written))
    run = env.run()
    sync = RunSync(env.api, make_s3_client(env.s3), run["bucket"], run["prefix"], root, SyncOptions(settle_s=0), 3600)
    result = sync.pass_once(env.api)
    assert [u.manifest.step for u in result.uploaded] == [100] and 200 in result.refused
    sync.succeeded()
    assert sync.last_error is not None and sync.last_error.startswith("step 200: complete, but not stored (")
    assert sync.failing_since is not None and sync.unsynced() == 1
    # Training saves on: a newer durable step supersedes the one the bucket could not hold (the pass that stores it
    # still says the older one was not stored; the next one finds it superseded).
    make_checkpoint(root, 300, 2**20, seed=3)
    assert [u.manifest.step for u in sync.pass_once(env.api).uploaded] == [300]
    assert 200 in sync.pass_once(env.api).superseded
    sync.succeeded()
    assert sync.last_error is None and sync.failing_since is None and sync.unsynced() == 0


def test_a_diverged_runs_nan_loss_is_sent_as_unknown_and_the_agent_goes_on(run_env: RunEnv, tmp_path: Path) -> None:
    """The Trainer logs a diverged fp16 run's loss as NaN, which JSON cannot carry: the heartbeat's encoding raised,
    and the exception ended `gpuplan agent`, leaving its node unwatched and its checkpoints unsynced (a probe of the
    node lifecycle). A step out of range had every heartbeat refused. Both are sent as unknown now."""
    env = run_env
    root = tmp_path / "out"
    checkpoint = make_checkpoint(root, 100, 2**20, seed=1)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 100, "log_history": [{"loss": NaN}]}')
    agent = env.joined_agent("nan-node")
    run = env.run()
    s3 = make_s3_client(env.s3)
    agent.attach_run(RunSync(env.api, s3, run["bucket"], run["prefix"], root, SyncOptions(settle_s=0), 3600))
    assert agent.heartbeat()
    assert env.run()["progress_step"] == 100 and env.run()["progress_loss"] is None

    (root / "gpuplan_progress.json").write_text('{"step": 1099511627776, "loss": Infinity}')
    assert agent.heartbeat()  # accepted: neither figure is sent
    (root / "gpuplan_progress.json").write_text('{"step": 120, "loss": 0.75}')
    assert agent.heartbeat()
    assert env.run()["progress_step"] == 120 and env.run()["progress_loss"] == 0.75
    assert agent.run(once=True) == "once"  # the loop itself runs through such a file
