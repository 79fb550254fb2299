"""Splitting an amount of cents into parts that add up to it exactly."""


def split_cents(total, parts):
    """`total` cents shared between `parts` people as evenly as possible."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    share = total // parts
    return [share] * parts


def split_by_weights(total, weights):
    """`total` cents shared in proportion to `weights` (largest remainders get the extra cents)."""
    if not weights or any(w < 0 for w in weights) or sum(weights) == 0:
        raise ValueError("weights must be non-negative and not all zero")
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    shares = [int(x) for x in exact]
    leftover = total - sum(shares)
    by_remainder = sorted(range(len(weights)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[:leftover]:
        shares[i] += 1
    return shares
