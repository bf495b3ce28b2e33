"""The Hub client and the resolver against a loopback fake of the Hub (no test reaches the internet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.errors import EstimatorError
from services.estimator.plan import Plan
from services.hub.client import fetch_model, stored_format
from services.hub.errors import HubFileInvalid, HubModelGated, HubModelNotFound, HubUnreachable
from services.hub.models import HubSettings
from services.hub.service import DiskCache, resolve_model, with_model_config
from tests.hub.conftest import INDEX, QWEN_1_8B
from tests.hub.fake_hub import FakeHub


def test_fetch_reads_config_and_the_index_size_and_format(hub: FakeHub) -> None:
    hub.add_model("Acme/Qwen1-1_8B-SFT", QWEN_1_8B, index=INDEX)
    model = fetch_model("Acme/Qwen1-1_8B-SFT")
    assert model.config == QWEN_1_8B
    assert model.checkpoint is not None
    assert model.checkpoint.stored_bytes == 3_673_657_344 and model.checkpoint.dtype == "bf16"
    assert len(model.revision) == 40
    # The fetched config estimates as any other: Qwen-1.8B's model card gives 1.84B parameters.
    total = parameter_counts(architecture_from_config(model.config)).total
    assert abs(total - 1.84e9) / 1.84e9 < 0.005


def test_without_an_index_the_single_file_size_comes_from_a_head(hub: FakeHub) -> None:
    repo = hub.add_model("acme/one-file", QWEN_1_8B)
    repo.files["model.safetensors"] = b"\0" * 4096
    repo.lfs = frozenset({"model.safetensors"})
    model = fetch_model("acme/one-file")
    assert model.checkpoint is not None and model.checkpoint.stored_bytes == 4096
    assert ("GET", "/acme/one-file/resolve/" + model.revision + "/model.safetensors", None) not in hub.requests


def test_not_found_gated_and_unreachable_are_distinct(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_model("meta-llama/Secret-8B", QWEN_1_8B, gated_token="hf_good")
    with pytest.raises(HubModelNotFound) as nf:
        fetch_model("acme/does-not-exist")
    assert nf.value.field == "model.name" and "not found" in nf.value.message
    with pytest.raises(HubModelGated) as gated:
        fetch_model("meta-llama/Secret-8B")
    assert "HF_TOKEN" in gated.value.message and gated.value.code == "model_gated"
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubModelGated) as denied:
        fetch_model("meta-llama/Secret-8B")
    assert "not been granted" in denied.value.message
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert fetch_model("meta-llama/Secret-8B").config == QWEN_1_8B
    assert any(auth == "Bearer hf_good" for _, _, auth in hub.requests)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(HubUnreachable) as down:
        fetch_model("meta-llama/Secret-8B", HubSettings(timeout_s=2))
    assert down.value.code == "hub_unreachable" and "127.0.0.1:9" in down.value.message


def test_a_slow_hub_is_bounded_by_the_timeout(hub: FakeHub) -> None:
    hub.add_model("acme/slow", QWEN_1_8B)
    hub.delay_s = 1.5
    with pytest.raises(HubUnreachable):
        fetch_model("acme/slow", HubSettings(timeout_s=0.5))


def test_a_repo_without_config_and_oversized_or_broken_files(hub: FakeHub) -> None:
    repo = hub.add_model("acme/no-config", QWEN_1_8B)
    del repo.files["config.json"]
    with pytest.raises(HubModelNotFound, match=r"no config\.json"):
        fetch_model("acme/no-config")
    hub.add_model("acme/huge", {"model_type": "llama", "pad": "x" * 5000})
    with pytest.raises(HubFileInvalid, match="limit"):
        fetch_model("acme/huge", HubSettings(max_file_bytes=1000))
    hub.add_model("acme/list", b"[1, 2]")
    with pytest.raises(HubFileInvalid, match="JSON object"):
        fetch_model("acme/list")
    hub.add_model("acme/broken", b"{not json")
    with pytest.raises(HubFileInvalid, match="not valid JSON"):
        fetch_model("acme/broken")
    hub.add_model("acme/nan", b'{"model_type": "llama", "hidden_size": NaN}')
    with pytest.raises(HubFileInvalid, match="not valid JSON"):
        fetch_model("acme/nan")
    hub.add_model("acme/nul", {"model_type": "llama", "_name_or_path": "a\u0000b"})
    with pytest.raises(HubFileInvalid, match="NUL"):
        fetch_model("acme/nul")
    hub.add_model("acme/deep", ("{" + '"a": {' * 40 + "}" * 41).encode())
    with pytest.raises(HubFileInvalid, match="deeper"):
        fetch_model("acme/deep")


def test_bad_ids_never_reach_the_hub(hub: FakeHub) -> None:
    for bad in ("../etc/passwd", "a/b/c", "a b", "x" * 300, "acme/..", "/abs"):
        with pytest.raises(HubModelNotFound):
            fetch_model(bad)
    assert hub.requests == []


def test_resolver_prefers_the_catalog_then_the_cache(hub: FakeHub, tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    bundled = resolve_model("meta-llama/Llama-3.1-8B", cache)
    assert bundled.origin == "catalog" and hub.requests == []
    hub.add_model("Acme/Qwen1-1_8B-SFT", QWEN_1_8B, index=INDEX)
    first = resolve_model("Acme/Qwen1-1_8B-SFT", cache)
    assert first.origin == "hub" and first.checkpoint is not None
    hub.close()  # offline from now on: the cached copy answers
    again = resolve_model("acme/QWEN1-1_8b-sft", cache)
    assert again.origin == "cache" and again.config == QWEN_1_8B
    assert again.checkpoint is not None and again.checkpoint.stored_bytes == INDEX["metadata"]["total_size"]
    assert json.loads(next(tmp_path.iterdir()).read_text())["config"] == QWEN_1_8B


def test_a_name_that_is_not_an_id_keeps_the_catalog_hint(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(EstimatorError) as err:
        resolve_model("Llama 3.1 8B please", DiskCache(tmp_path))
    assert err.value.field == "model.name" and "Closest" in err.value.message


def test_with_model_config_hands_the_config_down(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_model("Acme/Qwen1-1_8B-SFT", QWEN_1_8B)
    plan = Plan.model_validate({"model": {"name": "Acme/Qwen1-1_8B-SFT"}, "method": "lora"})
    filled, resolved = with_model_config(plan, DiskCache(tmp_path))
    assert resolved is not None and filled.model.name == "Acme/Qwen1-1_8B-SFT" and filled.model.config == QWEN_1_8B
    pasted = Plan.model_validate({"model": {"config": QWEN_1_8B}})
    assert with_model_config(pasted, DiskCache(tmp_path)) == (pasted, None)


def test_stored_format_from_weight_names() -> None:
    assert stored_format(["model.layers.0.mlp.experts.gate_up_proj_blocks"], {}) == "mxfp4"
    assert stored_format(["model.layers.0.self_attn.q_a_proj.weight_scale_inv"], {}) == "fp8"
    assert stored_format(["model.layers.0.mlp.down_proj.weight.absmax"], {}) == "bitsandbytes"
    assert stored_format(["model.layers.0.mlp.down_proj.qweight"], {}) == "int4 (GPTQ/AWQ)"
    assert stored_format(["lm_head.weight"], {"torch_dtype": "float16"}) == "fp16"
    assert stored_format([], {}) is None


def test_a_bundled_name_is_left_to_the_estimator(tmp_path: Path) -> None:
    plan = Plan.model_validate({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}})
    assert with_model_config(plan, DiskCache(tmp_path)) == (plan, None)


def test_a_refused_id_is_remembered_briefly_but_a_token_change_asks_again(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_model("acme/gated-2b", QWEN_1_8B, gated_token="hf_ok")
    cache = DiskCache(tmp_path)
    for _ in range(3):
        with pytest.raises(HubModelNotFound):
            resolve_model("acme/missing-2b", cache)
        with pytest.raises(HubModelGated):
            resolve_model("acme/gated-2b", cache)
    asked = [path for _, path, _ in hub.requests]
    assert sum("missing-2b" in p for p in asked) == 1 and sum("gated-2b" in p for p in asked) == 1
    monkeypatch.setenv("HF_TOKEN", "hf_ok")
    assert resolve_model("acme/gated-2b", cache).origin == "hub"
