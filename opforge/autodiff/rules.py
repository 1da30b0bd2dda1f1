"""Calling a gradient rule on a recorded call and checking what it returns — one copy, for eager autograd and
program mode alike.

A recorded call is seen through a small interface, ``RecordedCall``, that each kind of record provides — an eager
``Node`` (``opforge.tensor``), the view a replay recording gives of one (``autodiff.replay``) and a program's
``OpDesc`` (``opforge.program.backward``). The rule itself is written with ops, so the same call computes gradients
eagerly (Tensors), records them for higher orders (``create_graph``), or emits gradient ops into a program
(Variables).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .. import ops as F
from ..core import dtypes as D
from ..core.errors import GradientError, OpforgeError, describe
from ..core.opdef import OpDef, flat_ranges
from ..core.spec import Dim, broadcast_shapes
from ..tensor import _host_reads


@runtime_checkable
class RecordedCall(Protocol):
    """What ``call_rule`` reads of a recorded call. Every record a rule runs on provides all of it
    (tests/test_autograd.py checks each kind), so no caller can miss a member another one reads."""

    op: OpDef
    attrs: dict
    in_layout: tuple  # per schema input: -1 for a Tensor (or None), k for a list of k
    out_layout: tuple  # per schema output, likewise

    def saved_inputs(self) -> dict:
        """{rule parameter: forward input} for the inputs the rule names."""

    def saved_output(self, name: str, i: int, create_graph: bool):
        """Forward output ``i`` (a Tensor, a Variable, or a list of them); linked to the call when the backward
        pass is itself recorded."""

    def residual(self, name: str, create_graph: bool):
        """What the kernel saved under ``name`` for the rule (a Tensor), or None (see ``OpDef.saves``)."""

    def zeros(self, k: int):
        """A zero gradient for flat output ``k``, which no gradient reached."""

    def spec(self, where: str, i: int):
        """Spec(s) of schema input (``where`` "in") or output ("out") ``i``."""

    def needs_input_grad(self) -> tuple:
        """Per schema input: whether its gradient is wanted."""


def call_rule(call: RecordedCall, out_grads: list, create_graph: bool = False) -> list:
    """Run ``call.op``'s gradient rule; ``out_grads`` holds one gradient (or None) per flat output. Returns one
    gradient (or None) per flat input, in the order of ``call.in_layout``."""
    op = call.op
    rule = op.grad_rule
    kwargs = call.saved_inputs()
    for name, i in rule.saved_outputs:
        kwargs[name] = call.saved_output(name, i, create_graph)
    if len(out_grads) == 1 and call.out_layout == (-1,):  # one output (nearly every op): no ranges to work out
        for name, _ in rule.output_grads:
            kwargs[name] = out_grads[0] if out_grads[0] is not None or name in rule.none_grads else call.zeros(0)
    elif rule.output_grads:
        ranges = flat_ranges(call.out_layout)
        for name, i in rule.output_grads:
            start, count, is_list = ranges[i]
            if name in rule.none_grads:  # the rule takes None for an output no gradient reached (GradRule)
                grads = out_grads[start:start + count]
            else:
                grads = [out_grads[k] if out_grads[k] is not None else call.zeros(k)
                         for k in range(start, start + count)]
            kwargs[name] = grads if is_list else grads[0]
    for name, where, i in rule.spec_params:
        kwargs[name] = call.spec(where, i)
    attrs = call.attrs
    for name in rule.attrs:
        kwargs[name] = attrs[name]
    if rule.wants_needs:
        kwargs["needs_input_grad"] = call.needs_input_grad()
    for name in rule.residuals:
        kwargs[name] = call.residual(name, create_graph)
    try:
        if not create_graph:
            return flatten_input_grads(op, rule.fn(**kwargs), call.in_layout)
        reads = _host_reads.count
        result = rule.fn(**kwargs)
    except OpforgeError as e:
        raise _in_rule_of(op, e) from e
    if _host_reads.count != reads:  # the values went through NumPy: what came back is cut from the graph
        raise GradientError(
            f"gradient rule of op '{op.name}' read tensor values out to NumPy (.numpy(), .item(), np.* on a Tensor) "
            "while the backward pass is recorded (create_graph=True, higher-order gradients): a gradient computed "
            "in NumPy has no history, so its own derivative would silently be missing. Write the rule with ops "
            "(F.*, Tensor operators)"
        )
    return flatten_input_grads(op, result, call.in_layout)


def _in_rule_of(op, error: OpforgeError) -> OpforgeError:
    """``error``, raised inside ``op``'s gradient rule (by an op the rule called), saying whose rule it was: else
    a backward pass fails naming only an op the user never called."""
    prefix = f"in the gradient rule of '{op.name}': "
    message = str(error)
    if message.startswith(prefix) or f"gradient rule of op '{op.name}'" in message:
        return error
    try:
        return type(error)(prefix + message)
    except TypeError:  # an error class whose constructor takes more than a message
        return error


def flatten_input_grads(op, result, in_layout: tuple) -> list:
    """A rule's result (one value, a tuple in input order, or a dict by name) -> one gradient per flat input."""
    names = op.input_names
    if type(result) is tuple and len(result) == len(in_layout) and max(in_layout) < 0:
        return list(result)  # the common case: one gradient per plain input
    if isinstance(result, dict):
        unknown = set(result) - set(names)
        if unknown:
            raise GradientError(
                f"gradient rule of op '{op.name}' returned gradients for {sorted(unknown)}, "
                f"which are not inputs of the op {list(names)}"
            )
        per_input = [result.get(n) for n in names]
    elif len(names) == 1 and (in_layout[0] >= 0 or not isinstance(result, (tuple, list))):
        per_input = [result]  # one input: the value itself (a list of gradients for a Tensor[] input)
    elif isinstance(result, (tuple, list)) and len(result) == len(names):
        per_input = list(result)
    else:
        got = f"{len(result)} values" if isinstance(result, (tuple, list)) else describe(result)
        raise GradientError(
            f"gradient rule of op '{op.name}' must return {len(names)} gradient(s), one per input "
            f"{list(names)} (or a dict by name), returned {got}"
        )
    flat = []
    for name, n, g in zip(names, in_layout, per_input):
        if n < 0:
            flat.append(g)
        elif g is None:
            flat.extend([None] * n)
        elif not isinstance(g, (list, tuple)):
            flat.extend([g] * n)  # one gradient for a Tensor[] input: the same for each of its tensors
        elif isinstance(g, (list, tuple)) and len(g) == n:
            flat.extend(g)
        else:
            raise GradientError(
                f"gradient rule of op '{op.name}' must return a list of {n} gradients for input '{name}' "
                f"(a Tensor[] of {n}), returned {describe(g)}"
            )
    return flat


def fit(op, label: str, g, shape: tuple, dtype, value_type: type):
    """Check one gradient a rule returned for input ``label`` of ``shape`` and ``dtype``: a ``value_type`` (Tensor
    eagerly, Variable in a program), of the input's shape — a gradient that is larger than its broadcast input is
    summed down to it here, once, so rules never do it — and cast to the input's dtype."""
    if not isinstance(g, value_type):
        raise GradientError(
            f"gradient rule of op '{op.name}' returned {describe(g)} for input '{label}'; rules compute with ops "
            f"(F.*, Tensor operators) and return {value_type.__name__}s here"
        )
    have, want = _known(g.shape), _known(shape)
    if not _same(have, want):
        try:
            fits = _same(broadcast_shapes(want, have), have)  # the input broadcasts to the gradient's shape
        except ValueError:
            fits = False
        if not fits:
            raise GradientError(
                f"gradient rule of op '{op.name}' returned a gradient of shape {tuple(g.shape)} for input '{label}' "
                f"of shape {tuple(shape)}: it must have the input's shape or broadcast from it"
            )
        g = F.sum_to(g, shape=shape)
    if g.dtype != dtype:
        if not D.is_floating(g.dtype):
            raise GradientError(f"gradient rule of op '{op.name}' returned a {g.dtype} gradient for input '{label}' "
                                f"of dtype {dtype}")
        g = F.cast(g, dtype=dtype)
    return g


def fit_inputs(node, grads: list, value_type: type) -> list:
    """``grads`` (one per flat input of the eager ``node``, as ``call_rule`` returns them) with each one that goes
    somewhere fitted to its input (``fit``), in place; a gradient of the input's shape and dtype is left as it is."""
    in_meta = node.in_meta
    for i, (edge, g) in enumerate(zip(node.edges, grads)):
        if edge is not None and g is not None and (type(g) is not value_type
                                                   or in_meta[i] != (g._data.shape, g._data.dtype)):
            grads[i] = fit(node.op, input_label(node.op, i, node.in_layout), g, *in_meta[i], value_type)
    return grads


def _same(a: tuple, b: tuple) -> bool:
    """Whether two shapes can be equal (None, a size known only at run time, matches any size)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _known(shape) -> tuple:
    """A shape with each run-time dim (a Dim of a program variable, or None) as None."""
    return tuple(None if d is None or isinstance(d, Dim) else d for d in shape)


def input_label(op, flat_index: int, in_layout: tuple) -> str:
    """The name of the flat input ``flat_index`` ("x", or "xs[2]" inside a list input)."""
    i = 0
    for name, n in zip(op.input_names, in_layout):
        if n < 0:
            if i == flat_index:
                return name
            i += 1
        else:
            if flat_index < i + n:
                return f"{name}[{flat_index - i}]"
            i += n
    return f"#{flat_index}"


def missing_rule(op_name: str, path: list, fix: str) -> GradientError:
    """The error for an op without a gradient rule on the path being differentiated (``path``: op names from it
    to the output)."""
    return GradientError(
        f"op '{op_name}' has no gradient rule, but it lies on the path to the output being differentiated "
        f"({' -> '.join(path)}); give it one with @{op_name}.grad, mark it traits=['no_grad'], or {fix}"
    )

