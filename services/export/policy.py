"""One optimisation policy for every format: learning rate, schedule, warm-up, clipping and weight decay.

None of these changes memory; they change what the run learns, so the same plan exported to two formats
should learn the same way. Sources of the values:

- learning rate 2e-4 for LoRA/QLoRA adapters (Dettmers et al. 2023, QLoRA, appendix B: 2e-4 for 7B-13B
  models) and 2e-5 for full fine-tuning (Taori et al. 2023, Stanford Alpaca's training recipe);
- cosine decay after a linear warm-up over 3% of the optimizer steps (Stanford Alpaca's ``warmup_ratio
  0.03``, ``lr_scheduler_type cosine``);
- gradient clipping at a global norm of 1.0 (the Hugging Face Trainer's ``max_grad_norm`` default);
- weight decay 0 (the Trainer's default; ``torch.optim.AdamW`` would otherwise apply 0.01 in torchtune).

torchtune's scheduler takes a number of warm-up steps, not a ratio, so every format writes the same number
of warm-up steps, computed from the plan's data size; without one, each format writes the ratio's
nearest form and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.estimator.plan import Plan

LORA_LEARNING_RATE = 2e-4
FULL_LEARNING_RATE = 2e-5
WARMUP_RATIO = 0.03
MAX_GRAD_NORM = 1.0
WEIGHT_DECAY = 0.0
SCHEDULE = "cosine"


@dataclass(frozen=True)
class Policy:
    """What every format writes for the optimisation (``warmup_steps`` None: the data size is unknown)."""

    learning_rate: float
    warmup_steps: int | None
    total_steps: int | None
    max_grad_norm: float
    weight_decay: float

    def describe(self) -> str:
        warmup = (
            f"{self.warmup_steps} warm-up steps ({WARMUP_RATIO:.0%} of {self.total_steps})"
            if self.warmup_steps is not None
            else f"warm-up over {WARMUP_RATIO:.0%} of the steps"
        )
        return (
            f"Optimisation (the same in every format): learning rate {self.learning_rate:g}, {SCHEDULE} decay after "
            f"{warmup}, gradient clipping at norm {self.max_grad_norm:g}, weight decay {self.weight_decay:g}"
        )


def optimizer_steps(plan: Plan, accumulation: int) -> int | None:
    """Optimizer steps of the whole run: packed tokens over tokens per step, times epochs (None without data)."""
    data = plan.data
    if data is None:
        return None
    tokens_per_step = plan.micro_batch_size * accumulation * plan.gpus * plan.seq_len
    return max(1, math.ceil(data.total_tokens() / tokens_per_step))


def policy(plan: Plan, accumulation: int) -> Policy:
    """The policy of ``plan`` split into ``accumulation`` micro-batches per optimizer step."""
    total = optimizer_steps(plan, accumulation)
    return Policy(
        learning_rate=FULL_LEARNING_RATE if plan.method == "full" else LORA_LEARNING_RATE,
        warmup_steps=None if total is None else max(1, math.ceil(WARMUP_RATIO * total)),
        total_steps=total,
        max_grad_norm=MAX_GRAD_NORM,
        weight_decay=WEIGHT_DECAY,
    )
