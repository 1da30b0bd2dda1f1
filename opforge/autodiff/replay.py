"""Gradient rules replayed on bare arrays: the eager backward pass's fast path when it is not itself recorded.

A gradient rule is written with ops, so that one rule serves eager autograd, higher-order gradients and programs.
Eagerly, calling it costs what any op call costs — keyword arguments, interpreter check, dispatch, a Tensor per
intermediate value — and for the small tensors of a long chain that overhead is most of the backward pass (issue
12: a chain of tiny ops spent 3× its forward time there).

When the backward pass is not recorded (``create_graph=False``), a node's rule is *recorded once* for what decides
its behaviour — the op, its attrs, the shapes and dtypes of what it saved and received, which inputs want a
gradient, the device — and from then on *replayed*: a generated Python function calls the same kernels that
eager dispatch chose, with the same arguments (Python scalars already lifted to arrays of the dtype eager gave
them), and wraps the results. The recording runs the rule itself under an interpreter that notes each op call
after eager's own checks (``dispatch.prepare_call``), so the replay is derived from the rule, never a second
copy of it; the sum-down and cast that ``rules.fit`` adds are recorded with it. Calls whose results no gradient
needs are dropped (random ones are kept: they advance the generator as eagerly).

What cannot be replayed is never recorded, and its rule runs as before: a rule that reads values out to NumPy
(``.numpy()``, ``.item()``, branching on a value), turns gradient recording on, uses a Tensor it did not get from
the call (a captured one, a ``detach()``), or fails. A key is recorded the second time it is seen, so a shape met
once costs nothing extra. Results are bit for bit those of the rule (tests/test_replay.py runs every op's samples
both ways).
"""

from __future__ import annotations

import numpy as np

from .. import dispatch
from ..core import codegen
from ..core.devices import default_device
from ..core.grad_mode import _mode as _grad_mode
from ..core.grad_mode import set_grad_enabled
from ..core.interpreters import EAGER, Interpreter, current_interpreter, interpreting
from ..core.keys import exact
from ..core.opdef import definitions
from ..dispatch import _flatten_outputs, finish_call, prepare_call
from ..tensor import _SCALARS, Tensor, _host_reads, tensor_source, wrap
from .rules import call_rule, fit, fit_inputs, input_label

enabled = True  # set_replay(False) turns the fast path off (every rule runs as written)
_tapes: dict = {}  # key -> _SEEN_ONCE, a replay function, or _REFUSED
_tapes_of = [definitions[0]]  # the op definitions the tapes were recorded under
_REFUSED = object()
_SEEN_ONCE = object()
_MAX_TAPES = 4096  # shapes that keep changing must not grow the table without bound

def set_replay(on: bool) -> bool:
    """Turn the replay of gradient rules on or off (on by default); returns the previous setting. Off, every node's
    rule runs as written — to compare, or to debug a rule."""
    global enabled
    previous, enabled = enabled, bool(on)
    return previous


def usable() -> bool:
    """Whether this backward pass may replay: nothing but eager interprets op calls here (a custom interpreter
    sees every call of a rule), and debug mode is off (it checks every call against the shape rule)."""
    if _tapes_of[0] != definitions[0]:  # a kernel or a rule changed: what was recorded may call the old one
        _tapes.clear()
        _tapes_of[0] = definitions[0]
    return enabled and not dispatch._debug and current_interpreter() is EAGER


def run(node, grads: list) -> list:
    """The gradients of ``node``'s flat inputs from its outputs' ``grads`` (as ``call_rule`` with
    ``create_graph=False`` returns them), fitted to the inputs' shapes and dtypes: a tape recorded the fit with the
    rule, and a rule run as written is fitted here. The backward pass asks ``usable()`` first, which also forgets
    tapes recorded under other op definitions."""
    op, attrs, edges = node.op, node.attrs, node.edges
    n = len(edges)
    # Everything the tape's result depends on: the attrs (a tape bakes them in; floats by exact(), as -0.0 == 0.0
    # and a NaN is equal to no other), ...
    key = (op, (tuple(map(exact, attrs.values())) if op.float_attrs else tuple(attrs.values())) if attrs else (),
           node.in_meta, node.out_meta, node.in_layout,
           # which inputs want a gradient, and which outputs got one (a node with one input that requires none
           # is never made, and a node runs only once some output's gradient reached it)
           1 if n == 1 else (edges[0] is not None, edges[1] is not None) if n == 2 else tuple(map(bool, edges)),
           # ... and the dtypes of the gradients that came (their shapes are the outputs'): a tape recorded for
           # float32 ones has no cast back to float32 for a float64 one, and its lifted constants are float32
           grads[0]._data.dtype if len(grads) == 1 else tuple(map(_dtype, grads)),
           node.device.name)
    try:
        tape = _tapes.get(key)
    except TypeError:  # an unhashable attr (a list): not worth a key of its own
        return _as_written(node, grads)
    if tape is None or tape is _REFUSED or tape is _SEEN_ONCE:
        return _untaped(key, tape, node, grads)
    try:
        return tape(node, grads)
    except Exception:  # a kernel refused these values: the rule, run as written, says so as eager says it
        return _as_written(node, grads)


def _dtype(g):
    return None if g is None else g._data.dtype


def _untaped(key, tape, node, grads: list) -> list:
    """A key without a tape: met the first time (noted), the second (recorded now), or refused."""
    if tape is None:
        if len(_tapes) >= _MAX_TAPES:
            _tapes.clear()
        _tapes[key] = _SEEN_ONCE
    elif tape is _SEEN_ONCE:
        tape = _tapes[key] = _record(node, grads)
        if tape is not _REFUSED:
            try:
                return tape(node, grads)
            except Exception:
                pass
    return _as_written(node, grads)


def _as_written(node, grads: list) -> list:
    return fit_inputs(node, call_rule(node, grads, False), Tensor)


# -- recording ----------------------------------------------------------------------------------------------------

class _Refused(Exception):
    """The rule did something a replay could not repeat."""


class _Recorder(Interpreter):
    """Runs each op call of a rule as eager does and notes it: which recorded value each input is."""

    def __init__(self):
        self.slots: dict = {}  # id(Tensor) -> slot number
        self.values: list = []  # the Tensor of each slot (kept alive so that ids stay unique)
        self.devices: list = []  # the device of each slot
        self.steps: list = []  # (op, kernel, device, out_device, attrs, sources, first output slot, count)
        self.constants: list = []
        self.default_device = None

    def slot(self, t: Tensor) -> int:
        self.slots[id(t)] = len(self.values)
        self.values.append(t)
        self.devices.append(t._device)
        return len(self.values) - 1

    def apply(self, op, inputs: tuple, attrs: dict):
        if _grad_mode.enabled:
            raise _Refused(f"op '{op.name}' called with gradient recording on")
        if op.validate is not None:
            op.validate(attrs)
        coerced, device, kernel = prepare_call(op, inputs, attrs)
        sources = []
        for p, given, value in zip(op.inputs, inputs, coerced):
            if p.is_list:
                sources.append([self._source(op, g, v) for g, v in zip(given, value)])
            else:
                sources.append(None if value is None else self._source(op, given, value))
        if not any(t is not None for v in coerced for t in (v if isinstance(v, list) else (v,))):
            self.default_device = device
        out = finish_call(op, coerced, attrs, device, kernel)
        outs = [out] if len(op.outputs) == 1 else list(out)
        flat = [t for o, v in zip(op.outputs, outs) for t in (v if o.is_list else (v,))]
        first = len(self.values)
        for t in flat:
            self.slot(t)
        out_device = device if op.out_device is None else op.out_device(attrs)
        self.steps.append((op, kernel, device, out_device, dict(attrs), sources, first, len(flat)))
        return out

    def _source(self, op, given, value: Tensor):
        slot = self.slots.get(id(value))
        if slot is not None and self.values[slot] is value:
            return slot
        if given is value and not any(value is c for c in _SCALARS.values()):  # not a Python number that an
            raise _Refused(f"op '{op.name}' got a tensor from outside the rule")  # operator lifted (2 * dy)
        self.constants.append(value._data)  # a Python number or array, lifted as eager lifts it
        return ("constant", len(self.constants) - 1)

    def assign(self, target, value) -> None:
        raise _Refused("assign inside a gradient rule")

    def set_grad(self, param, grad) -> None:
        raise _Refused("set_grad inside a gradient rule")


class _View:
    """``node`` as ``call_rule`` reads it, with a fresh Tensor for each value the rule gets, numbered by the recorder
    in order (saved inputs, saved outputs, gradients, residuals): two of them may be one Tensor in this call and
    two in the next, so the replay must not take one for the other."""

    def __init__(self, node, recorder: _Recorder, grads: list):
        self.node, self.recorder = node, recorder
        self.op, self.attrs = node.op, node.attrs
        self.in_layout, self.out_layout = node.in_layout, node.out_layout
        rule = node.op.grad_rule
        self.reads = []  # per numbered value: (expression for its Tensor, for its array) in the replay function
        self.inputs = {}
        for name, _ in rule.saved_inputs:
            v = node.saved[name]
            if v is None or type(v) is Tensor:
                self.inputs[name] = None if v is None else self.fresh(v, f"s[{name!r}]")
            else:
                self.inputs[name] = [self.fresh(t, f"s[{name!r}][{j}]") for j, t in enumerate(v)]
        self.outputs = {name: [self.fresh(wrap(a, node.device), f"so[{name!r}][{j}][1]", array=True)
                               for j, (_, a) in enumerate(node.saved_out[name])]
                        for name, _ in rule.saved_outputs}
        self.grads = [None if g is None else self.fresh(g, f"grads[{k}]") for k, g in enumerate(grads)]
        residuals = node.residuals or {}
        self.residuals = {name: self.fresh(wrap(residuals[name], node.device), f"node.residuals[{name!r}]",
                                           array=True) if name in residuals else None
                          for name in rule.residuals}

    def fresh(self, t: Tensor, read: str, array: bool = False) -> Tensor:
        """A new Tensor for value ``t``, which the replay reads as ``read`` (a Tensor there, or its ``array``)."""
        copy = wrap(t._data, t._device, t._requires_grad)  # as the rule would see t (gradient recording is off)
        self.recorder.slot(copy)
        self.reads.append((f"_wrap({read}, node.device)", read) if array else (read, f"{read}._data"))
        return copy

    def saved_inputs(self) -> dict:
        return dict(self.inputs)

    def saved_output(self, name: str, i: int, create_graph: bool):
        tensors = self.outputs[name]
        return tensors if self.op.outputs[i].is_list else tensors[0]

    def residual(self, name: str, create_graph: bool):
        return self.residuals[name]  # a later node without it makes the replay fail: its rule then runs as written

    def zeros(self, k: int):
        raise _Refused("an output no gradient reached")

    def spec(self, where: str, i: int):
        return self.node.spec(where, i)

    def needs_input_grad(self) -> tuple:
        return self.node.needs_input_grad()


def _record(node, grads: list):
    """Run ``node``'s rule once under a recorder; the replay function, or ``_REFUSED``."""
    recorder = _Recorder()
    view = _View(node, recorder, grads)
    reads = _host_reads.count
    try:
        with set_grad_enabled(False), interpreting(recorder):
            result = call_rule(view, view.grads, False)
            for i, (edge, g) in enumerate(zip(node.edges, result)):
                # fit returns a gradient of the input's shape and dtype as it is; the sum-down or cast it adds is
                # recorded with the rule (the engine's own fit is then a no-op)
                result[i] = None if edge is None or g is None else \
                    fit(node.op, input_label(node.op, i, node.in_layout), g, *node.in_meta[i], Tensor)
        if _host_reads.count != reads:
            raise _Refused("the rule read values out to NumPy")
        returned = []
        for g in result:
            slot = None if g is None else recorder.slots.get(id(g))
            if g is not None and (slot is None or recorder.values[slot] is not g):
                raise _Refused("the rule returned a tensor from outside it")
            returned.append(slot)
    except Exception:  # _Refused, or an error the rule raises: the rule runs as written and says it itself
        return _REFUSED
    return _compile(node.op.name, recorder, view.reads, returned)


# -- the replay function ----------------------------------------------------------------------------------------

def _arg(source, env: dict, constants: list) -> str:
    """The replay function's expression for one kernel argument (a module function: a recursive closure would be a
    reference cycle holding the recording's values until the cyclic collector runs)."""
    if source is None:
        return "None"
    if isinstance(source, list):
        return "[" + "".join(_arg(x, env, constants) + ", " for x in source) + "]"
    if type(source) is int:
        return f"a{source}"
    env[f"c{source[1]}"] = constants[source[1]]
    return f"c{source[1]}"


def _compile(name: str, recorder: _Recorder, reads: list, returned: list):
    """Python source for the recorded steps, compiled: ``replay(node, grads) -> [gradient Tensor or None, ...]``
    (``reads``: how it finds each value the rule was given in the node and the gradients)."""
    given = len(reads)
    live = {s for s in returned if s is not None}
    steps = []
    for step in reversed(recorder.steps):  # keep a call if a gradient needs what it makes, or it draws randoms
        op, kernel, device, out_device, attrs, sources, first, count = step
        if kernel.takes_rng or any(first <= s < first + count for s in live):
            steps.append(step)
            for src in sources:
                for s in (src if isinstance(src, list) else (src,)):
                    if type(s) is int:
                        live.add(s)
    steps.reverse()
    env = {"_nd": np.ndarray, "_wrap": wrap, "_flat": _flatten_outputs, "_of_new": object.__new__, "_of_T": Tensor}
    lines = ["def replay(node, grads):", "    s, so = node.saved, node.saved_out"]
    if recorder.default_device is not None:  # a call with no tensor input ran on the then default device
        env.update(_default_device=default_device, _dd=recorder.default_device, _Moved=_DefaultDeviceMoved)
        lines.append("    if _default_device() is not _dd: raise _Moved")  # run() then runs the rule as written
    lines += [f"    a{i} = {reads[i][1]}" for i in range(given) if i in live]

    for n, (op, kernel, device, out_device, attrs, sources, first, count) in enumerate(steps):
        env[f"k{n}"], env[f"d{n}"], env[f"od{n}"], env[f"op{n}"] = kernel.bind(device), device, out_device, op
        call = f"k{n}({''.join(_arg(s, env, recorder.constants) + ', ' for s in sources)}"
        if attrs:
            env[f"at{n}"] = attrs
            call += f"**at{n}, "
        if kernel.takes_rng:
            call += f"rng=d{n}.generator()"
        call += ")"
        if len(op.outputs) == 1 and not op.outputs[0].is_list:
            lines.append(f"    a{first} = {call}")
            lines.append(f"    if type(a{first}) is not _nd:")
            lines.append(f"        a{first} = od{n}.array(a{first})")
        else:
            targets = "".join(f"a{first + i}, " for i in range(count))
            lines.append(f"    {targets}= _flat(op{n}, {call}, od{n})[0]")
    results = []
    for s in returned:
        if s is None:
            results.append("None")
        elif s < given:
            results.append(reads[s][0])  # a value the rule passed through: the very Tensor, as the rule returns it
        else:
            env[f"dev{s}"] = recorder.devices[s]
            results.append(f"t{s}")
    made = sorted({s for s in returned if s is not None and s >= given})
    for s in made:  # one Tensor per value, shared where the rule shares: wrap(), written out (a call less)
        lines += tensor_source(f"t{s}", f"a{s}", f"dev{s}")
    lines.append(f"    return [{', '.join(results)}]")
    source = "\n".join(lines) + "\n"
    replay = codegen.define(source, "replay", name, env, "replay", unique=True)
    del env["replay"]  # not left in its own globals: no cycle to keep a dropped tape alive
    return replay


class _DefaultDeviceMoved(Exception):
    """Raised by a tape whose rule made a tensor on the default device, which is another one now."""


__all__ = ["run", "set_replay", "usable"]
