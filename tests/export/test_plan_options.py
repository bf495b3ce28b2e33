"""The plan's kernels, double_quant and framework_version in every format: written where the tool has the
switch (and read by the real tool's schema), refused with the field named where it has none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.export import read_back
from services.export.errors import ExportError
from services.export.replan import retarget_plan
from tests.export.helpers import export, llama_plan

ROOT = Path(__file__).resolve().parents[2]
EXPORTCHECK = Path(os.environ.get("GPUPLAN_EXPORTCHECK_DIR", ROOT / ".gpuplan" / "exportcheck"))
HF_FORMATS = ["hf-trainer", "accelerate", "deepspeed"]
# Each format's setup: deepspeed needs a ZeRO stage on several GPUs.
SETUP: dict[str, dict[str, Any]] = {"deepspeed": {"gpus": 2, "sharding": "zero2"}}


def _hf_args(fmt: str, method: str, **fields: Any) -> dict[str, Any]:
    bundle = export(llama_plan(fmt, method, **SETUP.get(fmt, {}), **fields), fmt)
    args: dict[str, Any] = json.loads(bundle.files["hf_args.json"])
    return args


def _refused(fmt: str, method: str, **fields: Any) -> ExportError:
    with pytest.raises(ExportError) as err:
        export(llama_plan(fmt, method, **SETUP.get(fmt, {}), **fields), fmt)
    return err.value


# --------------------------------------------------------------------------------------------------
# Trainer-based formats


@pytest.mark.parametrize("fmt", HF_FORMATS)
def test_liger_is_use_liger_kernel_read_by_training_arguments(fmt: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    plan = llama_plan(fmt, "lora", kernels="liger", **SETUP.get(fmt, {}))
    bundle = export(plan, fmt)
    args = json.loads(bundle.files["hf_args.json"])["training_args"]
    assert args["use_liger_kernel"] is True
    args = {**args, "output_dir": str(tmp_path / "out"), "use_cpu": True, "deepspeed": None}
    assert transformers.TrainingArguments(**args).use_liger_kernel is True
    assert "liger-kernel==0.8.1" in bundle.files["requirements.txt"].splitlines()
    # The files carry it: read back onto a plan without kernels, they give Liger again.
    assert read_back(fmt, bundle.files, llama_plan(fmt, "lora", **SETUP.get(fmt, {}))).kernels == "liger"


def test_no_kernels_is_use_liger_kernel_false_and_fused_loss_is_liger() -> None:
    assert _hf_args("hf-trainer", "lora", kernels="none")["training_args"]["use_liger_kernel"] is False
    assert _hf_args("hf-trainer", "lora")["training_args"]["use_liger_kernel"] is False
    # The Trainer's fused loss comes from Liger (services/estimator/recipe.py resolved_kernels).
    assert _hf_args("hf-trainer", "lora", loss="fused")["training_args"]["use_liger_kernel"] is True


@pytest.mark.parametrize("fmt", [*HF_FORMATS, "axolotl"])
def test_transformer_engine_and_liger_without_its_loss_are_refused(fmt: str) -> None:
    assert _refused(fmt, "lora", kernels="transformer-engine").field == "kernels"
    assert _refused(fmt, "lora", kernels="liger", loss="standard").field == "loss"


@pytest.mark.parametrize("fmt", HF_FORMATS)
@pytest.mark.parametrize("double_quant", [True, False])
def test_double_quant_goes_to_bits_and_bytes_config(fmt: str, double_quant: bool) -> None:
    transformers = pytest.importorskip("transformers")
    plan = llama_plan(fmt, "qlora", double_quant=double_quant, **SETUP.get(fmt, {}))
    bundle = export(plan, fmt)
    quant = json.loads(bundle.files["hf_args.json"])["quantization_config"]
    assert quant["bnb_4bit_use_double_quant"] is double_quant
    config = transformers.BitsAndBytesConfig(**quant)
    assert config.bnb_4bit_use_double_quant is double_quant
    back = read_back(fmt, bundle.files, llama_plan(fmt, "qlora", **SETUP.get(fmt, {})))
    assert back.double_quant is (True if double_quant else None)


def test_framework_version_is_pinned_or_refused() -> None:
    bundle = export(llama_plan("hf-trainer", "lora", framework_version="5.23.1"), "hf-trainer")
    assert "transformers==5.23.1" in bundle.files["requirements.txt"].splitlines()
    # activation_checkpointing (transformers 5.23) and the other keys the files write need 5.23 or later.
    err = _refused("hf-trainer", "lora", framework_version="4.46.0")
    assert err.field == "framework_version" and "5.23" in err.message


# --------------------------------------------------------------------------------------------------
# axolotl


def test_axolotl_liger_and_double_quant_are_written_and_read_back() -> None:
    bundle = export(llama_plan("axolotl", "qlora", kernels="liger", double_quant=True), "axolotl")
    config = yaml.safe_load(bundle.files["axolotl.yaml"])
    assert config["plugins"] == ["axolotl.integrations.liger.LigerPlugin"]
    keys = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")
    assert all(config[key] is True for key in keys)
    assert config["bnb_config_kwargs"]["bnb_4bit_use_double_quant"] is True
    back = read_back("axolotl", bundle.files, llama_plan("axolotl", "qlora"))
    assert (back.kernels, back.double_quant) == ("liger", True)
    plain = yaml.safe_load(export(llama_plan("axolotl", "qlora"), "axolotl").files["axolotl.yaml"])
    assert "plugins" not in plain and plain["bnb_config_kwargs"]["bnb_4bit_use_double_quant"] is False


def test_axolotl_pins_its_release_and_refuses_an_older_one() -> None:
    bundle = export(llama_plan("axolotl", "lora", framework_version="0.19.1"), "axolotl")
    assert "axolotl==0.19.1" in bundle.files["requirements.txt"].splitlines()
    assert _refused("axolotl", "lora", framework_version="0.8.0").field == "framework_version"


# axolotl's validate_config merges each plugin's argument model into the config model (integrations/config.py
# merge_input_args); the Liger plugin's is LigerArgs. Its module is loaded from its file: the package's
# __init__ imports the plugin machinery, which needs packages axolotl pins beside this project's.
_AXOLOTL_LIGER_CHECK = textwrap.dedent(
    """
    import importlib.util, json, sys, warnings
    warnings.simplefilter("error", FutureWarning)
    from axolotl.utils.schemas.config import AxolotlConfigWCapabilities as Base
    spec = importlib.util.spec_from_file_location("liger_args", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    class WithLiger(Base, module.LigerArgs):
        pass
    capabilities = {"capabilities": {"bf16": True, "fp8": False, "n_gpu": 1, "n_node": 1,
                                     "compute_capability": "sm_90"},
                    "env_capabilities": {"torch_version": "2.13.0"}}
    out = []
    for config in json.load(sys.stdin):
        try:
            dumped = WithLiger(**config, **capabilities).model_dump(exclude_none=True)
            out.append({"ok": True, "liger": {k: v for k, v in dumped.items() if k.startswith("liger_")},
                        "bnb": dumped.get("bnb_config_kwargs")})
        except Exception as exc:
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(out))
    """
)


def test_axolotl_schema_reads_the_liger_keys_and_double_quant() -> None:
    where = EXPORTCHECK / "axolotl"
    args_file = where / "axolotl" / "integrations" / "liger" / "args.py"
    if not args_file.exists():
        pytest.skip(f"axolotl's wheel is not unpacked at {where} (bash infra/dev.sh test does it)")
    configs = [
        yaml.safe_load(export(llama_plan("axolotl", method, kernels="liger", **extra), "axolotl").files["axolotl.yaml"])
        for method, extra in [("qlora", {"double_quant": True}), ("lora", {"gpus": 4, "sharding": "fsdp"})]
    ]
    wrong = {**configs[0], "liger_rope": "sometimes"}  # control: a bad value is caught
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-c", _AXOLOTL_LIGER_CHECK, str(args_file)],
        input=json.dumps([*configs, wrong]),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    *found, caught = json.loads(result.stdout.strip().splitlines()[-1])
    assert not caught["ok"] and "liger_rope" in caught["error"], caught
    for outcome in found:
        assert outcome["ok"], outcome.get("error")
        expected = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")
        assert all(outcome["liger"].get(key) is True for key in expected), outcome["liger"]
    assert found[0]["bnb"]["bnb_4bit_use_double_quant"] is True


# --------------------------------------------------------------------------------------------------
# torchtune


@pytest.mark.parametrize("kernels", ["liger", "transformer-engine"])
def test_torchtune_refuses_kernels(kernels: str) -> None:
    assert _refused("torchtune", "lora", kernels=kernels).field == "kernels"


def test_torchtune_double_quant_false_is_refused_true_is_what_runs() -> None:
    assert _refused("torchtune", "qlora", double_quant=False).field == "double_quant"
    export(llama_plan("torchtune", "qlora", double_quant=True), "torchtune")
    export(llama_plan("torchtune", "lora", kernels="none"), "torchtune")


def test_torchtune_refuses_a_release_its_config_does_not_fit() -> None:
    err = _refused("torchtune", "lora", framework_version="0.2.1")
    assert err.field == "framework_version" and "0.6.1" in err.message
    bundle = export(llama_plan("torchtune", "lora", framework_version="0.6.1"), "torchtune")
    assert "torchtune==0.6.1" in bundle.files["requirements.txt"].splitlines()


def test_replanning_for_another_framework_drops_the_old_frameworks_release() -> None:
    # A transformers release says nothing of axolotl's or torchtune's: pinning it as theirs would be wrong.
    plan = llama_plan("hf-trainer", "lora", framework_version="5.23.1")
    for fmt, package in (("axolotl", "axolotl"), ("torchtune", "torchtune")):
        moved, notes = retarget_plan(plan, fmt)
        assert moved.framework_version is None
        assert any("framework_version 5.23.1 -> null" in note for note in notes)
        assert f"{package}==5.23.1" not in export(moved, fmt).files["requirements.txt"]
