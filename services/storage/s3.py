"""One way to build an S3 client from gpuplan's settings (AWS S3, MinIO, or any S3-compatible store).

Credentials come from the settings (or, when those are unset, boto3's usual chain: environment,
shared config, instance role). They are never logged and never returned by the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.core.errors import ConfigurationError
from services.core.settings import Settings


@dataclass(frozen=True)
class S3Location:
    """Where objects go: a bucket and a key prefix inside it (no leading or trailing slash)."""

    bucket: str
    prefix: str = ""

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))


def make_s3_client(
    settings: Settings,
    *,
    max_attempts: int = 3,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 15.0,
) -> Any:
    """A boto3 S3 client for the configured endpoint; ``max_attempts`` counts the first try.

    boto3 retries throttling, 5xx and connection errors itself ("standard" mode, exponential backoff
    with jitter); callers add resumption. An endpoint that accepts connections and never answers fails a
    call after about ``max_attempts * read_timeout_s`` (45 s by default, where 6 x 30 s took three minutes)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a core dependency
        raise ConfigurationError("object storage needs boto3: pip install boto3") from exc

    secret = settings.s3_secret_access_key.get_secret_value() if settings.s3_secret_access_key else None
    config = Config(
        region_name=settings.s3_region,
        # 3 attempts: standard mode's own default (boto3's retries guide).
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        # urllib3: the connect timeout also bounds each stalled send of a request body, and the read timeout runs
        # from the body's last byte handed to the socket, so a large part's sending time counts in neither.
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        s3={"addressing_style": settings.s3_addressing_style},
        # Checksums only where the operation needs them: several S3-compatible stores reject the
        # newer default trailing CRC headers. gpuplan verifies content with its own SHA-256 manifest.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    try:
        return boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            aws_access_key_id=settings.s3_access_key_id,
            aws_secret_access_key=secret,
            config=config,
        )
    except ValueError as exc:  # botocore's "Invalid endpoint: host:9000" (no scheme), or a malformed region
        raise ConfigurationError(
            f"GPUPLAN_S3_ENDPOINT_URL or GPUPLAN_S3_REGION: {exc} (an endpoint is a URL such as http://127.0.0.1:9000)"
        ) from None


def default_location(settings: Settings, prefix: str = "") -> S3Location:
    if not settings.s3_bucket:
        raise ConfigurationError("no bucket configured: set GPUPLAN_S3_BUCKET (and GPUPLAN_S3_ENDPOINT_URL for MinIO)")
    return S3Location(settings.s3_bucket, prefix.strip("/"))
