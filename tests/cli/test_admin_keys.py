"""`gpuplan admin` key management as the user runs it: a subprocess on a fresh SQLite database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from services.core.db import make_engine, make_sessionmaker, unit_of_work
from services.orgs.service import authenticate


def test_create_list_rotate_and_revoke_keys(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPLAN_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])

    def gp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli.main", *args], capture_output=True, text=True, cwd=tmp_path, env=env
        )

    factory = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'gpuplan.db'}"))
    assert gp("admin", "create-org", "acme").returncode == 0
    made = gp("admin", "create-key", "--org", "acme", "--scope", "read", "--name", "grafana", "--expires-in", "3600")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    with unit_of_work(factory) as session:
        principal = authenticate(session, f"Bearer {key}")
    assert principal.scopes == {"read"} and not principal.admin

    listed = gp("admin", "list-keys", "--org", "acme", "--json")
    items = json.loads(listed.stdout)["items"]
    assert [(i["name"], i["scopes"], i["prefix"]) for i in items] == [("grafana", ["read"], key[:10])]
    assert items[0]["expires_at"] is not None and key not in listed.stdout

    rotated = gp("admin", "rotate-key", key[:10])
    assert rotated.returncode == 0, rotated.stderr
    new_key = rotated.stdout.strip()
    assert new_key.startswith("gp_") and new_key != key
    revoked = gp("admin", "revoke-key", new_key[:10])
    assert revoked.returncode == 0 and "refused from the next request" in revoked.stderr
    with unit_of_work(factory) as session:
        for old in (key, new_key):
            try:
                authenticate(session, f"Bearer {old}")
            except Exception as exc:  # Unauthorized
                assert "revoked" in str(exc)
            else:
                raise AssertionError("a revoked key still authenticates")
    table = gp("admin", "list-keys", "--org", "acme", "--all")
    assert table.returncode == 0 and table.stdout.count("grafana") == 2

    for args, message in (
        (("create-key", "--org", "acme", "--scope", "root"), "unknown scope 'root'"),
        (("create-key", "--org", "acme", "--scope", "agent"), "node_id"),
        (("create-key", "--org", "nobody"), "no organization named 'nobody'"),
        (("create-key", "--org", "acme", "--expires-in", "5"), "--expires-in"),
        (("revoke-key", "gp_nothing"), "no single key"),
        (("rotate-key", key[:10]), "revoked"),
    ):
        bad = gp("admin", *args)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1
