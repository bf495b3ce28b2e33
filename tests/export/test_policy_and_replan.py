"""One optimisation policy across formats, the explicit estimate assumptions, and re-planning for a format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.datacheck import check_dataset
from services.estimator.plan import Plan
from services.export import ExportError
from services.export.dataset import data_format, data_format_of_report
from services.export.policy import policy
from services.export.replan import fit_setup, retarget_plan, setup_for_format
from services.planner import plan_setups
from services.planner.batching import batch_split
from services.planner.models import Recommendation
from tests.export.helpers import export, llama_plan

README_PLAN: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B"},
    "method": "qlora",
    "framework": "hf-trainer",
    "lora": {"rank": 16, "alpha": 32, "targets": "all-linear"},
    "precision": "bf16",
    "quantization": "nf4",
    "optimizer": "paged-adamw-8bit",
    "micro_batch_size": 4,
    "seq_len": 2048,
    "gradient_checkpointing": True,
    "gpus": 1,
    "sharding": "zero2",
    "data": {"examples": 20000, "avg_tokens_per_example": 750, "epochs": 3},
}


def _optimisation(fmt: str, plan: Plan) -> dict[str, Any]:
    """(learning rate, schedule, warm-up steps, clipping, weight decay) as each format's file writes them."""
    files = export(plan, fmt).files
    if fmt == "torchtune":
        c = yaml.safe_load(files["config.yaml"])
        return {
            "lr": c["optimizer"]["lr"],
            "schedule": c["lr_scheduler"]["_component_"].rsplit(".", 1)[-1],
            "warmup": c["lr_scheduler"]["num_warmup_steps"],
            "clip": c["clip_grad_norm"],
            "decay": c["optimizer"]["weight_decay"],
        }
    if fmt == "axolotl":
        c = yaml.safe_load(files["axolotl.yaml"])
        return {
            "lr": c["learning_rate"],
            "schedule": c["lr_scheduler"],
            "warmup": c["warmup_steps"],
            "clip": c["max_grad_norm"],
            "decay": c["weight_decay"],
        }
    t = json.loads(files["hf_args.json"])["training_args"]
    return {
        "lr": t["learning_rate"],
        "schedule": t["lr_scheduler_type"],
        "warmup": t["warmup_steps"],
        "clip": t["max_grad_norm"],
        "decay": t["weight_decay"],
    }


@pytest.mark.parametrize("method", ["full", "lora"])
def test_every_format_learns_with_the_same_policy(method: str) -> None:
    found = {}
    for fmt in ("hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"):
        sharding = {"gpus": 2, "sharding": "zero2"} if fmt == "deepspeed" else {"gpus": 2, "sharding": "fsdp"}
        found[fmt] = _optimisation(fmt, llama_plan(fmt, method, **sharding))
    values = list(found.values())
    for value in values:
        schedule = value.pop("schedule")
        assert "cosine" in schedule
    assert all(v == values[0] for v in values), found
    # 10,000 x 512 tokens x 3 epochs over micro-batch 4 x accumulation 4 x 2 GPUs x 512 tokens = 938 steps.
    assert values[0] == {"lr": 2e-4 if method == "lora" else 2e-5, "warmup": 29, "clip": 1.0, "decay": 0.0}


def test_differences_are_stated_in_the_file() -> None:
    plan = llama_plan("torchtune", "full", optimizer_in_backward=True, gradient_accumulation_steps=1, data=None)
    config = export(plan, "torchtune").files["config.yaml"]
    assert "Differs from the other formats: no gradient clipping" in config
    assert "Differs from the other formats: the plan has no data size, so the warm-up is 100 steps" in config
    assert yaml.safe_load(config)["clip_grad_norm"] is None
    hf = json.loads(export(llama_plan("hf-trainer", "lora", data=None), "hf-trainer").files["hf_args.json"])
    assert hf["training_args"]["warmup_steps"] == 0.03  # the Trainer's ratio form


def test_policy_steps_follow_the_data() -> None:
    plan = llama_plan("hf-trainer", "lora")
    assert policy(plan, 4).total_steps == 1875  # 15.36M tokens / (4 x 4 x 1 x 512)
    assert policy(plan, 4).warmup_steps == 57


def test_axolotl_kernels_off_and_zero3_buffers_written() -> None:
    axolotl = yaml.safe_load(export(llama_plan("axolotl", "lora"), "axolotl").files["axolotl.yaml"])
    assert (axolotl["lora_mlp_kernel"], axolotl["lora_qkv_kernel"], axolotl["lora_o_kernel"]) == (False, False, False)
    bundle = export(llama_plan("deepspeed", "full", gpus=8, sharding="zero3"), "deepspeed")
    ds = json.loads(bundle.files["ds_config.json"])
    zero = ds["zero_optimization"]
    # One Llama-3.1-8B layer: q, o 2 x 4096^2 + k, v 2 x 4096 x 1024 + MLP 3 x 4096 x 14336 + norms 2 x 4096.
    block = 218_112_000
    assert zero["stage3_prefetch_bucket_size"] == zero["reduce_bucket_size"] == block
    assert zero["stage3_max_live_parameters"] == 2 * block
    assert zero["stage3_param_persistence_threshold"] == 100_000
    comment = "\n".join(ds["_comment"])
    assert "valid only at 8 GPUs" in comment and ds["train_batch_size"] == 4 * 4 * 8


def _readme_plan(**fields: Any) -> Plan:
    return Plan.model_validate({**README_PLAN, **fields})


def test_retarget_changes_framework_and_sharding_and_says_so() -> None:
    plan = _readme_plan(sharding="none")
    # The files pack rows the Trainer's default collator would pad to the longest sample: the plan says so.
    packed, notes = retarget_plan(plan, "hf-trainer")
    assert packed.padding == "packed" and notes == [
        "re-planned for hf-trainer: padding null -> packed: the hf-trainer files pack the samples into rows of "
        "seq_len 2048 (hf-trainer's default pads each micro-batch to its longest sample), so time and cost count no "
        "pad tokens"
    ]
    same, notes = retarget_plan(packed, "hf-trainer")
    assert same is packed and notes == []
    tune, notes = retarget_plan(plan, "torchtune")
    assert tune.framework == "torchtune" and "re-planned for torchtune" in notes[0]
    ds, notes = retarget_plan(plan, "deepspeed")
    assert ds.sharding == "zero2" and "sharding none -> zero2" in notes[0]
    fsdp, _ = retarget_plan(_readme_plan(gpus=4, sharding="fsdp"), "deepspeed")
    assert fsdp.sharding == "zero3"


@pytest.mark.parametrize("fmt", ["hf-trainer", "accelerate", "deepspeed", "torchtune", "axolotl"])
def test_the_readme_plan_with_zero2_exports_in_every_format(fmt: str) -> None:
    plan = _readme_plan()

    def replan(p: Plan) -> list[Recommendation]:
        return plan_setups(p).recommendations

    chosen = setup_for_format(plan, fmt, replan(plan), replan)
    bundle = export(
        chosen.plan,
        fmt,
        setup=chosen.setup,
        peak_gib_per_gpu=chosen.setup.peak_gib_per_gpu,
        gpu_memory_gib=chosen.setup.gpu_memory_gib,
        gpu=chosen.setup.gpu,
        replan_notes=chosen.notes,
    )
    assert bundle.format == fmt
    if fmt == "torchtune":
        assert chosen.setup.sharding == ("none" if chosen.setup.gpus == 1 else "fsdp")
    if fmt == "deepspeed":
        assert chosen.setup.sharding in ("zero1", "zero2", "zero3")
    for note in chosen.notes:
        assert note in bundle.files["launch.sh"]


def test_a_moved_setup_that_no_longer_fits_is_refused() -> None:
    plan = _readme_plan(sharding="none")
    # The cheapest single-GPU setup (which setup is cheapest overall follows the estimator and the prices).
    rec = next(r for r in plan_setups(plan).recommendations if r.gpus == 1)
    tight = rec.model_copy(update={"usable_gib": rec.peak_gib_per_gpu})  # ZeRO-2 adds a little on one GPU
    with pytest.raises(ExportError) as err:
        fit_setup(plan, tight, "deepspeed")
    assert err.value.field == "sharding" and "usable" in err.value.message
    moved, notes = fit_setup(plan, rec, "deepspeed")
    assert moved.sharding == "zero2" and moved.peak_gib_per_gpu > rec.peak_gib_per_gpu and notes


def test_data_formats_name_their_field() -> None:
    with pytest.raises(ExportError) as err:
        data_format("csv", "--data-format")
    assert err.value.field == "data_format" and "allowed: chat, sharegpt" in err.value.message
    assert data_format_of_report({"detected_format": "alpaca"}, "d.jsonl").kind == "alpaca"
    with pytest.raises(ExportError) as err:
        data_format_of_report({"detected_format": None}, "d.jsonl")
    assert err.value.field == "dataset_id" and "give data_format" in err.value.message


@pytest.mark.parametrize(
    ("fields", "kind"),
    [(("instruction", "input", "output"), "alpaca"), (("instruction", "context", "response"), "dolly"), (None, None)],
)
def test_a_checked_instruction_file_is_exported_with_its_own_field_names(
    fields: tuple[str, str, str] | None, kind: str | None, tmp_path: Path
) -> None:
    # A Dolly file was exported as Alpaca, whose train.py reads 'output': every row lacked it. A 'prompt'/'response'
    # file (the check takes it as instructions) is read by no export: refused naming the data set.
    instruction, extra, answer = fields or ("prompt", "context", "response")
    rows = [{instruction: f"Say {i}", extra: "", answer: f"{i}"} for i in range(30)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = check_dataset(path).model_dump(mode="json")
    assert report["detected_format"] == "alpaca"
    if kind is None:
        with pytest.raises(ExportError) as err:
            data_format_of_report(report, "d.jsonl")
        assert err.value.field == "dataset_id" and "'prompt'/'response'" in err.value.message
        return
    data = data_format_of_report(report, "d.jsonl")
    assert data.kind == kind and data.instruction_fields == (instruction, extra, answer)


@pytest.mark.parametrize(
    ("field", "role", "content", "kind"),
    [("messages", "role", "content", "chat"), ("conversations", "from", "value", "sharegpt")],
)
def test_a_checked_chat_file_is_exported_with_its_own_list(
    field: str, role: str, content: str, kind: str, tmp_path: Path
) -> None:
    # A ShareGPT file was exported as 'messages': train.py found no turns in any row.
    user, assistant = ("user", "assistant") if kind == "chat" else ("human", "gpt")
    rows = [{field: [{role: user, content: f"Say {i}"}, {role: assistant, content: f"{i}"}]} for i in range(30)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = check_dataset(path).model_dump(mode="json")
    assert report["detected_format"] == "chat" and report["chat_field"] == field
    data = data_format_of_report(report, "d.jsonl")
    assert (data.kind, data.messages_field, data.role_key, data.content_key) == (kind, field, role, content)


def test_axolotl_without_accumulation_keeps_the_effective_batch_as_the_planner_rounds_it() -> None:
    plan = llama_plan("hf-trainer", "lora", gpus=4, sharding="fsdp", gradient_accumulation_steps=None)
    target, notes = retarget_plan(plan, "axolotl")
    assert target.gradient_accumulation_steps == 1  # null counts one: 4 x 1 x 4 GPUs, the plan's 16
    assert any("gradient_accumulation_steps null -> 1" in note for note in notes)
    # A caller that moved the plan to 4 GPUs keeps the batch it had: 32 -> 2 steps; 30 -> the planner's
    # smallest larger batch on 4 GPUs (8 per GPU, 32 in all), which micro-batch 4 reaches in 2 steps.
    for effective, steps in ((32, 2), (30, 2), (4, 1), (64, 4)):
        moved, notes = retarget_plan(plan, "axolotl", effective_batch=effective)
        assert moved.gradient_accumulation_steps == steps, effective
        assert batch_split(effective, 4).samples_per_gpu <= steps * plan.micro_batch_size
    assert any("the smallest above the plan's 30" in n for n in retarget_plan(plan, "axolotl", effective_batch=30)[1])
    # The hf-trainer default does not accumulate: nothing to derive, null stays.
    assert retarget_plan(plan, "hf-trainer")[0].gradient_accumulation_steps is None
