"""Tracing: run a function on symbolic ``Variable``s and record every op it calls into a ``Program``.

Any ``opforge.ops`` function and Tensor operator works on Variables: dispatch hands calls with a Variable
input to ``record_op`` here, which infers the outputs' Specs with the op's own shape rule, checks the call as
eagerly, and appends an ``OpDesc``. Eager Tensors the function closes over become variables too: persistable
parameters when they require grad, constants otherwise.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np

from ..core import dtypes as D
from ..core.errors import ArgumentError, describe
from ..core.opdef import OpDef
from ..core.spec import Dim, Spec, undim
from ..dispatch import register_symbolic, tracing
from ..tensor import Tensor, TensorOps
from .desc import OpDesc, Program


class Variable(TensorOps):
    """A symbolic tensor inside a program being built: a name and a Spec, no data."""

    __slots__ = ("name", "program")

    def __init__(self, program: Program, name: str):
        self.program = program
        self.name = name

    @property
    def spec(self) -> Spec:
        return self.program.block.vars[self.name].spec

    @property
    def shape(self) -> tuple:
        """The shape, with each dim that is known only at run time as a ``Dim``."""
        return tuple(Dim(self.name, i) if d is None else d for i, d in enumerate(self.spec.shape))

    @property
    def dtype(self) -> np.dtype:
        return self.spec.dtype

    @property
    def ndim(self) -> int:
        return len(self.spec.shape)

    @property
    def device(self) -> str:
        return "cpu"

    @property
    def requires_grad(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Variable({self.program.block.vars[self.name]})"

    def __bool__(self):
        raise ArgumentError(
            f"the truth value of program variable '{self.name}' is only known at run time: "
            "Python control flow on it cannot be traced (use F.where)"
        )

    def detach(self) -> Variable:
        """The same value, cut from differentiation: an identity whose output is marked stop_gradient."""
        from .. import ops as F

        out = F.identity(self)
        self.program.block.vars[out.name].stop_gradient = True
        return out

    def backward(self) -> None:
        """Append the backward pass for this (scalar) loss to its program: gradients of every parameter."""
        from .backward import append_backward

        append_backward(self.program, self)

    def numpy(self):
        raise ArgumentError(f"program variable '{self.name}' has no value while tracing; run the program "
                            "with of.Executor to get one")


class _Building(threading.local):
    program: Program | None = None
    role: str = "forward"


building = _Building()


def _program_of(opdef: OpDef, inputs: tuple) -> Program:
    programs = {id(v.program): v.program for slot in inputs
                for v in (slot if isinstance(slot, (list, tuple)) else (slot,)) if isinstance(v, Variable)}
    if len(programs) > 1:
        raise ArgumentError(f"{opdef.name}(): inputs come from different programs")
    if not programs:  # no symbolic input (a random op, an op on parameters): the program being traced
        return building.program
    return next(iter(programs.values()))


def constant_var(program: Program, tensor: Tensor, state: bool = False) -> str:
    """The variable of an eager Tensor used inside a program: a parameter if it requires grad, persistable state
    (optimizer moments, a learning rate: updated by the program, never differentiated) if ``state``, else a
    constant."""
    known = program._tensor_vars
    entry = known.get(id(tensor))
    if entry is not None and entry[0] is tensor:
        if state:
            program.block.vars[entry[1]].persistable = True
        return entry[1]
    # A writable array the function closed over (a buffer, a frozen weight) may change between runs: it is
    # state, read at each run. Only read-only arrays (Python numbers lifted while tracing) are constants,
    # which the executor may fold.
    state = state or (not tensor.requires_grad and tensor.numpy().flags.writeable)
    persistable = tensor.requires_grad or state
    name = program.fresh_name("param" if tensor.requires_grad else "state" if state else "const")
    program.add_var(name, Spec(tensor.shape, tensor.dtype), persistable=persistable,
                    stop_gradient=not tensor.requires_grad)
    program.values[name] = tensor.numpy()  # no copy: the executor updates persistable arrays in place
    known[id(tensor)] = (tensor, name)  # keeps the tensor alive, so its id stays its own
    return name


def tracing_program() -> Program | None:
    """The program this thread is tracing into, or None (eager mode)."""
    return building.program


def state(tensor: Tensor) -> Variable:
    """``tensor`` as persistable state of the program being traced (see ``constant_var``)."""
    program = building.program
    return Variable(program, constant_var(program, tensor, state=True))


def assign(target: Tensor, value) -> None:
    """Make ``value`` the new content of ``target`` after each run: in place in eager mode, recorded as an
    update of the persistable variable while tracing (the executor writes it into the same buffer)."""
    program = building.program
    if program is None:
        data = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        if data.shape != target.shape:
            raise ArgumentError(f"assign(): value of shape {data.shape} for a tensor of shape {target.shape}")
        np.copyto(target.numpy(), data, casting="same_kind")
        return
    name = constant_var(program, target, state=not target.requires_grad)
    if not isinstance(value, Variable):
        raise ArgumentError(f"assign(): while tracing, the value must be a program variable, got {describe(value)}")
    if value.spec.shape != program.block.vars[name].spec.shape:
        raise ArgumentError(f"assign(): value {value.spec} does not fit {program.block.vars[name]}")
    program.updates[name] = value.name


def _input_name(program: Program, opdef: OpDef, arg: str, value, peer) -> str:
    if isinstance(value, Variable):
        return value.name
    if isinstance(value, Tensor):
        return constant_var(program, value)
    if type(value) in (bool, int, float):
        array = np.asarray(value, dtype=D.scalar_dtype(value, peer))
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        D.as_dtype(array.dtype, op=opdef.name, arg=arg)
    else:
        raise ArgumentError(f"{opdef.name}(): argument '{arg}' expected Tensor, got {describe(value)}")
    from ..creation import tensor

    constant = tensor(array)
    constant.numpy().flags.writeable = False  # a literal of the traced code: a true constant
    return constant_var(program, constant)


def record_op(opdef: OpDef, inputs: tuple, attrs: dict):
    """Append ``opdef`` applied to ``inputs`` to their program; return output Variables shaped like eager results."""
    program = _program_of(opdef, inputs)
    block = program.block
    peers = [v.dtype for slot in inputs for v in (slot if isinstance(slot, (list, tuple)) else (slot,))
             if isinstance(v, (Variable, Tensor))]
    peer = D.promote(*peers) if peers else None
    names, specs = {}, []
    for p, value in zip(opdef.inputs, inputs):
        if p.is_list:
            slot = [_input_name(program, opdef, f"{p.name}[{i}]", v, peer) for i, v in enumerate(value)]
            specs.append([block.vars[n].spec for n in slot])
        elif value is None:
            if not p.optional:
                raise ArgumentError(f"{opdef.name}(): argument '{p.name}' expected Tensor, got None")
            slot = []
            specs.append(None)
        else:
            slot = [_input_name(program, opdef, p.name, value, peer)]
            specs.append(block.vars[slot[0]].spec)
        names[p.name] = slot
    out_specs = opdef.infer_specs(specs, {k: undim(v) for k, v in attrs.items()})
    outputs, flat = {}, []
    for o, spec in zip(opdef.outputs, out_specs):
        group = list(spec) if o.is_list else [spec]
        outputs[o.name] = []
        for s in group:
            name = program.fresh_name(opdef.name)
            program.add_var(name, s, stop_gradient="no_grad" in opdef.traits)
            outputs[o.name].append(name)
            flat.append(Variable(program, name))
    block.ops.append(OpDesc(opdef.name, names, outputs, dict(attrs), building.role))
    result, i = [], 0
    for o in opdef.outputs:
        n = len(outputs[o.name])
        result.append(flat[i:i + n] if o.is_list else flat[i])
        i += n
    return result[0] if len(result) == 1 else opdef.result_type(*result)


register_symbolic(Variable, record_op)
tracing.current_program = lambda: building.program


def trace(fn, *specs, **named_specs) -> Program:
    """Run ``fn`` on symbolic variables of the given Specs and return the program of the ops it called.

    ``of.trace(f, of.Spec((None, 3), "float32"))`` or by name, ``of.trace(f, x=of.Spec(...))``. What ``fn``
    returns (a Variable, a tuple or a dict of them) becomes ``program.outputs``.
    """
    params = list(inspect.signature(fn).parameters)
    if len(specs) > len(params):
        raise ArgumentError(f"trace(): {fn.__name__} takes {len(params)} arguments, {len(specs)} Specs given")
    given = dict(zip(params, specs)) | named_specs
    program = Program()
    args = {}
    for name, spec in given.items():
        if not isinstance(spec, Spec):
            if isinstance(spec, Tensor):
                spec = Spec(spec.shape, spec.dtype)
            else:
                raise ArgumentError(f"trace(): argument '{name}' expected a Spec, got {describe(spec)}")
        program.add_var(name, Spec.of(spec.shape, spec.dtype))
        program.feeds.append(name)
        args[name] = Variable(program, name)
    previous = building.program
    building.program = program
    tracing.active += 1
    try:
        result = fn(**args)
    finally:
        tracing.active -= 1
        building.program = previous
    if isinstance(result, dict):
        items = result.items()
    elif isinstance(result, (tuple, list)):
        items = [(f"out{i}", v) for i, v in enumerate(result)]
    else:
        items = [("out", result)]
    for key, value in items:
        if isinstance(value, Tensor):  # a result that does not depend on the inputs
            value = Variable(program, constant_var(program, value))
        if not isinstance(value, Variable):
            raise ArgumentError(f"trace(): {fn.__name__} must return Variables, returned {describe(value)}")
        program.outputs[key] = value.name
    return program
