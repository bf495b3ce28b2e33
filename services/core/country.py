"""ISO 3166-1 alpha-2 country codes, read the same way wherever a country is named (a price list's country, the
data-location check, `gpuplan data --data-country`)."""

from __future__ import annotations


def is_country_code(value: str) -> bool:
    """Two ASCII letters, either case: str.isalpha alone takes "ÇA", which names no country."""
    return len(value) == 2 and value.isascii() and value.isalpha()
