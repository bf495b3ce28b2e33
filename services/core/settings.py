"""The one settings class (environment variables prefixed GPUPLAN_)."""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SQLITE_FILE = "gpuplan.db"


class Settings(BaseSettings):
    """Runtime configuration. With nothing set, gpuplan runs embedded: SQLite in the working
    directory and background work in this process."""

    model_config = SettingsConfigDict(env_prefix="GPUPLAN_", extra="ignore")

    database_url: str | None = Field(default=None, description="SQLAlchemy URL; unset = SQLite file")
    redis_url: str | None = Field(default=None, description="Celery broker; unset = in-process tasks")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    safety_margin: float = Field(default=0.10, ge=0.0, le=0.5, description="memory headroom the planner keeps")
    quote_validity_days: int = Field(default=14, ge=1, le=365)
    background_workers: int = Field(default=2, ge=1, le=64)
    task_time_limit_s: int = Field(default=3600, ge=10, le=86_400, description="hard limit of one task")
    task_visibility_timeout_s: int = Field(
        default=3900, ge=1, le=172_800, description="Redis: an unacknowledged task is redelivered after this"
    )
    # Failure injection for the worker tests: sleep this long between computing and storing a result.
    task_debug_delay_s: float = Field(default=0.0, ge=0.0, le=600.0)
    stale_plan_after_s: int = Field(default=3900, ge=0, description="beat re-enqueues plans unfinished this long")

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        # Accept the common libpq-style scheme and use the psycopg 3 driver.
        if value.startswith("postgres://"):
            value = "postgresql://" + value[len("postgres://") :]
        if value.startswith("postgresql://"):
            value = "postgresql+psycopg://" + value[len("postgresql://") :]
        return value

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url is not None:
            return self.database_url
        return f"sqlite:///{Path.cwd() / DEFAULT_SQLITE_FILE}"

    @property
    def in_process_tasks(self) -> bool:
        return self.redis_url is None


@functools.cache
def get_settings() -> Settings:
    return Settings()
