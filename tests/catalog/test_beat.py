"""The beat refreshes the configured live price feeds on their interval (no worker is started here)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from services.core.settings import Settings
from workers.celery_app import TASK_QUEUES, make_celery


def test_the_beat_refreshes_the_configured_feeds_on_the_interval() -> None:
    settings = Settings(
        redis_url="redis://127.0.0.1:6379/15", catalog_feeds="runpod, aws", catalog_refresh_interval_s=3600
    )
    app = make_celery(settings)
    entry = app.conf.beat_schedule["refresh-catalog-feeds"]
    assert entry["task"] == "gpuplan.catalog.refresh_feeds"
    assert entry["schedule"] == timedelta(hours=1) and entry["options"] == {"expires": 3600}
    assert TASK_QUEUES["gpuplan.catalog.refresh_feeds"] == "maintenance"
    assert settings.feed_names == ("runpod", "aws")


def test_no_feeds_configured_means_no_beat_entry() -> None:
    app = make_celery(Settings(redis_url="redis://127.0.0.1:6379/15"))
    assert "refresh-catalog-feeds" not in app.conf.beat_schedule


def test_the_task_is_registered_under_its_stable_name() -> None:
    import workers.tasks
    from workers.celery_app import app

    assert "gpuplan.catalog.refresh_feeds" in app.tasks
    assert workers.tasks.refresh_catalog_feeds.name == "gpuplan.catalog.refresh_feeds"


@pytest.mark.parametrize(("name", "value"), [("catalog_feeds", "runpod,azure"), ("catalog_refresh_interval_s", 10)])
def test_feed_settings_are_checked(name: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(**{name: value})
    assert name in str(info.value)
