"""Lifecycle probes: a user's training loop, the sync, retention and restore through the real API and bucket."""

from __future__ import annotations

from pathlib import Path

from services.agent.node import RunSync
from services.runs.sync import SyncOptions, read_manifest
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint

MiB = 2**20
OPTIONS = SyncOptions(part_size=5 * MiB, multipart_threshold=5 * MiB, settle_s=0)


def test_a_metric_written_after_the_checkpoint_became_durable_reaches_retention(
    run_env: RunEnv, tmp_path: Path
) -> None:
    """The docs let `gpuplan_metric.json` come after the marker (an evaluation that outlasts the settle time). It was
    then a local file "changed after durable": the node was kept as unsynced for good, the sync alert raised, and the
    metric never reached the service, so keep_best deleted the best checkpoint from the bucket."""
    run_id = run_env.new_run(retention={"keep_last": 1, "keep_best": True, "metric_mode": "min"})
    run = run_env.client.get(f"/v1/runs/{run_id}", headers=run_env.headers).json()
    api = type(run_env.api)(run_env.client, run_env.key, run_id)
    s3, out = make_s3_client(run_env.s3), tmp_path / "out"
    sync = RunSync(api=api, s3=s3, bucket=run["bucket"], prefix=run["prefix"], checkpoint_dir=out, options=OPTIONS)
    for step, loss in ((100, 0.2), (200, 0.5), (300, 0.7)):
        directory = make_checkpoint(out, step, 1 * MiB, seed=step)
        result = sync.pass_once(api)
        assert step in [u.manifest.step for u in result.uploaded]
        # The evaluation ends after the sync made the checkpoint durable.
        (directory / "gpuplan_metric.json").write_text(f'{{"metric": {loss}}}')
        sync.pass_once(api)
        sync.succeeded()
        assert sync.changed == {}, sync.changed
        assert sync.last_error is None, sync.last_error
        assert sync.unsynced() == 0
    checkpoints = {c["step"]: c for c in api.run()["checkpoints"]}
    assert api.run()["best_step"] == 100
    assert checkpoints[100]["status"] == "durable" and checkpoints[100]["metric"] == 0.2
    assert checkpoints[200]["status"] == "deleted"
    # The bucket's manifest carries it too (`restore --from-bucket --best` ranks by it); its files are as uploaded.
    stored = read_manifest(s3, run["bucket"], run["prefix"], 100)
    assert stored is not None and stored.metric == 0.2
    assert [f.path for f in stored.files] == [f["path"] for f in checkpoints[100]["manifest"]["files"]]
