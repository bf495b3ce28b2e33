"""Money as gpuplan writes it in messages, quotes and pages: "$1,234.50", and never "$0.00" for an amount that is
not zero (a budget of $0.004 read "over the $0.00 budget", which says free, or no budget at all)."""

from __future__ import annotations


def usd(value: float, decimals: int = 2) -> str:
    """``value`` in dollars to ``decimals`` places with thousands separators ("-$2.50" below zero)."""
    return usd_written(value, f"{abs(value):,.{decimals}f}", decimals)


def usd_written(value: float, digits: str, decimals: int) -> str:
    """``value`` in dollars, its size written as ``digits`` to at most ``decimals`` places: where those read zero but
    the value is not, "< $0.01" ("> -$0.01" below zero) at the last place shown."""
    if value != 0 and not digits.strip("0.,"):
        smallest = f"0.{'1'.rjust(decimals, '0')}"
        return f"< ${smallest}" if value > 0 else f"> -${smallest}"
    return f"{'-' if value < 0 else ''}${digits}"
