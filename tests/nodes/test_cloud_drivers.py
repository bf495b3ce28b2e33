"""The cloud shutdown drivers against real HTTP on loopback: RunPod, Lambda Cloud and Vast.ai against a
fake provider that records every request, AWS EC2 through boto3 against moto's server. Each refuses an id
not in its provider's format before any request, and the credential appears in no error and no log."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from services.core.settings import Settings
from services.nodes.cloud_drivers import Ec2Driver, LambdaDriver, RunPodDriver, VastDriver
from services.nodes.drivers import DriverError, NodeTarget
from services.nodes.providers import make_driver
from tests.nodes.fake_provider import FakeProvider, running_provider

KEY = "rpa_SECRET0123456789abcdef"
ATTACK_ID = "x/../../../admin/wipe-all?force=true#"


def _node(instance_id: str) -> NodeTarget:
    return NodeTarget(id="n1", name="box", instance_id=instance_id, hostname="box", agent_pid=None)


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    yield from running_provider()


def _settings(provider: FakeProvider, driver: str, **fields: object) -> Settings:
    return Settings(provider_driver=driver, provider_api_key=KEY, provider_api_url=provider.url + "/api", **fields)  # type: ignore[arg-type]


def test_runpod_stops_terminates_and_starts_a_pod(provider: FakeProvider) -> None:
    stop = make_driver(_settings(provider, "runpod"))
    assert isinstance(stop, RunPodDriver)
    stop.stop(_node("ozz7oaeg7phj7w"))
    stop.start(_node("ozz7oaeg7phj7w"))
    make_driver(_settings(provider, "runpod", provider_stop_action="terminate")).stop(_node("ozz7oaeg7phj7w"))
    assert [(c.method, c.path) for c in provider.calls] == [
        ("POST", "/api/pods/ozz7oaeg7phj7w/stop"),
        ("POST", "/api/pods/ozz7oaeg7phj7w/start"),
        ("DELETE", "/api/pods/ozz7oaeg7phj7w"),
    ]
    assert {c.headers["authorization"] for c in provider.calls} == {f"Bearer {KEY}"}


def test_lambda_terminates_and_refuses_a_stop_it_cannot_do(provider: FakeProvider) -> None:
    instance = "0920582c7ff041399e34823a0be62549"
    driver = make_driver(_settings(provider, "lambda", provider_stop_action="terminate"))
    assert isinstance(driver, LambdaDriver)
    assert "terminate" in driver.stop(_node(instance))
    call = provider.calls[0]
    assert (call.method, call.path, call.body) == (
        "POST",
        "/api/instance-operations/terminate",
        {"instance_ids": [instance]},
    )
    with pytest.raises(DriverError, match="GPUPLAN_PROVIDER_STOP_ACTION=terminate"):
        make_driver(_settings(provider, "lambda"))
    with pytest.raises(DriverError, match="cannot be started"):
        driver.start(_node(instance))


def test_vast_stops_starts_and_destroys_an_instance(provider: FakeProvider) -> None:
    driver = make_driver(_settings(provider, "vast"))
    assert isinstance(driver, VastDriver)
    driver.stop(_node("2459368"))
    driver.start(_node("2459368"))
    make_driver(_settings(provider, "vast", provider_stop_action="terminate")).stop(_node("2459368"))
    assert [(c.method, c.path, c.body) for c in provider.calls] == [
        ("PUT", "/api/instances/2459368/", {"state": "stopped"}),
        ("PUT", "/api/instances/2459368/", {"state": "running"}),
        ("DELETE", "/api/instances/2459368/", None),
    ]


@pytest.mark.parametrize(
    ("driver", "bad_ids"),
    [
        ("runpod", [ATTACK_ID, "ABC/../x", "pod id", "", "a"]),
        ("lambda", [ATTACK_ID, "0920582c7ff041399e34823a0be6254", "../" + "0" * 32]),
        ("vast", [ATTACK_ID, "12/../admin", "-1", "1e9", "abc"]),
    ],
)
def test_an_id_outside_the_providers_format_makes_no_request(
    provider: FakeProvider, driver: str, bad_ids: list[str]
) -> None:
    built = make_driver(_settings(provider, driver, provider_stop_action="terminate"))
    for bad in bad_ids:
        with pytest.raises(DriverError):
            built.stop(_node(bad))
    assert provider.calls == []


def test_the_api_key_is_in_no_error_and_no_log(provider: FakeProvider, caplog: pytest.LogCaptureFixture) -> None:
    provider.status, provider.echo_auth = 401, True
    caplog.set_level(logging.DEBUG)
    messages = []
    for name in ("runpod", "vast"):
        with pytest.raises(DriverError) as failure:
            make_driver(_settings(provider, name)).stop(_node("ozz7oaeg7phj7w" if name == "runpod" else "2459368"))
        messages.append(str(failure.value))
    with pytest.raises(DriverError) as failure:
        make_driver(_settings(provider, "lambda", provider_stop_action="terminate")).stop(_node("0" * 32))
    messages.append(str(failure.value))
    assert all("HTTP 401" in m and "***" in m for m in messages), messages
    assert len(provider.calls) == 3 and all(KEY in c.headers["authorization"] for c in provider.calls)
    everything = " ".join(messages) + caplog.text + repr(_settings(provider, "runpod"))
    assert KEY not in everything
    with pytest.raises(DriverError, match="GPUPLAN_PROVIDER_API_KEY"):
        make_driver(Settings(provider_driver="runpod"))


# --- AWS EC2 through boto3, against moto's server over loopback HTTP ------------------------------

AWS_SECRET = "moto-test-SECRET-key-0123456789"


def _ec2(s3_server: str, action: str = "stop") -> Ec2Driver:
    settings = Settings(
        provider_driver="aws",
        provider_api_url=s3_server,
        provider_aws_region="us-east-1",
        provider_aws_access_key_id="AKIAMOTOTEST",
        provider_aws_secret_access_key=AWS_SECRET,  # type: ignore[arg-type]
        provider_stop_action=action,  # type: ignore[arg-type]
    )
    driver = make_driver(settings)
    assert isinstance(driver, Ec2Driver)
    return driver


def _launch(driver: Ec2Driver) -> str:
    client = driver._client
    image = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    instance: str = client.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")["Instances"][
        0
    ]["InstanceId"]
    return instance


def _state(driver: Ec2Driver, instance: str) -> str:
    reservations = driver._client.describe_instances(InstanceIds=[instance])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def test_ec2_stops_starts_and_terminates_through_boto3(s3_server: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    driver = _ec2(s3_server)
    instance = _launch(driver)
    assert _state(driver, instance) == "running"
    assert "aws stop" in driver.stop(_node(instance))
    assert _state(driver, instance) == "stopped"
    driver.start(_node(instance))
    assert _state(driver, instance) == "running"
    _ec2(s3_server, "terminate").stop(_node(instance))
    assert _state(driver, instance) == "terminated"
    with pytest.raises(DriverError, match="InvalidInstanceID") as failure:
        driver.stop(_node("i-0123456789abcdef0"))  # well-formed, but no such instance
    for bad in (ATTACK_ID, "i-XYZ", "i-0123", "vol-0123456789abcdef0"):
        with pytest.raises(DriverError, match="not a aws instance id"):
            driver.stop(_node(bad))
    assert AWS_SECRET not in str(failure.value) + caplog.text
