"""LoRA settings of a plan as the formats write them: rank, alpha, dropout, and target module names.

Hugging Face names come from the architecture's Linear layers (services/estimator/architecture.py mirrors
the transformers modelling files); PEFT matches a target by the module name's suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.estimator.architecture import Architecture
from services.estimator.plan import ALL_LINEAR_ROLES, LoraRole, Plan
from services.estimator.recipe import Recipe
from services.export.errors import ExportError

ROLE_ORDER: tuple[LoraRole, ...] = (*ALL_LINEAR_ROLES, "lm_head")
# A plan with method lora/qlora and no lora settings is estimated as rank 16 on all linear layers.
DEFAULT_RANK = 16

Targets = tuple[LoraRole, ...] | Literal["all-linear"]


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    alpha: int
    alpha_given: bool
    dropout: float
    targets: Targets


def lora_settings(plan: Plan, recipe: Recipe) -> LoraSettings:
    """The adapter settings the estimate used; alpha, when not given, is written as 2 x rank (no memory effect)."""
    lora = plan.lora
    rank = lora.rank if lora is not None else DEFAULT_RANK
    alpha = lora.alpha if lora is not None and lora.alpha is not None else 2 * rank
    targets: Targets = "all-linear" if lora is None or lora.targets == "all-linear" else tuple(lora.targets)
    return LoraSettings(
        rank=rank,
        alpha=alpha,
        alpha_given=lora is not None and lora.alpha is not None,
        dropout=recipe.lora_dropout,
        targets=targets,
    )


def lora_notes(plan: Plan, recipe: Recipe) -> list[str]:
    """What the export wrote for LoRA settings the plan left open."""
    if plan.method == "full":
        return []
    lora = lora_settings(plan, recipe)
    if plan.lora is None:
        return [
            f"no lora settings given: wrote rank {lora.rank} on all linear layers with alpha {lora.alpha}, "
            "as the estimate assumed"
        ]
    if not lora.alpha_given:
        return [f"lora.alpha not given: wrote 2 x rank = {lora.alpha} (no memory effect)"]
    return []


def ordered_roles(roles: set[str]) -> list[LoraRole]:
    return [role for role in ROLE_ORDER if role in roles]


def hf_target_modules(targets: Targets, arch: Architecture) -> str | list[str]:
    """PEFT ``target_modules``: "all-linear" as is, else the names of the layers computing the roles.

    A fused layer (Phi-3's qkv_proj, GPT-2's c_attn) computes several roles; PEFT adapts a whole layer, so
    a plan naming only some of its roles cannot be written.
    """
    if targets == "all-linear":
        return "all-linear"
    wanted = set(targets) - {"lm_head"}
    names: list[str] = []
    for block in arch.blocks:
        for lin in block.linears:
            hit = wanted & set(lin.roles)
            if not hit:
                continue
            if hit != set(lin.roles):
                raise ExportError(
                    "lora.targets",
                    f"{lin.name} computes {', '.join(lin.roles)} in one layer of this {arch.model_type} model and "
                    f"PEFT adapts whole layers: target all of {', '.join(lin.roles)} or none",
                )
            if lin.name not in names:
                names.append(lin.name)
    if "lm_head" in targets:
        names.append("lm_head")
    return names


def roles_from_hf(modules: str | list[str], arch: Architecture, where: str) -> Targets:
    """The plan roles of PEFT ``target_modules`` written by :func:`hf_target_modules`."""
    if modules == "all-linear":
        return "all-linear"
    if isinstance(modules, str):
        raise ExportError(where, f"must be 'all-linear' or a list of module names, got {modules!r}")
    by_name = {lin.name: lin.roles for block in arch.blocks for lin in block.linears}
    found: set[str] = set()
    for name in modules:
        if name == "lm_head":
            found.add("lm_head")
        elif name in by_name:
            found.update(by_name[name])
        else:
            raise ExportError(
                where, f"{name!r} is not a linear layer of this {arch.model_type} model; known: {', '.join(by_name)}"
            )
    return tuple(ordered_roles(found))
