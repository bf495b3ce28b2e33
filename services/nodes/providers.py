"""Which provider driver the settings pick. It sits above both driver modules (services/nodes/drivers.py:
the interface, the local and HTTP drivers; services/nodes/cloud_drivers.py: RunPod, Lambda, Vast, EC2), so
neither imports the other's way back."""

from __future__ import annotations

from services.core.settings import Settings
from services.nodes.cloud_drivers import Ec2Driver, LambdaDriver, RunPodDriver, VastDriver
from services.nodes.drivers import DriverError, HttpDriver, LocalDriver, NoDriver, ProviderDriver


def make_driver(settings: Settings) -> ProviderDriver:
    """The one driver the settings name."""
    timeout_s = settings.node_stop_timeout_s
    if settings.provider_driver == "local":
        return LocalDriver(wait_s=timeout_s)
    if settings.provider_driver in ("runpod", "lambda", "vast"):
        rest: type[RunPodDriver | LambdaDriver | VastDriver] = {
            "runpod": RunPodDriver,
            "lambda": LambdaDriver,
            "vast": VastDriver,
        }[settings.provider_driver]
        key = settings.provider_api_key.get_secret_value() if settings.provider_api_key else ""
        return rest(key, settings.provider_stop_action, base_url=settings.provider_api_url, timeout_s=timeout_s)
    if settings.provider_driver == "aws":
        secret = settings.provider_aws_secret_access_key
        return Ec2Driver(
            settings.provider_aws_region,
            settings.provider_stop_action,
            endpoint_url=settings.provider_api_url,
            access_key_id=settings.provider_aws_access_key_id,
            secret_access_key=secret.get_secret_value() if secret else None,
            timeout_s=timeout_s,
        )
    if settings.provider_driver == "http":
        if not settings.provider_stop_url:
            raise DriverError("GPUPLAN_PROVIDER_DRIVER=http needs GPUPLAN_PROVIDER_STOP_URL")
        token = settings.provider_auth_value.get_secret_value() if settings.provider_auth_value else None
        return HttpDriver(
            settings.provider_stop_url,
            settings.provider_start_url,
            settings.provider_http_method,
            settings.provider_auth_header,
            token,
            timeout_s=timeout_s,
            instance_id_pattern=settings.provider_instance_id_pattern,
        )
    return NoDriver()
