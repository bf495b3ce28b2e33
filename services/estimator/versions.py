"""Framework releases: a plan's ``framework_version`` parsed to a comparable version.

Which defaults each release changed lives in ``frameworks.versioned_defaults``; this module only knows what
a version of each framework looks like, so that ``plan.py`` can refuse a bad one with the field named.
A release newer than the newest listed here keeps the newest defaults we know (it is not refused).
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

# (the package whose version the field gives, its first release, the newest release these defaults follow).
# Newest: the versions installed beside gpuplan (transformers 5.24.0, torch 2.13.0) or PyPI's newest release
# of the package (late 2026). Unsloth numbers its releases year.month.n.
RELEASES: dict[str, tuple[str, str, str]] = {
    "hf-trainer": ("transformers", "4.0.0", "5.24.0"),
    "pytorch": ("torch", "1.12.0", "2.13.0"),
    "torchtune": ("torchtune", "0.1.0", "0.6.1"),
    "torchtitan": ("torchtitan", "0.0.2", "0.3.0"),
    "litgpt": ("litgpt", "0.1.0", "0.5.13"),
    "axolotl": ("axolotl", "0.3.0", "0.21.0"),
    "unsloth": ("unsloth", "2023.12", "2026.10.9"),
}


def parse_framework_version(framework: str, text: str) -> Version:
    """The release a plan names, comparable with ``<``; ValueError (naming ``framework_version``) when the
    text is no version or older than the framework's first release."""
    package, first, newest = RELEASES[framework]
    try:
        version = Version(text)
    except InvalidVersion:
        raise ValueError(
            f"framework_version: {text!r} is not a version of {package} (give a release such as {newest!r})"
        ) from None
    if version < Version(first):
        raise ValueError(
            f"framework_version: {package} {text} is older than its first release {first}; "
            f"give a release from {first} to {newest}"
        )
    return version
