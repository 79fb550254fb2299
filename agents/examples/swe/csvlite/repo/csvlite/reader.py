"""Reading whole documents into rows or header-keyed records."""
from csvlite.split import split_line


def read_rows(text, delimiter=","):
    """Every non-blank line of `text` as a list of fields."""
    return [split_line(line, delimiter) for line in text.splitlines() if line.strip()]


def read_records(text, delimiter=","):
    """Rows after the first as dicts keyed by the first row (the header)."""
    rows = read_rows(text, delimiter)
    if not rows:
        return []
    header, body = rows[0], rows[1:]
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"row {number} has {len(row)} fields, header has {len(header)}")
    return [dict(zip(header, row)) for row in body]
