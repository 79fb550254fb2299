"""A minimal comma-separated-values reader."""
from csvlite.reader import read_records, read_rows
from csvlite.split import split_line

__all__ = ["read_records", "read_rows", "split_line"]
