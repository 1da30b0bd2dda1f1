"""SBP layouts (OneFlow's): how a value of a distributed program lies across the ranks of a mesh axis.

* ``S(k)``: split — rank r holds block r of the value along axis k (blocks of equal size);
* ``B``: broadcast — every rank holds the whole value;
* ``P`` (``P("sum")``) and ``P("mean")``: partial — each rank holds a value of the full shape, and the value is
  their sum (or mean). A mean over the split batch axis gives ``P("mean")``: each rank's mean of its own rows.

An op says which layouts it runs under with ``@op.sbp``: a function of the input Specs (and the attrs) yielding
``(input layouts, output layouts)`` pairs, one layout per input (None for a missing ``Tensor?``; one for a whole
``Tensor[]``) and one per output. Its traits add more (``signatures``): an elementwise op runs split along any
axis, a broadcasting or pointwise op along any axis of its output where every input either has that axis whole or
broadcasts along it. Every op runs with every value broadcast (all ``B``), which is always correct, and is all
that an op with neither gets.

A rule sees what one process sees: the *whole* (global) Specs of the values and the attrs as the one-process call
has them, so a rule comparing a shape-carrying attr with a shape (``reshape``'s ``shape``) compares like with like.
Where the op must run on the blocks with other attrs, the signature says so in a third item, a dict of the attrs
the op runs with on each rank (``reshape(x, [8, -1])`` of ``x: S(0)`` runs as ``reshape(block, [4, -1])`` on 2
ranks); a rule that names the parameter ``ranks`` gets the number of ranks to work them out. The sharding pass
checks every signature it uses against the op's shape rule (the blocks it would compute must be the blocks of the
whole result), and ``check_op`` checks each one numerically: the blocks computed on split inputs, put together,
must be the whole op's result.

An attr that differs from rank to rank on the blocks (the first row of the rank's block of a table split by
rows) is a ``PerRank(fn)``: rank r runs the op with ``fn(r)``.

A rule that names the parameter ``batch_norm`` gets the mesh's choice for batch statistics over a split batch:
``"sync"`` (the default: the statistics of the whole batch, as one process computes them) or ``"local"`` (each
rank's rows alone, as PyTorch's DistributedDataParallel computes them: not what one process computes, so only
when the mesh asks for it, and not checked against the whole op).

Some ops have no single call that computes their blocks, yet a few ops do: a rule may yield a ``Decomposition``,
the layouts to bring the inputs to and a function written with ops that computes the op's result, each of its ops
getting layouts of its own. ``cross_entropy``'s mean over split rows is the sum of every rank's losses over the
count of every rank's rows that count (not the mean of the ranks' means, which is another number when a rank's
rows hold more ``ignore_index`` targets than another's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .errors import ArgumentError, describe


@dataclass(frozen=True)
class Layout:
    kind: str  # "S", "B" or "P"
    axis: int | None = None  # S: the split axis
    reduce: str | None = None  # P: "sum" or "mean"

    def __call__(self, reduce: str) -> Layout:
        """``P("mean")``: a partial value whose ranks' parts are averaged."""
        if self.kind != "P" or reduce not in ("sum", "mean"):
            raise ArgumentError(f"{self}(...): only P takes an argument, 'sum' or 'mean'; got {describe(reduce)}")
        return Layout("P", reduce=reduce)

    @property
    def split(self) -> bool:
        return self.kind == "S"

    @property
    def partial(self) -> bool:
        return self.kind == "P"

    def __str__(self) -> str:
        if self.kind == "S":
            return f"S({self.axis})"
        if self.kind == "P":
            return "P" if self.reduce == "sum" else f"P({self.reduce})"
        return "B"

    __repr__ = __str__


def S(axis: int) -> Layout:
    """Split along ``axis``."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ArgumentError(f"S(): the axis must be an int, got {describe(axis)}")
    return Layout("S", axis=axis)


B = Layout("B")
P = Layout("P", reduce="sum")


def as_layout(value, what: str) -> Layout:
    """A Layout, or its text ("S(0)", "B", "P", "P(mean)")."""
    if isinstance(value, Layout):
        return value
    if isinstance(value, str):
        text = value.replace(" ", "")
        if text == "B":
            return B
        if text == "P":
            return P
        if text.startswith("P(") and text.endswith(")"):
            return P(text[2:-1])
        if text.startswith("S(") and text.endswith(")") and text[2:-1].lstrip("-").isdigit():
            return S(int(text[2:-1]))
    raise ArgumentError(f"{what}: expected a layout (S(k), B, P or P('mean')), got {describe(value)}")


def normalized(layout: Layout, ndim: int) -> Layout:
    """``S(-1)`` of a rank-2 value is ``S(1)``; an axis out of range is an error."""
    if layout.kind != "S":
        return layout
    if not -ndim <= layout.axis < ndim:
        raise ArgumentError(f"layout {layout} does not fit a value of rank {ndim}")
    return S(layout.axis % ndim)


class Decomposition(NamedTuple):
    """What an SBP rule yields where no one call of the op computes its blocks: bring the inputs to layouts
    ``ins``, then ``fn(*inputs, **attrs)``, written with ops, computes the op's result (each of its ops gets
    layouts of its own)."""

    ins: tuple
    fn: object


class PerRank(NamedTuple):
    """An attr of a signature that differs between the ranks: rank r runs the op with ``fn(r)``."""

    fn: object


def on_rank(attrs: dict, rank: int) -> dict:
    """A signature's attrs as rank ``rank`` runs the op with them."""
    return {k: v.fn(rank) if isinstance(v, PerRank) else v for k, v in attrs.items()}


BATCH_NORM = ("sync", "local")  # a mesh's choices for batch statistics over a split batch (see the module)


class Signature(NamedTuple):
    """One way to run an op across ranks: its inputs' layouts, its outputs' layouts, the attrs that differ on the
    blocks, or (``via``) the function that computes it from inputs in those layouts (``outs`` is then None)."""

    ins: tuple
    outs: tuple | None
    attrs: dict
    via: object = None


def signatures(opdef, specs: list, attrs: dict, ranks: int, batch_norm: str = "sync") -> list:
    """The op's candidate ``Signature``s for inputs of these whole (global) Specs and attrs on ``ranks`` ranks,
    in order of preference; the last is always all-broadcast. ``batch_norm``: the mesh's choice of batch
    statistics, for a rule that names it."""
    found = []
    if opdef.sbp_fn is not None:
        given = {"ranks": ranks, "batch_norm": batch_norm}
        extra = {k: v for k, v in given.items() if k in opdef.sbp_takes}
        for signature in opdef.sbp_fn(*specs, **attrs, **extra):
            if isinstance(signature, Decomposition):
                found.append(Signature(tuple(signature.ins), None, {}, signature.fn))
                continue
            if not isinstance(signature, tuple) or len(signature) not in (2, 3):
                raise ArgumentError(f"op '{opdef.name}': an SBP rule yields (input layouts, output layouts), "
                                    "(input layouts, output layouts, attrs on the blocks) or a Decomposition, got "
                                    f"{describe(signature)}")
            ins, outs, local = signature if len(signature) == 3 else (*signature, {})
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            found.append(Signature(tuple(ins), outs, dict(local)))
    if opdef.traits & {"elementwise", "broadcast", "pointwise"}:
        found += [s for s in _from_traits(opdef, specs) if s not in found]
    every_b = Signature(tuple(None if s is None else B for s in specs), tuple(B for _ in opdef.outputs), {})
    if every_b not in found:
        found.append(every_b)
    return found


def whole_spec(spec, layout: Layout, ranks: int):
    """The Spec of the whole value whose rank-held block has ``spec``."""
    if not layout.split or spec.shape[layout.axis] is None:
        return spec
    shape = list(spec.shape)
    shape[layout.axis] *= ranks
    return type(spec)(tuple(shape), spec.dtype)


def block_spec(spec, layout: Layout, ranks: int):
    """The Spec of a rank's block of a whole value of ``spec``, or None if it does not split evenly."""
    if not layout.split:
        return spec
    layout = normalized(layout, len(spec.shape))
    shape = list(spec.shape)
    d = shape[layout.axis]
    if d is not None:
        if d % ranks:
            return None
        shape[layout.axis] = d // ranks
    return type(spec)(tuple(shape), spec.dtype)


def _from_traits(opdef, specs: list) -> list:
    present = [s for s in specs if s is not None]
    if any(isinstance(s, list) for s in present) or len(opdef.outputs) != 1:
        return []
    rank = max(len(s.shape) for s in present)
    out = []
    for k in range(rank):
        ins = []
        for s in specs:
            if s is None:
                ins.append(None)
                continue
            j = k - (rank - len(s.shape))  # the input's own axis aligned with output axis k
            ins.append(S(j) if j >= 0 and s.shape[j] != 1 else B)
        if any(layout is not B and layout is not None for layout in ins):
            out.append(Signature(tuple(ins), (S(k),), {}))
    return out


__all__ = ["BATCH_NORM", "B", "Decomposition", "Layout", "P", "PerRank", "S", "Signature", "as_layout", "block_spec",
           "on_rank", "signatures", "whole_spec"]
