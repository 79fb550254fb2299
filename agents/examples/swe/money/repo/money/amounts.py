"""Converting between decimal strings and integer cents."""
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation


def parse_amount(text):
    """Cents in a decimal amount such as "12.5" or "-3.99" (rounded half up)."""
    try:
        value = Decimal(text.replace(",", "").strip())
    except InvalidOperation:
        raise ValueError(f"not an amount: {text!r}") from None
    return int((value * 100).quantize(Decimal("1"), rounding=ROUND_HALF_UP))


def format_cents(cents):
    """Cents as a string with thousands separators and two decimals."""
    sign = "-" if cents < 0 else ""
    units, rest = divmod(abs(cents), 100)
    return f"{sign}{units:,}.{rest:02d}"
