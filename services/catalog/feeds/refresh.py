"""Refreshing the public catalog from the live feeds: fetch outside any transaction, then store each
provider's offers in one transaction of its own, or record why its fetch failed and keep its last good
prices. Used by `gpuplan catalog refresh` and the beat task."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from services.catalog.feeds import PROVIDERS, aws, lambda_cloud, runpod, vast
from services.catalog.feeds.base import FeedError, FeedOffers
from services.catalog.service import FeedDataError, record_feed_failure, record_feed_success
from services.core.db import unit_of_work, utcnow
from services.core.errors import GpuplanError
from services.core.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedOutcome:
    provider: str
    ok: bool
    offers: int
    error: str | None = None
    note: str | None = None
    kept_from: datetime | None = None  # a failed fetch: when the prices kept were fetched (None: there are none)

    def failure(self) -> str:
        """The failed fetch in one line, saying whether earlier prices stay."""
        if self.kept_from is not None:
            return f"failed, last good prices (fetched {self.kept_from:%Y-%m-%d %H:%M} UTC) kept: {self.error}"
        return f"failed, and no earlier fetch of it succeeded (no fetched prices to keep): {self.error}"


def _secret(value: object) -> str | None:
    getter = getattr(value, "get_secret_value", None)
    return str(getter()) if getter is not None else None


def fetch_offers(provider: str, settings: Settings, fetched_at: str) -> FeedOffers:
    """One provider's current offers as price-list rows (raises FeedError when the fetch fails)."""
    timeout_s = settings.catalog_feed_timeout_s
    if provider == "runpod":
        return runpod.fetch(settings.runpod_api_url, _secret(settings.runpod_api_key), fetched_at, timeout_s)
    if provider == "lambda":
        return lambda_cloud.fetch(settings.lambda_api_url, _secret(settings.lambda_api_key), fetched_at, timeout_s)
    if provider == "vast":
        return vast.fetch(settings.vast_api_url, _secret(settings.vast_api_key), fetched_at, timeout_s)
    if provider == "aws":
        regions = [r.strip() for r in settings.aws_feed_regions.split(",") if r.strip()]
        return aws.fetch(
            regions,
            fetched_at,
            pricing_endpoint_url=settings.aws_pricing_endpoint_url,
            ec2_endpoint_url=settings.aws_ec2_endpoint_url,
            access_key_id=settings.aws_access_key_id,
            secret_access_key=_secret(settings.aws_secret_access_key),
            timeout_s=timeout_s,
        )
    raise FeedError(f"unknown feed {provider!r}; feeds are {', '.join(PROVIDERS)}")


def refresh(
    factory: sessionmaker[Session], settings: Settings, providers: Sequence[str] | None = None
) -> list[FeedOutcome]:
    """Refresh each provider (default: the configured GPUPLAN_CATALOG_FEEDS); one failing feed never stops
    the others, and never removes the provider's last good prices."""
    outcomes = []
    for provider in providers if providers is not None else settings.feed_names:
        when = utcnow().replace(microsecond=0)
        try:
            fetched = fetch_offers(provider, settings, when.strftime("%Y-%m-%dT%H:%M:%SZ"))
            if not fetched.rows:
                why = f" ({fetched.note()})" if fetched.note() else ""
                raise FeedError(f"{provider}: the API listed no offer of a known card{why}")
            if fetched.invalid:
                log.warning(
                    "catalog feed %s: offers with a value gpuplan refuses skipped: %s", provider, fetched.invalid
                )
            if fetched.spot_dropped:
                log.warning("catalog feed %s: spot price above on demand dropped: %s", provider, fetched.spot_dropped)
            if fetched.spot_too_low:
                log.warning("catalog feed %s: spot price next to nothing dropped: %s", provider, fetched.spot_too_low)
            with unit_of_work(factory) as session:
                record_feed_success(session, provider, fetched.rows, when, fetched.note())
            outcomes.append(FeedOutcome(provider, True, len(fetched.rows), note=fetched.note()))
            log.info("catalog feed %s: %d offers", provider, len(fetched.rows))
        except (FeedError, FeedDataError, GpuplanError) as exc:
            error = (exc.message if isinstance(exc, GpuplanError) else str(exc))[:2000]
            with unit_of_work(factory) as session:
                kept_from = record_feed_failure(session, provider, error, when)
            outcome = FeedOutcome(provider, False, 0, error=error, kept_from=kept_from)
            outcomes.append(outcome)
            # Marked: `gpuplan catalog refresh` prints each outcome itself, and leaves this record out.
            log.warning("catalog feed %s %s", provider, outcome.failure(), extra={"feed_outcome": provider})
    return outcomes
