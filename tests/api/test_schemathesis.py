"""Property-based API fuzzing over OpenAPI (issue 15.4): no input makes any endpoint answer a server
error or a status code its schema does not declare, and every path answers an undeclared method with
405 and an ``Allow`` header naming the methods it does serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from services.api.app import create_app
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.settings import Settings
from services.orgs.service import create_key, create_organization
from tests.conftest import bounded_test_client
from tests.databases import migrate

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
HTTP_METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH")


def _fuzz(operation: Any, mode: GenerationMode, key: str, failures: list[str]) -> None:
    """Up to 25 generated requests of one mode against one operation; failed checks go to ``failures``."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: schemathesis.Case) -> None:
        response = case.call(headers={"Authorization": f"Bearer {key}"})
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception as exc:  # schemathesis raises one group naming every failed check
            failures.append(f"{case.method} {case.formatted_path} ({mode}): {response.status_code} {exc}"[:600])

    try:
        check()
    except Unsatisfiable:
        # An operation without parameters or body has no invalid request to generate.
        if mode != GenerationMode.NEGATIVE:
            raise


@pytest.mark.slow
def test_no_input_causes_a_server_error_or_an_undocumented_status(tmp_path: Path, s3_settings: Settings) -> None:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
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
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(operation, mode, key, failures)
    assert failures == []


def test_every_path_answers_an_undeclared_method_with_405_and_allow(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
    with unit_of_work(make_sessionmaker(make_engine(url))) as session:
        create_organization(session, "fuzz")
        key = create_key(session, "fuzz", admin=True)
    with bounded_test_client(create_app(Settings(database_url=url))) as client:
        paths = client.get("/openapi.json").json()["paths"]
        checked = 0
        for template, operations in paths.items():
            path = template.replace("{", "").replace("}", "")  # any id: routing decides 405 before lookup
            declared = sorted(m.upper() for m in operations)
            for method in HTTP_METHODS:
                if method in declared:
                    continue
                response = client.request(method, path, headers={"Authorization": f"Bearer {key}"})
                assert response.status_code == 405, (method, template, response.status_code)
                allow = sorted(response.headers["Allow"].split(", "))
                assert allow == declared, (method, template, allow)
                checked += 1
        assert checked > 20
