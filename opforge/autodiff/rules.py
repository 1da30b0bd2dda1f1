"""Calling a gradient rule and checking what it returns — shared by eager autograd and program mode."""

from __future__ import annotations

from ..core.errors import GradientError, describe
from ..core.spec import broadcast_shapes


def flatten_input_grads(op, result, in_layout: tuple) -> list:
    """A rule's result (one value, a tuple in input order, or a dict by name) -> one gradient per flat input."""
    names = op.input_names
    if type(result) is tuple and len(result) == len(in_layout) and all(n < 0 for n in in_layout):
        return list(result)  # the common case: one gradient per plain input
    if isinstance(result, dict):
        unknown = set(result) - set(names)
        if unknown:
            raise GradientError(
                f"gradient rule of op '{op.name}' returned gradients for {sorted(unknown)}, "
                f"which are not inputs of the op {list(names)}"
            )
        per_input = [result.get(n) for n in names]
    elif len(names) == 1 and (in_layout[0] >= 0 or not isinstance(result, (tuple, list))):
        per_input = [result]  # one input: the value itself (a list of gradients for a Tensor[] input)
    elif isinstance(result, (tuple, list)) and len(result) == len(names):
        per_input = list(result)
    else:
        got = f"{len(result)} values" if isinstance(result, (tuple, list)) else describe(result)
        raise GradientError(
            f"gradient rule of op '{op.name}' must return {len(names)} gradient(s), one per input "
            f"{list(names)} (or a dict by name), returned {got}"
        )
    flat = []
    for name, n, g in zip(names, in_layout, per_input):
        if n < 0:
            flat.append(g)
        elif g is None:
            flat.extend([None] * n)
        elif not isinstance(g, (list, tuple)):
            flat.extend([g] * n)  # one gradient for a Tensor[] input: the same for each of its tensors
        elif isinstance(g, (list, tuple)) and len(g) == n:
            flat.extend(g)
        else:
            raise GradientError(
                f"gradient rule of op '{op.name}' must return a list of {n} gradients for input '{name}' "
                f"(a Tensor[] of {n}), returned {describe(g)}"
            )
    return flat


def input_label(op, flat_index: int, in_layout: tuple) -> str:
    """The name of the flat input ``flat_index`` ("x", or "xs[2]" inside a list input)."""
    i = 0
    for name, n in zip(op.input_names, in_layout):
        if n < 0:
            if i == flat_index:
                return name
            i += 1
        else:
            if flat_index < i + n:
                return f"{name}[{flat_index - i}]"
            i += n
    return f"#{flat_index}"


def reduce_to(op, label: str, grad, shape: tuple, sum_to):
    """Sum a gradient that is larger than its (broadcast) input down to the input's shape."""
    gshape = tuple(grad.shape)
    if gshape == tuple(shape):
        return grad
    try:
        fits = broadcast_shapes(shape, gshape) == gshape
    except ValueError:
        fits = False
    if not fits:
        raise GradientError(
            f"gradient rule of op '{op.name}' returned a gradient of shape {gshape} for input '{label}' "
            f"of shape {tuple(shape)}: it must have the input's shape or broadcast from it"
        )
    return sum_to(grad, shape=shape)
