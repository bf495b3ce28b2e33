from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.main import main

CASES = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy" / "cases.jsonl"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def case_plan(tmp_path: Path) -> Path:
    case = json.loads(CASES.read_text().splitlines()[0])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(case["plan"]))
    return path


def test_estimate_json_has_the_design_fields(capsys: pytest.CaptureFixture[str], case_plan: Path) -> None:
    code, out, _ = _run(capsys, "estimate", "--plan", str(case_plan), "--json")
    assert code == 0
    data = json.loads(out)
    mem = data["memory"]
    assert mem["peak_allocated_gib"] < mem["peak_reserved_gib"] < mem["peak_device_gib"]
    assert sum(mem["breakdown"].values()) == pytest.approx(mem["peak_device_gib"], abs=0.01)
    assert {f["gpu"] for f in data["fits"]} >= {"A100 80GB", "RTX 4090"}
    assert data["throughput"] is None
    assert isinstance(data["warnings"], list)


def test_gpu_adds_throughput(capsys: pytest.CaptureFixture[str], case_plan: Path) -> None:
    code, out, _ = _run(capsys, "estimate", "--plan", str(case_plan), "--gpu", "A100 80GB", "--json")
    assert code == 0
    tp = json.loads(out)["throughput"]
    assert tp["gpu"] == "A100 80GB" and tp["tokens_per_s"] > 0


def test_a_benchmark_case_file_is_accepted_as_a_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "case.json"
    path.write_text(CASES.read_text().splitlines()[5])
    assert _run(capsys, "estimate", "--plan", str(path), "--json")[0] == 0


def test_table_output_from_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "qlora",
        "--lora-rank",
        "16",
        "--seq-len",
        "2048",
        "--micro-batch-size",
        "2",
        "--gradient-checkpointing",
        "--gpu",
        "a100-80gb",
        "--dataset-tokens",
        "10000000",
        "--epochs",
        "2",
    )
    assert code == 0
    assert "Peak memory per GPU" in out and "Fits on:" in out and "tokens/s" in out
    assert "Cost for 20.0M tokens" in out


def test_flags_override_the_plan_file(capsys: pytest.CaptureFixture[str], case_plan: Path) -> None:
    _, base, _ = _run(capsys, "estimate", "--plan", str(case_plan), "--json")
    _, bigger, _ = _run(capsys, "estimate", "--plan", str(case_plan), "--micro-batch-size", "8", "--json")
    assert json.loads(bigger)["memory"]["peak_allocated_gib"] > json.loads(base)["memory"]["peak_allocated_gib"]


def test_own_config_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 512,
                "intermediate_size": 1024,
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "vocab_size": 1000,
            }
        )
    )
    code, out, _ = _run(capsys, "estimate", "--config", str(config), "--json")
    assert code == 0 and json.loads(out)["parameters"]["total"] > 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "--model", "meta-llama/Llama-3.1-9B"], "model.name"),
        (["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "Voodoo 5"], "gpu: unknown GPU"),
        (["estimate", "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "0"], "seq_len"),
        (
            ["estimate", "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "lots"],
            "--seq-len must be an integer",
        ),
        (["estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "lorra"], "invalid choice"),
        (["estimate", "--plan", "/does/not/exist.json"], "cannot read"),
        (["estimate"], "no model"),
        (["bogus"], "invalid choice"),
    ],
)
def test_errors_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    code, out, err = _run(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan: error:") and needle in lines[0]


def test_invalid_json_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": ')
    code, _, err = _run(capsys, "estimate", "--plan", str(bad))
    assert code == 2 and "not valid JSON" in err


def test_installed_command_runs_without_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "estimate", "--model", "nope/none"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.startswith("gpuplan: error:")


def test_models_and_gpus_lists(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "models")
    assert code == 0 and "meta-llama/Llama-3.1-8B" in out
    code, out, _ = _run(capsys, "gpus")
    assert code == 0 and "H100 SXM" in out


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"GPUPLAN_PORT": "abc"}, "GPUPLAN_PORT"),
        ({"GPUPLAN_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"}, "cannot reach the database"),
    ],
)
def test_bad_service_settings_are_one_line(env: dict[str, str], needle: str, tmp_path: Path) -> None:
    import os

    out = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "migrate"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}, **env},
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuplan: error:") and needle in lines[0]


def test_admin_commands(tmp_path: Path) -> None:
    import os

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}}

    def gp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli.main", *args], capture_output=True, text=True, cwd=tmp_path, env=env
        )

    assert gp("admin", "create-org", "acme").returncode == 0
    key = gp("admin", "create-key", "--org", "acme")
    assert key.returncode == 0 and key.stdout.strip().startswith("gp_") and len(key.stdout.strip().splitlines()) == 1
    again = gp("admin", "create-org", "acme")
    assert again.returncode == 2 and "already exists" in again.stderr
    bad = tmp_path / "prices.csv"
    bad.write_text("provider,gpu,on_demand_usd_per_hour\nx,Voodoo 5,1\n")
    rejected = gp("admin", "import-offers", str(bad))
    assert rejected.returncode == 2 and "row 1: gpu" in rejected.stderr


def test_plans_submit_and_get_against_a_running_service(tmp_path: Path) -> None:
    import os
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        key = (tmp_path / ".gpuplan" / "local-key").read_text().strip()
        plan = tmp_path / "plan.json"
        plan.write_text(
            json.dumps(
                {
                    "model": {"name": "meta-llama/Llama-3.1-8B"},
                    "method": "qlora",
                    "dataset": {"examples": 1000, "avg_tokens": 512},
                    "epochs": 1,
                }
            )
        )
        api = f"http://127.0.0.1:{port}"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.cli.main",
                "plans",
                "submit",
                "--api",
                api,
                "--key",
                key,
                "--plan",
                str(plan),
                "--wait",
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert ": done" in done.stdout and " x " in done.stdout
        missing = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "plans", "get", "nope", "--api", api, "--key", key],
            capture_output=True,
            text=True,
            env=env,
        )
        assert missing.returncode == 2 and missing.stderr.startswith("gpuplan: error: no plan")
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_data_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "train.jsonl"
    rows = [
        {"instruction": "Say hi", "input": "", "output": "Hello there, my friend, how are you today?"},
        {"instruction": "Contact", "input": "", "output": "write to ali.veli@example.com please, thanks a lot"},
        {"instruction": "Say hi", "input": "", "output": "Hello there, my friend, how are you today?"},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    clean = tmp_path / "clean.jsonl"
    code, out, _ = _run(
        capsys,
        "data",
        "check",
        str(data),
        "--data-country",
        "TR",
        "--provider-country",
        "US",
        "--write-clean",
        str(clean),
    )
    assert code == 0
    assert "format alpaca" in out and "row 4" in out and "1 exact" in out and "KVKK" in out
    assert len(clean.read_text().splitlines()) == 2
    assert data.read_text().count("\n") == 4  # the original is untouched
    code, _, err = _run(capsys, "data", "check", str(tmp_path / "missing.jsonl"))
    assert code == 2 and err.startswith("gpuplan: error:")


def test_ctrl_c_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from services.cli import catalog

    def interrupted(_args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog, "cmd_models", interrupted)
    code, out, err = _run(capsys, "models")
    assert (code, out, err) == (130, "", "gpuplan: interrupted\n")
