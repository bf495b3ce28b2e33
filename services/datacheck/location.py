"""Where the data may go: a warning when personal data would leave its home jurisdiction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from services.core.country import is_country_code


class HasKind(Protocol):
    """A personal-data finding or a per-kind summary: anything that names the kind of data."""

    @property
    def kind(self) -> str: ...


# EU member states plus the EEA's Iceland, Liechtenstein and Norway (GDPR applies via the EEA Agreement).
EEA_COUNTRIES = frozenset(
    {
        "AT",
        "BE",
        "BG",
        "HR",
        "CY",
        "CZ",
        "DK",
        "EE",
        "FI",
        "FR",
        "DE",
        "GR",
        "HU",
        "IE",
        "IT",
        "LV",
        "LT",
        "LU",
        "MT",
        "NL",
        "PL",
        "PT",
        "RO",
        "SK",
        "SI",
        "ES",
        "SE",
        "IS",
        "LI",
        "NO",
    }
)


def _country(field: str, code: str) -> str:
    value = code.strip().upper()
    if not is_country_code(value):
        raise ValueError(f"{field}: {code!r} is not an ISO 3166-1 alpha-2 country code (e.g. TR, DE, US)")
    return value


def data_location_warning(
    findings: Iterable[HasKind], data_country: str, provider_country: str | None, *, provider_label: str = ""
) -> str | None:
    """A warning naming the law and the options when personal data would be processed in another country.

    `provider_country` None means the provider's country is not known: treated as outside the home country
    (a transfer cannot be ruled out). `provider_label` names the provider in the warning."""
    home = _country("data_country", data_country)
    provider = _country("provider_country", provider_country) if provider_country is not None else "??"
    kinds = sorted({f.kind for f in findings})
    if not kinds or home == provider:
        return None
    who = f"the GPU provider {provider_label}".rstrip() if provider_label else "the GPU provider"
    where = (
        f"is in {provider}" if provider_country is not None else "does not say which country its data centres are in"
    )
    found = f"The data set holds personal data ({', '.join(kinds)}) from {home}, and {who} {where}."
    options = (
        "Options: anonymise or mask the personal data before upload (write_masked), choose a provider in {home}, "
        "or put contractual safeguards in place"
    )
    if home == "TR":
        return (
            f"{found} Sending it abroad is a cross-border transfer under KVKK (Turkish Personal Data Protection "
            "Law No. 6698, Article 9 as amended by Law No. 7499): it needs an adequacy decision, appropriate "
            "safeguards (standard contract notified to the KVKK Authority within 5 business days, binding "
            "corporate rules, or a written undertaking approved by the Board), or a narrow occasional-transfer "
            f"exception. {options.format(home=home)}: standard contract or KVKK written undertaking."
        )
    if home in EEA_COUNTRIES:
        if provider in EEA_COUNTRIES:
            return None
        return (
            f"{found} A transfer outside the EU/EEA falls under GDPR Chapter V (Articles 44-50): it needs an "
            "adequacy decision (Art. 45) or appropriate safeguards (Art. 46) such as the European Commission's "
            f"standard contractual clauses, plus a transfer impact assessment. {options.format(home=home)}: "
            "standard contractual clauses or binding corporate rules."
        )
    return f"{found} Check {home}'s data-protection rules on cross-border transfers. {options.format(home=home)}."
