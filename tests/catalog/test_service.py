"""The catalog service over a migrated database: additive imports, organization overlays, pruning."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from services.catalog.market import Market
from services.catalog.offers import bundled_offers
from services.catalog.pricelist import parse_price_list
from services.catalog.service import (
    KEEP_INACTIVE_VERSIONS,
    active_offers,
    catalog_offers,
    import_offers,
    record_feed_success,
)
from services.catalog.tables import CatalogVersion, GpuOfferRow
from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.core.errors import Unprocessable
from services.orgs.service import create_organization
from tests.databases import migrate


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    migrate(url)
    yield make_sessionmaker(make_engine(url))


def _offers(text: str) -> list:  # type: ignore[type-arg]
    # The bundled cloudrux rows are 8-GPU nodes; the same node shape makes the same offer.
    return parse_price_list("provider,gpu,on_demand_usd_per_hour,region,gpus_per_node\n" + text, "csv")


def test_an_import_upserts_its_providers_and_keeps_the_rest(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        before = catalog_offers(session)
        result = import_offers(session, _offers("cloudrux,L4,0.70,partner-dc,8\nnewco,H100,3,eu,8\n"), source="t")
        assert (result.added, result.updated, result.kept, result.removed) == (1, 1, len(bundled_offers()) - 1, 0)
    with unit_of_work(factory) as session:
        after = catalog_offers(session)
        # A Market per version: the columns plans read are kept with the cached version, and a new version is a
        # new Market (no column of the old one carries over).
        assert isinstance(after, Market) and catalog_offers(session) is after and after is not before
    assert len(after) == len(before) + 1
    assert [o.on_demand_usd_per_hour for o in after if (o.provider, o.gpu) == ("cloudrux", "L4")] == [0.70]
    assert {o for o in before if o.provider == "aws"} == {o for o in after if o.provider == "aws"}


def test_replacing_a_provider_drops_its_other_offers_in_the_same_version(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        result = import_offers(
            session, _offers("cloudrux,L4,0.70,partner-dc,8\n"), source="t", replace_providers=["cloudrux"]
        )
        assert (result.updated, result.removed, result.kept) == (1, 8, len(bundled_offers()) - 9)
        assert sorted(o.gpu for o in catalog_offers(session) if o.provider == "cloudrux") == ["L4"]
        with pytest.raises(Unprocessable) as info:
            import_offers(session, _offers("a,L4,1,x,8\n"), source="t", replace_providers=["nobody"])
        assert info.value.field == "replace_provider" and "cloudrux" in info.value.message


def test_an_organizations_offers_overlay_the_public_ones_for_it_alone(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        alpha = create_organization(session, "alpha").id
        beta = create_organization(session, "beta").id
        public = catalog_offers(session)
        import_offers(
            session, _offers("cloudrux,L4,0.10,partner-dc,8\nown,A40,0.01,lab,8\n"), source="t", organization_id=alpha
        )
        assert catalog_offers(session, beta) == public == catalog_offers(session)
        mine = catalog_offers(session, alpha)
        assert len(mine) == len(public) + 1
        assert [o.on_demand_usd_per_hour for o in mine if (o.provider, o.gpu) == ("cloudrux", "L4")] == [0.10]
        # Filters apply after the overlay: the overridden public L4 never shows through.
        cheap = active_offers(session, alpha, gpu="L4")
        assert [(r.provider, r.on_demand_usd_per_hour) for r in cheap if r.provider == "cloudrux"] == [
            ("cloudrux", 0.10)
        ]
        assert {r.provider for r in cheap} == {o.provider for o in bundled_offers() if o.gpu == "L4"}
        assert active_offers(session, alpha, gpu="L4", max_usd_per_hour=0.05) == []


def test_old_versions_are_pruned(factory: sessionmaker[Session]) -> None:
    with unit_of_work(factory) as session:
        for i in range(KEEP_INACTIVE_VERSIONS + 5):
            import_offers(session, _offers(f"newco,H100,{3 + i / 100},eu,8\n"), source=f"import {i}")
    with unit_of_work(factory) as session:
        versions = session.scalar(
            select(func.count()).select_from(CatalogVersion).where(CatalogVersion.kind == "offers")
        )
        assert versions == KEEP_INACTIVE_VERSIONS + 1
        rows = session.scalar(select(func.count()).select_from(GpuOfferRow))
        assert rows == (KEEP_INACTIVE_VERSIONS + 1) * (len(bundled_offers()) + 1)


def test_the_migrated_catalog_is_the_bundled_list_with_its_v2_columns(factory: sessionmaker[Session]) -> None:
    from services.catalog.offers import bundled_offers

    with unit_of_work(factory) as session:
        assert set(catalog_offers(session)) == set(bundled_offers())


def test_a_feed_replaces_its_providers_offers_imported_in_another_case(factory: sessionmaker[Session]) -> None:
    """A file imported "NewCloud"; the newcloud feed's refresh matched the provider exactly, so it upserted beside the
    file's offers and the A40 it no longer lists stayed in the catalog at its old price."""
    with unit_of_work(factory) as session:
        import_offers(session, _offers("NewCloud,L4,0.50,eu,1\nNewCloud,A40,0.60,eu,1\n"), source="file")
        row = {"provider": "newcloud", "gpu": "L4", "on_demand_usd_per_hour": 0.45, "region": "eu", "gpus_per_node": 1}
        result = record_feed_success(session, "newcloud", [row], datetime(2026, 12, 1, tzinfo=UTC))
        assert (result.updated, result.removed) == (1, 1)
        mine = [(o.provider, o.gpu, o.on_demand_usd_per_hour) for o in catalog_offers(session)]
        assert [m for m in mine if m[0].casefold() == "newcloud"] == [("NewCloud", "L4", 0.45)]
