"""A store's answer lost after it carried out the request: the client's retry must not turn success into failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.runs.manifest import MANIFEST_NAME
from services.runs.sync import read_manifest
from services.storage.s3 import make_s3_client
from tests.runs.conftest import RunEnv, make_checkpoint
from tests.runs.lossy_proxy import LossyProxy


def test_a_manifest_whose_answer_was_lost_is_still_reported_durable(
    run_env: RunEnv, live_api: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The manifest's PUT landed but its answer was lost; boto3's retry of the conditional write found a manifest (its
    own) and the pass called the step 'made durable by another writer': not reported, so the service kept offering the
    older step to restore, and a final sync (the agent's on SIGTERM, `sync --final`) left it so for good."""
    out = tmp_path / "out"
    make_checkpoint(out, 100, 2**20, seed=1)
    first_manifest_put = [True]

    def lose(method: str, path: str) -> bool:
        if method == "PUT" and path.split("?")[0].endswith("/" + MANIFEST_NAME) and first_manifest_put[0]:
            first_manifest_put[0] = False
            return True
        return False

    proxy = LossyProxy(run_env.s3.s3_endpoint_url or "", lose)
    try:
        command = [sys.executable, "-m", "services.cli.main", "sync", "--api", live_api, "--key", run_env.key,
                   "--run", run_env.run_id, "--dir", str(out), "--settle-s", "0", "--final"]  # fmt: skip
        env = {**cli_env, "GPUPLAN_S3_ENDPOINT_URL": proxy.url}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    finally:
        proxy.close()
    assert len(proxy.lost) == 1, (proxy.lost, done.stdout, done.stderr)  # the answer was lost and the client retried
    assert done.returncode == 0, done.stderr
    assert "step 100: durable" in done.stdout, (done.stdout, done.stderr)
    run = run_env.run()
    assert run["last_durable_step"] == 100 and run["checkpoints"][0]["final"] is True
    stored = read_manifest(make_s3_client(run_env.s3), run["bucket"], run["prefix"], 100)
    assert stored is not None and stored.model_dump(mode="json") == run["checkpoints"][0]["manifest"]
