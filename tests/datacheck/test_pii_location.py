"""Personal-data detectors with valid and invalid checksums, masking, safe writers and the location warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.datacheck import (
    DataCheckError,
    check_dataset,
    data_location_warning,
    find_pii,
    iban_valid,
    luhn_valid,
    mask_text,
    tc_kimlik_valid,
    write_clean,
    write_masked,
)


def kinds(text: str, names: tuple[str, ...] = ()) -> list[str]:
    return [f.kind for f in find_pii(1, {"text": text}, names)]


def test_tc_kimlik_checksum() -> None:
    assert tc_kimlik_valid("10000000146")
    assert not tc_kimlik_valid("10000000147")
    assert not tc_kimlik_valid("01234567890")
    assert kinds("TC: 10000000146") == ["tc_kimlik"]
    assert kinds("TC: 10000000147") == []


def test_iban_mod97() -> None:
    assert iban_valid("TR330006100519786457841326")
    assert iban_valid("DE89370400440532013000")
    assert not iban_valid("TR330006100519786457841327")
    assert not iban_valid("TR33000610051978645784132")  # 25 characters
    assert kinds("IBAN TR33 0006 1005 1978 6457 8413 26 lütfen") == ["iban"]
    assert kinds("IBAN TR330006100519786457841327") == []


def test_a_turkish_tax_number_is_found_beside_its_name_and_a_random_ten_digit_number_is_not() -> None:
    from services.datacheck import vkn_valid

    assert vkn_valid("1234567890") and not vkn_valid("1234567891")
    for text in ("Firma VKN: 1234567890", "vergi no 1234567890 adres", "V.K.N. 1234567890", "Tax ID: 1234567890"):
        assert kinds(text) == ["vkn"], text
    assert kinds("VKN: 1234567891") == []  # its check digit is wrong
    # Ten digits with no word naming them: an order number, a product code, a phone without its 0.
    assert kinds("sipariş 1234567890 kargoda") == []
    assert mask_text("VKN: 1234567890") == "VKN: **********"


def test_ibans_of_every_country_by_their_own_rules() -> None:
    for iban in ("DE89 3704 0044 0532 0130 00", "GB82 WEST 1234 5698 7654 32", "FR14 2004 1010 0505 0001 3M02 606"):
        assert iban_valid(iban), iban
        assert kinds(f"pay to {iban} thanks") == ["iban"], iban
    assert not iban_valid("DE89370400440532013")  # a German IBAN is 22 characters
    assert not iban_valid("GB82WEST12345698765433")  # check digits


def test_phones_of_other_countries_by_their_numbering_plans() -> None:
    from services.datacheck import phone_valid

    assert phone_valid("+33 1 42 68 53 00") and phone_valid("+1 650 253 0000")
    assert kinds("appelez +33 1 42 68 53 00") == ["phone"]
    assert not phone_valid("+1 011 253 0000")  # no US area code starts with 0
    assert kinds("code +44 1 2 3 4 5 6 7 8") == []


def test_payment_card_luhn() -> None:
    assert luhn_valid("4111 1111 1111 1111") and luhn_valid("4111-1111-1111-1111")
    assert not luhn_valid("4111 1111 1111 1112")
    assert kinds("card 4111 1111 1111 1111 ok") == ["payment_card"]
    assert kinds("card 4111 1111 1111 1112 ok") == []


@pytest.mark.parametrize(
    "phone",
    ["+90 532 123 45 67", "0532 123 45 67", "05321234567", "+905321234567", "0212 555 12 34", "+44 20 7946 0958"],
)
def test_phone_formats(phone: str) -> None:
    assert kinds(f"ara beni {phone} yarın") == ["phone"]


def test_plain_numbers_are_not_phones() -> None:
    assert kinds("order 12345 costs 2024 lira") == []


def test_email_and_names_masked() -> None:
    text = "Write to john.doe@example.com or Ayşe Yılmaz, TC 10000000146, card 4111 1111 1111 1111"
    masked = mask_text(text, names=["Ayşe Yılmaz"])
    assert "j***@e***.com" in masked
    assert "A***" in masked and "Yılmaz" not in masked
    assert "***********" in masked and "10000000146" not in masked
    assert "**** **** **** 1111" in masked
    assert kinds(text, ("ayşe yılmaz",)) == ["email", "name", "tc_kimlik", "payment_card"]


def test_report_pii_summary(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [{"text": f"mail user{i}@example.com please"} for i in range(7)] + [{"text": "no personal data here"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = check_dataset(path)
    (email,) = report.pii
    assert (email.kind, email.count) == ("email", 7)
    assert email.example_row_numbers == (1, 2, 3, 4, 5)
    assert email.masked_examples[0] == "u***@e***.com"


def test_writers_never_touch_the_original(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    original = '{"text": "mail a.b@example.com now please"}\n{"text": "mail a.b@example.com now please"}\nbad\n'
    path.write_text(original, encoding="utf-8")
    assert write_clean(path, tmp_path / "clean.jsonl") == 1
    assert write_masked(path, tmp_path / "masked.jsonl") == 2
    assert path.read_text(encoding="utf-8") == original
    masked = (tmp_path / "masked.jsonl").read_text(encoding="utf-8")
    assert "a.b@example.com" not in masked and "a***@e***.com" in masked
    with pytest.raises(DataCheckError, match="out_path: must differ"):
        write_clean(path, path)
    with pytest.raises(DataCheckError, match="already exists"):
        write_masked(path, tmp_path / "masked.jsonl")
    assert path.read_text(encoding="utf-8") == original


def test_location_warning() -> None:
    findings = find_pii(3, {"text": "TC 10000000146"})
    kvkk = data_location_warning(findings, "tr", "US")
    assert kvkk is not None and "KVKK" in kvkk and "6698" in kvkk and "mask" in kvkk
    gdpr = data_location_warning(findings, "DE", "US")
    assert gdpr is not None and "GDPR Chapter V" in gdpr and "standard contractual clauses" in gdpr
    assert data_location_warning(findings, "DE", "FR") is None
    assert data_location_warning(findings, "TR", "TR") is None
    assert data_location_warning([], "TR", "US") is None
    with pytest.raises(ValueError, match="provider_country"):
        data_location_warning(findings, "TR", "USA")
    with pytest.raises(ValueError, match="data_country"):  # letters, but not ASCII ones: no country's code
        data_location_warning(findings, "ÇA", "US")


def test_datacheck_imports_nothing_heavy() -> None:
    forbidden = ("sqlalchemy", "fastapi", "celery", "boto3", "redis", "torch")
    code = f"import sys\nimport services.datacheck\nprint(','.join(m for m in {forbidden!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"datacheck imported: {out.stdout.strip()}"
