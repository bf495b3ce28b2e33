"""The one settings class (environment variables prefixed GPUPLAN_)."""

from __future__ import annotations

import functools
import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from services.core.retry import RetryPolicy

DEFAULT_SQLITE_FILE = "gpuplan.db"
# The live price feeds GPUPLAN_CATALOG_FEEDS may name, one module each in services/catalog/feeds (which
# re-exports this as PROVIDERS): the names live here so the settings check them without importing the catalog.
FEED_PROVIDERS = ("runpod", "lambda", "vast", "aws")


class Settings(BaseSettings):
    """Runtime configuration. With nothing set, gpuplan runs embedded: SQLite in the working
    directory and background work in this process."""

    model_config = SettingsConfigDict(env_prefix="GPUPLAN_", extra="ignore")

    database_url: str | None = Field(default=None, description="SQLAlchemy URL; unset = SQLite file")
    redis_url: str | None = Field(default=None, description="Celery broker; unset = in-process tasks")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    safety_margin: float = Field(
        default=0.0,
        ge=0.0,
        le=0.5,
        description="extra share of card memory the planner keeps free, on top of its fitted headroom",
    )
    quote_validity_days: int = Field(default=14, ge=1, le=365)
    background_workers: int = Field(default=2, ge=1, le=64)
    task_time_limit_s: int = Field(default=3600, ge=10, le=86_400, description="hard limit of one task")
    task_visibility_timeout_s: int = Field(
        default=3900, ge=1, le=172_800, description="Redis: an unacknowledged task is redelivered after this"
    )
    # Failure injection for the worker tests: sleep this long between computing and storing a result.
    task_debug_delay_s: float = Field(default=0.0, ge=0.0, le=600.0)
    stale_plan_after_s: int = Field(default=3900, ge=0, description="beat re-enqueues plans unfinished this long")
    # Task leases (services/core/leases.py): a running task renews its lease every third of this; a task
    # whose lease expired is sent again by the lease sweep, so a dead worker's task resumes within
    # task_lease_s + lease_sweep_interval_s (80 s by default), whatever the broker's visibility timeout.
    task_lease_s: float = Field(default=60.0, ge=1.0, le=3600.0, description="lease of a queued or running task")
    lease_sweep_interval_s: float = Field(default=20.0, ge=0.5, le=3600.0, description="how often leases are swept")
    task_max_deliveries: int = Field(
        default=5, ge=1, le=100, description="a task delivered this often without finishing is abandoned"
    )
    # API keys: 0 reads the key on every request, so a revocation holds from the next request on; a
    # few seconds saves that read on busy clients, and a revoked key then works that much longer in
    # the other processes (the process that revoked it forgets it at once).
    key_cache_s: float = Field(default=0.0, ge=0.0, le=300.0, description="how long a checked key is trusted")
    # Abuse limits (services/api/limits.py); 0 turns one off.
    rate_limit_per_minute: int = Field(default=6000, ge=0, le=10_000_000, description="requests per key per minute")
    # Failed authentications per client address and minute (services/api/limits.py): a person mistyping a key
    # fails a few times; a guesser is held to this many tries a minute.
    auth_failures_per_minute: int = Field(
        default=60, ge=0, le=10_000_000, description="failed sign-ins per client address per minute"
    )
    quota_plans_per_hour: int = Field(default=3000, ge=0, le=10_000_000, description="plans per organization per hour")
    quota_datasets: int = Field(default=200, ge=0, le=1_000_000, description="stored data sets per organization")
    quota_dataset_bytes: int = Field(default=2 * 2**40, ge=0, description="stored data set bytes per organization")
    quota_nodes: int = Field(default=200, ge=0, le=1_000_000, description="nodes (not stopped) per organization")
    # Each key carries its own rate limit, so unbounded keys would be unbounded requests (issue 21: 1,010 keys
    # minted in 16 s). 100 covers a person, a CI system and an agent per node of a large team.
    quota_keys: int = Field(
        default=100, ge=0, le=1_000_000, description="usable (unrevoked, unexpired) keys per organization"
    )
    api_workers: int = Field(default=1, ge=1, le=64, description="API processes `gpuplan serve` starts")
    access_log: bool = Field(default=True, description="one line per API request on stderr (gpuplan serve)")
    worker_metrics_port: int = Field(
        default=0, ge=0, le=65535, description="a Celery worker serves its task metrics here (0: off)"
    )
    # GET /metrics: open (keep it on the internal network) unless a token is set.
    otlp_endpoint: str | None = Field(
        default=None,
        max_length=500,
        description="OpenTelemetry collector (OTLP/HTTP), e.g. http://collector:4318: traces of requests, "
        "database statements, HTTP and S3 calls and tasks (services/core/tracing.py)",
    )
    metrics_token: SecretStr | None = Field(default=None, description="Bearer token /metrics asks for")
    # Object storage (checkpoints, uploaded data sets): any S3-compatible service. The secret is a
    # SecretStr so that it never appears in a repr, a log line or an API response.
    s3_endpoint_url: str | None = Field(default=None, description="unset = AWS S3; e.g. http://127.0.0.1:9000")
    s3_region: str = "us-east-1"
    s3_bucket: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_addressing_style: Literal["path", "virtual", "auto"] = "path"
    # Idle shutdown (services/nodes/lifecycle.py) and the provider driver that stops nodes.
    idle_sweep_interval_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    node_lost_after_s: float = Field(default=300.0, ge=30.0, le=86_400.0, description="no heartbeat this long: lost")
    # A stop (services/nodes/lifecycle.py): each provider call is bounded by node_stop_timeout_s and made
    # outside any transaction; a failed attempt is retried after node_stop_backoff_s, doubled per attempt
    # up to node_stop_backoff_max_s; after node_stop_max_attempts the node is marked stop_failed. A stop
    # the provider confirmed counts as failed when the node still heartbeats node_stop_grace_s later.
    node_stop_timeout_s: float = Field(default=30.0, ge=0.1, le=600.0, description="one provider stop call")
    node_stop_max_attempts: int = Field(default=5, ge=1, le=100, description="stop attempts before stop_failed")
    node_stop_backoff_s: float = Field(default=60.0, ge=0.0, le=86_400.0, description="wait after a failed stop")
    node_stop_backoff_max_s: float = Field(default=3600.0, ge=0.0, le=86_400.0, description="longest such wait")
    node_stop_grace_s: float = Field(
        default=300.0, ge=0.0, le=86_400.0, description="heartbeats this long after a confirmed stop are tolerated"
    )
    node_stop_concurrency: int = Field(default=8, ge=1, le=64, description="provider stop calls in flight at once")
    # A node's sync alert (services/nodes/lifecycle.py): its agent's sync passes have failed for
    # node_sync_alert_s, or it has held checkpoints that are not durable for node_unsynced_alert_s. The
    # defaults give a failing pass ten of the agent's 60 s intervals, and a checkpoint an hour to be durable.
    node_sync_alert_s: float = Field(
        default=600.0, ge=0.0, le=7 * 86_400.0, description="sync passes failing this long: alert"
    )
    node_unsynced_alert_s: float = Field(
        default=3600.0, ge=0.0, le=7 * 86_400.0, description="checkpoints not durable this long: alert"
    )
    provider_driver: Literal["none", "local", "http", "aws", "runpod", "lambda", "vast"] = "none"
    provider_stop_url: str | None = Field(
        default=None, description="e.g. https://api.example/v1/instances/{instance_id}/stop"
    )
    provider_start_url: str | None = None
    provider_http_method: Literal["POST", "PUT", "DELETE", "GET", "PATCH"] = "POST"
    provider_auth_header: str = "Authorization"
    provider_auth_value: SecretStr | None = Field(default=None, description="e.g. 'Bearer <token>'; never logged")
    # The cloud drivers (services/nodes/drivers.py): what a stop does, the provider's API key (a secret:
    # never logged, never in an error), and its base URL (unset: the provider's public API).
    provider_stop_action: Literal["stop", "terminate"] = Field(
        default="stop", description="stop (keep the disk; Lambda cannot) or terminate the instance"
    )
    provider_api_key: SecretStr | None = Field(default=None, description="RunPod, Lambda or Vast.ai API key")
    provider_api_url: str | None = Field(
        default=None, max_length=500, description="the provider API's base URL (aws: the EC2 endpoint URL)"
    )
    provider_aws_region: str = Field(default="us-east-1", max_length=50)
    provider_aws_access_key_id: str | None = Field(default=None, description="unset: boto3's credential chain")
    provider_aws_secret_access_key: SecretStr | None = None
    provider_instance_id_pattern: str | None = Field(
        default=None,
        max_length=200,
        description="http driver: a regular expression the provider's instance ids fully match (default: "
        "letters, digits and ._:-)",
    )
    # Signs the dashboard's session cookies. Unset: a random secret generated when the settings are
    # loaded, so sessions end when the process restarts and are not shared between processes; set it
    # (32+ characters, e.g. `python -c "import secrets; print(secrets.token_urlsafe(32))"`) when
    # several API processes serve the dashboard or sessions should survive a restart.
    session_secret: SecretStr = Field(default_factory=lambda: SecretStr(secrets.token_urlsafe(32)))
    session_max_age_s: int = Field(default=12 * 3600, ge=60, le=30 * 86_400, description="dashboard sign-in lifetime")
    # Data set uploads: the largest file accepted, and the part size of the resumable upload (S3 needs at
    # least 5 MiB per part but the last; at most 10,000 parts, so the part size also caps the file size).
    dataset_max_bytes: int = Field(default=20 * 2**30, ge=1, le=5 * 2**40, description="largest data set file")
    dataset_part_bytes: int = Field(default=8 * 2**20, ge=5 * 2**20, le=5 * 2**30, description="upload part size")
    # Data checks (services/datacheck/limits.py, docs/datasets.md): what one check may hold or decode. A
    # file past one is refused and the check's error names the limit and its setting.
    datacheck_max_record_bytes: int = Field(
        default=64 * 2**20, ge=1024, le=2**31, description="one JSONL line, JSON element, CSV record or Parquet row"
    )
    datacheck_max_cell_bytes: int = Field(
        default=16 * 2**20, ge=1024, le=2**31, description="one CSV cell or one string in a Parquet row"
    )
    datacheck_max_column_chunk_bytes: int = Field(
        default=512 * 2**20, ge=2**20, le=2**34, description="one Parquet column chunk, uncompressed (footer)"
    )
    datacheck_max_row_group_bytes: int = Field(
        default=2 * 2**30, ge=2**20, le=2**36, description="one Parquet row group, uncompressed (footer)"
    )
    datacheck_expansion_ratio: float = Field(
        default=100.0, ge=1.0, le=1e6, description="a compressed or Parquet file decodes to at most this x its size"
    )
    datacheck_expansion_floor_bytes: int = Field(
        default=256 * 2**20, ge=2**20, le=2**40, description="... and to at least this many bytes whatever its size"
    )
    # The check runs in a child process whose address space is capped here (RLIMIT_AS), so that a file
    # the limits above miss kills the check, not the API or the worker; 0 runs it in the calling process.
    datacheck_memory_limit_bytes: int = Field(
        default=2 * 2**30, ge=0, le=2**40, description="address space of the check's child process (0: no child)"
    )
    # Live price feeds (services/catalog/feeds): which providers the beat refreshes, how often, and each
    # provider's endpoint and credential. Credentials are SecretStr: never in a repr, a log or an error.
    catalog_feeds: str = Field(default="", description="comma list of runpod, lambda, vast, aws; empty = none")
    catalog_refresh_interval_s: int = Field(default=6 * 3600, ge=300, le=7 * 86_400, description="beat refresh")
    catalog_feed_timeout_s: float = Field(default=30.0, ge=1.0, le=300.0)
    runpod_api_url: str = "https://api.runpod.io/graphql"
    runpod_api_key: SecretStr | None = None
    lambda_api_url: str = "https://cloud.lambdalabs.com/api/v1"
    lambda_api_key: SecretStr | None = None
    vast_api_url: str = "https://console.vast.ai/api/v0"
    vast_api_key: SecretStr | None = None
    aws_feed_regions: str = Field(default="us-east-1,us-west-2", description="comma list of EC2 region codes")
    aws_pricing_endpoint_url: str | None = None
    aws_ec2_endpoint_url: str | None = None
    aws_access_key_id: str | None = Field(default=None, description="unset = boto3's credential chain")
    aws_secret_access_key: SecretStr | None = None

    # Connections (`gpuplan serve`, services/api/server.py): a client must send its request headers within
    # http_header_timeout_s of connecting (or of the previous response), and a body with no more than
    # http_body_timeout_s between two reads (nginx's client_header_timeout and client_body_timeout, 60 s by
    # default there); an idle keep-alive connection is closed after http_keep_alive_s (uvicorn's default,
    # 5 s); past http_max_connections connections or requests in flight a process answers 503.
    http_header_timeout_s: float = Field(default=15.0, ge=0.1, le=600.0, description="time to send request headers")
    http_body_timeout_s: float = Field(default=30.0, ge=0.1, le=600.0, description="longest pause in a request body")
    http_keep_alive_s: int = Field(default=5, ge=1, le=600, description="idle keep-alive connections closed after")
    http_max_connections: int = Field(
        default=1000, ge=1, le=100_000, description="connections (and requests) in flight per API process"
    )
    # Every other request body: refused with 413 over this size, before it is parsed or authenticated
    # (the largest real plan body, a config.json with a long mlp_only_layers list, is under 20 KiB).
    max_request_bytes: int = Field(
        default=2**20, ge=1024, le=2**30, description="largest request body outside the upload routes"
    )
    # CPU time one request may spend estimating or planning (the calling thread's own CPU time, so a
    # busy machine does not make requests fail); typical costs are about 1 ms and 10-150 ms.
    estimate_cpu_budget_s: float = Field(default=2.0, gt=0, le=600, description="CPU seconds per estimate")
    plan_cpu_budget_s: float = Field(default=10.0, gt=0, le=3600, description="CPU seconds per planning run")
    # A dropped database connection, a serialization failure or a Redis disconnect during an estimate,
    # a trace or a data check: the work is run again this many times in all, with exponential backoff.
    transient_retry_attempts: int = Field(
        default=5, ge=1, le=20, description="attempts at a task meeting a transient fault"
    )
    transient_retry_base_s: float = Field(default=0.5, ge=0.0, le=60.0, description="first backoff; doubles per retry")

    def retry_policy(self) -> RetryPolicy:
        from services.core.retry import RetryPolicy

        return RetryPolicy(attempts=self.transient_retry_attempts, base_s=self.transient_retry_base_s)

    # Models named by their Hugging Face Hub id (services/hub): HF_TOKEN and HF_ENDPOINT are read as
    # huggingface_hub reads them; these bound each request and each file fetched.
    hub_timeout_s: float = Field(default=10.0, gt=0.0, le=120.0, description="Hub request timeout")
    hub_max_file_bytes: int = Field(
        default=32 * 2**20, ge=1024, le=256 * 2**20, description="largest config.json / safetensors index fetched"
    )

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

    @field_validator("catalog_feeds")
    @classmethod
    def _known_feeds(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = sorted(set(names) - set(FEED_PROVIDERS))
        if unknown:
            raise ValueError(f"unknown feed {', '.join(unknown)}; feeds are {', '.join(FEED_PROVIDERS)}")
        return ",".join(names)

    @field_validator("provider_instance_id_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"provider_instance_id_pattern: not a regular expression ({exc})") from None
        return value

    @field_validator("session_secret")
    @classmethod
    def _strong_secret(cls, value: SecretStr) -> SecretStr:
        secret = value.get_secret_value()
        if len(secret) < 32 or len(set(secret)) < 8:  # refuses short and placeholder-like secrets
            raise ValueError("session_secret: give at least 32 random characters (GPUPLAN_SESSION_SECRET)")
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
    def feed_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.catalog_feeds.split(",") if n)

    @property
    def in_process_tasks(self) -> bool:
        return self.redis_url is None


@functools.cache
def get_settings() -> Settings:
    return Settings()
