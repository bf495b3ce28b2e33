"""Arguments the CLI refuses in one line with a non-zero exit, never a traceback or a silent default (a fuzzing pass
of stop 49 found each of these printing a traceback, exiting 0, or hanging)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

GPUPLAN = Path(sys.executable).with_name("gpuplan")
REPO = Path(__file__).resolve().parents[2]
AGENT = ("agent", "--api", "http://127.0.0.1:9", "--key", "k", "--once", "--name", "n", "--gpu", "cpu")


def _gpuplan(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "ok.jsonl").write_text('{"text": "hello there"}\n', encoding="utf-8")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "tokenizer.json").write_text('{"not": "a tokenizer"}', encoding="utf-8")
    (tmp_path / "plan.json").write_text((REPO / "infra" / "examples" / "llama-3.1-8b-qlora.json").read_text())
    model = '"model": {"name": "meta-llama/Llama-3.1-8B"}'
    (tmp_path / "twice.json").write_text(f'{{{model}, "method": "lora", "method": "full"}}', encoding="utf-8")
    (tmp_path / "yes.json").write_text(f'{{{model}, "gradient_checkpointing": "yes"}}', encoding="utf-8")
    (tmp_path / "epochs.json").write_text(f'{{{model}, "data": {{"tokens": 100, "epochs": 1e-300}}}}', encoding="utf-8")
    llama = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    (tmp_path / "no_mlp.json").write_text(json.dumps(llama), encoding="utf-8")
    escaped = {**llama, "intermediate_size": 14336, "model_type": "llama\u001b[2J"}
    (tmp_path / "escape.json").write_text(json.dumps(escaped), encoding="utf-8")
    no_roles = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "no_roles.json").write_text(json.dumps({**no_roles, "lora": {"rank": 16, "targets": []}}))
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [str(GPUPLAN), *args], capture_output=True, text=True, timeout=60, env=full, cwd=tmp_path, check=False
    )


CASES = [
    (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--avg-tokens", "5e-324", "--examples", "10"), "avg_tokens"),
    (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--avg-tokens", "1e308", "--examples", "10"), "avg_tokens"),
    (("estimate", "--plan", "binary.json"), "--plan binary.json: not UTF-8 text"),
    # Of a key given twice the last was used; "yes" was read as true; 1e-300 epochs were priced as no run at all.
    (("estimate", "--plan", "twice.json"), "method: given more than once in one object"),
    (("estimate", "--plan", "yes.json"), "gradient_checkpointing: input should be a valid boolean (got 'yes')"),
    (("estimate", "--plan", "epochs.json"), "a run trains at least one"),
    # Missing, intermediate_size was taken as 0: an 8B Llama of 2.4B parameters with "high" confidence.
    (("estimate", "--config", "no_mlp.json"), "model.config.intermediate_size: missing"),
    # The model_type was printed as given: an escape cleared the terminal.
    (("estimate", "--config", "escape.json"), "model.config.model_type: 'llama\\x1b[2J' is no architecture name"),
    # An empty role list is a frozen base to the estimate, but PEFT refuses target_modules=[] when train.py starts.
    (("export", "--plan", "no_roles.json", "--format", "hf-trainer", "--gpu", "h100"), "lora.targets: no layer"),
    (("export", "--plan", "no_roles.json", "--format", "torchtune"), "lora.targets: no recommended setup"),
    # The planner rejects a card without bf16 for a bf16 plan; exported on it, the Trainer refused to start.
    (("export", "--plan", "plan.json", "--format", "hf-trainer", "--gpu", "T4"), "--gpu T4: it has no bf16 support"),
    # An abbreviation passed the check of an option given twice: torchtune was exported.
    (("export", "--plan", "plan.json", "--format", "axolotl", "--form", "torchtune"), "unrecognized arguments: --form"),
    (("estimate", "--model", "meta-llama/Llama-3.1-8B", "--lora-targets", ""), "--lora-targets: no role given"),
    (("data", "check", "ok.jsonl", "--write-clean", "missing/dir/out.jsonl"), "cannot write"),
    (("data", "check", "ok.jsonl", "--data-country", "ZZZ"), "not a two-letter ISO country code"),
    (("plans", "get", "../../v1/keys"), "is not an id"),
    ((*AGENT, "--price-usd-per-hour", "nan"), "--price-usd-per-hour must be a finite number"),
    ((*AGENT, "--interval", "-1"), "--interval must be from 0.1 to 150"),
    # Each heartbeat declares the interval; over half the service's lost threshold (300 s) no idle time accrued, so
    # an idle node was never stopped.
    ((*AGENT, "--interval", "301"), "--interval must be from 0.1 to 150, got '301'"),
    ((*AGENT, "--idle-minutes", "20000"), "--idle-minutes must be from 1 to 10080, got '20000'"),
    # The guard read anything below a minute as one, silently (services/cli/runs.py agent_run_setup).
    ((*AGENT, "--idle-minutes", "0"), "--idle-minutes must be from 1 to 10080, got '0'"),
    # No process has pid 0 or one past Linux's largest (2**22): the job it named was never watched.
    ((*AGENT, "--job-pid", "0"), "--job-pid must be from 1 to 4194304, got '0'"),
    ((*AGENT, "--job-pid", "99999999999"), "--job-pid must be from 1 to 4194304, got '99999999999'"),
    # A name of spaces alone was registered as the node's name.
    ((*AGENT[:-4], "--gpu", "cpu", "--name", "   "), "--name: '   ' is blank"),
    (("sync", "--dir", ".", "--run", "r1", "--settle-s", "nan"), "--settle-s must be a finite number"),
    (("serve", "--port", "99999"), "--port must be from 1 to 65535"),
    (("serve", "--workers", "0"), "--workers must be from 1 to 64"),
    # An empty host bound 127.0.0.1 silently; a malformed one printed "serving on" before uvicorn's error.
    (("serve", "--host", ""), "--host: not an IP address or host name (got '')"),
    (("serve", "--host", "bad host"), "--host: not an IP address or host name (got 'bad host')"),
    # argparse keeps the last of a repeated option: the export of the second format exited 0 (a probe of the exports).
    (("export", "--plan", "plan.json", "--format", "axolotl", "--format=torchtune"), "--format given more than once"),
    (("export", "--plan", "plan.json", "--format", "axolotl", "--out", "x" * 300), "--out xxxx"),
]


@pytest.mark.parametrize(("args", "needle"), CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_a_bad_argument_is_one_line_and_a_non_zero_exit(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    done = _gpuplan(tmp_path, *args)
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None, reason="without tokenizers the count is approximate"
)
def test_a_file_that_is_not_a_tokenizer_is_one_line(tmp_path: Path) -> None:
    done = _gpuplan(tmp_path, "data", "check", "ok.jsonl", "--tokenizer", "tokenizer.json")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "not a tokenizer.json" in done.stderr


def test_a_database_url_of_no_known_database_is_one_line(tmp_path: Path) -> None:
    done = _gpuplan(tmp_path, "migrate", env={"GPUPLAN_DATABASE_URL": "garbage://"})
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("gpuplan: error: GPUPLAN_DATABASE_URL: not a database gpuplan can open")


def test_a_data_set_with_no_rows_or_none_that_can_train_fails_the_check(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    (tmp_path / "broken.jsonl").write_text("{bad\n{worse\n", encoding="utf-8")
    empty = _gpuplan(tmp_path, "data", "check", "empty.jsonl")
    assert empty.returncode == 2 and empty.stdout == "", empty.stdout
    assert (
        empty.stderr.strip()
        == "gpuplan: error: empty.jsonl: no rows: empty, or not JSONL, a JSON array, CSV or Parquet"
    )
    for extra in ((), ("--json",)):
        broken = _gpuplan(tmp_path, "data", "check", "broken.jsonl", *extra)
        assert broken.returncode == 1 and "Traceback" not in broken.stderr, broken.stderr
        assert broken.stdout  # the report says why each row fails
        if not extra:
            assert broken.stderr.strip() == "gpuplan: error: broken.jsonl: none of its 2 rows can train"


def test_serve_refuses_an_address_it_cannot_listen_on_before_saying_it_serves(tmp_path: Path) -> None:
    # A port in use, and an address of no interface here, were "serving on ..." then uvicorn's error.
    env = {"HOME": str(tmp_path), "GPUPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args, needle in (
            (("--port", port), f"cannot listen on 127.0.0.1 port {port}: Address already in use"),
            (("--host", "192.0.2.1", "--port", port), "cannot listen on 192.0.2.1 port"),
        ):
            done = _gpuplan(tmp_path, "serve", *args, env=env)
            assert done.returncode == 2 and done.stdout == "", done.stdout
            assert done.stderr.strip() == f"gpuplan: error: {needle}" or needle in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "db.sqlite").exists()  # refused before the database is migrated
    bad = _gpuplan(tmp_path, "serve", env={**env, "GPUPLAN_HOST": " "})
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "gpuplan: error: GPUPLAN_HOST: not an IP address or host name (got ' ')"
    )
