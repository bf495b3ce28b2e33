"""Personal data in text: e-mail, phone, TC Kimlik, VKN, IBAN, payment card, listed names; finding and masking.

Candidates are found by patterns and kept only when a maintained validator says they are what they look
like: python-stdnum for national ids, IBANs (each country's length and BBAN format, ISO 13616 check
digits) and Luhn (ISO/IEC 7812-1), Google's libphonenumber (the ``phonenumbers`` port) for phone numbers
of every country. A Turkish tax number (VKN) is ten digits with one check digit, so one random ten-digit
number in ten passes its checksum: it counts only beside words that name it (VKN, vergi, tax id).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import phonenumbers
from stdnum import iban as std_iban
from stdnum import luhn as std_luhn
from stdnum.tr import tckimlik as std_tckimlik
from stdnum.tr import vkn as std_vkn

PII_KINDS = ("email", "iban", "payment_card", "tc_kimlik", "vkn", "phone", "name")

_DIGIT = re.compile(r"\d")
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?![\w-])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_TC_KIMLIK = re.compile(r"(?<!\d)[1-9]\d{10}(?!\d)")
# A VKN: ten digits within a few words after "VKN", "vergi (kimlik) no(su)", "tax id/number" (Turkish
# forms write "V.K.N." and "Vergi No" before the number).
_VKN = re.compile(
    r"(?i)(?:\bv\.?\s?k\.?\s?n\.?|\bvergi(?:\s+kimlik)?(?:\s+(?:no|numaras[ıi]|numara)\w*)?|\btax\s+(?:id|number|no)\b)"
    r"[\s:#.\-]{0,5}(\d{10})(?!\d)"
)
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
    """TC Kimlik No (python-stdnum ``tr.tckimlik``: 11 digits, no leading 0, its two check digits)."""
    return bool(std_tckimlik.is_valid(number))


def vkn_valid(number: str) -> bool:
    """Turkish tax number, Vergi Kimlik Numarası (python-stdnum ``tr.vkn``: 10 digits, its check digit)."""
    return bool(std_vkn.is_valid(number))


def iban_valid(iban: str) -> bool:
    """An IBAN of any country (python-stdnum ``iban``: the country's length and BBAN format, mod-97 check digits)."""
    return bool(std_iban.is_valid(iban))


def luhn_valid(number: str) -> bool:
    """A payment card number: 13-19 digits (spaces or dashes between them) passing Luhn (ISO/IEC 7812-1)."""
    compact = number.replace(" ", "").replace("-", "")
    return compact.isdigit() and 13 <= len(compact) <= 19 and bool(std_luhn.is_valid(compact))


def phone_valid(candidate: str) -> bool:
    """A number libphonenumber knows as assigned in its country's plan; without a + it is read as Turkish."""
    try:
        number = phonenumbers.parse(candidate, "TR")
    except phonenumbers.NumberParseException:
        return False
    return bool(phonenumbers.is_valid_number(number))


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
    ("vkn", _VKN, lambda v: vkn_valid(v[-10:]), lambda v: v[:-10] + "*" * 10),
    ("phone", _PHONE_TR, phone_valid, lambda v: _mask_digits(v, 2)),
    ("phone", _PHONE_INTL, phone_valid, lambda v: _mask_digits(v, 2)),
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
