"""Lower-case, ASCII, dash-separated slugs."""
import re
import unicodedata

_NOT_WORD = re.compile(r"[^a-z0-9]")


def slugify(title, max_length=60):
    """A slug for `title`: ASCII letters and digits joined by single dashes."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    slug = _NOT_WORD.sub("-", ascii_text.lower()).strip("-")
    if len(slug) > max_length:
        slug = slug[:max_length].rstrip("-")
    return slug or "untitled"


def unique_slug(title, taken):
    """`slugify(title)`, suffixed with -2, -3, ... until it is not in `taken`."""
    base = slugify(title)
    candidate, number = base, 2
    while candidate in taken:
        candidate = f"{base}-{number}"
        number += 1
    return candidate
