"""Checkpoint size, the Young/Daly interval and expected spot hours against hand computations."""

from __future__ import annotations

import math

import pytest

from services.estimator.architecture import architecture_from_config, parameter_counts
from services.estimator.memory import adapter_params
from services.estimator.recipe import resolve_recipe
from services.planner.spot import (
    CHECKPOINT_WRITE_BYTES_PER_S,
    checkpoint_bytes,
    checkpoint_write_seconds,
    spot_run,
    young_daly_interval_seconds,
)
from tests.conftest import LLAMA_8B, make_plan

ARCH = architecture_from_config(LLAMA_8B)


def test_young_daly_interval() -> None:
    # 60 s writes, one failure every 20 h: sqrt(2 x 60 x 72,000) s ~ 49 min.
    assert young_daly_interval_seconds(60.0, 72_000.0) == pytest.approx(math.sqrt(2 * 60 * 72_000))


def test_write_seconds_at_200_mb_per_s() -> None:
    assert CHECKPOINT_WRITE_BYTES_PER_S == 200e6
    assert checkpoint_write_seconds(1e9) == pytest.approx(5.0)


def test_full_checkpoint_is_weights_plus_optimizer_states() -> None:
    plan = make_plan(method="full")  # bf16 weights, AdamW states in bf16 (no master copy)
    n = parameter_counts(ARCH).total
    assert checkpoint_bytes(plan, ARCH) == pytest.approx(n * 2 + n * 4)


def test_lora_checkpoint_is_16_bit_adapters_plus_their_optimizer_states() -> None:
    plan = make_plan(method="lora")
    adapters = adapter_params(ARCH, resolve_recipe(plan))
    # PEFT keeps fp32 adapters under the Trainer, so AdamW's two states are fp32: 8 bytes per parameter.
    assert checkpoint_bytes(plan, ARCH) == pytest.approx(adapters * 2 + adapters * 8)
    assert checkpoint_bytes(plan, ARCH) < checkpoint_bytes(make_plan(method="full"), ARCH) / 50


def test_spot_run_adds_checkpoints_and_rework() -> None:
    run = spot_run(hours=10.0, nodes=1, preemptions_per_node_hour=0.05, restart_minutes=10.0, write_seconds=60.0)
    interval = math.sqrt(2 * 60 * 72_000)
    assert run.checkpoint_interval_seconds == pytest.approx(interval)
    checkpoint_hours = (36_000 / interval - 1) * 60 / 3600
    assert run.checkpoint_hours == pytest.approx(checkpoint_hours)
    preemptions = (10.0 + checkpoint_hours) * 0.05
    assert run.expected_preemptions == pytest.approx(preemptions)
    assert run.rework_hours == pytest.approx(preemptions * (10 / 60 + interval / 2 / 3600))
    assert run.hours == pytest.approx(10.0 + checkpoint_hours + run.rework_hours)


def test_several_nodes_are_preempted_more_often() -> None:
    one = spot_run(5.0, 1, 0.05, 10.0, 30.0)
    four = spot_run(5.0, 4, 0.05, 10.0, 30.0)
    assert four.expected_preemptions > 3 * one.expected_preemptions
    assert four.checkpoint_interval_seconds == pytest.approx(one.checkpoint_interval_seconds / 2)


def test_no_preemptions_means_no_extra_time() -> None:
    run = spot_run(3.0, 2, 0.0, 10.0, 120.0)
    assert run.hours == pytest.approx(3.0)
    assert run.expected_preemptions == 0


def test_a_job_shorter_than_the_interval_writes_no_checkpoint_before_the_end() -> None:
    run = spot_run(0.1, 1, 0.05, 10.0, 60.0)
    assert run.checkpoint_interval_seconds == pytest.approx(360.0)
    assert run.checkpoint_hours == 0
