"""Property-based API fuzzing: no input makes any endpoint answer 500 (schemathesis over OpenAPI)."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.migrate import upgrade
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization


@pytest.mark.slow
def test_no_input_causes_a_server_error(tmp_path: Path, s3_settings: Settings) -> None:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    upgrade(url)
    with unit_of_work(make_sessionmaker(make_engine(url))) as session:
        create_organization(session, "fuzz")
        key = create_key(session, "fuzz", admin=True)
    # With object storage, so the data set endpoints are fuzzed past their "no bucket" 503.
    app = create_app(s3_settings.model_copy(update={"database_url": url}))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    failures: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            response = case.call(headers={"Authorization": f"Bearer {key}"})
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")

        check()
    assert failures == []
