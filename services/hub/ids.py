"""What a Hub model id looks like (no I/O, so forms and parsers can check it)."""

from __future__ import annotations

import re

# A Hub model id: owner/name, each letters, digits, '-', '_', '.' (huggingface_hub's validate_repo_id), at
# most 96 characters. The few legacy ids without an owner (gpt2, t5-small) are in the bundled catalog.
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z")


def is_hub_id(name: str) -> bool:
    value = name.strip()
    return bool(REPO_ID.match(value)) and ".." not in value and not value.endswith((".", "-"))
