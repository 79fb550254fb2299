from slugify import slugify, unique_slug


def test_simple_title():
    assert slugify("Release Notes") == "release-notes"


def test_accents_are_dropped():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_empty_title():
    assert slugify("!!!") == "untitled"


def test_truncation():
    assert slugify("abc def", max_length=4) == "abc"


def test_unique_slug():
    assert unique_slug("Hello World", {"hello-world", "hello-world-2"}) == "hello-world-3"
