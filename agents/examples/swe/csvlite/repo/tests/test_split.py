import pytest

from csvlite import split_line


def test_plain_fields():
    assert split_line("a,b,c") == ["a", "b", "c"]


def test_empty_fields():
    assert split_line("a,,c,") == ["a", "", "c", ""]


def test_quoted_delimiter():
    assert split_line('"Smith, J",41') == ["Smith, J", "41"]


def test_other_delimiter():
    assert split_line("a;b;c", delimiter=";") == ["a", "b", "c"]


def test_unterminated_quote():
    with pytest.raises(ValueError):
        split_line('"abc,def')
