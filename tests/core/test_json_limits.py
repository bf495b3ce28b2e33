"""The JSON input limits shared by the API middleware, the plan schema and the dashboard form."""

from __future__ import annotations

import json

import pytest

from services.core.json_limits import MAX_SAFE_INTEGER, JsonInputError, JsonSyntaxError, check_value, loads


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ('{"a": {"b": [1, Infinity]}}', "a.b[1]", "finite"),
        ('{"a": -Infinity}', "a", "finite"),
        ('{"a": NaN}', "a", "finite"),
        ('{"a": 1e400}', "a", "finite"),
        ('{"a": ' + "9" * 300 + "}", "a", "too large"),
        ('{"a": "x\\u0000y"}', "a", "NUL"),
        ('{"a": ["\\ud800"]}', "a[0]", "surrogate"),
        ('{"k\\u0000": 1}', "body", "a key"),
        ("[" * 33 + "]" * 33, "body" + "[0]" * 32, "nested more than 32"),
    ],
)
def test_values_json_should_not_carry_are_refused_with_their_path(text: str, field: str, problem: str) -> None:
    with pytest.raises(JsonInputError) as raised:
        loads(text)
    assert raised.value.field == field and problem in raised.value.message


def test_what_real_bodies_hold_passes() -> None:
    value = {"a": [1, 2.5, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER, True, None, "é ✓ 😀"], "b": {"c": {"d": []}}}
    assert loads(json.dumps(value)) == value
    assert loads("[" * 32 + "]" * 32) is not None


def test_syntax_errors_name_line_and_column_and_stay_errors_at_any_depth() -> None:
    with pytest.raises(JsonSyntaxError) as raised:
        loads('{\n  "a": 1,\n  "b": }')
    assert "line 3, column 8" in raised.value.message
    with pytest.raises(JsonInputError) as deep:
        loads("[" * 100_000 + "]" * 100_000)
    assert "nested more than 32" in deep.value.message
    with pytest.raises(JsonSyntaxError):
        loads(b"\xff\xfe")


def test_a_parsed_value_is_checked_without_recursion() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(50_000):
        child: list[object] = []
        node.append(child)
        node = child
    with pytest.raises(JsonInputError):
        check_value(deep)
