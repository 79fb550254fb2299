import pytest

from csvlite import read_records, read_rows


def test_rows_skip_blank_lines():
    assert read_rows("a,b\n\n1,2\n") == [["a", "b"], ["1", "2"]]


def test_records():
    text = 'name,age\n"Smith, J",41\nLee,7\n'
    assert read_records(text) == [{"name": "Smith, J", "age": "41"}, {"name": "Lee", "age": "7"}]


def test_records_ragged_row():
    with pytest.raises(ValueError):
        read_records("a,b\n1,2,3\n")
