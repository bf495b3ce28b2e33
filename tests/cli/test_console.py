"""Every `gpuplan` subcommand, run as a user runs it: the installed console script in its own process,
with PYTHONPATH pointing at this tree. The service commands run against `gpuplan serve` (embedded
SQLite, in-process tasks) with its data sets and checkpoints on the loopback S3 server."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.cli.main import build_parser
from services.storage.s3 import make_s3_client
from tests.conftest import S3_TEST_CREDENTIALS, require_trace_extra
from tests.runs.conftest import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PLAN = ROOT / "infra" / "examples" / "llama-3.1-8b-qlora.json"
GPUPLAN = Path(sys.executable).parent / "gpuplan"

# Each leaf command and the test below that drives it through the console script. A command added to
# the CLI without a console test fails test_every_command_is_driven_here.
DRIVEN = {
    "estimate": "test_estimate",
    "trace": "test_trace",
    "export": "test_export",
    "models": "test_models_and_gpus",
    "gpus": "test_models_and_gpus",
    "serve": "service (fixture)",
    "migrate": "test_migrate",
    "worker": "test_worker_and_beat_need_redis",
    "beat": "test_worker_and_beat_need_redis",
    "data check": "test_data_check",
    "data upload": "test_data_upload_wait",
    "data delete": "tests/datasets/test_delete_dataset.py::test_gpuplan_data_delete",
    "plans submit": "test_plans_submit_and_get",
    "plans get": "test_plans_submit_and_get",
    "agent": "test_agent_sync_and_restore",
    "sync": "test_agent_sync_and_restore",
    "restore": "test_agent_sync_and_restore",
    "admin create-org": "test_admin",
    "admin create-key": "test_admin",
    "admin import-offers": "test_admin",
    "admin list-keys": "test_admin_keys",
    "admin rotate-key": "test_admin_keys",
    "admin revoke-key": "test_admin_keys",
    "admin remove-provider": "tests/cli/test_catalog_cli.py::test_remove_provider",
    "catalog refresh": "tests/cli/test_catalog_cli.py::test_catalog_refresh_from_a_feed_and_a_failed_one",
    "completion": "tests/cli/test_completion.py::test_bash_completes_commands_subcommands_flags_and_choices",
}

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def gpuplan(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the installed `gpuplan` console script."""
    assert GPUPLAN.is_file(), f"{GPUPLAN} is missing: install the project (pip install -e '.[dev]')"
    return subprocess.run(
        [str(GPUPLAN), *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=env or _env(),
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def _one_error_line(result: subprocess.CompletedProcess[str], needle: str, code: int = 2) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan: error:") and needle in lines[0], result.stderr


def _leaf_commands() -> set[str]:
    import argparse

    def walk(parser: argparse.ArgumentParser, prefix: str) -> Iterator[str]:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups:
            yield prefix
            return
        for group in groups:
            for name, child in group.choices.items():
                yield from walk(child, f"{prefix} {name}".strip())

    return set(walk(build_parser(), ""))


def test_every_command_is_driven_here() -> None:
    assert _leaf_commands() == set(DRIVEN)


def test_help_lists_every_command() -> None:
    result = gpuplan("--help")
    assert result.returncode == 0
    for command in {c.split()[0] for c in DRIVEN}:
        assert command in result.stdout


def test_a_command_line_builds_the_same_parser_from_its_own_module_only(tmp_path: Path) -> None:
    """main.COMMANDS names the module of each top-level command; a command line imports that module alone, and
    its command parses as it does in the whole parser."""
    from services.cli.main import COMMANDS

    whole = build_parser()
    top = next(a for a in whole._actions if isinstance(a, argparse._SubParsersAction))
    assert [c for commands in COMMANDS.values() for c in commands] == list(top.choices)
    for command, full in top.choices.items():
        alone = build_parser(command)
        sub = next(a for a in alone._actions if isinstance(a, argparse._SubParsersAction))
        assert sub.choices[command].format_help() == full.format_help()
    # In a fresh interpreter, an estimate of a bundled model imports neither the exports, the data checks, boto3
    # nor the Hub client (huggingface_hub is imported by a fetch).
    probe = (
        "import contextlib, io, sys; from services.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    code = main(['estimate', '--model', 'meta-llama/Llama-3.1-8B', '--method', 'qlora', '--json'])\n"
        "heavy = ('services.export', 'services.datacheck', 'boto3', 'huggingface_hub')\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.stdout.strip() == "0 []", (out.stdout, out.stderr)


# --- commands that need no service ---------------------------------------------------------------


def test_estimate(tmp_path: Path) -> None:
    result = gpuplan("estimate", "--plan", str(EXAMPLE_PLAN), "--gpu", "A100 80GB", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["memory"]["peak_device_gib"] > 0 and data["throughput"]["tokens_per_s"] > 0
    table = gpuplan("estimate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--method", "qlora")
    assert table.returncode == 0 and "Peak memory per GPU" in table.stdout
    assert "is estimated as 'meta-llama/Llama-3.1-8B'" in table.stdout
    # Names that are not Hub ids (owner/name) are answered by the catalog alone.
    _one_error_line(gpuplan("estimate", "--model", "Kimi K2 Instruct"), "Nothing in it is close")
    unknown = gpuplan("estimate", "--model", "Llama-3.1-9B")
    _one_error_line(unknown, "Closest: meta-llama/Llama-3.1-8B")
    assert unknown.stderr.strip().endswith("or its config.json with --config FILE.")


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    # `gpuplan estimate ... | head`: the reader closes the pipe before gpuplan has written.
    proc = subprocess.Popen(
        [str(GPUPLAN), "estimate", "--plan", str(EXAMPLE_PLAN), "--gpu", "A100 80GB"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_models_and_gpus() -> None:
    models = gpuplan("models")
    assert models.returncode == 0
    header, rule, *rows = models.stdout.splitlines()
    assert header.split() == ["model", "type", "params", "params", "from"] and set(rule) <= {"-", " "}
    assert len(rows) >= 80 and not any(" ? " in f" {row} " for row in rows)
    santacoder = next(r for r in rows if r.startswith("bigcode/gpt_bigcode-santacoder "))
    assert santacoder.split()[-2:] == ["1.12B", "config.json"]
    llama = next(r for r in rows if r.startswith("meta-llama/Llama-3.1-8B "))
    assert llama.split()[-2:] == ["8.03B", "published"]
    gpus = gpuplan("gpus")
    assert gpus.returncode == 0
    header, _rule, *rows = gpus.stdout.splitlines()
    assert header.split() == ["GPU", "memory", "GiB", "bf16", "TFLOPs", "memory", "GB/s"]
    assert any(r.startswith("H100 SXM ") for r in rows)


def test_trace(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"model": {"config": TINY_LLAMA}, "micro_batch_size": 1, "seq_len": 128}))
    # Without torch the hint names the CPU build first, then the extra.
    no_torch = tmp_path / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text("raise ImportError('torch is not installed here')\n")
    missing = gpuplan("trace", "--plan", str(plan), env=_env(PYTHONPATH=f"{ROOT}{os.pathsep}{no_torch}"))
    _one_error_line(missing, "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert "pip install -e '.[trace]'" in missing.stderr
    require_trace_extra()
    result = gpuplan("trace", "--plan", str(plan), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["peak_allocated_gib"] > 0
    assert sum(data["breakdown"].values()) == pytest.approx(data["peak_allocated_gib"], rel=0.05, abs=0.01)


def test_export(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = gpuplan(
        "export", "--plan", str(EXAMPLE_PLAN), "--format", "hf-trainer", "--gpu", "A100 80GB", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert {"train.py", "hf_args.json"} <= {p.name for p in out.iterdir()}
    assert "start with:" in result.stdout
    _one_error_line(
        gpuplan(
            "export", "--plan", str(EXAMPLE_PLAN), "--format", "hf-trainer", "--gpu", "A100 80GB", "--out", str(out)
        ),
        "must be a new or empty directory",
    )


def test_data_check(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = [
        {"instruction": "Say hi", "input": "", "output": "Hello there, my friend, how are you today?"},
        {"prompt": "Say bye", "response": "Goodbye, my friend, see you tomorrow then."},
        {"instruction": "Thanks", "input": "", "output": "You are welcome, it was a pleasure to help."},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows) + '[{"text": broken\n')
    result = gpuplan("data", "check", str(data))
    assert result.returncode == 0, result.stderr
    assert "format alpaca" in result.stdout
    assert "1 not matching the format: row 2: fields 'prompt' / 'response'" in result.stdout
    assert "1 broken: row 4: not valid JSON" in result.stdout
    report = json.loads(gpuplan("data", "check", str(data), "--json").stdout)
    assert report["rows_kept"] == 2
    _one_error_line(gpuplan("data", "check", str(tmp_path / "missing.jsonl")), "no such file")
    (tmp_path / "folder.jsonl").mkdir()  # was "no such file" too
    _one_error_line(gpuplan("data", "check", str(tmp_path / "folder.jsonl")), "path: not a regular file")


def test_migrate(tmp_path: Path) -> None:
    result = gpuplan("migrate", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "database is at the latest migration" in result.stdout


def test_worker_and_beat_need_redis(tmp_path: Path) -> None:
    for command in ("worker", "beat"):
        result = gpuplan(command, cwd=tmp_path)
        assert result.returncode == 1 and f"{command} needs GPUPLAN_REDIS_URL" in result.stderr
    # A bad queue name is refused before the worker starts consuming anything.
    env = _env(GPUPLAN_REDIS_URL="redis://127.0.0.1:6379/15")
    refused = gpuplan("worker", "--queues", "estimate,bogus", cwd=tmp_path, env=env)
    assert refused.returncode == 1 and "--queues: unknown bogus; allowed:" in refused.stderr


def test_admin(tmp_path: Path) -> None:
    assert gpuplan("admin", "create-org", "acme", cwd=tmp_path).returncode == 0
    key = gpuplan("admin", "create-key", "--org", "acme", "--admin", cwd=tmp_path)
    assert key.returncode == 0 and key.stdout.strip().startswith("gp_")
    prices = tmp_path / "prices.csv"
    prices.write_text("provider,gpu,on_demand_usd_per_hour,spot_usd_per_hour\nacme,A100 80GB,1.89,0.99\n")
    imported = gpuplan("admin", "import-offers", str(prices), cwd=tmp_path)
    assert imported.returncode == 0 and "into the public catalog: 1 added" in imported.stderr
    _one_error_line(gpuplan("admin", "create-org", "acme", cwd=tmp_path), "already exists")


def test_admin_keys(tmp_path: Path) -> None:
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.core.errors import Unauthorized
    from services.orgs.service import authenticate

    assert gpuplan("admin", "create-org", "acme", cwd=tmp_path).returncode == 0
    args = ("--scope", "read", "--name", "grafana", "--expires-in", "3600")
    made = gpuplan("admin", "create-key", "--org", "acme", *args, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    factory = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'gpuplan.db'}"))
    with unit_of_work(factory) as session:
        assert authenticate(session, f"Bearer {key}").scopes == {"read"}

    listed = gpuplan("admin", "list-keys", "--org", "acme", "--json", cwd=tmp_path)
    items = json.loads(listed.stdout)["items"]
    assert [(i["name"], i["scopes"], i["prefix"]) for i in items] == [("grafana", ["read"], key[:10])]
    assert items[0]["expires_at"] is not None and key not in listed.stdout

    rotated = gpuplan("admin", "rotate-key", key[:10], cwd=tmp_path)
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    assert new_key.startswith("gp_") and new_key != key
    revoked = gpuplan("admin", "revoke-key", new_key[:10], cwd=tmp_path)
    assert revoked.returncode == 0 and "refused from the next request" in revoked.stderr
    with unit_of_work(factory) as session:
        for old in (key, new_key):
            with pytest.raises(Unauthorized):
                authenticate(session, f"Bearer {old}")
    table = gpuplan("admin", "list-keys", "--org", "acme", "--all", cwd=tmp_path)
    assert table.returncode == 0 and table.stdout.count("grafana") == 2

    for bad, message in (
        (("create-key", "--org", "acme", "--scope", "root"), "unknown scope 'root'"),
        (("create-key", "--org", "acme", "--scope", "agent"), "node_id"),
        (("create-key", "--org", "nobody"), "no organization named 'nobody'"),
        (("create-key", "--org", "acme", "--expires-in", "5"), "--expires-in"),
        (("revoke-key", "gp_nothing"), "no single key"),
        (("rotate-key", key[:10]), "revoked"),
    ):
        _one_error_line(gpuplan("admin", *bad, cwd=tmp_path), message)


# --- commands against a running service -----------------------------------------------------------


@dataclass
class Service:
    url: str
    key: str
    env: dict[str, str]
    bucket: str
    cwd: Path

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = httpx.post(self.url + path, json=body, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)
        assert response.status_code in (200, 201, 202), response.text
        return response.json()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def service(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`gpuplan serve` on a free port, its data sets in a fresh bucket on the loopback S3 server."""
    cwd = tmp_path_factory.mktemp("served")
    bucket = f"gpuplan-{uuid.uuid4().hex[:12]}"
    s3_env = {
        "GPUPLAN_S3_ENDPOINT_URL": s3_server,
        "GPUPLAN_S3_BUCKET": bucket,
        "GPUPLAN_S3_ACCESS_KEY_ID": S3_TEST_CREDENTIALS["s3_access_key_id"],
        "GPUPLAN_S3_SECRET_ACCESS_KEY": S3_TEST_CREDENTIALS["s3_secret_access_key"],
    }
    from services.core.settings import Settings

    make_s3_client(Settings(s3_endpoint_url=s3_server, **S3_TEST_CREDENTIALS)).create_bucket(Bucket=bucket)
    env = _env(**s3_env)
    port = _free_port()
    log = (cwd / "serve.log").open("w")
    server = subprocess.Popen(
        [str(GPUPLAN), "serve", "--port", str(port)], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (cwd / "serve.log").read_text()
            time.sleep(0.2)
        key_file = cwd / ".gpuplan" / "local-key"
        key = key_file.read_text().strip()
        # The first start writes the admin key to a file only this user can read, never to stdout.
        assert key_file.stat().st_mode & 0o777 == 0o600
        log.flush()
        printed = (cwd / "serve.log").read_text()
        assert key not in printed and "its admin API key is in .gpuplan/local-key" in printed
        yield Service(url=url, key=key, env=env, bucket=bucket, cwd=cwd)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_plans_submit_and_get(service: Service, tmp_path: Path) -> None:
    connect = ["--api", service.url, "--key", service.key]
    submitted = gpuplan("plans", "submit", *connect, "--plan", str(EXAMPLE_PLAN), env=service.env)
    assert submitted.returncode == 0, submitted.stderr
    plan_id = submitted.stdout.strip()
    done = gpuplan("plans", "submit", *connect, "--plan", str(EXAMPLE_PLAN), "--wait", env=service.env)
    assert done.returncode == 0, done.stderr
    assert ": done" in done.stdout and " x " in done.stdout
    got = gpuplan("plans", "get", plan_id, *connect, "--json", env=service.env)
    assert got.returncode == 0 and json.loads(got.stdout)["id"] == plan_id
    # Each listed setup's planner notes, word for word as the API has them (issue 22 item 4).
    done_id = done.stdout.split()[1].rstrip(":")
    body = json.loads(gpuplan("plans", "get", done_id, *connect, "--json", env=service.env).stdout)
    notes = [n for rec in body["recommendations"][:5] for n in rec["notes"]]
    assert notes and all(f"note: {n}" in done.stdout for n in notes), done.stdout
    for rec in body["recommendations"][:5]:  # the hours of the pricing shown, the card's memory as listed
        assert f"GiB, {rec['expected_hours']:.1f} h, ${rec['cost_usd']:,.2f} on demand" in done.stdout, done.stdout
    _one_error_line(gpuplan("plans", "get", "nope", *connect, env=service.env), "no plan")
    # Where the embedded service runs, its own key file is the default key (issue 23).
    local = gpuplan("plans", "get", plan_id, "--api", service.url, "--json", cwd=service.cwd, env=service.env)
    assert local.returncode == 0 and json.loads(local.stdout)["id"] == plan_id, local.stderr
    api_env = {**service.env, "GPUPLAN_API": service.url}
    by_env = gpuplan("plans", "get", plan_id, "--json", cwd=service.cwd, env=api_env)
    assert by_env.returncode == 0 and json.loads(by_env.stdout)["id"] == plan_id, by_env.stderr  # $GPUPLAN_API
    elsewhere = gpuplan("plans", "get", plan_id, "--api", service.url, cwd=tmp_path, env=service.env)
    assert elsewhere.returncode == 2 and "no API key" in elsewhere.stderr and "local-key" in elsewhere.stderr


def test_data_upload_wait(service: Service, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = [
        {"prompt": f"Question number {i}?", "completion": f"Answer number {i}, said twice: {i} {i}."}
        for i in range(200)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = gpuplan("data", "upload", str(data), "--api", service.url, "--key", service.key, "--wait", env=service.env)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("data set ") and first.endswith(": done"), result.stdout
    dataset_id = first.split()[2].rstrip(":")
    assert "200 rows, 200 kept" in result.stdout and f'"dataset_id": "{dataset_id}"' in result.stdout
    assert "uploading (after a cut: --resume" in result.stderr
    # The upload really is in the bucket, byte for byte.
    from services.core.settings import Settings

    s3 = make_s3_client(Settings(s3_endpoint_url=service.env["GPUPLAN_S3_ENDPOINT_URL"], **S3_TEST_CREDENTIALS))
    stored = [o["Size"] for o in s3.list_objects_v2(Bucket=service.bucket).get("Contents", [])]
    assert data.stat().st_size in stored
    as_json = gpuplan(
        "data", "upload", str(data), "--api", service.url, "--key", service.key, "--wait", "--json", env=service.env
    )
    assert json.loads(as_json.stdout)["report"]["rows_kept"] == 200
    _one_error_line(
        gpuplan("data", "upload", str(data), "--api", service.url, "--key", "gp_wrong", env=service.env), "API key"
    )


def test_agent_sync_and_restore(service: Service, tmp_path: Path) -> None:
    connect = ["--api", service.url, "--key", service.key]
    agent = gpuplan("agent", *connect, "--name", "console-node", "--gpu", "A100 80GB", "--once", env=service.env)
    assert agent.returncode == 0, agent.stderr
    assert "registered with" in agent.stderr and "stopped" in agent.stderr
    node = next(n for n in service.get("/v1/nodes")["items"] if n["name"] == "console-node")
    plan_id = service.post("/v1/plans", json.loads(EXAMPLE_PLAN.read_text()))["id"]
    deadline = time.monotonic() + 120
    while service.get(f"/v1/plans/{plan_id}")["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    run = service.post(
        f"/v1/plans/{plan_id}/runs",
        {"node_ids": [node["id"]], "checkpoint_dir": str(tmp_path / "out"), "bucket": service.bucket},
    )
    directory = make_checkpoint(tmp_path / "out", 300, 6 * 2**20, seed=3)
    run_args = [*connect, "--run", run["id"]]
    synced = gpuplan("sync", *run_args, "--dir", str(tmp_path / "out"), "--settle-s", "0", env=service.env)
    assert synced.returncode == 0, synced.stderr
    assert "step 300: durable" in synced.stdout
    restored = gpuplan("restore", *run_args, "--to", str(tmp_path / "back"), env=service.env)
    assert restored.returncode == 0, restored.stderr
    assert "step 300: 5 files" in restored.stdout
    back = tmp_path / "back" / "checkpoint-300"
    assert (back / "model.safetensors").read_bytes() == (directory / "model.safetensors").read_bytes()
    _one_error_line(gpuplan("restore", *run_args, "--to", str(tmp_path / "x"), "--step", "7", env=service.env), "7")
    # S3 takes parts of at most 5 GiB: a larger one would fail every pass on S3 (moto does not check it).
    big = gpuplan("sync", *run_args, "--dir", str(tmp_path / "out"), "--part-mib", "5121", env=service.env)
    _one_error_line(big, "--part-mib must be from 0 to 5120, got '5121'")
