"""``of.compile``: trace a function once per kind of call and run it with the Executor from then on — meaning what
the same code means eagerly, or tracing it again.

A call is bound to the function's signature as Python binds it (defaults, ``*args``, ``**kwargs``). Tensors and
arrays in the arguments (also inside tuples, lists and dicts) are the program's feeds; their shapes, dtypes, device
and ``requires_grad`` are part of the cache key, as are the values of Python numbers, strings and None (constants of
the trace) and the identity of modules and optimizers passed in.

A trace also depends on state outside its arguments, and each program is kept with guards on it, checked at every
call; a program whose guards fail is traced anew:

* the Python state of every module it called and every optimizer that stepped (``model.eval()``, ``dropout.p``, a
  replaced layer, ``momentum``): compared only after such state changed anywhere (``python_state``);
* what those modules' attributes hold that can change without an assignment (``m.layers.append(layer)``,
  ``m.cfg["scale"] = 3.0``, ``m.mask[0] = 5`` on an array, ``m.config.eps = 1e-6``): compared at every call;
* every tensor it read — parameters, buffers, optimizer state: the same array (a tensor whose array was replaced by
  one of the same shape and dtype, as ``load`` or ``to()`` may do, is simply read from its new array), the same
  ``requires_grad``;
* the ``.grad`` of every tensor whose gradient it read: None, or not.

The cache is bounded (``max_cache`` programs, 8 by default, as torch's recompile limit): a call that would trace
once more runs the function eagerly instead, with one warning.

``.grad`` behaves as eagerly: ``loss.backward()`` adds into the gradients tensors have when a run begins (fed into
the program), and what the code leaves in ``p.grad`` — new gradients, or None after ``zero_grad()`` — is written back
after the run. In-place updates (optimizer steps, ``p -= lr * g``) land in the tensors' own arrays; so does an
argument's (``a.add_(b)``, ``a += b``), written into its memory after the run. One tensor passed as two arguments is
one tensor (``f(a, a)`` is traced apart from ``f(a, b)``). An update the program cannot make as eager code does
fails, saying why: of a leaf that requires grad, with a value that requires grad, into memory other arguments or
captured tensors share. Views made inside the function share memory as eagerly (see ``trace._View``); a result that
is a view of an argument is returned as that view of it.

A result computed, with gradients recorded, from tensors that require grad requires grad, as eagerly; but a call
keeps no history, so a backward through such a result (after the call, outside it) is refused, naming the function
(``_CompiledCall``), where it would otherwise leave those tensors without the result's part of their gradient.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import numpy as np

from ..core.devices import default_device
from ..core.errors import ArgumentError, GradientError, OpforgeError, describe
from ..core.grad_mode import _mode as _grad_mode
from ..core.grad_mode import no_grad
from ..core.interpreters import EAGER, interpreting
from ..core.keys import exact
from ..core.spec import Spec
from ..tensor import Node, Tensor, _owner, note_write, note_writes, wrap, wrap_output, write_records
from .desc import Program
from .executor import Executor
from .trace import (
    ArgumentVariable,
    Tracer,
    Variable,
    _differentiable,
    argument_view,
    contents,
    current_name,
    python_state,
    trace_state,
)

_PLAIN = (bool, int, float, str, type(None))  # Python values a trace bakes in: constants of its cache key

# Extension points, kept apart from the rest: each wrapper (fn -> fn) may replace the function about to be traced by
# one that runs it differently (opforge.distributed runs it under its sharding interpreter inside `with mesh:`), and
# each context key (() -> hashable) names the context a call is traced in, which is part of the cache key (the
# mesh: a step compiled outside one must not keep its one-process program inside one).
traced_function_wrappers: list = []
trace_context_keys: list = []


class TraceAgain(OpforgeError):
    """Raised while ``of.compile`` traces, by code that finds the call must be traced in another context:
    ``context()`` gives a context manager, in which the call is traced again and its program runs from then on
    (opforge.distributed: a DistributedDataParallel model called outside a mesh is traced under its
    communicator's). Outside ``of.compile`` it is an error saying what to do."""

    def __init__(self, message: str, context):
        super().__init__(message)
        self.context = context


class CompiledFunction:
    """A function traced into a program per kind of call (see the module docstring) and run by an Executor."""

    # The most programs a compiled function keeps (torch's recompile limit is 8 too): each new shape, dtype, constant
    # or state of what the traces read is one more, and they must not pile up. A call that needs a program past it
    # runs the function eagerly, with one warning. of.compile(fn, max_cache=n) sets one function's limit.
    max_cache = 8

    def __init__(self, fn, optimize: bool = True, cache_key=None, max_cache: int | None = None):
        if not callable(fn):
            raise ArgumentError(f"compile(): expected a function or a module, got {describe(fn)}")
        module = hasattr(fn, "forward") and hasattr(fn, "_trace_state")
        if hasattr(fn, "__name__"):
            functools.update_wrapper(self, fn)
        else:  # a module or another callable object: named after its type (its own attributes are not copied)
            self.__name__ = self.__qualname__ = type(fn).__name__
            self.__doc__ = type(fn).__doc__
            self.__wrapped__ = fn
        self.fn = fn
        self.optimize = optimize
        self.cache_key = cache_key  # () -> hashable: more Python state the trace depends on
        self.signature = inspect.signature(fn.forward if module else fn)  # a module binds calls as its forward
        params = list(self.signature.parameters.values())
        self._names = [p.name for p in params]
        self._positional = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        self.cache: dict = {}  # call key -> [_Entry, ...], one per state of what the traces read (guards)
        if max_cache is not None:
            if type(max_cache) is not int or max_cache < 0:
                raise ArgumentError(f"compile(): max_cache must be an int >= 0 (programs kept), got "
                                    f"{describe(max_cache)}")
            self.max_cache = max_cache
        self._warned = False  # that calls past max_cache run eagerly

    def __getattr__(self, name: str):
        """A compiled module is used as the module itself is (``parameters()``, ``train()``, ``state_dict()``),
        as torch's compiled modules are."""
        wrapped = self.__dict__.get("__wrapped__")
        if wrapped is None or not hasattr(wrapped, "_trace_state"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(wrapped, name)

    def __call__(self, *args, **kwargs):
        arguments = self._bind(args, kwargs)
        key, feeds, tensors = self._read(arguments)
        entry = self._entry(key, arguments, tensors)
        if entry is None:
            return self._eagerly(args, kwargs)
        return entry.run(feeds, tensors)

    def program(self, *args, **kwargs) -> Program:
        """The program traced for arguments like these (traced now if needed, and kept if the cache has room;
        nothing runs)."""
        arguments = self._bind(args, kwargs)
        key, _, tensors = self._read(arguments)
        entry = self._entry(key, arguments, tensors)
        return (entry or self._trace(arguments, tensors)).program

    # -- calls ------------------------------------------------------------------------------------------------------

    def _bind(self, args: tuple, kwargs: dict) -> dict:
        """The arguments as Python binds them to the function's parameters: {parameter: value}."""
        if not kwargs and self._positional and len(args) == len(self._names):
            return dict(zip(self._names, args))
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.__name__}() (compiled): {e}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def _read(self, arguments: dict):
        """(the cache key, {feed name: array}, {feed name: Tensor}) of a call."""
        key, feeds, tensors = [], {}, {}
        for name, value in arguments.items():
            if type(value) is Tensor and value._node is None:  # the common case, kept short
                feeds[name] = value._data
                tensors[name] = value
                key.append((value._data.shape, value._data.dtype, value._device, value._requires_grad))
            else:
                key.append(_leaf_key(value, name, feeds, tensors, self.__name__))
        if len(tensors) > 1 and len({id(t) for t in tensors.values()}) < len(tensors):
            # one tensor passed twice (f(a, a)) is one variable: an update shows through both names
            passed = [id(t) for t in tensors.values()]
            key.append(("passed again", tuple(passed.index(p) for p in passed)))
        if not _grad_mode.enabled:  # traced under no_grad, its results do not require grad: not so for other calls
            key.append("no_grad")
        if self.cache_key is not None:
            key.append(self.cache_key())
        for context in trace_context_keys:
            key.append(context())
        return tuple(key), feeds, tensors

    def _entry(self, key: tuple, arguments: dict, tensors: dict) -> _Entry | None:
        """The program for this call: one kept, or one traced now; None if it needs a new one and the cache is
        full."""
        entries = self.cache.get(key)
        if entries:
            for entry in entries:
                verdict = entry.holds(tensors)
                if verdict:
                    return entry
                if verdict is None:  # what it captured changed for good (a replaced or re-typed tensor): drop it
                    entries.remove(entry)
                    break
        if sum(map(len, self.cache.values())) >= self.max_cache:
            return None
        entry = self._trace(arguments, tensors)
        self.cache.setdefault(key, []).append(entry)
        return entry

    def _eagerly(self, args: tuple, kwargs: dict):
        """A call past the cache's limit runs the function itself, eagerly: what a compiled call must mean anyway."""
        if any(wrapper(self.fn) is not self.fn for wrapper in traced_function_wrappers):
            raise OpforgeError(f"{self.__name__}() (compiled): this call needs a new program, and the cache holds "
                               f"{self.max_cache} (max_cache); under a distribution mesh the function cannot run "
                               "eagerly instead: raise max_cache")
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self.__name__}() (compiled): {self.max_cache} programs traced, the limit of its cache "
                          "(max_cache); calls that need another run eagerly from now on. Each new shape, dtype, "
                          "Python constant or state of what the traces read takes one: of.compile(fn, max_cache=n) "
                          "raises the limit", stacklevel=3)
        return self.fn(*args, **kwargs)

    # -- tracing ----------------------------------------------------------------------------------------------------

    def _trace(self, arguments: dict, tensors: dict, again_in=None) -> _Entry:
        devices = {t._device for t in tensors.values()}
        if len(devices) > 1:
            raise ArgumentError(f"{self.__name__}() (compiled): the tensor arguments are on several devices "
                                f"({sorted(map(str, devices))}); a program runs on one")
        program = Program(devices.pop() if devices else default_device(), name=self.__name__)
        state = trace_state(program)
        state.grads_in = True
        fed = {}  # feed -> its variable; a tensor passed twice is one variable (an array, two: as NumPy's are)
        of_tensor = {}  # id(tensor) -> its variable

        def feed(path: str, value):
            if isinstance(value, Tensor) and id(value) in of_tensor:
                return of_tensor[id(value)]
            data = value._data if isinstance(value, Tensor) else np.asarray(value)
            grad = isinstance(value, Tensor) and value._requires_grad
            program.add_var(path, Spec(data.shape, data.dtype), stop_gradient=not grad)
            program.feeds.append(path)
            state.arrays[path] = data
            if grad:
                state.tensor_of[path] = value
            fed[path] = ArgumentVariable(program, path, value)
            if isinstance(value, Tensor):
                of_tensor[id(value)] = fed[path]
            return fed[path]

        bound = inspect.BoundArguments(self.signature, {n: _rebuild(v, n, feed, (Tensor, np.ndarray))
                                                         for n, v in arguments.items()})
        fn = self.fn
        for wrapper in traced_function_wrappers:
            fn = wrapper(fn)
        try:
            with interpreting(Tracer(program)):
                result = fn(*bound.args, **bound.kwargs)
        except TraceAgain as again:
            if again_in is not None:  # traced in its context already: it cannot say more
                raise
            with again.context():
                entry = self._trace(arguments, tensors, again.context)
            return entry
        return _Entry(self.__name__, program, result, self.optimize, [v for v in fed.values() if v.updated],
                      again_in)


class _Entry:
    """One traced program, its executor, and what must hold for it to mean what the function means now."""

    def __init__(self, name: str, program: Program, result, optimize: bool, updated_arguments: list, context=None):
        self.name = name  # the compiled function's
        self.program = program
        self.context = context  # () -> the context manager it was traced in, and runs in (see TraceAgain)
        state = trace_state(program)
        fetch = {}
        self.result = _rebuild(result, "out", lambda path, v: _result(program, path, v, fetch), Variable)
        # arguments changed in place: their new values are fetched and written into their memory after a run
        self.argument_updates = [(v.path, f"{v.path}@updated") for v in updated_arguments]
        fetch.update({key: v.name for v, (_, key) in zip(updated_arguments, self.argument_updates)})
        self.guards = [(owner, owner._trace_state()) for owner in state.guards.values()]
        self.seen = python_state[0]  # the guards held at this count
        # attributes whose contents change unseen by python_state (a list appended to): compared at every call
        self.contents = [(owner, name, traced) for owner in state.guards.values() if hasattr(owner, "_trace_contents")
                         for name, traced in owner._trace_contents().items()]
        self.tensors = [(t, name, t._data, t._requires_grad) for t, name in program._tensor_vars.values()
                        if program.block.vars[name].persistable]
        # .grad in and out: a parameter's is read from its tensor, an argument's from this call's argument
        source = {name: (name if name in program.feeds else t) for name, t in state.tensor_of.items()}
        self.grad_feeds = [(source[n], feed) for n, feed in state.grad_feeds.items()]
        self.grad_sources = list(source.values())  # the tensors requiring grad it reads (arguments by name)
        self.call = _CompiledCall(name)
        self.grad_none = [source[n] for n in state.grad_none]
        self.grad_out = []  # (source, fetch key or None): what the code left in .grad, written back after a run
        for name, grad in state.grads.items():
            if grad != state.grad_feeds.get(name):
                key = None if grad is None else f"{name}@GRAD"
                if key is not None:
                    fetch[key] = grad
                self.grad_out.append((source[name], key))
        self.updated = [t for t, name in program._tensor_vars.values() if name in program.updates]
        self.writes = write_records([t._data for t in self.updated])  # a run's updates are in-place writes
        self.captured = {id(_owner(t._data)) for t, _ in program._tensor_vars.values()}  # their memory
        self.exe = Executor(program, fetch=fetch, optimize=optimize)

    def holds(self, arguments: dict):
        """True if this program means what the function means now; False if not; None if it never will again."""
        if self.guards and self.seen != python_state[0]:
            for owner, traced in self.guards:
                if owner._trace_state() != traced:
                    return False
            self.seen = python_state[0]
        for owner, name, traced in self.contents:
            if contents(owner.__dict__.get(name)) != traced:
                return False
        device = self.program.device
        for i, (t, name, array, requires_grad) in enumerate(self.tensors):
            if t._data is not array or t._requires_grad is not requires_grad:
                data = t._data
                if (t._requires_grad is not requires_grad or data.shape != array.shape or data.dtype != array.dtype
                        or t._device is not device):
                    return None
                self.exe.scope[name] = self.program.values[name] = data  # the same tensor, a new array: read it
                self.tensors[i] = (t, name, data, requires_grad)
                self.writes = write_records([t._data for t in self.updated])
                self.captured = {id(_owner(t._data)) for t, _ in self.program._tensor_vars.values()}
        if not (self.grad_none or self.grad_feeds):
            return True
        return (all(_tensor(source, arguments)._grad is None for source in self.grad_none)
                and all(_tensor(source, arguments)._grad is not None for source, _ in self.grad_feeds))

    def run(self, feeds: dict, arguments: dict):
        if self.context is not None:
            with self.context():
                return self._run(feeds, arguments)
        return self._run(feeds, arguments)

    def _run(self, feeds: dict, arguments: dict):
        if self.argument_updates:
            self._check_updates(feeds, arguments)
        for source, feed in self.grad_feeds:
            feeds[feed] = _tensor(source, arguments)._grad._data
        out = self.exe.run_arrays(feeds)
        device = self.program.device
        for path, key in self.argument_updates:  # (after the run: the program read the arguments as passed)
            device.copy_into(feeds[path], out[key])
            if path in arguments:
                note_write(feeds[path], "a compiled function's in-place update of an argument")
        given = set()
        for source, key in self.grad_out:
            t = _tensor(source, arguments)
            if key is None:
                t._grad = None
            else:  # each .grad owns its memory, as eagerly: never a view, never shared with another
                array = out[key]
                if array.base is not None or id(array) in given:
                    array = array.copy()
                given.add(id(array))
                t._grad = wrap(array, device)
        if self.writes:
            note_writes(self.writes, "a compiled function's update")
        if type(self.result) is _Fetched and not self.result.differentiable:  # one tensor, the commonest result
            return wrap(out[self.result.key], device)
        return _rebuild(self.result, "out", lambda path, r: arguments[r.path] if type(r) is _Argument else
                        r.of(arguments[r.path]) if type(r) is _ArgumentView else self._fetched(out, r, arguments),
                        (_Fetched, _Argument, _ArgumentView))

    def _fetched(self, out: dict, result: _Fetched, arguments: dict) -> Tensor:
        array, device = out[result.key], self.program.device
        if not result.differentiable or not _grad_mode.enabled:
            return wrap(array, device)
        # as eagerly, it requires grad; a backward through it is refused (see _CompiledCall)
        leaves = [_tensor(source, arguments) for source in self.grad_sources]
        edges = tuple((t, -1) if t._node is None else (t._node, t._index) for t in leaves if t._requires_grad)
        node = Node(self.call, {}, edges, (-1,) * len(edges), tuple((t.shape, t.dtype) for t in leaves), (-1,),
                    ((array.shape, array.dtype),), {}, {}, device)
        return wrap_output(array, node, 0, device)

    def _check_updates(self, feeds: dict, arguments: dict) -> None:
        """Refuse a run whose in-place update of an argument the program cannot follow as eager code does: into
        memory that another argument, or a tensor the function reads, shares (a view of it, or a view of the same
        tensor): eagerly they would see the new value at once, the program reads them as they were."""
        for path, _ in self.argument_updates:
            array, tensor = feeds[path], arguments.get(path)
            if not getattr(array.flags, "writeable", True):
                raise ArgumentError(f"{self.name}() (compiled): argument '{path}' is changed in place, and its memory "
                                    f"(shape {array.shape}) is read-only (a broadcast view or a constant)")
            owner = id(_owner(array))
            for other, a in feeds.items():
                one_variable = other == path or (tensor is not None and arguments.get(other) is tensor)
                if not one_variable and id(_owner(a)) == owner:
                    raise ArgumentError(
                        f"{self.name}() (compiled): argument '{path}' is changed in place and shares "
                        f"memory with argument '{other}' (a view of it, or of the same memory); a compiled "
                        "function cannot show the change through the other: pass tensors that do not share memory")
            if owner in self.captured:
                raise ArgumentError(
                    f"{self.name}() (compiled): argument '{path}' is changed in place and shares memory "
                    "with a tensor the function reads (a parameter, a buffer, a captured tensor); a compiled "
                    "function cannot show the change through it: pass a copy, or run the function eagerly")


# -- arguments and results ---------------------------------------------------------------------------------------


def _leaf_key(value, path: str, feeds: dict, tensors: dict, fn: str):
    """The cache-key part of one argument, collecting its tensors and arrays as feeds named by their path."""
    if isinstance(value, Tensor):
        if value._node is not None:
            raise GradientError(
                f"{fn}() (compiled): argument '{path}' was computed by recorded eager ops (it has a grad_fn); a "
                "compiled program cannot extend an eager graph: pass it detached, or compute it inside the function")
        feeds[path] = value._data
        tensors[path] = value
        return (value._data.shape, value._data.dtype, value._device, value._requires_grad)
    if isinstance(value, np.ndarray):
        feeds[path] = value
        return (value.shape, value.dtype)
    if isinstance(value, _PLAIN):
        return (type(value), exact(value))  # a constant of the trace: another value (-0.0 too) is another trace
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_leaf_key(v, f"{path}[{i}]", feeds, tensors, fn) for i, v in enumerate(value)))
    if isinstance(value, dict):
        return (dict, tuple((k, _leaf_key(v, f"{path}[{k}]", feeds, tensors, fn)) for k, v in value.items()))
    if hasattr(value, "_trace_state"):  # a module or an optimizer: by identity (its state is guarded when used)
        return ("object", id(value))
    raise ArgumentError(
        f"{fn}() (compiled): argument '{path}' is {describe(value)}; a compiled function takes Tensors, arrays, "
        "Python numbers, strings and None (constants of the trace), modules and optimizers, and tuples, lists and "
        "dicts of them. Close over anything else, and give Python state the trace reads to of.compile(cache_key=)"
    )


def _rebuild(value, path: str, leaf, kind):
    """``value`` with each item of type ``kind`` in it replaced by ``leaf(path, item)`` (containers rebuilt)."""
    if isinstance(value, kind):
        return leaf(path, value)
    if isinstance(value, (tuple, list)):
        items = [_rebuild(v, f"{path}[{i}]", leaf, kind) for i, v in enumerate(value)]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _rebuild(v, f"{path}[{k}]", leaf, kind) for k, v in value.items()}
    return value


class _Fetched:
    """Where a compiled function's result holds a value the program computes: its fetch key, and whether eagerly it
    would require grad (computed, with gradients recorded, from a tensor that requires grad)."""

    __slots__ = ("differentiable", "key")

    def __init__(self, key: str, differentiable: bool = False):
        self.key, self.differentiable = key, differentiable


class _CompiledCall:
    """What a compiled function's differentiable result is linked to in the eager autograd graph (a stand-in for an
    op, without a gradient rule): eagerly the result would carry its history, and a backward through it would reach
    the tensors it was computed from. A compiled call keeps no history, so such a backward is refused, naming the
    function, rather than silently leaving those tensors' gradients without the result's part (torch.compile's
    results differentiate)."""

    grad_rule = None
    traits = frozenset()

    def __init__(self, name: str):
        self.name = f"{name}() (compiled)"
        self.refusal = (
            f"backward through a result of the compiled function {name}(): a compiled call returns its results "
            "without their history, so the gradient cannot reach the tensors they were computed from. Call backward "
            "inside the compiled function (as a training step does), or call the function uncompiled where its "
            "result is differentiated")


class _Argument:
    """Where a compiled function's result is one of its tensor arguments itself (``return a``, after ``a.add_(b)``
    or not): the call returns that tensor, as eagerly."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


class _ArgumentView:
    """Where a compiled function's result is a view of one of its tensor arguments (``return x[0]``, ``x.T``): the
    call returns that view of the argument (after its update, if any), sharing its memory as eagerly."""

    __slots__ = ("chain", "path")

    def __init__(self, path: str, chain: list):
        self.path, self.chain = path, chain

    def of(self, argument: Tensor) -> Tensor:
        with interpreting(EAGER), no_grad():
            for op, attrs, index in self.chain:
                argument = EAGER.apply(op, (argument,), attrs)
                argument = argument if index is None else argument[index]
        return argument


def _result(program: Program, path: str, value: Variable, fetch: dict):
    """A result of the traced function: an argument tensor itself or a view of one, or a program output fetched
    under its path (``out``, ``out[0]``)."""
    program.outputs[path] = current_name(value)
    if isinstance(value, ArgumentVariable) and isinstance(value.argument, Tensor):
        return _Argument(value.path)
    view = argument_view(value)
    if view is not None and isinstance(view[0].argument, Tensor):
        return _ArgumentView(view[0].path, view[1])
    fetch[path] = value.name
    return _Fetched(path, _grad_mode.enabled and _differentiable(program, value.name))


def _tensor(source, arguments: dict) -> Tensor:
    return arguments[source] if isinstance(source, str) else source


def compile(fn=None, *, optimize: bool = True, cache_key=None, max_cache: int | None = None):
    """Decorator: trace ``fn`` per kind of call and run it as a compiled program (see the module docstring).

        @of.compile
        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

    Modules' modes and attributes, optimizers' hyper-parameters, the tensors the function reads and the ``.grad``
    it reads are guarded automatically. ``cache_key``, a function of no arguments, adds Python state no guard sees
    (a global flag, a closed-over number): ``of.compile(step, cache_key=lambda: config.scale)``.

    ``max_cache``: the most programs kept (``CompiledFunction.max_cache``, 8, if not given); a call that needs one
    more runs ``fn`` eagerly, with one warning. ``fn`` may be a module: calls bind as its ``forward``.
    """
    if fn is None:
        return lambda f: CompiledFunction(f, optimize, cache_key, max_cache)
    return CompiledFunction(fn, optimize, cache_key, max_cache)


__all__ = ["CompiledFunction", "TraceAgain", "compile"]
