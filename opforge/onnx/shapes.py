"""Shapes at import: constants of the program being traced, and shapes known symbolically (tuples holding ``Dim``s)
turned into program variables, or variables into sizes an op's attr can hold (``Elem``s), for importers and the
importer alike."""

from __future__ import annotations

import math

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


FOLD_ELEMENTS = 4096  # integer constants of more dims are computed at import up to this size (torch's pad chains)
MAX_EVALUATED = 1 << 20  # elements of each value value_at_import computes on the way to what a node needs


class NotAtImport(LookupError):
    """A value ``value_at_import`` cannot compute: ``name`` is the variable it stops at (a feed, state, ...)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def value_at_import(variable) -> np.ndarray:
    """The value of a program variable of at most ``FOLD_ELEMENTS`` elements that the ops recorded so far compute from
    constants alone (and from the shapes of feeds whose shapes are fully known), computed now by the ops' kernels as
    the executor's constant folding would; ``NotAtImport`` when it depends on a feed's values, on state
    (parameters), on a random draw or on a size known only at run time, or holds more (or a value on the way holds
    more than ``MAX_EVALUATED`` elements). What a node needs at load
    (a Loop's trip count, an If's condition, Pad's value, Range's limit) may be computed in the model (the
    expansions of ONNX's functions)."""
    from ..core.opdef import registry
    from ..program.executor import _flattener

    program = variable.program
    block = program.block
    if any(d is None for d in variable.spec.shape) or math.prod(variable.spec.shape) > FOLD_ELEMENTS:
        raise NotAtImport(variable.name)
    producer = {n: op for op in block.ops for n in op.output_names()}
    device = program.device
    values: dict = {}

    def value(name: str):
        if name in values:
            return values[name]
        op = producer.get(name)
        if op is None:  # a constant, or a feed or state: not known
            if name in program.values and not block.vars[name].persistable:
                return program.values[name]
            raise NotAtImport(name)
        opdef = registry.get(op.type)
        for out in op.output_names():  # (checked before the kernel allocates: a file gives these sizes)
            shape = block.vars[out].spec.shape
            if None in shape or math.prod(shape) > MAX_EVALUATED:
                raise NotAtImport(out)
        if "random" in opdef.traits or op.value_reads() or any(
                isinstance(v, (Dim, Elem)) for a in op.attrs.values() for v in (a if isinstance(a, tuple) else (a,))):
            raise NotAtImport(name)
        known = {}
        for n in op.input_names():
            spec = block.vars[n].spec
            if "shape_only" in opdef.traits:  # (its result depends on the input's spec alone)
                if any(d is None for d in spec.shape):
                    raise NotAtImport(n)
                known[n] = device.xp.empty(spec.shape, spec.dtype)
            else:
                known[n] = value(n)
        args = [[known[n] for n in op.inputs[p.name]] if p.is_list else
                (known[op.inputs[p.name][0]] if op.inputs[p.name] else None) for p in opdef.inputs]
        dtypes = tuple(block.vars[n].spec.dtype for n in op.input_names())[:1]
        result = opdef.kernel_for(device, dtypes, op.attrs).bind(device)(*args, **op.attrs)
        for n, v in zip(op.output_names(), _flattener(opdef, device)(result)):
            values[n] = v
        return values[name]

    with np.errstate(all="ignore"):
        return np.array(device.to_host(value(variable.name)))
