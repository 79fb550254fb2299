import pytest

from semver import bump, compare, latest, parse


def test_parse_accepts_v_prefix():
    assert parse("v1.2.3") == ["1", "2", "3"]


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse("1.2")


def test_compare_equal():
    assert compare("2.0.0", "v2.0.0") == 0


def test_compare_single_digits():
    assert compare("1.2.3", "1.3.0") == -1
    assert compare("2.0.0", "1.9.9") == 1


def test_bump_parts():
    assert bump("1.2.3", "patch") == "1.2.4"
    assert bump("1.2.3", "minor") == "1.3.0"
    assert bump("1.2.3", "major") == "2.0.0"


def test_bump_rejects_unknown_part():
    with pytest.raises(ValueError):
        bump("1.2.3", "build")
