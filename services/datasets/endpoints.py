from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from services.api.deps import DbDep, PageCursor, PrincipalDep, SettingsDep
from services.api.routing import OffLoopRoute, off_loop
from services.core.errors import PayloadTooLarge, Unprocessable
from services.datasets import service
from services.datasets.schemas import DatasetCreate, DatasetList, DatasetOut

# Bodies are parsed and validated off the event loop (services/api/routing.py).
router = APIRouter(prefix="/v1", tags=["datasets"], route_class=OffLoopRoute)

PartNumber = Annotated[int, Path(ge=1, le=service.S3_MAX_PARTS, description="1-based part number")]
DatasetId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the data set's id")]


async def _read_body(request: Request, limit: int, field: str = "body") -> bytes:
    """The request body, read as it arrives and refused as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"{field}: {int(declared):,} bytes is over the {limit:,} allowed here", field=field)
    data = bytearray()
    async for chunk in request.stream():
        data.extend(chunk)
        if len(data) > limit:
            raise PayloadTooLarge(f"{field}: more than the {limit:,} bytes allowed here", field=field)
    return bytes(data)


@router.post("/datasets", operation_id="datasets-create", status_code=201, response_model=DatasetOut)
def create_dataset(
    body: DatasetCreate, db: DbDep, principal: PrincipalDep, settings: SettingsDep, response: Response
) -> DatasetOut:
    """Open a resumable upload: then PUT each part's raw bytes to upload.part_url and POST complete_url."""
    with db.transaction() as (session, _pending):
        out = service.to_out(session, service.create(session, principal, body, settings))
    response.headers["Location"] = f"/v1/datasets/{out.id}"
    return out


@router.get("/datasets", operation_id="datasets-list", response_model=DatasetList)
def list_datasets(
    db: DbDep, principal: PrincipalDep, limit: Annotated[int, Query(ge=1, le=200)] = 50, before: PageCursor = None
) -> DatasetList:
    """The organization's data sets, newest first, a page at a time (``next_cursor`` names the next page)."""
    with db.transaction() as (session, _pending):
        rows, cursor = service.datasets_page(session, principal, limit, before)
        return DatasetList(items=[service.to_summary(r) for r in rows], next_cursor=cursor)


@router.get("/datasets/{dataset_id}", operation_id="datasets-get", response_model=DatasetOut)
def get_dataset(dataset_id: DatasetId, db: DbDep, principal: PrincipalDep) -> DatasetOut:
    """Status, the parts received (to resume an upload), the check's progress and its report."""
    with db.transaction() as (session, _pending):
        return service.to_out(session, service.get(session, principal, dataset_id))


@router.put("/datasets/{dataset_id}/parts/{part_number}", operation_id="datasets-put-part", response_model=DatasetOut)
async def put_part(
    dataset_id: DatasetId,
    part_number: PartNumber,
    request: Request,
    db: DbDep,
    principal: PrincipalDep,
    settings: SettingsDep,
) -> DatasetOut:
    """One part's raw bytes (application/octet-stream): exactly part_size_bytes, the last part the rest."""

    def expected() -> int:
        with db.transaction() as (session, _pending):
            return service.expected_part_size(session, principal, dataset_id, part_number)

    size = await run_in_threadpool(expected)
    data = await _read_body(request, size)
    if len(data) != size:
        raise Unprocessable(f"body: part {part_number} must be exactly {size:,} bytes, got {len(data):,}", field="body")

    def store() -> DatasetOut:
        with db.transaction() as (session, _pending):
            row = service.put_part(session, principal, dataset_id, part_number, data, settings)
            return service.to_out(session, row)

    return await run_in_threadpool(store)


@router.post("/datasets/{dataset_id}/complete", operation_id="datasets-complete", response_model=DatasetOut)
@off_loop
def complete_upload(dataset_id: DatasetId, db: DbDep, principal: PrincipalDep, settings: SettingsDep) -> DatasetOut:
    """Assemble the parts, verify size (and SHA-256 when declared) and queue the check."""
    with db.transaction() as (session, pending):
        row, problem = service.complete(session, principal, dataset_id, settings, pending)
        out = service.to_out(session, row)
    if problem is not None:
        raise problem
    return out


@router.put("/datasets/{dataset_id}/tokenizer", operation_id="datasets-put-tokenizer", response_model=DatasetOut)
async def put_tokenizer(
    dataset_id: DatasetId, request: Request, db: DbDep, principal: PrincipalDep, settings: SettingsDep
) -> DatasetOut:
    """The model's tokenizer.json (Hugging Face tokenizers format) for exact token counts."""
    data = await _read_body(request, service.TOKENIZER_MAX_BYTES)

    def store() -> DatasetOut:
        with db.transaction() as (session, pending):
            row = service.set_tokenizer(session, principal, dataset_id, data, settings, pending)
            return service.to_out(session, row)

    return await run_in_threadpool(store)


@router.post("/datasets/{dataset_id}/check", operation_id="datasets-check", response_model=DatasetOut)
@off_loop
def recheck_dataset(dataset_id: DatasetId, db: DbDep, principal: PrincipalDep) -> DatasetOut:
    """Run the check again (after a failure)."""
    with db.transaction() as (session, pending):
        return service.to_out(session, service.recheck(session, principal, dataset_id, pending))


@router.delete("/datasets/{dataset_id}", operation_id="datasets-delete", status_code=204, response_class=Response)
@off_loop
def delete_dataset(dataset_id: DatasetId, db: DbDep, principal: PrincipalDep, settings: SettingsDep) -> Response:
    """Delete the data set and its stored file; plans made from it keep their numbers (404: none in this
    organization)."""
    with db.transaction() as (session, _pending):
        service.delete(session, principal, dataset_id, settings)
    return Response(status_code=204)
