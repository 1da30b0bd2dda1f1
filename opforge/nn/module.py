"""``Module``: a layer or a model, whose parameters, buffers and submodules are found by attribute assignment.

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)          # a submodule: its parameters are "fc1.weight", "fc1.bias"
            self.fc2 = nn.Linear(8, 2)
            self.scale = of.ones(2, requires_grad=True)   # a leaf tensor that requires grad: a parameter

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x))) * self.scale

Parameters are ordinary eager Tensors that require grad. Inside a traced or compiled function they become the
program's persistable variables and share their arrays with it, so everything here that changes values
(``load_state_dict``, ``nn.init``) writes into the existing arrays in place: eager and compiled code go on seeing
the same model.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator

import numpy as np

from ..core import dtypes as D
from ..core.devices import Device
from ..core.errors import ArgumentError, OpforgeError, describe
from ..core.interpreters import EAGER, current_interpreter
from ..core.keys import exact
from ..program.trace import contents, python_state_changed
from ..tensor import Tensor, _to_args, note_write, wrap


class StateDictError(OpforgeError, RuntimeError):
    """A state dict that does not fit the module: missing, unexpected, mis-shaped or mis-typed entries."""


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class _ParameterType(type):
    def __instancecheck__(cls, obj) -> bool:
        return _is_parameter(obj)


class Parameter(metaclass=_ParameterType):
    """``nn.Parameter(data)``, as torch's: a leaf tensor that requires grad, sharing ``data``'s memory (a tensor's;
    other data is copied); assigned to a Module, it is a parameter. In opforge every leaf tensor that requires grad
    is one (the rule ``Module.__setattr__`` registers by), so ``isinstance(t, nn.Parameter)`` asks exactly that: it
    holds for every tensor of ``model.parameters()``. The tensors are plain Tensors (``type(p)`` is Tensor), so ops
    take their fast path on them."""

    def __new__(cls, data=None, requires_grad: bool = True) -> Tensor:
        if data is None:
            data = np.zeros(0, D.DEFAULT_FLOAT)
        t = wrap(data._data, data._device) if isinstance(data, Tensor) else Tensor(data)
        return t.requires_grad_(requires_grad)


def _traced_value(v):
    """An attribute as a trace may have read it: numbers, strings and such by value, anything else by identity."""
    # with its type and by exact(): 2 → 2.0 changes an int tensor's product, 0.0 → -0.0 the sign of a zero
    if v is None or type(v) in (bool, int, float, str):
        return type(v), exact(v)
    if type(v) is tuple and all(x is None or type(x) in (bool, int, float, str) for x in v):
        return tuple((type(x), exact(x)) for x in v)
    return ("object", id(v))


def _is_parameter(value) -> bool:
    return isinstance(value, Tensor) and value.requires_grad and value.is_leaf


class Module:
    """Base class of layers and models: subclasses call ``super().__init__()`` first and define ``forward``.

    Assigning an attribute registers it: a Module becomes a child, a leaf Tensor that requires grad a parameter;
    ``register_buffer`` adds state that is saved but not trained (BatchNorm's running statistics). Names are
    dotted paths, as in PyTorch, so state dicts of the same architecture have the same keys in both.
    """

    training: bool

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward(): define forward(self, ...) to call it")

    def __call__(self, *args, **kwargs):
        interpreter = current_interpreter()
        if interpreter is not EAGER:  # a tracer names our tensors and guards on our state
            interpreter.enter_module(self)
        return self.forward(*args, **kwargs)

    def _trace_state(self) -> tuple:
        """What a trace of ``forward`` may have read besides tensor values: the mode, which parameters, buffers and
        submodules are here, and the other attributes. A compiled function traces again when it changes."""
        return tuple((k, _traced_value(v)) for k, v in self.__dict__.items()
                     if k not in ("_parameters", "_buffers", "_modules", "_non_persistent"))

    def _trace_contents(self) -> dict:
        """{attribute: its contents} for the attributes whose contents can change without an assignment (a list, a
        dict, an array, a config object: ``m.layers.append(...)``, ``m.cfg["scale"] = 3``, ``m.mask[0] = 5``),
        which ``_trace_state`` sees by identity only. A compiled function compares them at every call."""
        registries = ("_parameters", "_buffers", "_modules", "_non_persistent")
        return {k: c for k, v in self.__dict__.items() if k not in registries and (c := contents(v)) is not None}

    # -- registration ------------------------------------------------------------------------------------------

    def _registries(self) -> tuple[dict, dict, dict]:
        try:
            d = self.__dict__
            return d["_parameters"], d["_buffers"], d["_modules"]
        except KeyError:
            raise ArgumentError(f"{type(self).__name__}: call super().__init__() at the start of __init__, "
                                "before assigning attributes") from None

    def __setattr__(self, name: str, value) -> None:
        params, buffers, modules = self._registries()
        python_state_changed()
        if isinstance(value, Module):
            params.pop(name, None), buffers.pop(name, None)
            modules[name] = value
        elif _is_parameter(value):
            buffers.pop(name, None), modules.pop(name, None)
            params[name] = value
        elif name in params:
            if value is not None:
                raise ArgumentError(f"{type(self).__name__}: cannot assign {describe(value)} to parameter '{name}': "
                                    "expected a leaf Tensor that requires grad, or None")
            params[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise ArgumentError(f"{type(self).__name__}: cannot assign {describe(value)} to buffer '{name}': "
                                    "expected a Tensor or None")
            buffers[name] = value
        elif name in modules:
            if value is not None:
                raise ArgumentError(f"{type(self).__name__}: cannot assign {describe(value)} to submodule "
                                    f"'{name}': expected a Module or None")
            modules[name] = None
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        python_state_changed()
        for registry in self._registries():
            registry.pop(name, None)
        self._non_persistent.discard(name)
        object.__delattr__(self, name)

    def _check_new_name(self, kind: str, name: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise ArgumentError(f"{type(self).__name__}: a {kind} name must be a non-empty string without '.', "
                                f"got {name!r}")
        if hasattr(self, name) and name not in self._parameters and name not in self._buffers:
            raise ArgumentError(f"{type(self).__name__}: attribute '{name}' already exists and is not a {kind}")

    def register_parameter(self, name: str, param: Tensor | None) -> None:
        """Add a parameter (a leaf Tensor that requires grad), or None for an absent one (like a bias=False)."""
        self._check_new_name("parameter", name)
        if param is not None and not _is_parameter(param):
            raise ArgumentError(f"{type(self).__name__}.register_parameter('{name}'): expected a leaf Tensor that "
                                f"requires grad, got {describe(param)}")
        self._buffers.pop(name, None)
        self._parameters[name] = param
        object.__setattr__(self, name, param)
        python_state_changed()

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add state that is not trained: in ``state_dict()`` (unless ``persistent=False``), moved by ``to()``."""
        self._check_new_name("buffer", name)
        if tensor is not None and (not isinstance(tensor, Tensor) or tensor.requires_grad):
            raise ArgumentError(f"{type(self).__name__}.register_buffer('{name}'): expected a Tensor that does not "
                                f"require grad, got {describe(tensor)}")
        self._parameters.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        object.__setattr__(self, name, tensor)
        python_state_changed()

    def add_module(self, name: str, module: Module | None) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise ArgumentError(f"{type(self).__name__}.add_module(): bad name {name!r}")
        if module is not None and not isinstance(module, Module):
            raise ArgumentError(f"{type(self).__name__}.add_module('{name}'): expected a Module, got "
                                f"{describe(module)}")
        self._parameters.pop(name, None), self._buffers.pop(name, None)
        self._modules[name] = module
        object.__setattr__(self, name, module)
        python_state_changed()

    # -- walking the tree --------------------------------------------------------------------------------------

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        """This module and every submodule, with dotted names (this module's is ``prefix``); a module reachable
        by several paths comes once, under its first name, unless ``remove_duplicate=False``."""
        memo = set() if memo is None else memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        return (m for _, m in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self) -> Iterator[Module]:
        return (m for _, m in self.named_children())

    def _named(self, attr: str, prefix: str, recurse: bool, remove_duplicate: bool):
        seen = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for path, module in modules:
            for name, t in getattr(module, attr).items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield (f"{path}.{name}" if path else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, parameter) pairs; a parameter shared by several modules comes once, under its first name."""
        return self._named("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        return (b for _, b in self.named_buffers(recurse=recurse))

    def apply(self, fn) -> Module:
        """Call ``fn(module)`` on every submodule (children first) and on this module; returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # -- state -------------------------------------------------------------------------------------------------

    def _state_tensors(self) -> dict[str, Tensor]:
        """The live tensors a state dict holds: parameters, then persistent buffers, per module in order."""
        out = {}
        for path, module in self.named_modules(remove_duplicate=False):  # a shared layer under each of its names
            pre = f"{path}." if path else ""
            for name, p in module._parameters.items():
                if p is not None:
                    out[pre + name] = p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    out[pre + name] = b
        return out

    def state_dict(self) -> dict[str, Tensor]:
        """{dotted name: tensor} for every parameter and persistent buffer. The tensors are detached but share
        memory with the module (as in PyTorch): copy them (or save them) to keep a snapshot."""
        return {name: t.detach() for name, t in self._state_tensors().items()}

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy the values of ``state_dict`` (Tensors, NumPy arrays, or anything ``np.asarray`` reads, such as
        CPU torch tensors) into this module's parameters and buffers, in place.

        Every entry is checked before anything is written, so a failed load changes nothing. Mis-shaped entries and
        values whose dtype does not cast safely within its kind (a float into an int tensor) are always errors;
        missing and unexpected names are errors when ``strict``, else returned as ``(missing_keys,
        unexpected_keys)``.
        """
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise ArgumentError(f"{type(self).__name__}.load_state_dict(): expected a dict of name -> tensor, got "
                                f"{describe(state_dict)}")
        own = self._state_tensors()
        missing = [n for n in own if n not in state_dict]
        unexpected = [n for n in state_dict if n not in own]
        arrays, bad = {}, []
        for name, target in own.items():
            if name not in state_dict:
                continue
            value = state_dict[name]
            try:
                array = value._device.to_host(value._data) if isinstance(value, Tensor) else np.asarray(value)
            except Exception as e:  # whatever could not be read is reported with the rest
                bad.append(f"{name}: cannot read {describe(value)} as an array ({e})")
                continue
            if array.shape != target.shape:
                bad.append(f"{name}: expected shape {target.shape}, got {array.shape}")
            elif not np.can_cast(array.dtype, target.dtype, casting="same_kind"):
                bad.append(f"{name}: expected dtype {target.dtype}, got {array.dtype}")
            else:
                arrays[name] = array
        lines = []
        if strict and missing:
            lines.append(f"missing keys ({len(missing)}): {', '.join(missing)}")
        if strict and unexpected:
            lines.append(f"unexpected keys ({len(unexpected)}): {', '.join(map(str, unexpected))}")
        if bad:
            lines.append(f"mismatched entries ({len(bad)}):\n    " + "\n    ".join(bad))
        if lines:
            raise StateDictError(f"{type(self).__name__}.load_state_dict(): nothing was loaded:\n  "
                                 + "\n  ".join(lines))
        for name, array in arrays.items():
            t = own[name]
            t._device.copy_into(t._data, t._device.from_host(array))
            note_write(t._data, "load_state_dict()")
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> Module:
        """Set the ``training`` flag of this module and every submodule (Dropout, BatchNorm read it)."""
        if not isinstance(mode, bool):
            raise ArgumentError(f"{type(self).__name__}.train(): mode must be a bool, got {describe(mode)}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        python_state_changed()
        return self

    def eval(self) -> Module:
        """``train(False)``: inference behaviour (Dropout off, BatchNorm uses its running statistics)."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's ``.grad``: set it to None (PyTorch's default), or with ``set_to_none=False``
        write zeros into it (torch's older behaviour; a parameter without one keeps None)."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    def to(self, *args, **kwargs) -> Module:
        """Move parameters and buffers to a device and/or convert the floating ones to a floating dtype:
        ``to("twin")``, ``to(of.float64)``, ``to(device, dtype)``, as in PyTorch. In place: the Tensor objects stay
        the same, so optimizers holding them follow (their state moves at their next step), and compiled functions
        read the new arrays (or trace again for a new dtype). Gradients move and convert with their tensors."""
        device, dtype = _to_args(None, args, kwargs)
        if dtype is not None and not D.is_floating(dtype):
            raise ArgumentError(f"{type(self).__name__}.to(): expected a floating dtype, got {dtype}")
        for t in [*self.parameters(), *self.buffers()]:
            _move(t, device, dtype)
            if t.grad is not None:
                _move(t.grad, device, dtype)
        python_state_changed()
        return self

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self, device=None) -> Module:
        return self.to("cuda" if device is None else device if isinstance(device, str) else f"cuda:{device}")

    def double(self) -> Module:
        return self.to(D.float64)

    def float(self) -> Module:
        return self.to(D.float32)

    # -- printing ----------------------------------------------------------------------------------------------

    def extra_repr(self) -> str:
        """What goes between the parentheses of this module's repr (its configuration)."""
        return ""

    def __repr__(self) -> str:
        children = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        extra = self.extra_repr()
        if not children:
            return f"{type(self).__name__}({extra})"
        lines = ([extra] if extra else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


def _move(t: Tensor, device: Device | None, dtype) -> None:
    """``t`` on ``device`` and (if floating) of ``dtype``, in place: the same Tensor object, a new array."""
    data, source = t._data, t._device
    if dtype is not None and D.is_floating(t.dtype) and t.dtype != dtype:
        data = data.astype(dtype)
    if device is not None and device is not source:
        data = device.from_host(source.to_host(data), copy=True)
        t._device = device
    t._data = data


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ...: ``self.blocks = nn.ModuleList([...])``."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, index):
        items = list(self._modules.values())
        return ModuleList(items[index]) if isinstance(index, slice) else items[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList is a container and has no forward(): iterate over it instead")


class ModuleDict(Module):
    """Modules by name, registered as children under their keys: ``self.heads = nn.ModuleDict({"cls": ..., ...})``;
    indexed, iterated (keys), ``items()``, ``keys()``, ``values()``, ``update()``, as a dict."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules) -> None:
        for key, module in (modules.items() if hasattr(modules, "items") else modules):
            self[key] = module

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict is a container and has no forward(): index it instead")


class Sequential(ModuleList):
    """Modules applied one after another: ``Sequential(Linear(4, 8), ReLU(), Linear(8, 2))``; children are named
    "0", "1", ... (or by the keys of a single dict argument)."""

    def __init__(self, *modules):
        if len(modules) == 1 and isinstance(modules[0], dict):
            Module.__init__(self)
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            super().__init__(modules)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*list(self._modules.values())[index])
        return super().__getitem__(index)

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x


__all__ = ["IncompatibleKeys", "Module", "ModuleDict", "ModuleList", "Parameter", "Sequential", "StateDictError"]
