"""The ``Optimizer`` base class: parameter groups, state, ``zero_grad``, ``step``, state dicts.

One ``step()`` serves eager and compiled training. It reads each parameter's gradient with ``grad_of`` (``p.grad``
eagerly; the gradient variable ``loss.backward()`` appended, while tracing), computes the new parameter and state
values with the update ops of ``opforge.ops.optim`` under ``no_grad``, and hands them to ``assign``: eagerly that
copies them into the parameter's and the state's own arrays; while tracing it records them as the program's updates,
which the executor writes into the same arrays (in place, through the update ops' ``out=``). So eager and compiled
steps can alternate on the same model and optimizer.

State tensors (momentum buffers, moments, step counts) are made when a parameter joins the optimizer, so they exist
before any tracing and become persistable program state. Each group's learning rate, momentum and beta1 are 0-d float64
tensors, also program state: schedules write them in place, so a compiled step reads the current values and is not
traced again. The other hyper-parameters (beta2, weight decay, ...) are attrs of the recorded update ops, fixed when
a step is traced: changing them traces the step again.

Within one traced function, call ``step()`` once and read no parameter after it: a program's ops read the values
persistable variables had when the run began (updates land at the end), whereas eagerly they read the new ones.
"""

from __future__ import annotations

import math

import numpy as np

from .. import ops as F
from ..checkpoint import StateDictError, diff_structure
from ..core import dtypes as D
from ..core.errors import ArgumentError, describe
from ..core.grad_mode import enable_grad, no_grad
from ..core.interpreters import current_interpreter
from ..creation import tensor
from ..program.trace import python_state_changed
from ..tensor import Tensor, note_write


def grad_of(p: Tensor):
    """The gradient of parameter ``p``: ``p.grad`` eagerly; while tracing, the gradient variable the program's
    backward pass made for it (``program.grad_names``); None when ``p`` got none."""
    return current_interpreter().grad_of(p)


def set_grad(p: Tensor, g) -> None:
    """Make ``g`` the gradient of ``p`` from here on: ``p.grad`` eagerly, the program's gradient while tracing
    (so an optimizer step recorded later reads ``g``)."""
    current_interpreter().set_grad(p, g)


def live(t: Tensor):
    """An optimizer state tensor as ops should see it: itself eagerly, its persistable variable while tracing
    (without this, a tensor that is read but never assigned, like the learning rate, would be a constant)."""
    return current_interpreter().live(t)


# Entries torch's learning-rate schedules add to parameter groups (and ours, as torch's): a state dict may hold them
# or not, whichever this optimizer's groups do.
SCHEDULE_KEYS = frozenset({"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"})


def _exactly_as(value, like):
    """``value`` (a state entry being loaded) in the dtype of ``like`` (ours) when it converts exactly, as torch's
    float32 step counts do into our int64 ones; else unchanged, for the structure check to report."""
    if like is None or not isinstance(value, (Tensor, np.ndarray, np.generic)) or value.dtype == like.dtype:
        return value
    host = value._device.to_host(value._data) if isinstance(value, Tensor) else np.asarray(value)
    if host.shape != tuple(like.shape) or host.dtype.kind not in "biuf":
        return value
    with np.errstate(all="ignore"):
        cast = host.astype(like.dtype)
    return cast if np.array_equal(cast.astype(host.dtype), host) and np.all(np.isfinite(host)) else value


def _follow(t: Tensor, p: Tensor | None, dtype: bool) -> None:
    """Optimizer state follows its parameter, in place: to its device (``model.to(device)``) and, for state shaped
    like it, to its floating dtype (``model.double()``)."""
    if p is None:
        return
    if t._device is not p._device:
        t._data, t._device = p._device.from_host(t._device.to_host(t._data), copy=True), p._device
    if dtype and t.dtype != p.dtype and D.is_floating(t.dtype) and D.is_floating(p.dtype):
        t._data = t._data.astype(p.dtype)


class _InTensor(tuple):
    """What a parameter group's dict holds for a hyper-parameter kept in a tensor: whether its value is nonzero,
    the one thing about it an update's structure depends on (SGD and RMSprop keep a momentum buffer only for a
    nonzero momentum), so the value itself is no part of what a traced step bakes in."""

    def __new__(cls, value: float):
        return super().__new__(cls, ("in a tensor", value != 0))


class ParamGroup(dict):
    """One group of parameters and its hyper-parameters, a dict as in ``torch.optim`` (``group["momentum"]``).

    The hyper-parameters schedules change at every step live in 0-d float64 tensors, which compiled steps read: the
    learning rate (``lr_tensor``), ``momentum`` and beta1 (the first of ``betas``), which ``CyclicLR`` and
    ``OneCycleLR`` cycle. ``group["lr"]``, ``group["momentum"]`` and ``group["betas"]`` give them as floats and
    setting them writes the tensors in place. Other keys are plain entries, baked into a traced step.
    """

    def __init__(self, params: list, lr: float, **hyper):
        device = params[0].device if params else None
        self.tensors = {"lr": tensor(np.array(float(lr)), device=device)}  # key -> its 0-d float64 tensor
        if "momentum" in hyper:
            self.tensors["momentum"] = tensor(np.array(float(hyper["momentum"])), device=device)
            hyper["momentum"] = _InTensor(hyper["momentum"])
        if "betas" in hyper:
            beta1, *rest = hyper["betas"]
            self.tensors["beta1"] = tensor(np.array(float(beta1)), device=device)
            hyper["betas"] = (_InTensor(beta1), *rest)
        super().__init__(params=params, **hyper)
        self.lr_tensor = self.tensors["lr"]

    def __getitem__(self, key):
        if key == "lr" or key == "momentum":
            return float(self.tensors[key].item())
        if key == "betas":
            return (float(self.tensors["beta1"].item()), *super().__getitem__("betas")[1:])
        return super().__getitem__(key)

    def __setitem__(self, key, value):
        if key == "lr":  # compiled steps read the tensor at each run: nothing to trace again
            self._write("lr", value)
        elif key == "momentum" and key in self.tensors:
            self._write("momentum", value)
            self._set_plain("momentum", _InTensor(value))
        elif key == "betas" and "beta1" in self.tensors:
            beta1, *rest = value
            self._write("beta1", beta1)
            self._set_plain("betas", (_InTensor(beta1), *rest))
        else:  # baked into traced update ops: compiled steps check their guards again
            self._set_plain(key, value)

    def _write(self, key: str, value) -> None:
        t = self.tensors[key]
        t.device.copy_into(t._data, t.device.from_host(np.array(float(value))))

    def _set_plain(self, key: str, value) -> None:
        if not (dict.__contains__(self, key) and _same(dict.__getitem__(self, key), value)):
            super().__setitem__(key, value)
            python_state_changed()

    def __contains__(self, key) -> bool:
        return key == "lr" or super().__contains__(key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def setting(self, key: str):
        """The entry as it was set, without reading a tensor: on a device each read of one would stall it (for
        ``betas``, beta2 is a float here; beta1 and a momentum are only known as zero or not, ``nonzero``)."""
        return super().__getitem__(key)

    def nonzero(self, key: str) -> bool:
        """Whether a hyper-parameter is nonzero, read without a device read for those kept in tensors."""
        entry = super().__getitem__(key)
        return entry[1] if isinstance(entry, _InTensor) else entry != 0

    def value(self, key: str):
        """A hyper-parameter as an update rule reads it: ``lr``, ``momentum`` or ``beta1`` as ops should see their
        tensor (``live``: a compiled step reads it at each run), any other as its Python value."""
        if key in self.tensors:
            return live(self.tensors[key])
        return self["betas"][0] if key == "beta1" else self[key]

    def hyper(self) -> dict:
        """The hyper-parameters, lr included (everything but the parameters)."""
        return {"lr": self["lr"], **{k: self[k] for k in dict.keys(self) if k != "params"}}

    def __repr__(self) -> str:
        return f"ParamGroup({len(super().__getitem__('params'))} params, {self.hyper()})"


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError):  # values that do not compare to a bool (arrays): assume changed
        return False


class Optimizer:
    """Base class. A subclass sets ``defaults`` (hyper-parameters, lr included), and implements ``_check`` (refuse
    bad hyper-parameters), ``_new_state`` (the state tensors of one parameter) and ``_update`` (one parameter's step,
    with ops, ending in ``assign``s).

    ``params`` is an iterable of Tensors that require grad, or of dicts ``{"params": [...], **overrides}``, one per
    parameter group.
    """

    scalar_state: tuple = ()  # state that keeps its dtype, even beside a 0-d parameter (NAdam's mu_product)

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.param_groups: list[ParamGroup] = []
        self.state: dict = {}  # parameter -> {name: state Tensor}
        if isinstance(params, Tensor):
            params = [params]
        groups = list(params)
        if not groups:
            raise ArgumentError(f"{type(self).__name__}(): got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict) -> None:
        """Add a group of parameters (with hyper-parameters overriding the defaults) and make their state."""
        name = type(self).__name__
        if not isinstance(group, dict) or "params" not in group:
            raise ArgumentError(f"{name}(): a parameter group is a dict with a 'params' entry, got {describe(group)}")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for i, p in enumerate(params):  # a frozen one (requires_grad False) is kept, and skipped while it has no grad
            if not isinstance(p, Tensor) or not p.is_leaf:
                raise ArgumentError(f"{name}(): parameter {i} must be a leaf Tensor, got {describe(p)}"
                                    + (" made by recorded ops" if isinstance(p, Tensor) else ""))
            if id(p) in seen:
                raise ArgumentError(f"{name}(): parameter {i} (shape {p.shape}) appears in more than one place")
            seen.add(id(p))
        hyper = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}}
        self._check(hyper)
        new = ParamGroup(params, **hyper)
        self.param_groups.append(new)
        for p in params:
            self.state[p] = self._new_state(p, new)
        python_state_changed()

    # -- what subclasses provide -------------------------------------------------------------------------------

    def _check(self, hyper: dict) -> None:
        name = type(self).__name__
        self._check_flags(hyper)
        for key, value in hyper.items():  # from a constructor or a loaded state dict: trust neither
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if v is None or isinstance(v, (bool, np.bool_)):
                    continue
                try:
                    finite = isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(float(v))
                except OverflowError:  # an int no float can hold (10**400)
                    finite = False
                if not finite:
                    raise ArgumentError(f"{name}(): hyper-parameter {key} must be a finite number, got "
                                        f"{describe(v)}")
        if not hyper["lr"] >= 0:
            raise ArgumentError(f"{name}(): lr must be >= 0, got {hyper['lr']}")

    def _error(self, message: str) -> ArgumentError:
        return ArgumentError(f"{type(self).__name__}(): {message}")

    def _check_betas(self, hyper: dict) -> None:
        """``betas``: two numbers in [0, 1), as torch's Adam family requires."""
        betas = hyper["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ArgumentError(f"{type(self).__name__}(): betas must be two numbers in [0, 1), got {betas!r}")
        hyper["betas"] = tuple(float(b) for b in betas)

    def _check_nonnegative(self, hyper: dict, *keys: str) -> None:
        for key in keys:
            if not hyper[key] >= 0:
                raise ArgumentError(f"{type(self).__name__}(): {key} must be >= 0, got {hyper[key]}")

    def _check_flags(self, hyper: dict) -> None:
        """torch's flags that choose how an update runs, not what it computes — ``foreach`` (one kernel per list of
        tensors), ``capturable`` (graph capture), ``fused`` (one fused kernel) — are accepted and change nothing
        here (every step is one recorded program already). ``differentiable=True`` (autograd through the step)
        would change what a step computes, and is refused; ``maximize`` is implemented by the update rules."""
        name = type(self).__name__
        for key in ("maximize", "capturable", "differentiable"):
            if key in hyper and not isinstance(hyper[key], (bool, np.bool_)):
                raise ArgumentError(f"{name}(): {key} must be a bool, got {describe(hyper[key])}")
        for key in ("foreach", "fused"):
            if key in hyper and hyper[key] is not None and not isinstance(hyper[key], (bool, np.bool_)):
                raise ArgumentError(f"{name}(): {key} must be None or a bool, got {describe(hyper[key])}")
        if hyper.get("differentiable"):
            raise ArgumentError(f"{name}(): differentiable=True (autograd through the optimizer step) is not "
                                "supported: steps run under no_grad")
        if hyper.get("fused") and hyper.get("foreach"):
            raise ArgumentError(f"{name}(): fused=True and foreach=True cannot be set together (as in torch)")

    def _new_state(self, p: Tensor, group: ParamGroup) -> dict:
        return {}

    def _add_missing_state(self, p: Tensor, group: ParamGroup, state: dict) -> dict:
        """Fresh entries for state a hyper-parameter asks for now but did not when ``p`` joined (a schedule such as
        CyclicLR turning momentum on): torch makes them at the first step that needs them, so do we."""
        for key, value in self._new_state(p, group).items():
            state.setdefault(key, value)
        return state

    def _complete_state(self, entries: dict) -> dict:
        """A parameter's state being loaded, with what our state keeps beyond torch's filled in (torch's own state
        dicts lack it). Nothing here; SGD's step count."""
        return entries

    def _update(self, p: Tensor, g, lr, group: ParamGroup, state: dict) -> None:
        """One parameter's step: read ``state``'s tensors through ``live(...)``, compute with ops, and end with
        ``assign(p, ...)`` and ``assign(state[name], ...)``. ``g`` and ``lr`` are ready to use."""
        raise NotImplementedError

    # -- training -----------------------------------------------------------------------------------------------

    def step(self, closure=None):
        """Update every parameter that has a gradient (eagerly, or recorded into the program being traced).
        ``closure`` (optional) recomputes the loss with gradients and returns it, as in ``torch.optim``."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        interpreter = current_interpreter()
        if interpreter.symbolic:
            interpreter.guard(self)  # the hyper-parameters are baked into the traced update ops
        with no_grad():
            for group in self.param_groups:
                for t in group.tensors.values():
                    _follow(t, group["params"][0] if group["params"] else None, dtype=False)
                lr = live(group.lr_tensor)
                for p in group["params"]:
                    g = grad_of(p)
                    if g is not None:
                        state = self.state[p]
                        for key, t in state.items():
                            _follow(t, p, dtype=t.shape == p.shape and key not in self.scalar_state)
                        self._update(p, g, lr, group, state)
        return loss

    def _trace_state(self) -> tuple:
        """What a traced step bakes in: which parameters each group holds, and the hyper-parameters but those kept
        in tensors, read at each run (of those, whether they are nonzero)."""
        return tuple((tuple(map(id, g["params"])), tuple((k, v) for k, v in dict.items(g) if k != "params"))
                     for g in self.param_groups)

    def _trace_names(self):
        """(state tensor, its parameter or None, name): how a traced step names the state it reads."""
        for i, group in enumerate(self.param_groups):
            for key, t in group.tensors.items():
                yield t, None, f"{key}.{i}" if len(self.param_groups) > 1 else key
            for p in group["params"]:
                for key, t in self.state[p].items():
                    yield t, p, key

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: ``p.grad = None`` (or zeros) eagerly; while tracing, the program's gradients are
        dropped from its outputs (``program.grad_names``), so a compiled step need not return them."""
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if set_to_none:
                        set_grad(p, None)  # without reading the gradient: a compiled step need not bring it in
                    else:
                        g = grad_of(p)
                        set_grad(p, None if g is None else F.zeros_like(g))

    # -- state dicts ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """``{"state": {index: {name: Tensor}}, "param_groups": [{hyper-parameters..., "params": [index, ...]}]}``,
        parameters numbered in group order as in ``torch.optim``. The Tensors are copies."""
        state, groups, index = {}, [], 0
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                if self.state[p]:
                    state[index] = {k: tensor(v, device=v.device) for k, v in self.state[p].items()}
                ids.append(index)
                index += 1
            groups.append({**group.hyper(), "params": ids})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what ``state_dict`` returned — here, from a checkpoint, or from torch's optimizer of the same name
        (its tensors as NumPy arrays). Names, counts, shapes and dtypes must fit this optimizer: a
        ``StateDictError`` lists every entry that does not, and nothing is loaded. As in torch, a parameter with no
        state in it (one that never stepped) starts afresh, and a state value of another dtype that converts exactly
        (torch's float32 step counts into our int64 ones) is converted. Values are copied into the existing state
        arrays and learning-rate tensors, so compiled steps carry on with them."""
        name = type(self).__name__
        if not isinstance(state_dict, dict):
            raise StateDictError(f"{name}.load_state_dict(): expected a dict, got {describe(state_dict)}")
        mine = self.state_dict()
        params = [p for group in self.param_groups for p in group["params"]]
        group_of = [group for group in self.param_groups for _ in group["params"]]
        state = state_dict.get("state")
        if isinstance(state, dict):  # torch's: no entry for a parameter that never stepped, float step counts
            state = {**{i: self._new_state(params[i], group_of[i]) for i in mine["state"]}, **state}
            for i, entries in state.items():
                if i in mine["state"] and isinstance(entries, dict):
                    entries = self._complete_state(entries)
                    state[i] = {k: _exactly_as(v, mine["state"][i].get(k)) for k, v in entries.items()}
        groups = state_dict.get("param_groups")
        problems = diff_structure({"state": mine["state"], "param_groups": [0] * len(mine["param_groups"])},
                                  {"state": state, "param_groups": groups if not isinstance(groups, list)
                                   else [0] * len(groups)})
        for i, (g_mine, g_new) in enumerate(zip(mine["param_groups"], groups if isinstance(groups, list) else [])):
            if not isinstance(g_new, dict):
                problems.append(f"param_groups/{i}: expected dict, got {describe(g_new)}")
                continue
            problems += [f"missing: param_groups/{i}/{k}" for k in g_mine if k not in g_new and k not in SCHEDULE_KEYS]
            problems += [f"unexpected: param_groups/{i}/{k}" for k in g_new
                         if k not in g_mine and k not in SCHEDULE_KEYS]
            if "params" in g_new and not (isinstance(g_new["params"], (list, tuple))
                                          and all(isinstance(p, (int, np.integer)) and not isinstance(p, bool)
                                                  for p in g_new["params"])):
                problems.append(f"param_groups/{i}/params: expected a list of parameter indices, got "
                                f"{describe(g_new['params'])}")
            elif "params" in g_new and list(g_new["params"]) != g_mine["params"]:
                problems.append(f"param_groups/{i}/params: this optimizer's group holds parameters "
                                f"{g_mine['params']}, the state dict's {list(g_new['params'])}")
        if problems:
            raise StateDictError(f"{name}.load_state_dict(): the state dict does not fit this optimizer:\n  "
                                 + "\n  ".join(problems))
        hypers = [{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k != "params"}
                  for saved in groups]
        for hyper in hypers:
            self._check(dict(hyper))
        for i, entries in state.items():
            for key, value in entries.items():
                t = self.state[params[i]][key]
                if isinstance(value, Tensor) and value._device is t._device:  # copied there, not through the host
                    t._device.copy_into(t._data, value._data)
                else:
                    host = value._device.to_host(value._data) if isinstance(value, Tensor) else np.asarray(value)
                    t._device.copy_into(t._data, t._device.from_host(host))
                note_write(t._data, "load_state_dict()")
        for group, hyper in zip(self.param_groups, hypers):
            for key, value in hyper.items():
                group[key] = value

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"  group {i}: {len(group['params'])} params, " +
                         ", ".join(f"{k}={v}" for k, v in group.hyper().items()))
        return "\n".join([*lines, ")"])
