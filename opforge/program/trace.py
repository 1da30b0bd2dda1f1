"""Tracing: run a function on symbolic ``Variable``s and append every op it calls to a ``Program``.

``trace`` makes a ``Tracer`` the innermost interpreter (see ``opforge.dispatch``) while the function runs, so every
``opforge.ops`` function and Tensor operator it calls — on Variables, on eager Tensors it closes over, or on no
input at all (random ops) — is appended as an ``OpDesc`` instead of run: its outputs' Specs come from the op's own
shape rule, its attrs are checked as eagerly. Eager Tensors the function reads become variables: persistable
parameters when they require grad, persistable state when writable, constants otherwise.
"""

from __future__ import annotations

import inspect

import numpy as np

from ..core import dtypes as D
from ..core.devices import default_device, get_device
from ..core.errors import ArgumentError, GradientError, describe
from ..core.opdef import OpDef
from ..core.spec import Dim, Spec, undim
from ..dispatch import Interpreter, current_interpreter, interpreting
from ..tensor import Tensor, TensorOps, wrap
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
    def device(self):
        return self.program.device

    @property
    def requires_grad(self) -> bool:
        return False

    @property
    def interpreter(self) -> Tracer:
        """The interpreter that calls on this variable go to when no trace is running: its program's."""
        return Tracer(self.program)

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
        self.interpreter.append_backward(self)

    def numpy(self):
        raise ArgumentError(f"program variable '{self.name}' has no value while tracing; run the program "
                            "with of.Executor to get one")


class Tracer(Interpreter):
    """The interpretation of op calls as program building: each call is appended to ``program`` as an OpDesc, with
    its outputs' Specs inferred by the op's own shape rule and its attrs checked as eagerly. Eager Tensors a call
    reads (parameters, buffers, optimizer state) become variables of the program (``var_for_tensor``); ``role``
    marks the ops ``append_backward`` emits."""

    def __init__(self, program: Program, role: str = "forward"):
        self.program = program
        self.role = role

    def apply(self, op: OpDef, inputs: tuple, attrs: dict):
        if op.validate is not None:
            op.validate(attrs)  # (an attr holding a run-time size is checked by the executor, with the real size)
        return _append(self.program, self.role, op, inputs, attrs)

    def live(self, tensor: Tensor) -> Variable:
        return Variable(self.program, var_for_tensor(self.program, tensor, state=True))

    def assign(self, target: Tensor, value) -> None:
        program = self.program
        name = var_for_tensor(program, target, state=not target.requires_grad)
        if not isinstance(value, Variable):
            raise ArgumentError(f"assign(): while tracing, the value must be a program variable, got {describe(value)}")
        if value.spec.shape != program.block.vars[name].spec.shape:
            raise ArgumentError(f"assign(): value {value.spec} does not fit {program.block.vars[name]}")
        program.updates[name] = value.name

    def grad_of(self, param: Tensor):
        name = self.program.grad_names.get(var_for_tensor(self.program, param))
        return None if name is None else Variable(self.program, name)

    def set_grad(self, param: Tensor, grad) -> None:
        name = var_for_tensor(self.program, param)
        if grad is None:  # forgotten (zero_grad): a compiled step need not return it
            self.program.grad_names.pop(name, None)
        else:
            self.program.grad_names[name] = grad.name

    def differentiate(self, outputs, inputs, grad_outputs, allow_unused: bool):
        """``of.grad`` inside a traced function: append_backward on the program."""
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        if len(outputs) != 1 or grad_outputs is not None:
            raise GradientError("grad() inside a traced function takes one scalar output and no grad_outputs")
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        names = [var_for_tensor(self.program, t) if isinstance(t, Tensor) else t.name for t in inputs]
        grads = self.append_backward(outputs[0], wrt=names)
        result = []
        for t, n in zip(inputs, names):
            if n not in grads and not allow_unused:
                raise GradientError(f"grad(): {describe(t)} was not used to compute the output; "
                                    "pass allow_unused=True")
            result.append(grads.get(n))
        return tuple(result)

    def append_backward(self, loss, wrt=None):
        from .backward import append_backward  # backward builds on tracing: imported where a trace asks for it

        return append_backward(self.program, loss, wrt=wrt)


def tracing_program() -> Program | None:
    """The program this thread is tracing into, or None (eager mode)."""
    interpreter = current_interpreter()
    return interpreter.program if isinstance(interpreter, Tracer) else None


def var_for_tensor(program: Program, tensor: Tensor, state: bool = False) -> str:
    """The variable of an eager Tensor a program reads: a parameter if it requires grad, persistable state
    (optimizer moments, a learning rate: updated by the program, never differentiated) if ``state``, else a
    constant."""
    known = program._tensor_vars
    entry = known.get(id(tensor))
    if entry is not None and entry[0] is tensor:
        if state:
            program.block.vars[entry[1]].persistable = True
        return entry[1]
    if tensor.device is not program.device:
        raise ArgumentError(f"a program for device '{program.device}' cannot read a tensor on device "
                            f"'{tensor.device}' (shape {tensor.shape}); move it to '{program.device}' first")
    # A writable array the function closed over (a buffer, a frozen weight) may change between runs: it is
    # state, read at each run. Only read-only arrays (Python numbers lifted while tracing) are constants,
    # which the executor may fold.
    state = state or (not tensor.requires_grad and getattr(tensor._data.flags, "writeable", True))
    persistable = tensor.requires_grad or state
    name = program.fresh_name("param" if tensor.requires_grad else "state" if state else "const")
    program.add_var(name, Spec(tensor.shape, tensor.dtype), persistable=persistable,
                    stop_gradient=not tensor.requires_grad)
    program.values[name] = tensor._data  # no copy: the executor updates persistable arrays in place
    known[id(tensor)] = (tensor, name)  # keeps the tensor alive, so its id stays its own
    return name


def live(tensor: Tensor):
    """``tensor`` as ops should read it: itself eagerly; while tracing, its persistable program variable, so that
    each run reads its current value (a plain constant could be folded into the program once)."""
    return current_interpreter().live(tensor)


def assign(target: Tensor, value) -> None:
    """Make ``value`` the new content of ``target`` after each run: in place in eager mode, recorded as an
    update of the persistable variable while tracing (the executor writes it into the same buffer)."""
    current_interpreter().assign(target, value)


def _input_name(program: Program, opdef: OpDef, arg: str, value, peer) -> str:
    if isinstance(value, Variable):
        if value.program is not program:
            raise ArgumentError(f"{opdef.name}(): argument '{arg}' is a variable of another program")
        return value.name
    if isinstance(value, Tensor):
        return var_for_tensor(program, value)
    if type(value) in (bool, int, float):
        array = np.asarray(value, dtype=D.scalar_dtype(value, peer))
    elif isinstance(value, (np.ndarray, np.generic)):
        array = np.array(value)
        D.as_dtype(array.dtype, op=opdef.name, arg=arg)
    else:
        raise ArgumentError(f"{opdef.name}(): argument '{arg}' expected Tensor, got {describe(value)}")
    array.flags.writeable = False  # a literal of the traced code: a true constant
    device = program.device
    return var_for_tensor(program, wrap(device.from_host(array), device))


def _append(program: Program, role: str, opdef: OpDef, inputs: tuple, attrs: dict):
    """Append ``opdef`` applied to ``inputs`` to ``program``; return output Variables shaped like eager results."""
    block = program.block
    peers = [v.dtype for slot in inputs for v in (slot if isinstance(slot, (list, tuple)) else (slot,))
             if isinstance(v, (Variable, Tensor))]
    peer = D.promote(*peers) if peers else None
    names, specs = {}, []
    for p, value in zip(opdef.inputs, inputs):
        if p.is_list:
            if not isinstance(value, (list, tuple)):
                raise ArgumentError(f"{opdef.name}(): argument '{p.name}' expected a list of Tensors, "
                                    f"got {describe(value)}")
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
    block.ops.append(OpDesc(opdef.name, names, outputs, dict(attrs), role))
    result, i = [], 0
    for o in opdef.outputs:
        n = len(outputs[o.name])
        result.append(flat[i:i + n] if o.is_list else flat[i])
        i += n
    return result[0] if len(result) == 1 else opdef.result_type(*result)


def trace(fn, *specs, device=None, **named_specs) -> Program:
    """Run ``fn`` on symbolic variables of the given Specs and return the program of the ops it called.

    ``of.trace(f, of.Spec((None, 3), "float32"))`` or by name, ``of.trace(f, x=of.Spec(...))``. What ``fn``
    returns (a Variable, a tuple or a dict of them) becomes ``program.outputs``. The program runs on ``device``
    (the default device if not given): the tensors ``fn`` reads must live there.
    """
    params = list(inspect.signature(fn).parameters)
    if len(specs) > len(params):
        raise ArgumentError(f"trace(): {fn.__name__} takes {len(params)} arguments, {len(specs)} Specs given")
    given = dict(zip(params, specs)) | named_specs
    program = Program(default_device() if device is None else get_device(device, "trace()"))
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
    with interpreting(Tracer(program)):
        result = fn(**args)
    if isinstance(result, dict):
        items = result.items()
    elif isinstance(result, (tuple, list)):
        items = [(f"out{i}", v) for i, v in enumerate(result)]
    else:
        items = [("out", result)]
    for key, value in items:
        if isinstance(value, Tensor):  # a result that does not depend on the inputs
            value = Variable(program, var_for_tensor(program, value))
        if not isinstance(value, Variable):
            raise ArgumentError(f"trace(): {fn.__name__} must return Variables, returned {describe(value)}")
        program.outputs[key] = value.name
    return program
