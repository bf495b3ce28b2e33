"""The three ways a Hub lookup fails, each a distinct 422 naming ``model.name`` (exit 2 in the CLI)."""

from __future__ import annotations

from services.core.errors import Unprocessable


class HubModelNotFound(Unprocessable):
    code = "model_not_found"


class HubModelGated(Unprocessable):
    code = "model_gated"


class HubUnreachable(Unprocessable):
    code = "hub_unreachable"


class HubFileInvalid(Unprocessable):
    """The Hub answered, but config.json is too large or not a JSON object."""

    code = "model_config_invalid"
