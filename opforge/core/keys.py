"""Cache keys that tell apart the values a cached result depends on, where ``==`` (and so a dict) does not.

``-0.0 == 0.0``, yet ``1 / (x + -0.0)`` and ``1 / (x + 0.0)`` differ at ``x = -0.0``; ``nan != nan``, so a NaN key
never finds itself again (a miss per call, and a table that grows). A float keyed by ``exact`` is keyed by its bits
wherever ``==`` would mislead. (Mixing types, ``1 == 1.0 == True``, is for the caller to rule out: it keys on the
type too where the type can vary.)
"""

import struct

_bits = struct.Struct("<d").pack


def exact(value):
    """``value`` as a dict key that equals another only where the two give the same results: a float that is 0 or
    NaN becomes its 8 bytes (any other float is its own key), and a tuple is keyed item by item."""
    kind = type(value)
    if kind is float:
        return value if value and value == value else _bits(value)
    if kind is tuple:
        return tuple(map(exact, value))
    return value


__all__ = ["exact"]
