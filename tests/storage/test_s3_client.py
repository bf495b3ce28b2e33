"""The S3 client from settings talks to a real S3-compatible server over HTTP, and keeps its secret."""

from __future__ import annotations

import pytest

from services.core.errors import ConfigurationError
from services.core.settings import Settings
from services.storage.s3 import default_location, make_s3_client


def test_round_trip_through_the_loopback_server(s3_settings: Settings) -> None:
    client = make_s3_client(s3_settings)
    location = default_location(s3_settings, "/runs/abc/")
    key = location.key("step-10", "adapter.safetensors")
    assert key == "runs/abc/step-10/adapter.safetensors"
    client.put_object(Bucket=location.bucket, Key=key, Body=b"weights")
    assert client.get_object(Bucket=location.bucket, Key=key)["Body"].read() == b"weights"


def test_the_secret_never_appears_in_a_repr(s3_settings: Settings) -> None:
    assert "gpuplan-test-secret" not in repr(s3_settings)
    assert "gpuplan-test-secret" not in str(s3_settings.model_dump())


def test_no_bucket_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="GPUPLAN_S3_BUCKET"):
        default_location(Settings())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"s3_endpoint_url": "127.0.0.1:9000"}, "Invalid endpoint: 127.0.0.1:9000"),  # the scheme left out
        ({"s3_region": "us east 1"}, "region_name 'us east 1'"),
    ],
)
def test_an_endpoint_or_region_boto3_refuses_is_a_configuration_error(fields: dict[str, str], message: str) -> None:
    """A probe: botocore's ValueError went through `gpuplan sync` and `gpuplan restore` as a traceback."""
    with pytest.raises(ConfigurationError, match=message) as raised:
        make_s3_client(Settings(**fields))
    assert "GPUPLAN_S3_ENDPOINT_URL or GPUPLAN_S3_REGION" in raised.value.message
