"""The id format of each provider's machines (pure): what a registration's ``instance_id`` must look
like for the provider driver the server stops nodes through. An id that does not match is refused at
registration (422 naming ``instance_id``) and again by the driver before any call is built from it.

Sources for the formats:
- AWS EC2: "i-" followed by 8 (older) or 17 hexadecimal characters (Amazon EC2 User Guide, "Resource
  IDs": the longer ID format since 2016).
- RunPod: pod ids are lowercase letters and digits, e.g. ``ozz7oaeg7phj7w`` (RunPod REST API reference,
  ``/pods/{podId}`` examples).
- Lambda Cloud: instance ids are 32 lowercase hexadecimal characters, e.g.
  ``0920582c7ff041399e34823a0be62549`` (Lambda Cloud API reference, ``/instances/{id}``).
- Vast.ai: instance ids are integers (Vast.ai API reference, ``/instances/{id}/``).
- ``http``, ``local`` and ``none``: a conservative generic format (letters, digits, ``._:-``, starting
  with a letter or digit; never ``.`` or ``..``), unless ``GPUPLAN_PROVIDER_INSTANCE_ID_PATTERN`` names
  the provider's own.
"""

from __future__ import annotations

import re

GENERIC_ID = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}"

ID_FORMATS: dict[str, tuple[str, str]] = {
    "aws": (r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})", "'i-' and 8 or 17 lowercase hex digits, e.g. i-0abc1234def567890"),
    "runpod": (r"[a-z0-9]{8,32}", "8 to 32 lowercase letters and digits, e.g. ozz7oaeg7phj7w"),
    "lambda": (r"[0-9a-f]{32}", "32 lowercase hex digits, e.g. 0920582c7ff041399e34823a0be62549"),
    "vast": (r"[0-9]{1,12}", "an integer, e.g. 2459368"),
}
GENERIC_DESCRIPTION = "letters, digits and . _ : - (starting with a letter or digit, at most 200 characters)"


class InstanceIdError(ValueError):
    """An instance id that does not have its provider's format (the message is safe to show)."""


def id_format(driver: str, custom_pattern: str | None = None) -> tuple[re.Pattern[str], str]:
    """The compiled full-match pattern and its description for the named driver."""
    if driver in ID_FORMATS:
        pattern, description = ID_FORMATS[driver]
        return re.compile(pattern), description
    if custom_pattern:
        return re.compile(custom_pattern), f"the pattern {custom_pattern!r} (GPUPLAN_PROVIDER_INSTANCE_ID_PATTERN)"
    return re.compile(GENERIC_ID), GENERIC_DESCRIPTION


def check_instance_id(instance_id: str, driver: str, custom_pattern: str | None = None) -> str:
    """The id unchanged when it has the driver's format; raises InstanceIdError naming the format."""
    pattern, description = id_format(driver, custom_pattern)
    if instance_id in (".", "..") or pattern.fullmatch(instance_id) is None:
        shown = instance_id if len(instance_id) <= 60 else instance_id[:60] + "..."
        raise InstanceIdError(f"instance_id {shown!r} is not a {driver} instance id: expected {description}")
    return instance_id
