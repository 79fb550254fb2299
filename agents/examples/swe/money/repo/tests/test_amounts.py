import pytest

from money import format_cents, parse_amount


def test_parse_rounds_half_up():
    assert parse_amount("0.125") == 13
    assert parse_amount("1,234.5") == 123450


def test_parse_rejects_text():
    with pytest.raises(ValueError):
        parse_amount("twelve")


def test_format():
    assert format_cents(123456) == "1,234.56"
    assert format_cents(-5) == "-0.05"
