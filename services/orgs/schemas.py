from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from services.core.request_models import ClosedModel

Scope = Literal["read", "plan", "agent", "admin"]
_ID_PATTERN = "^[0-9a-f]{32}$"


class KeyCreate(ClosedModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=100, description="what the key is for")
    scopes: list[Scope] = Field(default=["read", "plan"], min_length=1, max_length=4)
    expires_in_s: StrictInt | None = Field(
        default=None, ge=60, le=5 * 366 * 86_400, description="the key stops working this many seconds from now"
    )
    node_id: str | None = Field(default=None, pattern=_ID_PATTERN, description="agent keys: the node it acts for")
    run_id: str | None = Field(default=None, pattern=_ID_PATTERN, description="agent keys: the run it acts for")


class KeyRotate(ClosedModel):
    model_config = ConfigDict(extra="forbid")

    grace_s: StrictInt = Field(default=0, ge=0, le=7 * 86_400, description="the old key keeps working this long")


class KeyOut(BaseModel):
    id: str
    prefix: str
    name: str | None
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    node_id: str | None
    run_id: str | None
    rotated_from_id: str | None


class KeyCreated(KeyOut):
    key: str = Field(description="the key itself; shown only in this answer")


class KeyList(BaseModel):
    items: list[KeyOut]
    next_cursor: str | None = Field(default=None, description="pass as ?before= for the next page; null: the last")


class AuditEventOut(BaseModel):
    id: str
    created_at: datetime
    actor: str
    action: str
    target: str | None
    remote_addr: str | None
    detail: dict[str, Any] | None


class AuditList(BaseModel):
    items: list[AuditEventOut]
    next_cursor: str | None
