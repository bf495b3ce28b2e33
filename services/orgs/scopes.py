"""Key scopes and what each lets a request do (pure: no web framework, no database).

- ``read``: GET the organization's plans, quotes, nodes, runs, data sets, catalog.
- ``plan``: everything a user does that writes (plans, estimates, quotes, runs, data sets, nodes).
- ``agent``: a node's key; only the agent's own calls (heartbeat, calibration jobs, run join and
  checkpoint reports) and only for the node (and run) it is bound to.
- ``admin``: the organization's keys and audit log (and, with the catalog's rules, its price list).

The split follows least privilege as in OWASP's API Security Top 10 (API5:2023 Broken Function Level
Authorization): each route names the scope it needs, and a key only carries the scopes it was given.
"""

from __future__ import annotations

from collections.abc import Iterable

SCOPES = ("read", "plan", "agent", "admin")
DEFAULT_SCOPES = frozenset({"read", "plan"})
ADMIN_SCOPES = frozenset({"read", "plan", "admin"})

# The agent's calls (services/agent, services/runs/client.py): method and route template.
AGENT_ROUTES = frozenset(
    {
        ("POST", "/v1/nodes/{node_id}/heartbeat"),
        ("POST", "/v1/nodes/{node_id}/calibrations/next"),
        ("POST", "/v1/calibrations/{calibration_id}/result"),
        ("POST", "/v1/calibrations/{calibration_id}/failure"),
        ("POST", "/v1/runs/{run_id}/nodes"),
        ("GET", "/v1/runs/{run_id}"),
        ("POST", "/v1/runs/{run_id}/checkpoints"),
        ("POST", "/v1/runs/{run_id}/checkpoints/{step}/deleted"),
    }
)
ADMIN_PREFIXES = ("/v1/keys", "/v1/audit")


def parse_scopes(value: str | Iterable[str], field: str = "scopes") -> frozenset[str]:
    """A set of known scopes from a comma list or an iterable; ValueError naming the bad one."""
    items = value.split(",") if isinstance(value, str) else list(value)
    scopes = frozenset(s.strip() for s in items if s.strip())
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise ValueError(f"{field}: unknown scope {unknown[0]!r}; allowed: {', '.join(SCOPES)}")
    if not scopes:
        raise ValueError(f"{field}: give at least one of {', '.join(SCOPES)}")
    if "agent" in scopes and len(scopes) > 1:
        raise ValueError(f"{field}: 'agent' is a node's key and takes no other scope")
    return scopes


def format_scopes(scopes: Iterable[str]) -> str:
    return ",".join(s for s in SCOPES if s in set(scopes))


def allowed_scopes(method: str, route: str) -> frozenset[str]:
    """The scopes any one of which lets a request through (``route`` is the route template)."""
    if route.startswith(ADMIN_PREFIXES):
        return frozenset({"admin"})
    if (method, route) in AGENT_ROUTES:
        # A user key may act for its nodes too (an agent started with the organization's key).
        return frozenset({"agent", "read" if method == "GET" else "plan"})
    if method in ("GET", "HEAD", "OPTIONS"):
        return frozenset({"read"})
    return frozenset({"plan"})
