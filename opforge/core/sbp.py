"""SBP layouts (OneFlow's): how a value of a distributed program lies across the ranks of a mesh axis.

* ``S(k)``: split — rank r holds block r of the value along axis k (blocks of equal size);
* ``B``: broadcast — every rank holds the whole value;
* ``P`` (``P("sum")``) and ``P("mean")``: partial — each rank holds a value of the full shape, and the value is
  their sum (or mean). A mean over the split batch axis gives ``P("mean")``: each rank's mean of its own rows.

An op says which layouts it runs under with ``@op.sbp``: a function of the input Specs (and the attrs) yielding
``(input layouts, output layouts)`` pairs, one layout per input (None for a missing ``Tensor?``; one for a whole
``Tensor[]``) and one per output. Its traits add more (``signatures``): an elementwise op runs split along any
axis, a broadcasting op along any axis of its output where every input either has that axis whole or broadcasts
along it. Every op runs with every value broadcast (all ``B``), which is always correct, and is all that an op
with neither gets. Specs are those a rank holds (local), so a rule can compare sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def signatures(opdef, specs: list, attrs: dict) -> list:
    """The op's candidate signatures for inputs of these (local) Specs, in order of preference; the last is
    always all-broadcast. Each is ``(input layouts, output layouts)``, as tuples."""
    found = []
    if opdef.sbp_fn is not None:
        for ins, outs in opdef.sbp_fn(*specs, **attrs):
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            found.append((tuple(ins), outs))
    if "elementwise" in opdef.traits or "broadcast" in opdef.traits:
        found += [s for s in _from_traits(opdef, specs) if s not in found]
    every_b = (tuple(None if s is None else B for s in specs), tuple(B for _ in opdef.outputs))
    if every_b not in found:
        found.append(every_b)
    return found


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
            out.append((tuple(ins), (S(k),)))
    return out


__all__ = ["B", "Layout", "P", "S", "as_layout", "signatures"]
