"""Version strings of the form MAJOR.MINOR.PATCH."""
from semver.version import bump, compare, latest, parse

__all__ = ["bump", "compare", "latest", "parse"]
