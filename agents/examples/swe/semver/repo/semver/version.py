"""Parsing, ordering and bumping of MAJOR.MINOR.PATCH versions."""
import functools
import re

_PATTERN = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")
PARTS = ("major", "minor", "patch")


def parse(text):
    """Split a version string into its three numeric parts (as strings)."""
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(f"not a MAJOR.MINOR.PATCH version: {text!r}")
    return list(match.groups())


def compare(a, b):
    """-1, 0 or 1 as version `a` is older than, equal to or newer than `b`."""
    left, right = parse(a), parse(b)
    if left == right:
        return 0
    return -1 if left < right else 1


def latest(versions):
    """The newest of `versions` (ValueError when empty)."""
    if not versions:
        raise ValueError("no versions given")
    return max(versions, key=functools.cmp_to_key(compare))


def bump(version, part):
    """The next version after `version` when `part` (major/minor/patch) changes."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, not {part!r}")
    numbers = [int(n) for n in parse(version)]
    index = PARTS.index(part)
    numbers[index] += 1
    numbers[index + 1:] = [0] * (2 - index)
    return ".".join(str(n) for n in numbers)
