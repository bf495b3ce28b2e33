"""The data sets API on SQLite and PostgreSQL with a loopback S3 server: resumable uploads, limits,
tenancy, the background check with progress and report, and plans sized from a checked data set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.api.app import create_app
from services.core.settings import Settings
from tests.api.conftest import QLORA_PLAN
from tests.conftest import bounded_test_client
from tests.datacheck.planted import Planted, write_planted
from tests.datasets.conftest import MAX_BYTES, PART_BYTES, DataApi, sha256
from tests.hub.conftest import QWEN_1_8B
from tests.hub.fake_hub import FakeHub
from tests.hub.test_tokenizer import TURKISH, small_bpe


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Planted]:
    """~11 MB with planted problems: three parts of 5 MiB."""
    path = tmp_path_factory.mktemp("big") / "train.jsonl"
    truth = write_planted(path, base_rows=1000, filler_bytes=11_000_000)
    return path.read_bytes(), truth


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Planted]:
    """Well under one part, with Turkish personal data (valid TC Kimlik, IBAN, card numbers)."""
    path = tmp_path_factory.mktemp("small") / "train.jsonl"
    truth = write_planted(path, base_rows=600, seed=11)
    return path.read_bytes(), truth


def test_resumable_upload_then_check_with_progress_and_report(data_api: DataApi, big: tuple[bytes, Planted]) -> None:
    data, truth = big
    created = data_api.create(data, sha256=sha256(data), data_country="tr")
    assert created["status"] == "uploading" and created["data_country"] == "TR"
    upload = created["upload"]
    assert (upload["part_size_bytes"], upload["parts_total"], upload["parts_missing"]) == (PART_BYTES, 3, [1, 2, 3])
    dataset_id = created["id"]
    # The connection drops after parts 1 and 3; the client asks which parts arrived.
    assert data_api.put_part(dataset_id, data, 1).status_code == 200
    assert data_api.put_part(dataset_id, data, 3).status_code == 200
    seen = data_api.client.get(f"/v1/datasets/{dataset_id}", headers=data_api.headers()).json()
    assert (seen["upload"]["parts_done"], seen["upload"]["parts_missing"]) == ([1, 3], [2])
    early = data_api.client.post(f"/v1/datasets/{dataset_id}/complete", headers=data_api.headers())
    assert early.status_code == 409 and early.json()["details"] == {"missing": [2]}
    assert "parts missing: 2" in early.json()["message"]
    assert data_api.put_part(dataset_id, data, 2).status_code == 200
    assert data_api.put_part(dataset_id, data, 1).status_code == 200  # sent again: replaces the first copy
    done = data_api.client.post(f"/v1/datasets/{dataset_id}/complete", headers=data_api.headers())
    assert done.status_code == 200 and done.json()["status"] in ("queued", "running", "done")
    body = data_api.wait_for_dataset(dataset_id)
    assert body["status"] == "done", body["error"]
    assert body["progress"] == {
        "rows_done": truth.rows_total,
        "rows_total": truth.rows_total,
        "rows_total_estimated": False,
        "percent": 100.0,
    }
    report = body["report"]
    assert report["rows_total"] == truth.rows_total
    assert report["counts"] == {
        "broken_rows": len(truth.broken),
        "encoding_problem_rows": len(truth.encoding),
        "mismatched_rows": len(truth.mismatched),
        "empty_rows": len(truth.empty),
        "short_rows": 0,
        "overlong_rows": len(truth.overlong),
        "exact_duplicates": len(truth.exact),
        "near_duplicates": len(truth.near),
    }
    assert {d["row_number"]: d["duplicate_of"] for d in report["near_duplicates"]} == truth.near
    assert {p["kind"]: p["count"] for p in report["pii"]} == truth.pii
    assert report["tokens"]["recommended_seq_len_tokens"] == 512
    # Completing again is harmless.
    again = data_api.client.post(f"/v1/datasets/{dataset_id}/complete", headers=data_api.headers())
    assert again.status_code == 200 and again.json()["status"] == "done"


def test_progress_is_stored_while_the_check_runs(
    data_api: DataApi, big: tuple[bytes, Planted], monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.datasets import service

    data, truth = big
    seen: list[dict[str, Any]] = []
    real_check = service.run_in_child

    # The check runs in its child process and sends its progress back; watch what the API stores of it.
    def check_and_watch(job: Any, report_progress: Any, *args: Any) -> Any:
        def progress(done: int, total: int) -> None:
            report_progress(done, total)  # stores it; then read it back as a client would
            body = data_api.client.get(f"/v1/datasets/{dataset_id}", headers=data_api.headers()).json()
            seen.append(body["progress"] | {"status": body["status"]})

        return real_check(job, progress, *args)

    monkeypatch.setattr(service, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(service, "run_in_child", check_and_watch)
    created = data_api.create(data)
    dataset_id = created["id"]
    for n in (1, 2, 3):
        assert data_api.put_part(dataset_id, data, n).status_code == 200
    assert data_api.client.post(f"/v1/datasets/{dataset_id}/complete", headers=data_api.headers()).status_code == 200
    assert data_api.wait_for_dataset(dataset_id)["status"] == "done"
    running = [s for s in seen if s["rows_done"] < truth.rows_total]
    assert [s["rows_done"] for s in running] == list(range(1000, truth.rows_total, 1000))
    assert all(s["status"] == "running" and s["rows_total_estimated"] for s in running)
    # Totals estimated from the bytes read: within 20% of the truth once a fifth is read.
    assert all(abs(s["rows_total"] - truth.rows_total) < 0.2 * truth.rows_total for s in running[1:])
    assert all(0 < s["percent"] < 100 for s in running)


def test_limits_and_validation_name_the_field(data_api: DataApi, small: tuple[bytes, Planted]) -> None:
    headers = data_api.headers()
    too_big = data_api.client.post(
        "/v1/datasets", json={"name": "a.jsonl", "size_bytes": MAX_BYTES + 1}, headers=headers
    )
    assert too_big.status_code == 413
    assert too_big.json()["field"] == "size_bytes" and f"{MAX_BYTES:,}" in too_big.json()["message"]
    for body, field in (
        ({"name": "data.txt", "size_bytes": 10}, "format"),
        ({"name": "a.jsonl", "size_bytes": 0}, "size_bytes"),
        ({"name": "a.jsonl", "size_bytes": 10, "data_country": "TUR"}, "data_country"),
        ({"name": "a.jsonl", "size_bytes": 10, "sha256": "abc"}, "sha256"),
        ({"name": "a.jsonl", "size_bytes": 10, "format": "xml"}, "format"),
        ({"name": "a.jsonl", "size_bytes": 10, "colour": "red"}, "colour"),
    ):
        response = data_api.client.post("/v1/datasets", json=body, headers=headers)
        assert response.status_code == 422, body
        assert field in response.json()["message"], response.json()
    data, _ = small
    created = data_api.create(data)
    url = f"/v1/datasets/{created['id']}/parts"
    assert data_api.client.put(f"{url}/0", content=b"x", headers=headers).status_code == 422
    beyond = data_api.client.put(f"{url}/2", content=b"x", headers=headers)
    assert beyond.status_code == 422 and beyond.json()["field"] == "part_number" and "1..1" in beyond.json()["message"]
    short = data_api.client.put(f"{url}/1", content=data[:-1], headers=headers)
    assert short.status_code == 422 and short.json()["field"] == "body"
    long = data_api.client.put(f"{url}/1", content=data + b"x", headers=headers)
    assert long.status_code == 413 and long.json()["field"] == "body"


def test_sha256_mismatch_is_422_and_the_upload_starts_over(data_api: DataApi, small: tuple[bytes, Planted]) -> None:
    data, _ = small
    created = data_api.create(data, sha256=sha256(b"something else"))
    assert data_api.put_part(created["id"], data, 1).status_code == 200
    response = data_api.client.post(f"/v1/datasets/{created['id']}/complete", headers=data_api.headers())
    assert response.status_code == 422 and response.json()["field"] == "sha256"
    assert sha256(data) in response.json()["message"]
    body = data_api.client.get(f"/v1/datasets/{created['id']}", headers=data_api.headers()).json()
    assert body["status"] == "uploading" and body["upload"]["parts_missing"] == [1]
    good = data_api.upload(data, sha256=sha256(data))
    assert good["status"] == "done" and good["sha256"] == sha256(data)


def test_another_organization_sees_nothing(data_api: DataApi, small: tuple[bytes, Planted]) -> None:
    data, _ = small
    created = data_api.create(data)
    dataset_id = created["id"]
    beta = data_api.headers("beta")
    assert data_api.client.get(f"/v1/datasets/{dataset_id}", headers=beta).status_code == 404
    assert data_api.client.put(f"/v1/datasets/{dataset_id}/parts/1", content=data, headers=beta).status_code == 404
    assert data_api.client.post(f"/v1/datasets/{dataset_id}/complete", headers=beta).status_code == 404
    assert data_api.client.put(f"/v1/datasets/{dataset_id}/tokenizer", content=b"{}", headers=beta).status_code == 404
    assert data_api.client.get("/v1/datasets", headers=beta).json()["items"] == []
    plan = {**{k: v for k, v in QLORA_PLAN.items() if k != "dataset"}, "dataset_id": dataset_id}
    assert data_api.client.post("/v1/plans", json=plan, headers=beta).status_code == 404
    assert [d["id"] for d in data_api.client.get("/v1/datasets", headers=data_api.headers()).json()["items"]] == [
        dataset_id
    ]


def test_no_bucket_is_a_clear_503(database_url: str) -> None:
    from services.core.db import make_engine, make_sessionmaker, unit_of_work
    from services.orgs.service import create_key, create_organization
    from tests.databases import migrate

    migrate(database_url)
    with unit_of_work(make_sessionmaker(make_engine(database_url))) as session:
        create_organization(session, "alpha")
        key = create_key(session, "alpha")
    with bounded_test_client(create_app(Settings(database_url=database_url))) as client:
        response = client.post(
            "/v1/datasets", json={"name": "a.jsonl", "size_bytes": 10}, headers={"Authorization": f"Bearer {key}"}
        )
    assert response.status_code == 503 and "GPUPLAN_S3_BUCKET" in response.json()["message"]


def test_unreadable_file_fails_with_a_readable_message(data_api: DataApi) -> None:
    body = data_api.upload(b'{"text": "not gzip at all"}\n', name="train.jsonl.gz")
    assert body["status"] == "failed" and body["report"] is None
    assert "cannot be read" in body["error"] and "gzip" in body["error"]


def _word_level_tokenizer(tmp_path: Path) -> bytes:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return (tmp_path / "tokenizer.json").read_bytes()


def test_uploaded_tokenizer_gives_exact_counts(data_api: DataApi, tmp_path: Path) -> None:
    data = b"".join(b'{"text": "%s"}\n' % (b"a " * n).strip() for n in range(1, 41))
    body = data_api.upload(data)
    assert body["report"]["tokens"]["method"] == "approx_4_chars_per_token"
    url = f"/v1/datasets/{body['id']}/tokenizer"
    bad = data_api.client.put(url, content=b'{"model": 3}', headers=data_api.headers())
    assert bad.status_code == 422 and bad.json()["field"] == "body"
    put = data_api.client.put(url, content=_word_level_tokenizer(tmp_path), headers=data_api.headers())
    assert put.status_code == 200 and put.json()["tokenizer"] is True
    checked = data_api.wait_for_dataset(body["id"])
    assert checked["status"] == "done", checked["error"]
    tokens = checked["report"]["tokens"]
    # Each row's words plus the EOS train.py appends (this tokenizer's post-processor adds no BOS).
    assert (tokens["method"], tokens["max_tokens"], tokens["p50_tokens"]) == ("tokenizer_json", 40 + 1, 20 + 1)


def test_the_datasets_model_tokenizer_from_the_hub_counts(
    data_api: DataApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No upload step: the data set names its model, the check fetches its tokenizer.json from the Hub."""
    hub = FakeHub()
    try:
        tokenizer = small_bpe()
        hub.add_model("acme/tiny-bpe", QWEN_1_8B).files["tokenizer.json"] = tokenizer.to_str().encode()
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("GPUPLAN_HUB_CACHE_DIR", str(tmp_path / "hub-cache"))
        # Each row as train.py encodes it: the tokenizer's special tokens (none here), then one EOS.
        lengths = [len(e.ids) + 1 for e in tokenizer.encode_batch(TURKISH, add_special_tokens=True)]
        data = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in TURKISH).encode()
        body = data_api.upload(data, model="acme/tiny-bpe")
        assert body["status"] == "done", body["error"]
        assert body["model"] == "acme/tiny-bpe" and body["tokenizer"] is False
        report = body["report"]
        assert report["tokenizer"] == {"source": "hub:acme/tiny-bpe", "revision": hub.repos["acme/tiny-bpe"].commit}
        assert report["tokens"]["tokens_per_epoch_packed"] == sum(lengths)
        assert report["tokens"]["max_tokens"] == max(lengths)
        missing = data_api.upload(data, name="b.jsonl", model="acme/missing")
        assert missing["report"]["tokenizer"]["source"] == "estimate: characters/4"
        assert "not found" in missing["report"]["tokenizer"]["reason"]
    finally:
        hub.close()
    bad = data_api.client.post(
        "/v1/datasets", json={"name": "c.jsonl", "size_bytes": 10, "model": "not a model"}, headers=data_api.headers()
    )
    assert bad.status_code == 422 and bad.json()["field"] == "model"


def _plan_body(dataset_id: str, **extra: Any) -> dict[str, Any]:
    return {
        **{k: v for k, v in QLORA_PLAN.items() if k not in ("dataset", "seq_len")},
        "dataset_id": dataset_id,
        **extra,
    }


def test_plan_sized_from_the_checked_data_set_with_a_kvkk_warning(
    data_api: DataApi, small: tuple[bytes, Planted]
) -> None:
    data, truth = small
    checked = data_api.upload(data, data_country="TR")
    assert checked["status"] == "done", checked["error"]
    report = checked["report"]
    response = data_api.client.post("/v1/plans", json=_plan_body(checked["id"]), headers=data_api.headers())
    assert response.status_code == 202, response.text
    plan = data_api.wait_for_plan(response.json()["id"])
    assert plan["status"] == "done", plan["error"]
    examples = report["rows_kept"] - report["validation_split"]["rows"]
    # The kept rows' lengths, every token counted (the planted empty and duplicate rows are not trained on, and the
    # plan's seq_len decides what is cut): a probe found the average over every row, cut at the recommended length.
    t = report["kept_tokens"]
    assert t["rows_counted"] == report["rows_kept"] < report["tokens"]["rows_counted"]
    assert t["tokens_per_epoch"] > t["tokens_per_epoch_packed"]  # the planted long rows, whole
    avg = round(t["tokens_per_epoch"] / t["rows_counted"], 2)
    percentiles = {k: t[k] for k in ("p50_tokens", "p90_tokens", "p99_tokens", "max_tokens")}
    assert plan["request"]["dataset"] == {"examples": examples, "avg_tokens": avg, **percentiles}
    assert plan["request"]["seq_len"] == t["recommended_seq_len_tokens"] == 512
    assert plan["request"]["dataset_id"] == checked["id"]
    warnings = "\n".join(plan["warnings"])
    assert f"{examples:,} training examples" in warnings
    assert "tokens on average (counted by estimate: characters/4)" in warnings
    # The bundled catalog's providers are outside Turkey (US regions; cloudrux's partner data centres and the
    # Vast.ai marketplace of unknown country): Turkish personal data meets KVKK, with the options named.
    kvkk = [w for w in plan["warnings"] if "KVKK" in w]
    assert kvkk and all("contractual safeguards" in w and "anonymise" in w for w in kvkk)
    unknown = ("cloudrux (partner-dc) does not say which country", "vast (marketplace) does not say which country")
    assert any(u in w for w in kvkk for u in unknown)
    assert all(k in kvkk[0] for k in truth.pii)
    cheapest = plan["recommendations"][0]
    tokens = plan["estimate"]
    assert cheapest["cost_usd"] > 0 and tokens is not None
    # The user's own seq_len wins over the recommendation.
    own = data_api.client.post("/v1/plans", json=_plan_body(checked["id"], seq_len=1024), headers=data_api.headers())
    assert data_api.wait_for_plan(own.json()["id"])["request"]["seq_len"] == 1024


def test_plan_needs_a_checked_data_set(data_api: DataApi, small: tuple[bytes, Planted]) -> None:
    data, _ = small
    created = data_api.create(data)
    response = data_api.client.post("/v1/plans", json=_plan_body(created["id"]), headers=data_api.headers())
    assert response.status_code == 409 and response.json()["field"] == "dataset_id"
    assert "uploading" in response.json()["message"]
    both = _plan_body(created["id"], dataset={"examples": 10, "avg_tokens": 10})
    response = data_api.client.post("/v1/plans", json=both, headers=data_api.headers())
    assert response.status_code == 422 and response.json()["field"] == "dataset_id"
    missing = data_api.client.post("/v1/plans", json=_plan_body("nope"), headers=data_api.headers())
    assert missing.status_code == 404 and missing.json()["field"] == "dataset_id"


def test_gdpr_warning_only_outside_the_eea(data_api: DataApi, small: tuple[bytes, Planted]) -> None:
    data, _ = small
    checked = data_api.upload(data, data_country="DE")
    body = _plan_body(checked["id"], constraints={"regions": ["us"]})
    plan = data_api.wait_for_plan(data_api.client.post("/v1/plans", json=body, headers=data_api.headers()).json()["id"])
    gdpr = [w for w in plan["warnings"] if "GDPR" in w]
    assert len(gdpr) == 1 and "is in US" in gdpr[0] and "standard contractual clauses" in gdpr[0]
