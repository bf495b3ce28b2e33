"""Personal data in text: e-mail, phone, TC Kimlik, IBAN, payment card, listed names; finding and masking."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PII_KINDS = ("email", "iban", "payment_card", "tc_kimlik", "phone", "name")

_DIGIT = re.compile(r"\d")
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?![\w-])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_TC_KIMLIK = re.compile(r"(?<!\d)[1-9]\d{10}(?!\d)")
# Turkish numbers need a +90/0090/0 prefix: mobiles 5xx, landlines 2xx-4xx, then 3-2-2 digits.
_PHONE_TR = re.compile(r"(?<![\w+])(?:\+90|0090|0)[ -]?\(?[2-5]\d{2}\)?[ -]?\d{3}[ -]?\d{2}[ -]?\d{2}(?!\d)")
# E.164: a + and 8-15 digits, optionally grouped by spaces or dashes.
_PHONE_INTL = re.compile(r"(?<![\w+])\+[1-9](?:[ -]?\d){7,14}(?!\d)")


@dataclass(frozen=True)
class PiiFinding:
    """One piece of personal data: its kind, the row it is in, and a masked rendering of it."""

    kind: str
    row_number: int
    masked: str


def tc_kimlik_valid(number: str) -> bool:
    """TC Kimlik No: 11 digits, first not 0, d10 = (7*odd(1..9) - even(2..8)) mod 10, d11 = sum(1..10) mod 10."""
    if len(number) != 11 or not number.isdigit() or number[0] == "0":
        return False
    d = [int(c) for c in number]
    d10 = (7 * (d[0] + d[2] + d[4] + d[6] + d[8]) - (d[1] + d[3] + d[5] + d[7])) % 10
    return d[9] == d10 and d[10] == sum(d[:10]) % 10


def iban_valid(iban: str) -> bool:
    """ISO 13616: move the first 4 characters to the end, letters to 10..35, the number mod 97 is 1; TR is 26 long."""
    compact = iban.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34 or not compact.isalnum() or not compact[:2].isalpha():
        return False
    if compact.startswith("TR") and len(compact) != 26:
        return False
    digits = "".join(str(int(ch, 36)) for ch in compact[4:] + compact[:4])
    return int(digits) % 97 == 1


def luhn_valid(number: str) -> bool:
    """Luhn (ISO/IEC 7812-1) over 13-19 digits, spaces and dashes ignored."""
    digits = [int(c) for c in number if c.isdigit()]
    if not 13 <= len(digits) <= 19 or len(digits) != len(number.replace(" ", "").replace("-", "")):
        return False
    total = 0
    for index, digit in enumerate(reversed(digits)):
        if index % 2 == 1:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def _mask_digits(value: str, keep_last: int) -> str:
    """Every digit but the last `keep_last` becomes '*', separators stay."""
    positions = [i for i, c in enumerate(value) if c.isdigit()]
    hide = set(positions[: max(len(positions) - keep_last, 0)])
    return "".join("*" if i in hide else c for i, c in enumerate(value))


def _mask_email(value: str) -> str:
    local, domain = value.split("@", 1)
    host, _, tld = domain.rpartition(".")
    return f"{local[0]}***@{host[0]}***.{tld}"


def _mask_iban(value: str) -> str:
    return value[:2] + "".join("*" if c.isalnum() else c for c in value[2:-4]) + value[-4:]


_Detector = tuple[str, re.Pattern[str], Callable[[str], bool], Callable[[str], str]]
# Order matters: a span taken by an earlier detector is not offered to the later ones.
_DETECTORS: tuple[_Detector, ...] = (
    ("email", _EMAIL, lambda v: True, _mask_email),
    ("iban", _IBAN, iban_valid, _mask_iban),
    ("payment_card", _CARD, luhn_valid, lambda v: _mask_digits(v, 4)),
    ("tc_kimlik", _TC_KIMLIK, tc_kimlik_valid, lambda v: "*" * len(v)),
    ("phone", _PHONE_TR, lambda v: True, lambda v: _mask_digits(v, 2)),
    ("phone", _PHONE_INTL, lambda v: True, lambda v: _mask_digits(v, 2)),
)


def _names_pattern(names: Sequence[str]) -> re.Pattern[str] | None:
    cleaned = sorted({n.strip() for n in names if n.strip()}, key=len, reverse=True)
    if not cleaned:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(n) for n in cleaned) + r")(?!\w)", re.IGNORECASE)


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    kind: str
    masked: str


def find_spans(text: str, names: Sequence[str] = ()) -> list[_Span]:
    """Non-overlapping personal-data spans in `text`, each with its masked replacement, in text order."""
    spans: list[_Span] = []
    # Cheap tests first: most text has no '@' and many rows no digit, and the patterns are slow to fail.
    has_at, has_digit = "@" in text, _DIGIT.search(text) is not None
    detectors = [d for d in _DETECTORS if (has_at if d[0] == "email" else has_digit)]
    name_pattern = _names_pattern(names)
    if name_pattern is not None:
        detectors.append(("name", name_pattern, lambda v: True, lambda v: v[0] + "***"))
    for kind, pattern, valid, mask in detectors:
        for match in pattern.finditer(text):
            start, end = match.span()
            if any(s.start < end and start < s.end for s in spans) or not valid(match.group()):
                continue
            spans.append(_Span(start, end, kind, mask(match.group())))
    return sorted(spans, key=lambda s: s.start)


def mask_text(text: str, names: Sequence[str] = ()) -> str:
    """`text` with every personal-data span replaced by its masked form."""
    out, last = [], 0
    for span in find_spans(text, names):
        out.append(text[last : span.start])
        out.append(span.masked)
        last = span.end
    out.append(text[last:])
    return "".join(out)


def strings_in(value: Any) -> Iterable[str]:
    """Every string (keys excluded) inside a decoded JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def mask_value(value: Any, names: Sequence[str] = ()) -> Any:
    """A copy of a decoded JSON value with every string masked."""
    if isinstance(value, str):
        return mask_text(value, names)
    if isinstance(value, dict):
        return {k: mask_value(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(v, names) for v in value]
    return value


def find_pii(row_number: int, row: Any, names: Sequence[str] = ()) -> list[PiiFinding]:
    """All personal data in one row (every string field, whatever the format)."""
    return [
        PiiFinding(span.kind, row_number, span.masked) for text in strings_in(row) for span in find_spans(text, names)
    ]
