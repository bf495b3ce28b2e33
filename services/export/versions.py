"""The package versions an export needs: a pinned requirements.txt and a check the run does at start.

requirements.txt pins the versions the files were validated with (tests/export/test_real_tools.py, the
``exportcheck`` extra); ``check_versions.py`` checks the ranges each file's keys need, so an older
library fails at start with a line that says why instead of training with a setting silently dropped:

- transformers >= 5.23: ``activation_checkpointing`` replaced ``gradient_checkpointing`` in 5.23 (the old
  name is deprecated); the ``fsdp_config`` keys the export writes (wrap policy, cpu_offload) are read from
  5.10 on, and before that the whole model is wrapped as one unit and offload is dropped.
- torchtune 0.6.x with torchao < 0.15: torchtune 0.6.1 fails to import with torchao 0.15 and later.
- axolotl >= 0.19: the LoRA kernel switches (``lora_*_kernel``) and ``fsdp_version: 2`` the export writes.
- TRL (not used by train.py, but hf_args.json loads as an ``SFTConfig``): >= 1.0 names it ``max_length``.

- liger-kernel (hf formats with kernels 'liger'): transformers' ``use_liger_kernel`` needs >= 0.3.0; pinned at
  0.8.1, the release axolotl 0.19 requires (axolotl installs its own).
- A plan's ``framework_version`` (the package of its framework: transformers, torchtune, axolotl) is pinned in
  requirements.txt instead of the tested release, so the run uses the release the estimate assumed; a
  version outside the range the files need is refused (``framework_version``).

torch itself is not pinned: install the build for your CUDA first (https://pytorch.org/get-started/).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from packaging.version import Version

from services.estimator.versions import RELEASES
from services.export.errors import ExportError
from services.export.hf import ZERO_STAGES
from services.export.target import Target

REQUIREMENTS_FILE = "requirements.txt"
CHECK_FILE = "check_versions.py"
_BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw", "paged-adamw-8bit")


@dataclass(frozen=True)
class Need:
    """A package the export needs: the tested pin, and the range its keys need (``below`` exclusive)."""

    package: str
    tested: str
    at_least: str
    below: str | None
    why: str


def needs(target: Target) -> list[Need]:
    """What the exported files of ``target`` need installed, the plan's framework release pinned."""
    out = _needs(target)
    given = target.plan.framework_version
    if given is None:
        return out
    package = RELEASES[target.plan.framework][0]
    for i, need in enumerate(out):
        if need.package != package:
            continue
        version = Version(given)
        if version < Version(need.at_least) or (need.below is not None and version >= Version(need.below)):
            wanted = f">= {need.at_least}" + (f", < {need.below}" if need.below else "")
            raise ExportError(
                "framework_version",
                f"{package} {given}: the {target.fmt} files need {package} {wanted} ({need.why}); "
                "plan with a release in that range or leave it null",
            )
        out[i] = replace(need, tested=given)
    return out


def _needs(target: Target) -> list[Need]:
    plan = target.plan
    out: list[Need] = []
    bnb = plan.quantized is not None or plan.optimizer in _BNB_OPTIMIZERS
    if target.fmt == "torchtune":
        out += [
            Need("torchtune", "0.6.1", "0.6.1", "0.7", "the recipes and builders config.yaml names"),
            Need("torchao", "0.14.1", "0.12", "0.15", "torchtune 0.6.1 fails to import with torchao >= 0.15"),
        ]
        if plan.optimizer in _BNB_OPTIMIZERS:
            out.append(Need("bitsandbytes", "0.50.2", "0.45", None, "the 8-bit / paged optimizer"))
        return out
    if target.fmt == "axolotl":
        out.append(
            Need("axolotl", "0.19.0", "0.19", None, "the lora_*_kernel switches and fsdp_version 2 in axolotl.yaml")
        )
    else:
        out += [
            Need(
                "transformers",
                "5.24.0",
                "5.23",
                None,
                "activation_checkpointing (5.23) and the fsdp_config keys (5.10) in hf_args.json",
            ),
            Need("accelerate", "1.15.0", "1.10", None, "the Trainer's launcher and FSDP2 plugin"),
            Need("datasets", "5.2.0", "3.0", None, "load_dataset('json') in train.py"),
        ]
        if plan.method != "full":
            out.append(Need("peft", "0.21.2", "0.13", None, "LoraConfig(target_modules='all-linear')"))
        if bnb:
            out.append(Need("bitsandbytes", "0.50.2", "0.45", None, "NF4 / int8 weights or the 8-bit optimizer"))
        if target.recipe.kernels == "liger":
            out.append(Need("liger-kernel", "0.8.1", "0.3.0", None, "use_liger_kernel in hf_args.json"))
    if plan.sharding in ZERO_STAGES:
        out.append(Need("deepspeed", "0.19.8", "0.16", None, "the ZeRO config ds_config.json"))
    return out


def requirements_text(target: Target) -> str:
    """requirements.txt: the tested versions, pinned."""
    lines = [
        f"# gpuplan export ({target.fmt}): the versions these files were validated with.",
        "# Install torch for your CUDA first (https://pytorch.org/get-started/), then: pip install -r requirements.txt",
    ]
    lines += [f"{need.package}=={need.tested}" for need in needs(target)]
    return "\n".join(lines) + "\n"


_CHECK_BODY = '''
import sys
from importlib.metadata import PackageNotFoundError, version


def _numbers(text):
    """(5, 23, 0) of '5.23.0' / '5.23.0.dev0' / '2.13.0+cpu': the leading numeric parts."""
    out = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_versions():
    """Exit with one line per package that is missing or outside the range the files need."""
    problems = []
    for package, at_least, below, why in NEEDS:
        wanted = f">= {at_least}" + (f", < {below}" if below else "")
        try:
            found = version(package)
        except PackageNotFoundError:
            problems.append(f"{package} is not installed; needs {wanted}: {why}")
            continue
        if _numbers(found) < _numbers(at_least) or (below and _numbers(found) >= _numbers(below)):
            problems.append(f"{package} {found} is installed; needs {wanted}: {why}")
    if problems:
        sys.exit(
            "gpuplan export: the installed packages do not match these files:\\n  "
            + "\\n  ".join(problems)
            + "\\nInstall the tested versions: pip install -r requirements.txt"
        )


if __name__ == "__main__":
    check_versions()
    print("check_versions.py: the installed packages match")
'''


def check_script(target: Target) -> str:
    """check_versions.py: stdlib only, run by launch.sh (and train.py) before anything is loaded."""
    rows = "".join(f"    ({n.package!r}, {n.at_least!r}, {n.below!r}, {n.why!r}),\n" for n in needs(target))
    head = f'"""Check the installed packages against what the {target.fmt} export needs (gpuplan)."""\n'
    return head + _CHECK_BODY.replace("\n\ndef _numbers", f"\nNEEDS = [\n{rows}]\n\n\ndef _numbers", 1)
