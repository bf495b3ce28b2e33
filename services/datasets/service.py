"""Data sets: resumable upload sessions over S3 multipart uploads, the check as a background task, and
what a plan takes from a checked data set."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from services.core.db import new_id, unit_of_work, utcnow
from services.core.errors import Conflict, GpuplanError, NotFound, PayloadTooLarge, TooManyRequests, Unprocessable
from services.core.leases import SweepDecision, held_after_releasing_dead
from services.core.retry import describe, is_transient
from services.core.settings import Settings
from services.core.tasks import PendingTasks
from services.datacheck import (
    FILE_FORMATS,
    DataCheckError,
    counter_from_json,
    data_location_warning,
    file_format,
)
from services.datasets.isolation import TOKENIZER_MAX_BYTES as TOKENIZER_MAX_BYTES
from services.datasets.isolation import CheckJob, run_in_child, run_job
from services.datasets.repository import DatasetRepository
from services.datasets.schemas import (
    DatasetCreate,
    DatasetOut,
    DatasetProgress,
    DatasetSummary,
    DatasetUpload,
)
from services.datasets.storage import object_sha256, s3_client, storage_error
from services.datasets.tables import DatasetPartRow, DatasetRow
from services.estimator.errors import EstimatorError
from services.orgs.repository import OrganizationRepository
from services.orgs.service import Principal
from services.storage.s3 import default_location

log = logging.getLogger("gpuplan.datasets")

CHECK_TASK = "gpuplan.datasets.check"
S3_MAX_PARTS = 10_000
# Each list of problem rows in the stored report holds at most this many (counts stay exact).
REPORT_LIST_LIMIT = 100
# Progress is written to the database at most this often during a check.
PROGRESS_EVERY_S = 1.0


class StorageUnavailable(GpuplanError):
    """Object storage refused or did not answer: 503, the message says what it said."""

    status_code = 503
    code = "storage_unavailable"


_storage_error = storage_error


def _format_of(body: DatasetCreate) -> tuple[str, bool]:
    gzipped = body.gzip if body.gzip is not None else body.name.lower().endswith(".gz")
    if body.format is not None:
        return body.format, gzipped
    try:
        return file_format(body.name), gzipped
    except DataCheckError:
        raise Unprocessable(
            f"format: cannot tell the format from the name {body.name!r}; give format, one of "
            f"{', '.join(FILE_FORMATS)}, or a name ending in one of them (optionally .gz)",
            field="format",
        ) from None


def _model_of(name: str | None) -> str | None:
    """The data set's model as given, once it names a bundled model or is a Hub id (else a 422 on model)."""
    if name is None:
        return None
    from services.hub.tokenizer import hub_repo_id

    try:
        hub_repo_id(name)
    except (Unprocessable, EstimatorError):
        raise Unprocessable(
            f"model: {name.strip()!r:.120} is neither a bundled model nor a Hugging Face model id (owner/name)",
            field="model",
        ) from None
    return name.strip()


def create(session: Session, principal: Principal, body: DatasetCreate, settings: Settings) -> DatasetRow:
    """Open an upload session: a multipart upload in the bucket and the row that tracks its parts."""
    OrganizationRepository(session).lock(principal.organization_id)
    fmt, gzipped = _format_of(body)
    if body.size_bytes > settings.dataset_max_bytes:
        raise PayloadTooLarge(
            f"size_bytes: {body.size_bytes:,} bytes is over this server's limit of {settings.dataset_max_bytes:,} "
            "bytes (GPUPLAN_DATASET_MAX_BYTES)",
            field="size_bytes",
        )
    part = settings.dataset_part_bytes
    if math.ceil(body.size_bytes / part) > S3_MAX_PARTS:
        raise PayloadTooLarge(
            f"size_bytes: {body.size_bytes:,} bytes needs more than {S3_MAX_PARTS:,} parts of {part:,} bytes; "
            f"the largest upload with this part size (GPUPLAN_DATASET_PART_BYTES) is {S3_MAX_PARTS * part:,} bytes",
            field="size_bytes",
        )
    check_dataset_quota(session, principal.organization_id, settings, body.size_bytes)
    location = default_location(settings, "datasets")
    dataset_id = new_id()
    key = location.key(principal.organization_id, dataset_id, f"data.{fmt}" + (".gz" if gzipped else ""))
    try:
        upload = s3_client(settings).create_multipart_upload(Bucket=location.bucket, Key=key)
    except (ClientError, BotoCoreError) as exc:
        raise StorageUnavailable(_storage_error(exc)) from None
    return DatasetRepository(session).add(
        DatasetRow(
            id=dataset_id,
            organization_id=principal.organization_id,
            name=body.name,
            file_format=fmt,
            gzipped=gzipped,
            size_bytes=body.size_bytes,
            sha256=body.sha256.lower() if body.sha256 else None,
            data_country=body.data_country.upper() if body.data_country else None,
            model=_model_of(body.model),
            status="uploading",
            bucket=location.bucket,
            object_key=key,
            upload_id=upload["UploadId"],
            part_size_bytes=part,
        )
    )


def check_dataset_quota(session: Session, organization_id: str, settings: Settings, new_bytes: int = 0) -> None:
    """429 when the organization stores its quota of data sets, or ``new_bytes`` more would pass its byte
    quota (call under the organization's lock: :meth:`OrganizationRepository.lock`)."""
    count, stored = session.execute(
        select(func.count(), func.coalesce(func.sum(DatasetRow.size_bytes), 0)).where(
            DatasetRow.organization_id == organization_id
        )
    ).one()
    if settings.quota_datasets and count >= settings.quota_datasets:
        raise TooManyRequests(
            f"quota: {settings.quota_datasets} stored data sets per organization; delete one first",
            retry_after_s=3600,
            field="datasets",
        )
    if settings.quota_dataset_bytes and int(stored) + new_bytes > settings.quota_dataset_bytes:
        raise TooManyRequests(
            f"quota: {settings.quota_dataset_bytes:,} stored data set bytes per organization "
            f"({int(stored):,} stored, {new_bytes:,} asked)",
            retry_after_s=3600,
            field="size_bytes",
        )


def get(session: Session, principal: Principal, dataset_id: str) -> DatasetRow:
    row = DatasetRepository(session).get_for_org(principal.organization_id, dataset_id)
    if row is None:
        raise NotFound(f"no data set {dataset_id!r}", field="id")
    return row


def datasets_page(
    session: Session, principal: Principal, limit: int, before: str | None
) -> tuple[Sequence[DatasetRow], str | None]:
    """A page of the organization's data sets, newest first."""
    return DatasetRepository(session).page_for_org(principal.organization_id, limit, before)


def parts_total(row: DatasetRow) -> int:
    return math.ceil(row.size_bytes / row.part_size_bytes)


def part_size(row: DatasetRow, part_number: int) -> int:
    """The exact size part `part_number` must have (every part is full but the last)."""
    total = parts_total(row)
    if not 1 <= part_number <= total:
        raise Unprocessable(
            f"part_number: {part_number} is outside 1..{total} (a {row.size_bytes:,}-byte file in parts of "
            f"{row.part_size_bytes:,} bytes)",
            field="part_number",
        )
    if part_number < total:
        return row.part_size_bytes
    return row.size_bytes - (total - 1) * row.part_size_bytes


def expected_part_size(session: Session, principal: Principal, dataset_id: str, part_number: int) -> int:
    """Check that a part may be sent now; its required size in bytes."""
    row = get(session, principal, dataset_id)
    if row.status != "uploading":
        raise Conflict(f"data set {dataset_id} is {row.status}: its upload is complete", field="id")
    return part_size(row, part_number)


def put_part(
    session: Session, principal: Principal, dataset_id: str, part_number: int, data: bytes, settings: Settings
) -> DatasetRow:
    """Store one part in the multipart upload (a part sent again replaces the earlier one)."""
    row = get(session, principal, dataset_id)
    if row.status != "uploading":
        raise Conflict(f"data set {dataset_id} is {row.status}: its upload is complete", field="id")
    wanted = part_size(row, part_number)
    if len(data) != wanted:
        raise Unprocessable(
            f"body: part {part_number} must be exactly {wanted:,} bytes, got {len(data):,}", field="body"
        )
    try:
        answer = s3_client(settings).upload_part(
            Bucket=row.bucket, Key=row.object_key, UploadId=row.upload_id, PartNumber=part_number, Body=data
        )
    except (ClientError, BotoCoreError) as exc:
        raise StorageUnavailable(_storage_error(exc)) from None
    repo = DatasetRepository(session)
    existing = repo.part(row.id, part_number)
    if existing is not None:
        existing.etag, existing.size_bytes = answer["ETag"], len(data)
        return row
    try:
        repo.add_part(
            DatasetPartRow(dataset_id=row.id, part_number=part_number, size_bytes=len(data), etag=answer["ETag"])
        )
    except IntegrityError:
        raise Conflict(
            f"part_number: part {part_number} arrived twice at once; send it again", field="part_number"
        ) from None
    return row


def complete(
    session: Session, principal: Principal, dataset_id: str, settings: Settings, pending: PendingTasks
) -> tuple[DatasetRow, Unprocessable | None]:
    """Finish the upload and queue the check. A SHA-256 mismatch is returned (not raised) so that the
    reset upload session is committed: the client sends the parts again."""
    row = get(session, principal, dataset_id)
    if row.status != "uploading":
        return row, None  # completing twice is harmless
    repo = DatasetRepository(session)
    parts = repo.parts(row.id)
    done = {p.part_number for p in parts}
    missing = [n for n in range(1, parts_total(row) + 1) if n not in done]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise Conflict(
            f"parts missing: {shown} ({len(missing)} of {parts_total(row)}); PUT them, then complete",
            field="parts",
            details={"missing": missing},
        )
    received = sum(p.size_bytes for p in parts)
    if received != row.size_bytes:
        raise Unprocessable(f"size_bytes: {received:,} bytes received, {row.size_bytes:,} declared", field="size_bytes")
    client = s3_client(settings)
    try:
        client.complete_multipart_upload(
            Bucket=row.bucket,
            Key=row.object_key,
            UploadId=row.upload_id,
            MultipartUpload={"Parts": [{"ETag": p.etag, "PartNumber": p.part_number} for p in parts]},
        )
        if row.sha256 is not None:
            digest, size = object_sha256(client, row.bucket, row.object_key)
        else:
            digest, size = None, int(client.head_object(Bucket=row.bucket, Key=row.object_key)["ContentLength"])
    except (ClientError, BotoCoreError) as exc:
        raise StorageUnavailable(_storage_error(exc)) from None
    problem = None
    if size != row.size_bytes:
        problem = Unprocessable(
            f"size_bytes: the stored object has {size:,} bytes, {row.size_bytes:,} declared; send the parts again",
            field="size_bytes",
        )
    elif digest is not None and digest != row.sha256:
        problem = Unprocessable(
            f"sha256: the uploaded bytes hash to {digest}, not the declared {row.sha256}; send the parts again",
            field="sha256",
        )
    if problem is not None:
        _restart_upload(session, row, client)
        return row, problem
    row.upload_id = None
    row.uploaded_at = utcnow()
    row.status = "queued"
    pending.enqueue(CHECK_TASK, row.id)
    return row, None


def _restart_upload(session: Session, row: DatasetRow, client: Any) -> None:
    """Drop the stored object and the received parts, and open a fresh multipart upload."""
    try:
        client.delete_object(Bucket=row.bucket, Key=row.object_key)
        row.upload_id = client.create_multipart_upload(Bucket=row.bucket, Key=row.object_key)["UploadId"]
    except (ClientError, BotoCoreError) as exc:
        raise StorageUnavailable(_storage_error(exc)) from None
    for part in DatasetRepository(session).parts(row.id):
        session.delete(part)


def set_tokenizer(
    session: Session,
    principal: Principal,
    dataset_id: str,
    data: bytes,
    settings: Settings,
    pending: PendingTasks,
) -> DatasetRow:
    """Store a tokenizer.json for exact token counts; a data set already checked is checked again."""
    row = get(session, principal, dataset_id)
    if row.status in ("queued", "running"):
        raise Conflict(f"data set {dataset_id} is being checked; send the tokenizer when it is done", field="id")
    try:
        text = data.decode("utf-8")
        parsed = json.loads(text)
    # ValueError beyond JSONDecodeError: an integer of more than 4,300 digits; RecursionError: deep nesting (both
    # were a 500). Not json_limits.loads: a real tokenizer.json's vocabulary holds far more than its MAX_ITEMS.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Unprocessable(f"body: not a JSON tokenizer.json ({exc})", field="body") from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("model"), dict):
        raise Unprocessable(
            "body: a tokenizer.json (Hugging Face tokenizers format) is an object with a 'model' object",
            field="body",
        )
    try:
        counter_from_json(text)
    except ValueError as exc:
        raise Unprocessable(f"body: {exc}", field="body") from None
    key = row.object_key.rsplit("/", 1)[0] + "/tokenizer.json"
    try:
        s3_client(settings).put_object(Bucket=row.bucket, Key=key, Body=data)
    except (ClientError, BotoCoreError) as exc:
        raise StorageUnavailable(_storage_error(exc)) from None
    row.tokenizer_key = key
    if row.status in ("done", "failed"):
        _queue_again(row, pending)
    return row


def recheck(session: Session, principal: Principal, dataset_id: str, pending: PendingTasks) -> DatasetRow:
    """Queue the check again (after a failure, or to pick up a new tokenizer)."""
    row = get(session, principal, dataset_id)
    if row.status == "uploading":
        raise Conflict(f"data set {dataset_id} is still uploading; complete the upload first", field="id")
    if row.status in ("done", "failed"):
        _queue_again(row, pending)
    return row


def _queue_again(row: DatasetRow, pending: PendingTasks) -> None:
    """Queue a finished data set's check again. The report of the check before goes: its counts are no longer
    the data set's (a new tokenizer counts otherwise; the file may no longer be read), and a check that then fails
    must not leave them shown beside its error as if current. A plan waits for the new check (plan_data)."""
    row.status = "queued"
    row.error = None
    row.report = None
    row.rows_done, row.rows_total, row.rows_total_estimated = 0, None, True
    pending.enqueue(CHECK_TASK, row.id)


def delete(session: Session, principal: Principal, dataset_id: str, settings: Settings) -> None:
    """Delete a data set: its stored objects (the file, its tokenizer.json, an unfinished multipart upload),
    its parts and its row. Plans made from it keep the numbers they took; a new plan naming it is a 404. The
    objects go first: storage that does not answer is a 503 and the data set stays, whole, to delete again."""
    row = get(session, principal, dataset_id)
    client = s3_client(settings)
    try:
        if row.upload_id is not None:
            try:
                client.abort_multipart_upload(Bucket=row.bucket, Key=row.object_key, UploadId=row.upload_id)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                    raise
        for key in _stored_keys(client, row):
            client.delete_object(Bucket=row.bucket, Key=key)
    except (ClientError, BotoCoreError) as exc:
        raise StorageUnavailable(_storage_error(exc)) from None
    DatasetRepository(session).delete(row)


def _stored_keys(client: Any, row: DatasetRow) -> list[str]:
    """The data set's objects: its file and tokenizer.json, and anything else under its own folder (the key
    prefix that ends in its id, which no other data set shares)."""
    keys = {row.object_key, *([row.tokenizer_key] if row.tokenizer_key else [])}
    folder = row.object_key.rsplit("/", 1)[0]
    if folder.rsplit("/", 1)[-1] == row.id:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=row.bucket, Prefix=folder + "/"):
            keys.update(o["Key"] for o in page.get("Contents", []))
    return sorted(keys)


# --- the background check -------------------------------------------------------------------------


def run_check(factory: sessionmaker[Session], settings: Settings, dataset_id: str) -> None:
    """queued -> running -> done/failed; a finished check delivered again does nothing. A transient
    database fault is retried with backoff (settings.transient_retry_*), the check failed only after the
    last attempt, naming its error."""
    retries = settings.retry_policy()
    try:
        retries.run(lambda: _run_check_once(factory, settings, dataset_id))
    except Exception as exc:
        if not is_transient(exc):
            raise
        _finish(
            factory,
            dataset_id,
            error=f"the database failed {retries.attempts} times while checking; last error: {describe(exc)}",
        )


def _run_check_once(factory: sessionmaker[Session], settings: Settings, dataset_id: str) -> None:
    with unit_of_work(factory) as session:
        row = DatasetRepository(session).get(dataset_id)
        if row is None or row.status not in ("queued", "running"):
            return
        row.status = "running"
        row.started_at = utcnow()
        row.finished_at = None
        row.attempts = (row.attempts or 0) + 1
        row.rows_done, row.rows_total, row.rows_total_estimated = 0, None, True
        name, fmt, gzipped, size = row.name, row.file_format, row.gzipped, row.size_bytes
        bucket, key, tokenizer_key, model = row.bucket, row.object_key, row.tokenizer_key, row.model
    last_write = time.monotonic()

    def progress(done: int, total: int) -> None:
        nonlocal last_write
        now = time.monotonic()
        if now - last_write < PROGRESS_EVERY_S:
            return
        last_write = now
        with unit_of_work(factory) as session:
            current = DatasetRepository(session).get(dataset_id)
            if current is not None and current.status == "running":
                current.rows_done, current.rows_total = done, total

    job = CheckJob(settings, name, fmt, gzipped, size, bucket, key, tokenizer_key, REPORT_LIST_LIMIT, model)
    try:
        # In a child process capped in memory (isolation.py) unless the limit is 0.
        if settings.datacheck_memory_limit_bytes:
            report = run_in_child(job, progress, settings.datacheck_memory_limit_bytes, settings.task_time_limit_s)
        else:
            report = run_job(job, progress)
    except (DataCheckError, ValueError) as exc:
        _finish(factory, dataset_id, error=str(exc))
        return
    except (ClientError, BotoCoreError) as exc:
        _finish(factory, dataset_id, error=_storage_error(exc))
        return
    except Exception as exc:
        if is_transient(exc):
            raise  # retried by run_check
        log.exception("check of data set %s failed", dataset_id)
        _finish(factory, dataset_id, error=f"internal error while checking: {type(exc).__name__}")
        return
    _finish(factory, dataset_id, report=report)


def _finish(
    factory: sessionmaker[Session], dataset_id: str, *, report: dict[str, Any] | None = None, error: str | None = None
) -> None:
    with unit_of_work(factory) as session:
        row = DatasetRepository(session).get(dataset_id)
        if row is None or row.status != "running":
            return
        if report is not None:
            row.report = report
            row.rows_done = row.rows_total = int(report["rows_total"])
            row.rows_total_estimated = False
            row.status = "done"
        else:
            # No report beside the error: counts from a check before this one are not the data set's now.
            row.report = None
            row.error = error
            row.status = "failed"
        row.finished_at = utcnow()


def give_up_abandoned(factory: sessionmaker[Session], decision: SweepDecision) -> None:
    """A lease sweep hook: a check delivered too often without finishing is recorded as failed."""
    if decision.action == "abandon" and decision.task_name == CHECK_TASK:
        _finish(
            factory,
            decision.subject_id,
            error=f"the worker died {decision.deliveries} times while checking this data set; gave up",
        )


def check_task(factory: sessionmaker[Session], settings: Settings) -> Callable[[str], None]:
    """The check task bound to this process's session factory and settings."""

    def run(dataset_id: str) -> None:
        run_check(factory, settings, dataset_id)

    return run


def resume_unfinished(factory: sessionmaker[Session], pending: PendingTasks) -> int:
    """Re-enqueue checks left queued or running by a stopped process (in-process tasks die with it);
    a check a live worker holds the lease of is left to it."""
    with unit_of_work(factory) as session:
        held = held_after_releasing_dead(session, CHECK_TASK)
        repo = DatasetRepository(session)
        ids = [dataset_id for dataset_id in repo.unfinished_ids() if dataset_id not in held]
        repo.requeue_running(ids)
    for dataset_id in ids:
        pending.enqueue(CHECK_TASK, dataset_id)
    return len(ids)


# --- views ----------------------------------------------------------------------------------------


def to_out(session: Session, row: DatasetRow) -> DatasetOut:
    parts = DatasetRepository(session).parts(row.id)
    total = parts_total(row)
    done = sorted(p.part_number for p in parts)
    done_set = set(done)
    percent = None
    if row.status == "done":
        percent = 100.0
    elif row.rows_total:
        percent = round(min(99.9, 100.0 * row.rows_done / row.rows_total), 1)
    return DatasetOut(
        id=row.id,
        name=row.name,
        status=row.status,
        file_format=row.file_format,
        gzipped=row.gzipped,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        data_country=row.data_country,
        tokenizer=row.tokenizer_key is not None,
        model=row.model,
        created_at=row.created_at,
        uploaded_at=row.uploaded_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        attempts=row.attempts or 0,
        upload=DatasetUpload(
            part_size_bytes=row.part_size_bytes,
            parts_total=total,
            parts_done=done if row.status == "uploading" else list(range(1, total + 1)),
            parts_missing=[n for n in range(1, total + 1) if n not in done_set] if row.status == "uploading" else [],
            bytes_received=sum(p.size_bytes for p in parts) if row.status == "uploading" else row.size_bytes,
            part_url=f"/v1/datasets/{row.id}/parts/{{n}}",
            complete_url=f"/v1/datasets/{row.id}/complete",
        ),
        progress=DatasetProgress(
            rows_done=row.rows_done or 0,
            rows_total=row.rows_total,
            rows_total_estimated=row.rows_total_estimated,
            percent=percent,
        ),
        report=row.report,
        error=row.error,
    )


def to_summary(row: DatasetRow) -> DatasetSummary:
    return DatasetSummary(
        id=row.id,
        name=row.name,
        status=row.status,
        size_bytes=row.size_bytes,
        created_at=row.created_at,
    )


# --- what a plan takes from a checked data set ----------------------------------------------------


@dataclass(frozen=True)
class PlanData:
    """The sizes and warnings a plan takes from a checked data set."""

    dataset_id: str
    examples: int
    avg_tokens: float
    # The 50th, 90th and 99th percentile and the longest row, in tokens (the check's counting method).
    length_percentiles: tuple[int, int, int, int]
    recommended_seq_len: int
    warnings: tuple[str, ...]
    pii_kinds: tuple[str, ...]
    data_country: str | None


def _length_percentiles(tokens: dict[str, Any]) -> tuple[int, int, int, int]:
    """p50, p90, p99 and the maximum of the rows' token counts (at least 1 token each, never decreasing)."""
    out: list[int] = []
    for key in ("p50_tokens", "p90_tokens", "p99_tokens", "max_tokens"):
        out.append(max(1, int(tokens[key]), *out))
    return out[0], out[1], out[2], out[3]


def plan_data(session: Session, organization_id: str, dataset_id: str) -> PlanData:
    """Training examples (kept rows less the validation split), average tokens, seq_len and warnings."""
    row = DatasetRepository(session).get_for_org(organization_id, dataset_id)
    if row is None:
        raise NotFound(f"dataset_id: no data set {dataset_id!r}", field="dataset_id")
    if row.status != "done" or row.report is None:
        hint = f": {row.error}" if row.status == "failed" and row.error else ""
        raise Conflict(
            f"dataset_id: data set {dataset_id} is {row.status}{hint}; a plan can use it once its check is done "
            f"(GET /v1/datasets/{dataset_id})",
            field="dataset_id",
        )
    report = row.report
    tokens = report["tokens"]
    counts = report.get("counts", {})
    if report.get("file_problem"):
        # A trainer's JSON loader reads none of such a file; the rows before the break priced a plan (a probe).
        raise Unprocessable(
            f"dataset_id: data set {row.name} cannot be loaded whole ({report['file_problem']}): a JSON loader "
            "reads none of it; fix the file and upload it again",
            field="dataset_id",
        )
    training_rows = int(report["rows_kept"]) - int(report["validation_split"]["rows"])
    if training_rows <= 0:
        # A plan priced at one example of one token is no plan (a probe: an all-empty file, one of the wrong format).
        raise Unprocessable(
            f"dataset_id: data set {row.name} has no row to train on ({report['rows_total']:,} rows, "
            f"{report['rows_kept']:,} kept: see its report's broken, mismatched, empty and duplicate rows)",
            field="dataset_id",
        )
    examples = training_rows
    # The kept rows' lengths, every token counted: the plan's own seq_len decides what is cut or packed (the
    # estimator's data model). Reports from before keep the old reading: all rows, cut at the recommended seq_len.
    kept = report.get("kept_tokens")
    if kept is not None and kept.get("tokens_per_epoch") is not None and int(kept["rows_counted"]) > 0:
        tokens = kept
        avg_tokens = max(1.0, float(kept["tokens_per_epoch"]) / int(kept["rows_counted"]))
    else:
        avg_tokens = max(1.0, float(tokens["tokens_per_epoch_packed"]) / max(1, int(tokens["rows_counted"])))
    # Reports checked before the tokenizer entry existed name only the method.
    counted_by = (report.get("tokenizer") or {}).get("source") or tokens["method"]
    warnings = [
        f"data set {row.name}: {examples:,} training examples ({report['rows_kept']:,} kept of "
        f"{report['rows_total']:,} rows, {report['validation_split']['rows']:,} held out for validation), "
        f"{avg_tokens:,.0f} tokens on average (counted by {counted_by})"
    ]
    dropped = {k: counts.get(k, 0) for k in ("broken_rows", "encoding_problem_rows", "mismatched_rows", "empty_rows")}
    dropped["duplicates"] = counts.get("exact_duplicates", 0) + counts.get("near_duplicates", 0)
    if any(dropped.values()):
        listed = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in dropped.items() if v)
        warnings.append(f"data set {row.name}: {listed} left out of the example count; clean them before training")
    if tokens["truncated_rows"]:
        warnings.append(
            f"data set {row.name}: {tokens['truncated_rows']:,} rows ({tokens['truncated_share']:.2%}) are longer "
            f"than the recommended seq_len {tokens['recommended_seq_len_tokens']} and would be truncated"
        )
    warnings.extend(f"data set {row.name}: {note}" for note in tokens.get("notes", ()))
    kinds = tuple(str(p["kind"]) for p in report.get("pii", ()))
    if kinds and row.data_country is None:
        warnings.append(
            f"data set {row.name}: holds personal data ({', '.join(kinds)}); give data_country when uploading "
            "to check where it may be processed"
        )
    return PlanData(
        dataset_id=row.id,
        examples=examples,
        avg_tokens=round(avg_tokens, 2),
        length_percentiles=_length_percentiles(tokens),
        recommended_seq_len=int(tokens["recommended_seq_len_tokens"]),
        warnings=tuple(warnings),
        pii_kinds=kinds,
        data_country=row.data_country,
    )


@dataclass(frozen=True)
class _Kind:
    kind: str


def location_warnings(data: PlanData, places: Sequence[tuple[str, str, str]]) -> list[str]:
    """Data-location warnings for the (provider, region, country) of each recommended setup: one per
    provider country outside the data's home country ('' = a country the catalog does not know)."""
    if not data.pii_kinds or data.data_country is None:
        return []
    findings = [_Kind(k) for k in data.pii_kinds]
    out: list[str] = []
    seen: set[str] = set()
    for provider, region, country in places:
        where = country.strip().upper()
        if where in seen:
            continue
        seen.add(where)
        warning = data_location_warning(
            findings, data.data_country, where or None, provider_label=f"{provider} ({region})"
        )
        if warning is not None:
            out.append(warning)
    return out
