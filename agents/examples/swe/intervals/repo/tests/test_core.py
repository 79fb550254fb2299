import pytest

from intervals import gaps, merge, total_length


def test_merge_disjoint_sorted():
    assert merge([(5, 8), (1, 3)]) == [(1, 3), (5, 8)]


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_merge_touching():
    assert merge([(1, 2), (2, 4)]) == [(1, 4)]


def test_merge_empty():
    assert merge([]) == []


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        merge([(3, 1)])


def test_total_length():
    assert total_length([(1, 4), (3, 5), (10, 11)]) == 5


def test_gaps():
    assert gaps([(1, 2), (4, 6), (5, 7), (9, 10)]) == [(2, 4), (7, 9)]
