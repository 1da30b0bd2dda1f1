"""Tracing: run a function on symbolic ``Variable``s and append every op it calls to a ``Program``.

``trace`` makes a ``Tracer`` the innermost interpreter (see ``opforge.dispatch``) while the function runs, so every
``opforge.ops`` function and Tensor operator it calls — on Variables, on eager Tensors it closes over, or on no
input at all (random ops) — is appended as an ``OpDesc`` instead of run: its outputs' Specs come from the op's own
shape rule, its attrs are checked as eagerly. Eager Tensors the function reads become variables: persistable
parameters when they require grad, persistable state when writable, constants otherwise.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import sys
import types
import weakref

import numpy as np

from .. import ops as F
from ..core import dtypes as D
from ..core.devices import default_device, get_device
from ..core.errors import ArgumentError, GradientError, describe
from ..core.grad_mode import _mode as _grad_mode
from ..core.grad_mode import no_grad as _grad_off
from ..core.interpreters import EAGER, Interpreter, current_interpreter, interpreting
from ..core.opdef import OpDef
from ..core.spec import Dim, Elem, Spec, undim
from ..dispatch import check_same_dtype, coerce_inputs
from ..tensor import Tensor, TensorOps, _owner, put, wrap
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
        """The shape, with each dim that is known only at run time as a ``Dim``; as the tracer building the
        program shows it to the traced code (a sharding tracer shows whole values' shapes)."""
        interpreter = current_interpreter()
        if type(interpreter) is not Tracer and isinstance(interpreter, Tracer) and interpreter.program is self.program:
            return interpreter.shape_of(self)
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
        """Whether eagerly the value would require grad: computed, with gradients recorded, from a tensor that
        requires grad (``_differentiable``)."""
        return _differentiable(self.program, self.name)

    @property
    def grad(self):
        """None, as a computed (non-leaf) tensor's ``.grad`` is eagerly."""
        return None

    @property
    def interpreter(self) -> Tracer:
        """The interpreter that ``backward()`` and ``of.grad`` on this variable go to: the tracer building its
        program if one is running (a sharding tracer makes gradients the logical loss's), else its program's."""
        interpreter = current_interpreter()
        if isinstance(interpreter, Tracer) and interpreter.program is self.program:
            return interpreter
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
        out = F.identity(self)
        self.program.block.vars[out.name].stop_gradient = True
        return out

    @property
    def data(self) -> Variable:
        """``detach()``, as torch's ``.data`` (writes through it reach this value, as eagerly)."""
        return self.detach()

    @data.setter
    def data(self, value) -> None:
        raise ArgumentError(f"assigning .data of program variable '{self.name}': in traced code a tensor cannot be "
                            "made to share another's memory; write into it (x.copy_(value)) or compute a new one")

    def backward(self) -> None:
        """Append the backward pass for this (scalar) loss to its program: each parameter's gradient is added to
        the one it has (its ``.grad``, as the traced code sees it), as eager ``backward()`` does."""
        self.interpreter.backward(self)

    def numpy(self, *args, **kwargs):
        raise ArgumentError(f"program variable '{self.name}' has no value while tracing: the traced function "
                            "cannot read values (numpy(), item(), float(), np.asarray()) — return them from it "
                            "instead, or run the program with of.Executor")

    item = tolist = __float__ = __int__ = __index__ = __array__ = numpy

    def register_hook(self, hook):
        raise ArgumentError(f"register_hook() on program variable '{self.name}': hooks run Python code on values, "
                            "which a compiled program does not have; call it in eager code")

    retain_grad = register_hook

    def _assign_value(self, what: str, value: Variable) -> Variable:
        """An in-place op on a variable: it names the new value from now on (programs are written once per
        variable). Where it shares memory with views, as eagerly (see ``_View``), the write goes to that memory,
        and the views read after it see it."""
        return _write(trace_state(self.program), self, what, value)


# Bumped whenever Python state that traces read changes (a module's attribute or mode, an optimizer's
# hyper-parameter): a compiled function compares the ``_trace_state()`` of what it read only when this moved.
python_state = [0]


def python_state_changed() -> None:
    python_state[0] += 1


def contents(value):
    """What a guard compares, at every call, of a value a trace may have read whose contents can change without an
    assignment (which ``python_state`` would see): the items of a list, a dict or a set and the bytes of an array, all
    the way down, and the attributes of a configuration object (a dataclass, a namespace; the objects those hold, by
    identity). None for a
    value with no such contents: a number or a string (compared by value when assigned), a tensor (read at each run),
    a module or an optimizer (guarded itself), a function."""
    return _contents(value, set(), False) if _mutable(value) else None


def _mutable(value) -> bool:
    if isinstance(value, (list, dict, set, np.ndarray)) or _plain_object(value):
        return True
    return isinstance(value, (tuple, frozenset)) and any(_mutable(v) for v in value)


def _plain_object(value) -> bool:
    """A configuration object: a dataclass instance, a ``types.SimpleNamespace`` or an ``argparse.Namespace``,
    whose attributes are its data. Any other object is compared by identity: its attributes may be state that changes
    at every call without changing what a trace computes (a communicator's count of collectives, a logger's
    handlers), and comparing them would trace anew each time."""
    if isinstance(value, type):
        return False
    if dataclasses.is_dataclass(value) or type(value) is types.SimpleNamespace:
        return True
    argparse = sys.modules.get("argparse")
    return argparse is not None and type(value) is argparse.Namespace


def _contents(value, active: set, in_object: bool):
    kind = type(value)
    if kind is float:  # exactly: -0.0 is not 0.0, and nan is nan
        return (kind, value.hex())
    if value is None or kind in (bool, int, str, bytes, complex):
        return (kind, value)
    if isinstance(value, (np.ndarray, np.generic)):
        return (kind, value.shape, value.dtype.str, value.tobytes())
    if not isinstance(value, (list, tuple, dict, set, frozenset)) and (in_object or not _plain_object(value)):
        # a tensor, a module, a function...; and what an object's attributes hold (a logger's manager, which holds
        # every logger): by identity
        return ("object", id(value))
    if id(value) in active:  # a container that holds itself
        return ("cycle", id(value))
    active.add(id(value))
    if isinstance(value, dict):
        items = tuple((_contents(k, active, in_object), _contents(v, active, in_object)) for k, v in value.items())
    elif isinstance(value, (set, frozenset)):
        items = frozenset(_contents(v, active, in_object) for v in value)
    elif isinstance(value, (list, tuple)):
        items = tuple(_contents(v, active, in_object) for v in value)
    else:
        items = (id(value), _contents(vars(value), active, True))
    active.discard(id(value))
    return (kind, items)


class GradVariable(Variable):
    """``p.grad`` in traced code: changed in place (``p.grad.zero_()``), it changes ``p``'s gradient, as eagerly."""

    __slots__ = ("param",)

    def __init__(self, program: Program, name: str, param: Tensor):
        super().__init__(program, name)
        self.param = param

    def _assign_value(self, what: str, value: Variable) -> Variable:
        super()._assign_value(what, value)
        Tracer(self.program).set_grad(self.param, self)
        return self


class ArgumentVariable(Variable):
    """An argument of a compiled function while it is traced (``path`` names its feed). Changed in place
    (``a.add_(b)``, ``a += b``, ``a.copy_(b)``), it names the new value from then on, and ``of.compile`` writes that
    value into the argument's own memory after each run, as eagerly; where eagerly the argument would not take the
    value in its memory (it requires grad, or the value does), the trace fails, saying so."""

    __slots__ = ("argument", "path")

    def __init__(self, program: Program, path: str, argument):
        super().__init__(program, path)
        self.argument = argument  # the Tensor or array passed
        self.path = path

    def _requires_grad(self) -> bool:
        return isinstance(self.argument, Tensor) and self.argument._requires_grad

    @property
    def grad(self):
        """The argument's gradient as the traced code sees it at this point (what its ``.grad`` is when the run
        begins, plus what ``backward()`` calls in the code added), as eagerly; None if it does not require grad."""
        if not self._requires_grad():
            return self.argument._grad if isinstance(self.argument, Tensor) else None
        name = self.interpreter._grad(self.path)
        return None if name is None else Variable(self.program, name)

    def _assign_value(self, what: str, value: Variable) -> Variable:
        if _grad_mode.enabled and self._requires_grad():
            raise GradientError(
                f"{what} on argument '{self.path}': a leaf tensor that requires grad (shape {self.argument.shape}) "
                "cannot be changed in place while gradients are recorded; update it inside `with of.no_grad():`, "
                "or compute a new tensor")
        data = self.argument._data if isinstance(self.argument, Tensor) else self.argument
        if not getattr(data.flags, "writeable", True):
            raise ArgumentError(f"{what} on argument '{self.path}': its memory (shape {data.shape}) is read-only "
                                "(a broadcast view or a constant); compute a new tensor instead")
        if _grad_mode.enabled and _differentiable(self.program, value.name):
            raise GradientError(
                f"{what} on argument '{self.path}': the new value requires grad, so eagerly the argument would "
                "become a non-leaf tensor with a grad_fn, which a compiled function cannot hand back; update it "
                "inside `with of.no_grad():`, or return the new value instead")
        return super()._assign_value(what, value)

    @property
    def updated(self) -> bool:
        """Whether the traced code changed the argument in place."""
        return self.name != self.path


def _refuse_no_grad_writes(program: Program, loss: str) -> None:
    """Refuse a backward from ``loss`` that reaches, through ops recorded with gradients, a value written in place
    under no_grad into a value with history (``_write``): eagerly the gradient flows through that history."""
    written = trace_state(program).no_grad_writes
    if not written:
        return
    block = program.block
    producer = {n: op for op in block.ops for n in op.output_names()}
    todo, seen = [loss], set()
    while todo:
        n = todo.pop()
        op = producer.get(n)
        if n in seen or op is None or block.vars[n].stop_gradient:
            continue
        seen.add(n)
        for i in op.input_names():
            if i in written:
                raise GradientError(
                    f"backward through op '{op.type}': it reads a value that was changed in place under no_grad "
                    "although it has history (it was computed from tensors that require grad); eagerly the "
                    "gradient flows through that history with the new elements, which a compiled function cannot "
                    "follow: change a clone() of it, or run the function eagerly")
            todo.append(i)


def _differentiable(program: Program, name: str) -> bool:
    """Whether variable ``name`` would require grad eagerly: it was computed, through ops recorded with gradients,
    from a tensor that requires grad (a parameter, an argument)."""
    block, tensor_of = program.block, trace_state(program).tensor_of
    if block.vars[name].stop_gradient:  # (made under no_grad, as most values an in-place op changes there)
        return False
    producer = {n: op for op in block.ops for n in op.output_names()}
    todo, seen = [name], set()
    while todo:
        n = todo.pop()
        if n in seen or block.vars[n].stop_gradient:
            continue
        if n in tensor_of:
            return True
        seen.add(n)
        op = producer.get(n)
        if op is not None:
            todo += op.input_names()
    return False


class TraceState:
    """What a trace learns besides its ops, kept per program while it is built: names for the tensors it reads,
    the Python state its ops depend on (which a compiled function guards on), and the gradient each tensor's
    ``.grad`` holds as the traced code sees it."""

    def __init__(self):
        self.names: dict = {}  # id(tensor) -> (tensor, dotted path) from the modules the traced code called
        self.guards: dict = {}  # id(owner) -> owner whose _trace_state() the ops depend on: modules, optimizers
        self.tensor_of: dict = {}  # variable name -> the tensor it stands for (whose .grad it has)
        self.grads: dict = {}  # variable -> its gradient's variable, or None after zero_grad: .grad as code sees it
        self.grads_in = False  # of.compile: runs start from the .grad each tensor has then (else from none)
        self.grad_feeds: dict = {}  # variable -> the feed that brings its tensor's .grad into a run
        self.grad_none: dict = {}  # variable -> tensor read while its .grad was None (a compiled run needs that)
        self.memories: dict = {}  # id(variable or tensor) -> the _Memory it owns, once a view of it was made
        self.views: dict = {}  # id(variable) -> its _View: how it shares other memory, as eagerly
        self.no_grad_writes: set = set()  # values written under no_grad into values with history (see _write)
        self.arrays: dict = {}  # feed -> the array a compiled call passed (its layout decides what a reshape is)
        self.updated_memory: dict = {}  # id(memory owner) -> (captured tensor, its variable) changed in place
        self.cutting = False  # a view is being cut again from its memory's new content (current_name)


_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Program -> its TraceState


def trace_state(program: Program) -> TraceState:
    state = _states.get(program)
    if state is None:
        state = _states[program] = TraceState()
    return state


class Tracer(Interpreter):
    """The interpretation of op calls as program building: each call is appended to ``program`` as an OpDesc, with
    its outputs' Specs inferred by the op's own shape rule and its attrs checked as eagerly. Eager Tensors a call
    reads (parameters, buffers, optimizer state) become variables of the program (``var_for_tensor``); ``role``
    marks the ops ``append_backward`` emits."""

    symbolic = True

    def __init__(self, program: Program, role: str = "forward"):
        self.program = program
        self.role = role
        self.state = trace_state(program)

    def apply(self, op: OpDef, inputs: tuple, attrs: dict):
        if op.validate is not None:
            op.validate(attrs)  # (an attr holding a run-time size is checked by the executor, with the real size)
        if op.out_device is not None and op.out_device(attrs) is not self.program.device:
            raise ArgumentError(f"{op.name}(): a program runs on one device ('{self.program.device}'); move data "
                                "to other devices outside the traced function")
        return _append(self.program, self.role, op, inputs, attrs)

    def shape_of(self, variable: Variable) -> tuple:
        """The shape of ``variable`` as traced code sees it (its Spec's; a subclass may show another view)."""
        return tuple(Dim(variable.name, i) if d is None else d for i, d in enumerate(variable.spec.shape))

    def size_tensor(self, size):
        """A size known only at run time (a Dim: the size of a dim of a variable; an Elem: an element of a shape the
        program computes) as a 1-element int64 variable, computed from shapes; an int as itself."""
        if isinstance(size, Elem):
            flat = F.reshape(Variable(self.program, size.var), shape=[-1])
            t = F.slice(flat, axes=[0], starts=[size.axis], ends=[size.axis + 1], steps=[1])
            return -t if size.sign < 0 else t
        if isinstance(size, Dim):
            shape = F.shape_as_tensor(Variable(self.program, size.var))
            return F.slice(shape, axes=[0], starts=[size.axis], ends=[size.axis + 1], steps=[1])
        return int(size)

    def size_scalar(self, size, dtype):
        """A size known only at run time where an op takes a tensor (``x.sum(1) / x.shape[1]``): a 0-d variable of
        ``dtype``, the dtype a Python int takes there, computed from shapes."""
        t = F.reshape(self.size_tensor(size), shape=[])
        return t if t.dtype == dtype else F.cast(t, dtype=dtype)

    def size_arithmetic(self, op: str, a, b) -> Elem:
        """``a <op> b`` (add, sub, mul, floordiv, mod as Python's ints do them) where a size is known only at run
        time (``x.shape[1] // 2``): computed in the program from shapes, a size ops' attrs take (an Elem)."""
        x, y = self.size_tensor(a), self.size_tensor(b)
        result = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
                  "mod": operator.mod}[op](x, y)
        return Elem(result.name, 0)

    def enter_module(self, module) -> None:
        """Name the module's parameters and buffers by their paths in it (``fc1.weight``) and guard the program on
        the Python state of it and its submodules (modes, attributes), unless an enclosing module did already."""
        state = self.state
        if id(module) in state.guards:
            return
        for path, sub in module.named_modules():
            state.guards[id(sub)] = sub
            for name, t in [*sub._parameters.items(), *sub._buffers.items()]:
                if t is not None and id(t) not in state.names:
                    state.names[id(t)] = (t, f"{path}.{name}" if path else name)

    def guard(self, owner) -> None:
        """Guard on ``owner`` (an optimizer); the state tensors it lists are named after their parameters
        (``fc1.weight.exp_avg``)."""
        state = self.state
        if id(owner) in state.guards:
            return
        state.guards[id(owner)] = owner
        known = self.program._tensor_vars
        for tensor, param, suffix in owner._trace_names():
            base = known.get(id(param), (None, "param"))[1] if param is not None else None
            state.names.setdefault(id(tensor), (tensor, f"{base}.{suffix}" if base else suffix))

    def live(self, tensor: Tensor) -> Variable:
        name = var_for_tensor(self.program, tensor, state=True)
        return Variable(self.program, self.program.updates.get(name, name))  # as updated so far by this trace

    def assign(self, target: Tensor, value) -> None:
        program = self.program
        if not getattr(target._data.flags, "writeable", True):  # as eagerly, before the program would write it
            raise ArgumentError(f"assign(): the memory of this tensor (shape {target.shape}) is read-only (a "
                                "broadcast view or a constant); compute a new tensor instead")
        name = var_for_tensor(program, target, state=not target.requires_grad)
        if not isinstance(value, Variable):
            raise ArgumentError(f"assign(): while tracing, the value must be a program variable, got {describe(value)}")
        if value.spec.shape != program.block.vars[name].spec.shape:
            raise ArgumentError(f"assign(): value {value.spec} does not fit {program.block.vars[name]}")
        program.updates[name] = value.name
        self.state.updated_memory[id(_owner(target._data))] = (target, name)

    def grad_of(self, param: Tensor):
        name = self._grad(var_for_tensor(self.program, param))
        return None if name is None else GradVariable(self.program, name, param)

    def set_grad(self, param: Tensor, grad) -> None:
        name = var_for_tensor(self.program, param)
        self.state.grads[name] = None if grad is None else grad.name
        if grad is None:  # forgotten (zero_grad): a compiled step need not return it
            self.program.grad_names.pop(name, None)
        else:
            self.program.grad_names[name] = grad.name

    def _grad(self, name: str) -> str | None:
        """The variable holding the gradient of ``name`` as the traced code sees it now: what this trace made, else
        (under of.compile) the tensor's ``.grad`` when the run begins, brought in by a feed."""
        state = self.state
        if name in state.grads:
            return state.grads[name]
        grad = None
        tensor = state.tensor_of.get(name)
        if state.grads_in and tensor is not None:
            if tensor._grad is None:
                state.grad_none[name] = tensor
            else:
                grad = _unique(self.program, f"{name}.grad")
                self.program.add_var(grad, Spec(tensor.shape, tensor.dtype))
                self.program.feeds.append(grad)
                state.grad_feeds[name] = grad
        state.grads[name] = grad
        return grad

    def gradients(self, loss, wrt: list) -> dict:
        """{variable of ``wrt``: the variable of its gradient} for ``loss.backward()``: the backward ops appended."""
        from .backward import gradients

        return gradients(self.program, loss, wrt=wrt)

    def backward(self, loss) -> None:
        """``loss.backward()`` in traced code: the gradient of every parameter (and differentiable input) it
        reaches is added to the gradient that parameter has, which becomes its new one."""
        program, state = self.program, self.state
        _refuse_no_grad_writes(program, current_name(loss))
        wrt = [v.name for v in program.block.vars.values() if not v.stop_gradient and D.is_floating(v.spec.dtype)
               and (v.persistable or v.name in state.tensor_of)]
        for name, g in self.gradients(loss, wrt).items():
            old = self._grad(name)
            if old is not None:
                with interpreting(Tracer(program, role="backward")):
                    g = F.add(Variable(program, old), Variable(program, g)).name
            program.block.vars[g].stop_gradient = True  # as eagerly: backward() leaves gradients without history
            state.grads[name] = program.grad_names[name] = g

    def differentiate(self, outputs, inputs, grad_outputs, allow_unused: bool):
        """``of.grad`` inside a traced function: the backward ops are appended; no ``.grad`` changes."""
        from .backward import gradients

        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        if len(outputs) != 1 or grad_outputs is not None:
            raise GradientError("grad() inside a traced function takes one scalar output and no grad_outputs")
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        _refuse_no_grad_writes(self.program, current_name(outputs[0]))
        names = [var_for_tensor(self.program, t) if isinstance(t, Tensor) else t.name for t in inputs]
        grads = gradients(self.program, outputs[0], wrt=names)
        result = []
        for t, n in zip(inputs, names):
            if n not in grads and not allow_unused:
                raise GradientError(f"grad(): {describe(t)} was not used to compute the output; "
                                    "pass allow_unused=True")
            result.append(None if n not in grads else Variable(self.program, grads[n]))
        return tuple(result)


def _unique(program: Program, name: str) -> str:
    """``name``, or ``name.2``, ``name.3``... if the program has that variable already."""
    if name not in program.block.vars:
        return name
    i = 2
    while f"{name}.{i}" in program.block.vars:
        i += 1
    return f"{name}.{i}"


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
    trace = trace_state(program)
    if tensor.device is not program.device:
        raise ArgumentError(f"a program for device '{program.device}' cannot read a tensor on device "
                            f"'{tensor.device}' (shape {tensor.shape}); move it to '{program.device}' first")
    # A writable array the function closed over (a buffer, a frozen weight) may change between runs: it is
    # state, read at each run; so is a read-only view of other memory (F.broadcast_to(base)), which changes with
    # its base. Only read-only arrays that own their memory (Python numbers lifted while tracing) are constants,
    # which the executor may fold.
    data = tensor._data
    state = state or (not tensor.requires_grad and (getattr(data.flags, "writeable", True) or data.base is not None))
    persistable = tensor.requires_grad or state
    path = trace.names.get(id(tensor))
    if path is not None and path[0] is tensor:  # a module's parameter or buffer: named by its path (fc1.weight)
        name = _unique(program, path[1])
    else:
        name = program.fresh_name("param" if tensor.requires_grad else "state" if state else "const")
    program.add_var(name, Spec(tensor.shape, tensor.dtype), persistable=persistable,
                    stop_gradient=not tensor.requires_grad)
    program.values[name] = tensor._data  # no copy: the executor updates persistable arrays in place
    known[id(tensor)] = (tensor, name)  # keeps the tensor alive, so its id stays its own
    if tensor.requires_grad:
        trace.tensor_of[name] = tensor
    return name


def live(tensor: Tensor):
    """``tensor`` as ops should read it: itself eagerly; while tracing, its persistable program variable, so that
    each run reads its current value (a plain constant could be folded into the program once)."""
    return current_interpreter().live(tensor)


def assign(target: Tensor, value) -> None:
    """Make ``value`` the new content of ``target`` after each run: in place in eager mode, recorded as an
    update of the persistable variable while tracing (the executor writes it into the same buffer)."""
    current_interpreter().assign(target, value)


def _input_name(program: Program, opdef: OpDef, arg: str, value) -> str:
    """The variable an op of ``program`` reads for a tensor input ``value`` (a Variable, or an eager Tensor the
    traced code reads)."""
    if isinstance(value, Variable):
        if value.program is not program:
            raise ArgumentError(f"{opdef.name}(): argument '{arg}' is a variable of another program")
        current_name(value)
        if type(value) is ArgumentVariable and value.updated and value._requires_grad() and _grad_mode.enabled:
            raise ArgumentError(
                f"{opdef.name}(): argument '{arg}' is argument '{value.path}' of the compiled function, which "
                "requires grad and was updated earlier in it; a compiled function cannot yet differentiate through "
                "an argument's value after its update: read it under of.no_grad(), or update it at the end")
        return value.name
    name = var_for_tensor(program, value)
    updated = program.updates.get(name)
    if updated is None:
        written = trace_state(program).updated_memory
        other = written.get(id(_owner(value._data))) if written else None
        if other is not None and other[0] is not value:
            raise ArgumentError(
                f"{opdef.name}(): argument '{arg}' is a tensor the traced function reads (shape {value.shape}) that "
                f"shares memory with '{other[1]}', which it changed in place earlier (a view of it, or it of this "
                "one); eagerly the read sees the change, a compiled function reads each captured tensor as its own "
                "value: read it before the change, pass it as an argument, or make the view inside the function")
        return name
    if value.requires_grad and _grad_mode.enabled:
        raise ArgumentError(
            f"{opdef.name}(): argument '{arg}' is parameter '{name}', updated earlier in this traced function; "
            "a compiled function cannot yet differentiate through a parameter's value after its update: "
            "read it under of.no_grad(), or update it at the end (after the last forward pass)")
    return updated  # reads after an in-place update see the new value, as eagerly


def constant_name(program: Program, array: np.ndarray) -> str:
    """The variable of a literal of the traced code (a Python number or array, lifted as eagerly): a read-only
    constant, which the executor may fold."""
    array.flags.writeable = False
    device = program.device
    return var_for_tensor(program, wrap(device.from_host(array), device))


def _append(program: Program, role: str, opdef: OpDef, inputs: tuple, attrs: dict):
    """Append ``opdef`` applied to ``inputs`` to ``program``; return output Variables shaped like eager results
    (those of a view op noted as views of its input's memory)."""
    block = program.block
    slots = coerce_inputs(opdef, inputs, lambda arg, v: _input_name(program, opdef, arg, v),
                          lambda arg, array: constant_name(program, array))
    names, specs = {}, []
    for p, slot in zip(opdef.inputs, slots):
        if slot is None:
            slot = []
            specs.append(None)
        elif p.is_list:
            specs.append([block.vars[n].spec for n in slot])
        else:
            slot = [slot]
            specs.append(block.vars[slot[0]].spec)
        names[p.name] = slot
    if "same_dtype" in opdef.traits:
        check_same_dtype(opdef, specs)
    out_specs = opdef.infer_specs(specs, {k: undim(v) for k, v in attrs.items()})
    outputs, flat = {}, []
    stop_gradient = "no_grad" in opdef.traits or not _grad_mode.enabled  # under of.no_grad(), as eagerly
    for o, spec in zip(opdef.outputs, out_specs):
        group = list(spec) if o.is_list else [spec]
        outputs[o.name] = []
        for s in group:
            name = program.fresh_name(opdef.name)
            program.add_var(name, s, stop_gradient=stop_gradient)
            outputs[o.name].append(name)
            flat.append(Variable(program, name))
    block.ops.append(OpDesc(opdef.name, names, outputs, dict(attrs), role))
    result, i = [], 0
    for o in opdef.outputs:
        n = len(outputs[o.name])
        result.append(flat[i:i + n] if o.is_list else flat[i])
        i += n
    if "view" in opdef.traits and inputs and isinstance(inputs[0], (Variable, Tensor)):
        _note_views(program, opdef, inputs[0], attrs, result[0])
    return result[0] if len(result) == 1 else opdef.result_type(*result)


# -- memory shared by views, as eagerly ------------------------------------------------------------------------
#
# Eagerly the result of a view op (a slice, a transpose, a reshape NumPy makes without copying; ops with the trait
# "view") shares its input's memory: a write to either shows in the other (``v = x[0]; v.mul_(2)`` changes ``x``;
# ``v = x.T; x.add_(1)`` changes ``v``). A program's variables are values, each written once, so the tracer keeps
# per shared memory the variable that holds its content now (``_Memory``), and per view the view ops that cut it
# from that memory (``_View``): a write through a view puts the new elements at their positions in the memory's
# content (``tensor.put``), which becomes the content of the memory's owner (an argument, a captured tensor, a
# computed value); a view read after its memory changed is cut again from the new content. A value computed in the
# traced function is taken to be laid out in C order, as a fresh NumPy result is; an argument or a captured tensor
# is laid out as its array is, which decides whether a reshape of it is a view.


class _Memory:
    """Memory that views share: its ``owner`` (the Variable or captured Tensor whose memory it is; None once the
    owner took other memory, given a new value with history by a recorded in-place op) and ``value``, the name of
    the variable that holds its content now (for a captured tensor, the program's update of it)."""

    __slots__ = ("_layout", "owner", "program", "value")

    def __init__(self, owner, value: str, program: Program):
        self.owner, self.value, self.program, self._layout = owner, value, program, None

    def c_ordered(self) -> bool:
        """Whether the owner's memory is known to be laid out in C order: an argument's or a captured tensor's array
        says; a value computed in the traced function is, as a fresh NumPy result, unless it was computed from
        transposed memory (NumPy's results follow their inputs' order), which the trace cannot tell for sure."""
        if isinstance(self.owner, (Tensor, ArgumentVariable)):
            return True  # its layout is its array's
        program = self.program
        block, arrays = program.block, trace_state(program).arrays
        arrays = {**arrays, **{name: t._data for t, name in program._tensor_vars.values()}}
        producer = {n: op for op in block.ops for n in op.output_names()}
        todo, seen = [self.value], set()
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in arrays and not arrays[n].flags.c_contiguous:
                return False
            op = producer.get(n)
            if op is not None:
                if op.type in ("transpose", "permute"):
                    return False
                todo += op.input_names()
        return True

    def content(self, program: Program) -> str:
        if isinstance(self.owner, Tensor):
            name = var_for_tensor(program, self.owner)
            return program.updates.get(name, name)
        return self.value

    def layout(self) -> np.ndarray:
        """An int64 host array of the owner's shape holding each element's C-order position, laid out in memory as
        the owner's array is: the view ops applied to it give the positions a view reads, and whether it is one."""
        if self._layout is None:
            owner = self.owner
            array = owner._data if isinstance(owner, Tensor) else getattr(owner, "argument", None)
            array = array._data if isinstance(array, Tensor) else array
            shape = tuple(owner.shape)
            if None in shape or _runtime_size(shape):
                raise ArgumentError(f"a view of a value of shape {shape}, known only at run time, shares memory with "
                                    "a value changed in place; traced code follows such a write only where shapes "
                                    "are known when it is traced")
            positions = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
            if array is not None and not array.flags.c_contiguous and all(s % array.itemsize == 0
                                                                          for s in array.strides):
                steps = [s // array.itemsize for s in array.strides]
                low = sum((n - 1) * s for n, s in zip(shape, steps) if s < 0)
                high = sum((n - 1) * s for n, s in zip(shape, steps) if s > 0)
                laid = np.ndarray(shape, np.int64, np.empty(max(high - low + 1, 1), np.int64), offset=-low * 8,
                                  strides=[s * 8 for s in steps])
                laid[...] = positions
                positions = laid
            if array is not None and not getattr(array.flags, "writeable", True):
                positions.flags.writeable = False
            self._layout = positions
        return self._layout


class _View:
    """A variable of traced code that is a view of a ``_Memory``: the view ops (op, attrs, output index) that cut it
    from the memory's content, the content its name was cut from (``seen``), and the grad mode it was made in."""

    __slots__ = ("_cut", "chain", "grad", "memory", "seen", "variable")

    def __init__(self, variable: Variable, memory: _Memory, chain: list, seen: str, grad: bool):
        self.variable, self.memory, self.chain, self.seen, self.grad = variable, memory, chain, seen, grad
        self._cut = None

    def cut(self):
        """(the C-order positions in the memory of the view's elements, whether it is a view at all: a reshape
        NumPy cannot make without copying is not, whether its memory is writable), the view ops run on the
        memory's layout."""
        if self._cut is None:
            layout = self.memory.layout()
            with interpreting(EAGER), _grad_off():
                t = wrap(layout)
                for op, attrs, index in self.chain:
                    if _runtime_size(attrs):
                        raise ArgumentError(f"{op.name}(): a view whose shape is known only at run time shares "
                                            "memory with a value changed in place; traced code follows such a "
                                            "write only where shapes are known when it is traced")
                    t = EAGER.apply(op, (t,), attrs)
                    t = t if index is None else t[index]
            array = t._data
            shares = np.may_share_memory(array, layout)
            if "reshape" in [op.name for op, _, _ in self.chain] and not self.memory.c_ordered():
                with interpreting(EAGER), _grad_off():  # the same ops on memory laid out in Fortran order
                    other = wrap(np.asfortranarray(layout))
                    t = other
                    for op, attrs, index in self.chain:
                        t = EAGER.apply(op, (t,), attrs)
                        t = t if index is None else t[index]
                if np.may_share_memory(t._data, other._data) != shares:
                    raise ArgumentError(
                        "reshape(): a reshape of a value computed from transposed memory is changed in place, or "
                        "read after its memory changed; eagerly it is a view or a copy as NumPy laid that value "
                        "out, which a compiled function does not know: clone() the value first, or run eagerly")
            self._cut = (array, shares, bool(array.flags.writeable))
        return self._cut


def _runtime_size(value) -> bool:
    """Whether attrs or a shape hold a size known only at run time (a ``Dim``)."""
    if isinstance(value, dict):
        return any(map(_runtime_size, value.values()))
    if isinstance(value, (list, tuple)):
        return any(map(_runtime_size, value))
    return isinstance(value, Dim)


def _known_sizes(view: _View) -> bool:
    """Whether the sizes a view's ops work on are known while tracing (not so in ``of.trace`` with a ``None`` dim):
    else whether it copied is left open, and only a write through it, or a read after a write, is refused."""
    shape = tuple(view.memory.owner.shape)
    return None not in shape and not _runtime_size(shape) and not any(_runtime_size(a) for _, a, _ in view.chain)


def _may_copy(view: _View) -> bool:
    """Whether ``view``'s ops may have copied (a reshape of memory that is not C-ordered): then whether it is a view
    is worked out when it is made, since later views share its memory if it copied."""
    ops = [op.name for op, _, _ in view.chain]
    if "reshape" not in ops:
        return False
    owner = view.memory.owner
    array = owner._data if isinstance(owner, Tensor) else getattr(owner, "argument", None)
    array = array._data if isinstance(array, Tensor) else array
    other = next(i for i, name in enumerate(ops) if name != "reshape") if set(ops) != {"reshape"} else len(ops)
    return "reshape" in ops[other:] or (array is not None and not array.flags.c_contiguous)


def _note_views(program: Program, opdef: OpDef, source, attrs: dict, result) -> None:
    """Note the outputs of view op ``opdef`` on ``source`` as views of ``source``'s memory (not while a view is cut
    again: those ops' outputs are the view's new values, not views of their own)."""
    state = trace_state(program)
    if state.cutting:
        return
    view = state.views.get(id(source))
    if view is not None and view.variable is source and _may_copy(view) and _known_sizes(view):
        view = _view_of(state, source)
    if view is not None and view.variable is source:
        memory, chain = view.memory, view.chain
    else:
        memory = state.memories.get(id(source))
        if memory is None or memory.owner is not source:
            value = source.name if isinstance(source, Variable) else None
            memory = state.memories[id(source)] = _Memory(source, value, program)
        chain = []
    seen = memory.content(program)
    outputs = list(enumerate(result)) if isinstance(result, list) else [(None, result)]
    for index, out in outputs:
        state.views[id(out)] = _View(out, memory, [*chain, (opdef, dict(attrs), index)], seen, _grad_mode.enabled)


def _view_of(state: TraceState, variable: Variable) -> _View | None:
    """The view ``variable`` is of other memory, or None (its own memory; or a reshape that copies)."""
    view = state.views.get(id(variable))
    if view is None or view.variable is not variable:
        return None
    if not view.cut()[1]:  # a copy: its own memory from the start
        del state.views[id(variable)]
        return None
    return view


def current_name(variable: Variable) -> str:
    """The name of ``variable``'s value now: a view read after a write to its memory is cut again from the new
    content, in the grad mode it was made in, as eagerly it reads the memory."""
    state = trace_state(variable.program)
    if not state.views:
        return variable.name
    view = state.views.get(id(variable))
    if view is None or view.variable is not variable:
        return variable.name
    program = variable.program
    content = view.memory.content(program)
    if content == view.seen or _view_of(state, variable) is None:
        return variable.name
    owner = view.memory.owner
    if isinstance(owner, Tensor) and owner.requires_grad and view.grad and _grad_mode.enabled:
        raise ArgumentError(
            f"a view of parameter '{var_for_tensor(program, owner)}' is read after the parameter was updated in this "
            "traced function; a compiled function cannot yet differentiate through a parameter's value after its "
            "update: read it under of.no_grad(), or update it at the end")
    stop_gradient = program.block.vars[variable.name].stop_gradient
    x = Variable(program, content)
    interpreter = current_interpreter()  # (a sharding tracer gives the new ops' outputs their layouts)
    apply = interpreter.apply if isinstance(interpreter, Tracer) and interpreter.program is program else \
        Tracer(program).apply
    enabled, state.cutting = _grad_mode.enabled, True
    _grad_mode.enabled = view.grad
    try:
        for op, attrs, index in view.chain:
            x = apply(op, (x,), attrs)
            x = x if index is None else x[index]
    finally:
        _grad_mode.enabled, state.cutting = enabled, False
    program.block.vars[x.name].stop_gradient = stop_gradient or program.block.vars[x.name].stop_gradient
    variable.name, view.seen = x.name, content
    return variable.name


def argument_view(variable: Variable):
    """(the ArgumentVariable, the view ops) if ``variable`` is a view of an argument's memory that does not require
    grad, made from it and not changed since but through that memory; else None."""
    state = trace_state(variable.program)
    view = state.views.get(id(variable)) if state.views else None
    owner = view.memory.owner if view is not None and view.variable is variable else None
    if type(owner) is not ArgumentVariable or owner._requires_grad() or _view_of(state, variable) is None:
        return None
    current_name(variable)
    return owner, view.chain


def _write(state: TraceState, variable: Variable, what: str, value: Variable) -> Variable:
    """``variable`` given ``value`` in place, where it may share memory with views (``Variable._assign_value``).

    As eagerly (and as in torch): the value is the memory's new content, written through the view if it is one, so
    every view of that memory reads it, a value recorded for autograd (grad mode on, the value differentiable)
    with its history (``tensor.note_view``)."""
    program = variable.program
    view = _view_of(state, variable) if state.views else None
    memory = state.memories.get(id(variable)) if state.memories else None
    memory = memory if memory is not None and memory.owner is variable else None
    owner = variable if view is None else view.memory.owner
    if not _grad_mode.enabled and (owner is None or type(owner) is Variable):
        # eagerly a value with history keeps it: a later backward differentiates through that history, with the new
        # elements; the program's new value has no history. Noted, so that a backward reaching it is refused
        old = variable.name if view is None else view.memory.content(program)
        if _differentiable(program, old):
            state.no_grad_writes.add(value.name)
    if view is None and memory is None:
        pass
    elif view is not None:
        positions, _, writable = view.cut()
        if not writable:
            raise ArgumentError(f"{what}: the memory of this tensor (shape {tuple(variable.shape)}) is read-only (a "
                                "broadcast view or a constant); compute a new tensor instead")
        memory = view.memory
        if isinstance(owner, Tensor) and owner.requires_grad and _grad_mode.enabled and \
                _differentiable(program, value.name):
            raise GradientError(
                f"{what}: a view of a leaf tensor that requires grad (shape {tuple(owner.shape)}) cannot be changed in "
                "place while gradients are recorded (torch refuses it too); clone() the leaf first, or write inside "
                "`with of.no_grad():`")
        whole = put(Variable(program, memory.content(program)), positions, value)
        if value.name in state.no_grad_writes:
            state.no_grad_writes.add(whole.name)
        if owner is None:
            memory.value = whole.name
        elif isinstance(owner, Tensor):
            Tracer(program).assign(owner, whole)
        else:
            owner._assign_value(what, whole)  # an argument checks it may change; a .grad becomes the new one
        view.seen = memory.content(program)
    elif memory is not None:
        memory.value = value.name
    variable.name = value.name
    return variable


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
    program = Program(default_device() if device is None else get_device(device, "trace()"),
                      name=getattr(fn, "__name__", type(fn).__name__))
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
        program.outputs[key] = current_name(value)
    return program
