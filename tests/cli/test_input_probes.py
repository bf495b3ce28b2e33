"""Input probes of the `gpuplan` command (files and flags): each case printed a traceback, exited 0 on a
contradiction, or left a half-written output behind. Bad input is one line on stderr and a non-zero exit, and no
output file is left."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GPUPLAN = Path(sys.executable).with_name("gpuplan")
REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "infra" / "examples" / "llama-3.1-8b-qlora.json"
GOOD_ROW = '{"text": "a perfectly ordinary training example"}\n'
# A JSON escape of a lone UTF-16 surrogate: valid JSON, but no UTF-8 file (nor tokenizer) can hold the text.
SURROGATE_ROW = '{"text": "broken \\ud800 escape in this row"}\n'
# An integer past Python's 4,300-digit conversion limit: json.loads raises a plain ValueError.
LONG_NUMBER_ROW = '{"text": "a row with a long id", "id": 1' + "0" * 5000 + "}\n"


def _gpuplan(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [str(GPUPLAN), *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=False
    )


def _one_line_error(done: subprocess.CompletedProcess[str], needle: str, status: int = 2) -> None:
    assert done.returncode == status, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr


# --- gpuplan data check ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["train.jsonl", "train.json"])
def test_a_row_with_a_number_too_long_to_read_is_a_broken_row(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text(GOOD_ROW + LONG_NUMBER_ROW, encoding="utf-8")
    else:
        path.write_text("[" + GOOD_ROW.strip() + ",\n" + LONG_NUMBER_ROW.strip() + "]", encoding="utf-8")
    done = _gpuplan(tmp_path, "data", "check", name, "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    report = __import__("json").loads(done.stdout)
    assert report["rows_kept"] == 1
    assert [r["row_number"] for r in report["broken_rows"]] == [2]


@pytest.mark.parametrize("flag", ["--write-clean", "--write-masked"])
def test_a_lone_surrogate_row_is_an_encoding_problem_and_the_output_is_whole(tmp_path: Path, flag: str) -> None:
    (tmp_path / "train.jsonl").write_text(GOOD_ROW + SURROGATE_ROW + GOOD_ROW.replace("ordinary", "other"), "utf-8")
    done = _gpuplan(tmp_path, "data", "check", "train.jsonl", flag, "out.jsonl", "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    report = __import__("json").loads(done.stdout)
    assert [r["row_number"] for r in report["encoding_problem_rows"]] == [2]
    assert report["rows_kept"] == 2
    written = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(written) == 2 and all("ordinary" in line or "other" in line for line in written)


def test_a_second_output_refused_leaves_no_first_output(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(GOOD_ROW, encoding="utf-8")
    done = _gpuplan(tmp_path, "data", "check", "train.jsonl", "--write-clean", "a.jsonl", "--write-masked", "a.jsonl")
    _one_line_error(done, "--write-masked")
    assert not (tmp_path / "a.jsonl").exists()
    done = _gpuplan(
        tmp_path, "data", "check", "train.jsonl", "--write-clean", "b.jsonl", "--write-masked", "missing/dir/m.jsonl"
    )
    _one_line_error(done, "cannot write")
    assert not (tmp_path / "b.jsonl").exists()


@pytest.mark.parametrize("name", ["train.jsonl", "train.json"])
def test_nan_infinity_and_numbers_past_a_double_are_broken_rows_and_the_clean_file_is_strict_json(
    tmp_path: Path, name: str
) -> None:
    # Python's json takes them; --write-clean wrote "n": Infinity back as a kept row, which strict readers refuse.
    rows = [
        '{"text": "one row here", "n": 1e999}',
        '{"text": "two row here", "n": NaN}',
        '{"text": "x", "n": -Infinity}',
    ]
    good = '{"text": "a perfectly ordinary training example", "n": 1.5}'
    text = "\n".join([*rows, good]) + "\n" if name.endswith("l") else "[" + ", ".join([*rows, good]) + "]"
    (tmp_path / name).write_text(text, encoding="utf-8")
    done = _gpuplan(tmp_path, "data", "check", name, "--json", "--write-clean", "clean.jsonl")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["rows_total"], report["rows_kept"], len(report["broken_rows"])) == (4, 1, 3)
    written = (tmp_path / "clean.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line, parse_constant=_refuse) for line in written] == [json.loads(good)]


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


def test_a_check_that_keeps_no_row_writes_no_output(tmp_path: Path) -> None:
    # It exits 1 (nothing can train); an empty clean file was left, which the run on the mended file then refused.
    (tmp_path / "train.jsonl").write_text('[1, 2]\n"text"\nnull\n', encoding="utf-8")
    done = _gpuplan(tmp_path, "data", "check", "train.jsonl", "--write-clean", "c.jsonl", "--write-masked", "m.jsonl")
    assert done.returncode == 1, done.stderr
    assert not (tmp_path / "c.jsonl").exists() and not (tmp_path / "m.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="without tokenizers no file is read")
@pytest.mark.parametrize(("make", "needle"), [("dir", "tokenizer_json: no such file"), ("binary", "not UTF-8")])
def test_a_tokenizer_path_that_is_no_text_file_is_one_line(tmp_path: Path, make: str, needle: str) -> None:
    (tmp_path / "train.jsonl").write_text(GOOD_ROW, encoding="utf-8")
    if make == "dir":
        (tmp_path / "tok").mkdir()
    else:
        (tmp_path / "tok").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    _one_line_error(_gpuplan(tmp_path, "data", "check", "train.jsonl", "--tokenizer", "tok"), needle)


def test_a_names_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(GOOD_ROW, encoding="utf-8")
    (tmp_path / "names.txt").write_bytes(b"Ada Lovelace\n\xff\xfe\n")
    _one_line_error(_gpuplan(tmp_path, "data", "check", "train.jsonl", "--names", "names.txt"), "--names names.txt")


# --- gpuplan export -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", ["0", "-1", "65537"])
def test_export_refuses_a_gpu_count_the_plan_cannot_hold(tmp_path: Path, gpus: str) -> None:
    done = _gpuplan(tmp_path, "export", "--plan", str(PLAN), "--format", "hf-trainer", "--gpu", "h100", "--gpus", gpus)
    _one_line_error(done, "--gpus")
    assert done.stdout == ""


def test_export_into_a_directory_that_cannot_be_made_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory", encoding="utf-8")
    done = _gpuplan(
        tmp_path, "export", "--plan", str(PLAN), "--format", "hf-trainer", "--gpu", "h100", "--out", "afile/run"
    )
    _one_line_error(done, "--out afile/run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# --- gpuplan estimate -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("--seq-len", "4096"), ("--context-len", "512")),
        (("--micro-batch-size", "8"), ("--concurrent-sequences", "2")),
    ],
)
def test_two_flags_setting_one_field_to_different_values_are_refused(
    tmp_path: Path, first: tuple[str, str], second: tuple[str, str]
) -> None:
    done = _gpuplan(tmp_path, "estimate", "--model", "meta-llama/Llama-3.1-8B", *first, *second)
    _one_line_error(done, f"{second[0]} {second[1]} contradicts {first[0]} {first[1]}")
    agreeing = _gpuplan(tmp_path, "estimate", "--model", "meta-llama/Llama-3.1-8B", *first, second[0], first[1])
    assert agreeing.returncode == 0, agreeing.stderr


# --- commands that call the service ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "api",
    ["http://[::1", "http://" + "a" * 300 + ".example.org", "http://127.0.0.1:99999", "ftp://127.0.0.1:5799", ""],
    ids=["unclosed-bracket", "label-over-63", "port-over-65535", "ftp", "empty"],
)
def test_a_service_address_that_is_no_url_is_one_line(tmp_path: Path, api: str) -> None:
    done = _gpuplan(tmp_path, "plans", "submit", "--plan", str(PLAN), "--key", "gp_x", "--api", api)
    _one_line_error(done, "is not the http(s) URL of a service")


@pytest.mark.parametrize("key", ["clé", "two\nlines", "with space"], ids=["non-ascii", "newline", "space"])
def test_an_api_key_that_cannot_be_a_header_is_one_line(tmp_path: Path, key: str) -> None:
    # Port 5799 on loopback: nothing listens there, and the key is refused before any connection is tried.
    (tmp_path / "key").write_text(key + "\n", encoding="utf-8")
    for source in (("--key", key), ("--key-file", "key")):
        done = _gpuplan(tmp_path, "plans", "get", "abc", "--api", "http://127.0.0.1:5799", *source)
        _one_line_error(done, f"{source[0]}")
        assert "not an API key" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="Parquet needs pyarrow")
def test_a_parquet_file_whose_footer_is_longer_than_the_file_is_not_readable_rather_than_over_a_limit(
    tmp_path: Path,
) -> None:
    # The 4 bytes before the trailing magic read as a footer length of 1.6 GiB in a 15-byte file.
    (tmp_path / "bad.parquet").write_bytes(b"PAR1garbagePAR1")
    done = _gpuplan(tmp_path, "data", "check", "bad.parquet", "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert "record limit" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr  # a file none of whose rows can train
    report = __import__("json").loads(done.stdout)
    assert report["broken_rows"][0]["reason"].startswith("not a readable Parquet file")


# --- gpuplan migrate / admin (the server's database) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needle"),
    [("mysql://user@127.0.0.1:5799/gpuplan", "no driver"), ("sqlite:///notes.txt", "not a database gpuplan can use")],
    ids=["driver-not-installed", "not-a-database-file"],
)
def test_a_database_url_gpuplan_cannot_use_is_one_line(tmp_path: Path, url: str, needle: str) -> None:
    if url.startswith("mysql") and importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("the MySQL driver is installed here")  # gpuplan's install has none
    (tmp_path / "notes.txt").write_text("plain text, not SQLite\n" * 10, encoding="utf-8")
    for command in (("migrate",), ("admin", "create-org", "acme")):
        done = _gpuplan(tmp_path, *command, env={"GPUPLAN_DATABASE_URL": url})
        _one_line_error(done, needle, status=1)  # the service's commands exit 1 on a database they cannot use
        assert "GPUPLAN_DATABASE_URL" in done.stderr
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "plain text, not SQLite\n" * 10


# Nothing listens on loopback port 5799: a worker that got past its arguments could not reach a broker there.
UNREACHABLE_BROKER = {"GPUPLAN_REDIS_URL": "redis://127.0.0.1:5799/10"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--concurrency", "-1"), "--concurrency must be from 1 to 64"),
        (("--concurrency", "0"), "--concurrency must be from 1 to 64"),
        (("--concurrency", "100000"), "--concurrency must be from 1 to 64"),
        (("--queues", ",,"), "--queues: no queue named"),
    ],
    ids=["negative", "zero", "fork-bomb", "no-queue"],
)
def test_a_worker_setting_celery_cannot_run_is_one_line(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    env = {**UNREACHABLE_BROKER, "GPUPLAN_DATABASE_URL": f"sqlite:///{tmp_path / 'gpuplan.db'}"}
    done = _gpuplan(tmp_path, "worker", *args, env=env)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr[-2000:]


def test_an_export_that_fails_part_way_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A disk that fills up at launch.sh (in-process: root writes anywhere, so no permission makes the write fail).
    from services.cli.main import main

    real_write_text = Path.write_text

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "launch.sh":
            raise OSError(28, "No space left on device")
        return real_write_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = tmp_path / "run"
    argv = ["export", "--plan", str(PLAN), "--format", "hf-trainer", "--gpu", "h100", "--out", str(out)]
    assert main(argv) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "empty").mkdir()
    assert main([*argv[:-1], str(tmp_path / "empty")]) == 2
    assert list((tmp_path / "empty").iterdir()) == []  # the user's empty directory stays, and stays empty


@pytest.mark.parametrize("flag", ["--write-clean", "--write-masked"])
def test_a_data_set_copy_that_fails_part_way_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # The disk fills up after the first row is written (in-process, for the same reason as above).
    import services.datacheck.report as report
    from services.cli.main import main

    def rows_then_full_disk(path: object) -> object:
        yield 1, {"text": "a perfectly ordinary training example"}
        raise OSError(28, "No space left on device", "out.jsonl")

    (tmp_path / "train.jsonl").write_text(GOOD_ROW * 3, encoding="utf-8")
    monkeypatch.setattr(report, "load_rows", rows_then_full_disk)
    monkeypatch.chdir(tmp_path)
    assert main(["data", "check", "train.jsonl", flag, "out.jsonl"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
