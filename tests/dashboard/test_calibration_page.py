"""The benchmarks page shows where each calibration ran and whether it is used, and starts one (issue 25)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import Api
from tests.api.test_calibration_trust import A100_NVML, LLAMA_LORA, _estimate, _node, _submit
from tests.dashboard.conftest import csrf_token


def _calibration_table(html: str) -> str:
    return html.split('aria-label="Calibration runs"', 1)[1].split("</table>", 1)[0]


def test_the_table_shows_device_gpu_count_and_why_a_result_is_not_used(api: Api, alpha: TestClient) -> None:
    rate = _estimate(api, LLAMA_LORA)["tokens_per_s_per_gpu"]
    _submit(api, _node(api, nvml_gpu="", gpu_count=0), LLAMA_LORA, 30.1, device="cpu")
    implausible = _submit(api, _node(api), LLAMA_LORA, rate * 0.02)
    used = _submit(api, _node(api), LLAMA_LORA, rate * 0.9)
    table = _calibration_table(alpha.get("/dashboard/benchmarks").text)
    for column in ("Measured on", "GPUs", "Used for estimates"):
        assert f">{column}</th>" in table
    rows = table.split("<tbody>", 1)[1].split("</tr>")
    cpu_row = next(r for r in rows if "<td>cpu" in r)
    assert '<td class="num">0</td>' in cpu_row and "not used" in cpu_row
    assert "CPU measurement never calibrates a GPU" in cpu_row
    slow_row = next(r for r in rows if "implausible" in r)
    assert implausible["unused_reason"].split(" (")[0] in slow_row  # the API's reason, as the API gives it
    assert f'<td>{A100_NVML} <span class="badge">NVML verified</span>' in slow_row
    assert sum(1 for r in rows if '<td class="used">yes</td>' in r) == 1 and used["used"] is True


def test_a_calibration_is_started_from_the_page(api: Api, alpha: TestClient) -> None:
    plan_id = alpha.post("/v1/plans", json=LLAMA_LORA, headers=api.headers()).json()["id"]
    assert api.wait_for_plan(plan_id)["status"] == "done"
    node = _node(api)
    page = alpha.get("/dashboard/benchmarks").text
    assert "No calibration runs yet" in page and f'<option value="{node["id"]}">' in page
    assert f'<option value="{plan_id}">' in page
    form = {"csrf_token": csrf_token(page), "node_id": node["id"], "plan_id": plan_id, "timed_steps": "3"}
    started = alpha.post("/dashboard/calibrations", data=form, follow_redirects=False)
    assert started.status_code == 303, started.text
    # The same job the API's endpoint queues: the node's agent claims it, with the plan to run.
    agent = {**api.headers(), "X-Node-Token": node["node_token"]}
    claimed = alpha.post(f"/v1/nodes/{node['id']}/calibrations/next", headers=agent, json={})
    assert claimed.status_code == 200 and claimed.json()["plan_id"] == plan_id
    assert claimed.json()["timed_steps"] == 3 and claimed.json()["warmup_steps"] == 2
    jobs = alpha.get("/dashboard/benchmarks").text.split('aria-label="Calibration jobs"', 1)[1]
    assert "<td>running</td>" in jobs
    # Bad input is a message on the page, not a 500; a foreign or unknown node likewise.
    bad = alpha.post("/dashboard/calibrations", data={**form, "timed_steps": "0"})
    assert bad.status_code == 422 and "timed steps: from 1 to 1000 (got 0)" in bad.text
    unknown = alpha.post("/dashboard/calibrations", data={**form, "node_id": "nope"})
    assert unknown.status_code == 422 and "no node" in unknown.text
    refused = alpha.post("/dashboard/calibrations", data={k: v for k, v in form.items() if k != "csrf_token"})
    assert refused.status_code in (400, 403)
