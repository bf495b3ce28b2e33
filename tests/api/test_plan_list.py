"""GET /v1/plans: keyset pages over summary rows, stable under equal timestamps, scoped to the org."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from services.core.db import make_engine, make_sessionmaker, unit_of_work, utcnow
from services.orgs.tables import Organization
from services.plans.tables import PlanRow
from tests.api.conftest import QLORA_PLAN, Api


def test_pages_walk_every_plan_once_newest_first_as_summaries(api: Api) -> None:
    factory = make_sessionmaker(make_engine(api.url))
    start = utcnow() - timedelta(days=1)
    with unit_of_work(factory) as session:
        org_ids = {name: org_id for name, org_id in session.execute(select(Organization.name, Organization.id)).all()}
        for i in range(25):
            at = start + timedelta(seconds=i // 3)  # three plans share each timestamp
            session.add(
                PlanRow(
                    organization_id=org_ids["alpha"],
                    status="done",
                    request=QLORA_PLAN,
                    model_name=f"m{i}",
                    method="qlora",
                    created_at=at,
                    recommendations=[{"gpu": "L4", "rank": r} for r in range(50)],
                    cheapest={"gpu": "L4", "rank": 0},
                )
            )
        session.add(
            PlanRow(organization_id=org_ids["beta"], status="queued", request=QLORA_PLAN, model_name="b", method="lora")
        )
    seen: list[dict[str, object]] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, object] = {"limit": 10, **({"before": cursor} if cursor else {})}
        body = api.client.get("/v1/plans", params=params, headers=api.headers()).json()
        seen.extend(body["items"])
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and len(seen) == 25 and len({p["id"] for p in seen}) == 25
    keys = [(p["created_at"], p["id"]) for p in seen]
    assert keys == sorted(keys, reverse=True)  # newest first, ties by id
    assert set(seen[0]) == {"id", "status", "model", "method", "created_at", "cheapest"}  # no full plan
    assert seen[0]["cheapest"] == {"gpu": "L4", "rank": 0}
    assert all(p["model"] != "b" for p in seen)  # another organization's plan is not listed
