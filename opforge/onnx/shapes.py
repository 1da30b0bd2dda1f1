"""Shapes at import: constants of the program being traced, and shapes known symbolically (tuples holding ``Dim``s)
turned into program variables, or variables into sizes an op's attr can hold (``Elem``s), for importers and the
importer alike."""

from __future__ import annotations

import numpy as np

from .. import ops as F
from ..core.opdef import registry
from ..core.spec import Dim, Elem
from ..creation import tensor
from ..program.trace import Variable, tracing_program


def constant(array: np.ndarray):
    """``array`` as a constant of the program being traced (read-only: a constant the executor may fold, not state)."""
    t = tensor(array)
    t.numpy().flags.writeable = False
    return t


def sizes_of(variable) -> tuple:
    """The elements of a 1-d int64 program variable (a shape computed at run time) as sizes an op's attr can hold."""
    return tuple(Elem(variable.name, k) for k in range(variable.spec.shape[0]))


def shape_variable(value):
    """A shape known symbolically at import (a tuple, or an object array, of ints and ``Dim``s: ``x.shape[0]``) as
    an int64 program variable, computed from the shapes of the variables its Dims name, for a node that uses it as
    data (``x.size(1) // 2``, a size cast to float)."""
    program = tracing_program()
    shape = np.shape(value)
    parts, run = [], []
    for d in np.asarray(value, dtype=object).reshape(-1).tolist():
        if isinstance(d, Dim):
            if run:
                parts.append(constant(np.array(run, np.int64)))
                run = []
            sizes = F.shape_as_tensor(Variable(program, d.var))
            parts.append(F.slice(sizes, axes=[0], starts=[d.axis], ends=[d.axis + 1], steps=[1]))
        else:
            run.append(int(d))
    if run:
        parts.append(constant(np.array(run, np.int64)))
    flat = parts[0] if len(parts) == 1 else F.concat(parts, axis=0)
    return flat if len(shape) == 1 else F.reshape(flat, shape=list(shape))


def from_shapes(variable) -> bool:
    """Whether the value of ``variable`` depends on shapes and constants alone (Shape → Gather → Concat …), not on
    the values of feeds or parameters: what the executor computes when it plans a run, and an attr may read."""
    program = variable.program
    producer = {n: op for op in program.block.ops for n in op.output_names()}
    seen: dict = {}

    def known(name: str) -> bool:
        if name not in seen:
            op = producer.get(name)
            if op is None:  # a feed, a parameter or state: read at run time; or a constant
                seen[name] = name in program.values and not program.block.vars[name].persistable
            else:
                traits = registry.get(op.type).traits
                seen[name] = "random" not in traits and (
                    "shape_only" in traits or all(known(n) for n in (*op.input_names(), *op.value_reads())))
        return seen[name]

    return known(variable.name)
