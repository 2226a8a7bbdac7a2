"""common.digits.parse_digits: ASCII digits with a bound, checked before int() runs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.digits import parse_digits


@pytest.mark.parametrize(("text", "maximum", "expected"), [
    ("0", 0, 0), ("7", 9, 7), ("65535", 65535, 65535), ("00065535", 65535, 65535),
    ("0" * 5000, 5, 0),  # int() refuses over 4300 digits, leading zeros included
    ("0" * 5000 + "12", 99, 12),
    ("65536", 65535, None), ("9" * 5000, 2**63 - 1, None), ("1" + "0" * 19, 2**63 - 1, None),
    ("", 9, None), ("-1", 9, None), ("+1", 9, None), (" 1", 9, None), ("1_0", 99, None), ("1.0", 9, None),
    ("\u0663", 9, None),  # Arabic-Indic 3: int() reads it as 3
    ("\u00b2", 9, None),  # superscript 2: isdigit() says yes, int() raises
    ("\uff11", 9, None),  # fullwidth 1
])
def test_parse_digits(text: str, maximum: int, expected: int | None) -> None:
    assert parse_digits(text, maximum) == expected


@given(st.integers(min_value=0, max_value=2**64), st.integers(min_value=0, max_value=2**64),
       st.integers(min_value=0, max_value=30))
def test_agrees_with_int_on_ascii_digits(value: int, maximum: int, zeros: int) -> None:
    assert parse_digits("0" * zeros + str(value), maximum) == (value if value <= maximum else None)
