"""Object-storage side of data sets: one cached client per configuration, and the uploaded file read
back as a stream of rows (never downloaded whole)."""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from services.core.settings import Settings
from services.datacheck import Limits, iter_rows, sniff_compression
from services.storage.s3 import make_s3_client

READ_CHUNK_BYTES = 1 << 20
_clients: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def s3_client(settings: Settings) -> Any:
    """A boto3 client for these settings (clients are thread-safe and costly to build, so they are reused)."""
    secret = settings.s3_secret_access_key.get_secret_value() if settings.s3_secret_access_key else None
    key = (
        settings.s3_endpoint_url,
        settings.s3_region,
        settings.s3_access_key_id,
        secret,
        settings.s3_addressing_style,
    )
    with _lock:
        if key not in _clients:
            _clients[key] = make_s3_client(settings)
        return _clients[key]


def storage_error(exc: Exception) -> str:
    """What object storage said, in one line (never a credential)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"object storage: {error.get('Code', 'error')}: {error.get('Message', '')}".rstrip(": ")
    return f"object storage unreachable: {exc}"


class _CountingReader(io.RawIOBase):
    """A raw reader over a boto3 StreamingBody that counts the bytes it has handed out."""

    def __init__(self, body: Any) -> None:
        self._body = body
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._body.read(len(view))
        view[: len(data)] = data
        self.bytes_read += len(data)
        return len(data)


class RangeReader(io.RawIOBase):
    """A seekable, read-only view of an object through ranged GETs (Parquet reads its footer first)."""

    def __init__(self, client: Any, bucket: str, key: str, size: int) -> None:
        self._client, self._bucket, self._key, self._size = client, bucket, key, size
        self._pos = 0
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pos >= self._size or not len(view):
            return 0
        end = min(self._size, self._pos + len(view)) - 1
        body = self._client.get_object(Bucket=self._bucket, Key=self._key, Range=f"bytes={self._pos}-{end}")["Body"]
        data = body.read()
        view[: len(data)] = data
        self._pos += len(data)
        self.bytes_read += len(data)
        return len(data)


class S3RowSource:
    """Rows of an uploaded data set, streamed from object storage: each pass is one GET of the object."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        file_format: str,
        gzipped: bool,
        size_bytes: int,
        *,
        limits: Limits | None = None,
        label: str = "the file",
    ) -> None:
        self.client, self.bucket, self.key = client, bucket, key
        self.file_format, self.gzipped, self.size_bytes = file_format, gzipped, size_bytes
        self.limits, self.label = limits, label
        self._reader: _CountingReader | RangeReader | None = None

    def rows(self) -> Iterator[tuple[int, Any]]:
        options: dict[str, Any] = {"limits": self.limits, "label": self.label, "stored_bytes": self.size_bytes}
        if self.file_format == "parquet" and not self.gzipped:
            ranged = RangeReader(self.client, self.bucket, self.key, self.size_bytes)
            head = ranged.read(16) or b""
            ranged.seek(0)
            # Parquet is read from its footer back, through ranged GETs; a compressed one is streamed.
            if sniff_compression(head) is None:
                self._reader = ranged
                yield from iter_rows(io.BufferedReader(ranged, READ_CHUNK_BYTES), "parquet", **options)
                return
        body = self.client.get_object(Bucket=self.bucket, Key=self.key)["Body"]
        reader = _CountingReader(body)
        self._reader = reader
        try:
            yield from iter_rows(reader, self.file_format, gzipped=self.gzipped, **options)  # type: ignore[arg-type]
        finally:
            body.close()

    def fraction_read(self) -> float | None:
        if self._reader is None or not self.size_bytes:
            return None
        return min(1.0, self._reader.bytes_read / self.size_bytes)


def object_sha256(client: Any, bucket: str, key: str) -> tuple[str, int]:
    """SHA-256 and size of an object, read as a stream in 1 MiB chunks."""
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in iter(lambda: body.read(READ_CHUNK_BYTES), b""):
            digest.update(chunk)
            size += len(chunk)
    finally:
        body.close()
    return digest.hexdigest(), size
