"""The exported files themselves: headers, the script's literals, checkpoint steps, readers' errors, purity."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from typing import Any

import pytest
import yaml

from services.export import FORMATS, ExportError, read_back
from tests.export.helpers import export, llama_plan
from tests.export.test_roundtrip import recommendation

MULTI_GPU = {"gpus": 4, "sharding": "zero3"}


def bundle_for(fmt: str, method: str = "qlora", **kwargs: Any) -> Any:
    fields = MULTI_GPU if fmt == "deepspeed" else {}
    return export(llama_plan(fmt, method, **fields), fmt, **kwargs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_file_states_the_peak_the_headroom_and_the_command(fmt: str) -> None:
    bundle = bundle_for(fmt, peak_gib_per_gpu=41.5, gpu_memory_gib=80.0, gpu="H100 SXM")
    assert bundle.format == fmt
    assert {"requirements.txt", "check_versions.py", "resume.py"} <= set(bundle.files)
    for name, text in bundle.files.items():
        if name in ("requirements.txt", "check_versions.py", "resume.py"):
            continue  # the package pins, the version check and the resume helper: not settings of the run
        header = "\n".join(json.loads(text)["_comment"]) if name.endswith(".json") else text
        assert "41.50 GiB per GPU of 80.00 GiB" in header, name
        assert "38.50 GiB headroom" in header, name
        assert f"Start training: {bundle.command}" in header, name
        assert "H100 SXM" in header, name
    # The command, then (torchtune, axolotl) the run's checkpoint folder and resume.py's arguments.
    last = bundle.files["launch.sh"].rstrip().splitlines()[-1]
    assert last.startswith(bundle.command), last


@pytest.mark.parametrize("fmt", FORMATS)
def test_yaml_and_json_files_parse(fmt: str) -> None:
    for name, text in bundle_for(fmt).files.items():
        if name.endswith(".yaml"):
            assert isinstance(yaml.safe_load(text), dict)
        elif name.endswith(".json"):
            assert isinstance(json.loads(text), dict)


def _calls(tree: ast.AST) -> dict[str, dict[str, Any]]:
    """Keyword literals of the calls in the script, by the called name."""
    found: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.keywords and all(k.arg for k in node.keywords):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                name = f"{func.value.id}.{func.attr}"
            literals = {}
            for keyword in node.keywords:
                try:
                    literals[str(keyword.arg)] = ast.literal_eval(keyword.value)
                except ValueError:
                    literals[str(keyword.arg)] = ast.unparse(keyword.value)
            found[name] = literals
    return found


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed"])
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_the_script_compiles_and_its_arguments_match_the_json(fmt: str, method: str) -> None:
    fields = MULTI_GPU if fmt == "deepspeed" else {"gpus": 4, "sharding": "fsdp"}
    bundle = export(llama_plan(fmt, method, **fields), fmt, checkpoint_interval_s=1800, step_seconds=6.0)
    script = bundle.files["train.py"]
    tree = compile(script, "train.py", "exec", ast.PyCF_ONLY_AST)
    compile(script, "train.py", "exec")
    args = json.loads(bundle.files["hf_args.json"])
    calls = _calls(tree)
    # hf_args.json's values are the parser's defaults; output_dir is the run's checkpoint folder.
    defaults = next(
        _calls(ast.Module(body=[ast.Expr(node)], type_ignores=[]))["parser.set_defaults"]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "parser.set_defaults" and len(node.keywords) > 1
    )
    assert defaults.pop("output_dir") == "checkpoint_dir()"
    assert defaults == {k: v for k, v in args["training_args"].items() if k != "output_dir"}
    assert args["training_args"]["output_dir"] == "outputs"  # resume.py's default folder
    model = dict(calls["AutoModelForCausalLM.from_pretrained"])
    if args["quantization_config"] is not None:
        assert model.pop("quantization_config") == "quantization_config"
        assert calls["BitsAndBytesConfig"] == args["quantization_config"]
    else:
        assert "BitsAndBytesConfig" not in calls
    assert model == args["model"]
    assert calls.get("LoraConfig") == args["lora_config"]
    assert f"MAX_SEQ_LENGTH = {args['data']['max_length']}" in script


def test_checkpoint_steps_are_the_interval_over_the_step_time_rounded_down() -> None:
    bundle = bundle_for("hf-trainer", checkpoint_interval_s=1800, step_seconds=7.0)
    args = json.loads(bundle.files["hf_args.json"])["training_args"]
    assert args["save_steps"] == args["eval_steps"] == 257  # 1800 / 7 = 257.1
    assert args["save_strategy"] == args["eval_strategy"] == "steps"
    assert args["prediction_loss_only"] is True
    assert args["per_device_eval_batch_size"] == args["per_device_train_batch_size"]


def test_a_recommendation_supplies_the_interval_and_the_step_time() -> None:
    # 16 GPUs x micro 2 x accumulation 2 x 512 tokens = 32,768 tokens per step at 64,000 tokens/s = 0.512 s;
    # 30 minutes / 0.512 s = 3515.6 steps.
    bundle = export(llama_plan("axolotl", "lora"), "axolotl", setup=recommendation())
    config = yaml.safe_load(bundle.files["axolotl.yaml"])
    assert config["save_steps"] == 3515
    assert "--num_machines 2" in bundle.command


def test_a_recommendation_for_another_card_is_refused() -> None:
    with pytest.raises(ExportError) as err:
        export(llama_plan("hf-trainer", "lora"), "hf-trainer", setup=recommendation(), gpu="A100 80GB")
    assert err.value.field == "gpu"


def test_zero_config_batch_and_offload() -> None:
    plan = llama_plan("deepspeed", "full", gpus=8, sharding="zero3", cpu_offload=True)
    bundle = export(plan, "deepspeed")
    config = json.loads(bundle.files["ds_config.json"])
    assert config["train_batch_size"] == 4 * 4 * 8
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["bf16"] == {"enabled": True}
    assert bundle.command == "deepspeed --num_gpus 8 train.py"


def test_accelerate_config() -> None:
    bundle = export(llama_plan("accelerate", "lora", gpus=4, sharding="fsdp", cpu_offload=True), "accelerate")
    config = yaml.safe_load(bundle.files["accelerate.yaml"])
    assert config["distributed_type"] == "FSDP"
    assert (config["num_processes"], config["num_machines"], config["mixed_precision"]) == (4, 1, "bf16")
    assert config["fsdp_config"]["fsdp_offload_params"] is True
    assert bundle.command == "accelerate launch --config_file accelerate.yaml train.py"


def test_torchtune_recipe_and_builder() -> None:
    bundle = export(llama_plan("torchtune", "qlora", gpus=4, sharding="fsdp"), "torchtune")
    config = yaml.safe_load(bundle.files["config.yaml"])
    assert bundle.command == "tune run --nproc_per_node 4 lora_finetune_distributed --config config.yaml"
    assert config["model"]["_component_"] == "torchtune.models.llama3_1.qlora_llama3_1_8b"
    assert config["model"]["lora_attn_modules"] == ["q_proj", "k_proj", "v_proj", "output_proj"]
    assert config["model"]["apply_lora_to_mlp"] is True
    assert (config["batch_size"], config["gradient_accumulation_steps"], config["dtype"]) == (4, 4, "bf16")
    assert config["tokenizer"]["max_seq_len"] == 512 and config["dataset"]["packed"] is True
    assert config["fsdp_cpu_offload"] is False


def test_hf_target_module_names_follow_the_architecture() -> None:
    plan = llama_plan("hf-trainer", "lora", lora={"rank": 8, "targets": ["q", "k", "v", "o", "gate", "up", "down"]})
    lora = json.loads(export(plan, "hf-trainer").files["hf_args.json"])["lora_config"]
    assert lora["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    all_linear = json.loads(export(llama_plan("hf-trainer", "lora"), "hf-trainer").files["hf_args.json"])
    assert all_linear["lora_config"]["target_modules"] == "all-linear"


@pytest.mark.parametrize(
    ("fmt", "file", "edit", "field"),
    [
        (
            "hf-trainer",
            "hf_args.json",
            lambda d: d["quantization_config"].update(bnb_4bit_use_double_quant="yes"),
            "hf_args.json:quantization_config.bnb_4bit_use_double_quant",
        ),
        (
            "hf-trainer",
            "hf_args.json",
            lambda d: d["training_args"].update(optim="lion"),
            "hf_args.json:training_args.optim",
        ),
        (
            "hf-trainer",
            "hf_args.json",
            lambda d: d["lora_config"].update(target_modules=["q_proj", "w9"]),
            "hf_args.json:lora_config.target_modules",
        ),
        ("deepspeed", "ds_config.json", lambda d: d.update(train_batch_size=63), "ds_config.json:train_batch_size"),
        ("deepspeed", "ds_config.json", lambda d: d["bf16"].update(enabled=False), "ds_config.json:bf16.enabled"),
        (
            "torchtune",
            "config.yaml",
            lambda d: d.update(enable_activation_offloading="sometimes"),
            "config.yaml:enable_activation_offloading",
        ),
        ("torchtune", "config.yaml", lambda d: d["dataset"].update(packed=False), "config.yaml:dataset.packed"),
        ("axolotl", "axolotl.yaml", lambda d: d.update(sample_packing=False), "axolotl.yaml:sample_packing"),
        (
            "accelerate",
            "accelerate.yaml",
            lambda d: d.update(mixed_precision="fp16"),
            "accelerate.yaml:mixed_precision",
        ),
    ],
)
def test_a_tampered_file_is_refused_naming_the_key(fmt: str, file: str, edit: Any, field: str) -> None:
    plan = llama_plan(fmt, "qlora", **(MULTI_GPU if fmt == "deepspeed" else {}))
    files = dict(export(plan, fmt).files)
    data = json.loads(files[file]) if file.endswith(".json") else yaml.safe_load(files[file])
    edit(data)
    files[file] = json.dumps(data) if file.endswith(".json") else yaml.safe_dump(data)
    with pytest.raises(ExportError) as err:
        read_back(fmt, files, plan)
    assert err.value.field == field


def test_a_missing_file_is_named() -> None:
    plan = llama_plan("hf-trainer", "lora")
    files = dict(export(plan, "hf-trainer").files)
    del files["launch.sh"]
    with pytest.raises(ExportError) as err:
        read_back("hf-trainer", files, plan)
    assert err.value.field == "launch.sh"


def test_export_imports_nothing_heavy() -> None:
    forbidden = ("sqlalchemy", "fastapi", "celery", "boto3", "redis", "torch")
    code = (
        "import sys\n"
        "from services.export import export_setup, read_back\n"
        "from services.estimator.plan import Plan\n"
        "p = Plan.model_validate({'model': {'name': 'meta-llama/Llama-3.1-8B'}, 'method': 'qlora',\n"
        "    'framework': 'torchtune'})\n"
        "b = export_setup(p, None, 'torchtune', peak_gib_per_gpu=10, gpu_memory_gib=24, gpu='L4')\n"
        "read_back('torchtune', b.files, p)\n"
        f"print(','.join(m for m in {forbidden!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"services.export imported: {out.stdout.strip()}"
