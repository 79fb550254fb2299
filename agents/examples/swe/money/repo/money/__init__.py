"""Integer-cent money helpers."""
from money.amounts import format_cents, parse_amount
from money.split import split_cents, split_by_weights

__all__ = ["format_cents", "parse_amount", "split_by_weights", "split_cents"]
