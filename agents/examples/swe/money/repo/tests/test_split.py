import pytest

from money import split_by_weights, split_cents


def test_even_split():
    assert split_cents(1000, 4) == [250, 250, 250, 250]


def test_split_needs_parts():
    with pytest.raises(ValueError):
        split_cents(100, 0)


def test_split_by_weights():
    assert split_by_weights(100, [1, 1, 1]) == [34, 33, 33]
    assert sum(split_by_weights(1001, [3, 5, 2])) == 1001
