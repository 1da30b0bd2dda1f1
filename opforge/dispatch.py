"""Turn an op definition into a callable: bind the call to the schema, check it, pick the kernel, run it
eagerly and record it for autograd — or hand it to the program being traced.

``op(signature)`` is the public ``@of.op`` decorator. For each op it *generates* the functional API
(``opforge.ops.<name>``) as real Python source, once: the function has the schema's exact signature,
type-checks attrs inline and, when every input is already a Tensor, runs a straight-line fast path.
Everything unusual (Python scalars, arrays, ``Tensor[]`` inputs, symbolic program variables, errors)
goes through ``_general``, so the fast path stays short.
"""

from __future__ import annotations

import inspect
import linecache
from collections import namedtuple

import numpy as np

from .core import dtypes as D
from .core.errors import ArgumentError, OpforgeError, SchemaError, describe
from .core.grad_mode import state as _grad_state
from .core.opdef import OpDef, flat_ranges, registry, split_by_layout
from .core.random import generator as _generator
from .core.schema import check_attr, parse_signature
from .core.spec import Spec
from .tensor import Node, Tensor, _new

# Types of symbolic values (program variables) and the function that records an op applied to them.
# The program layer registers itself here; dispatch does not import it.
_symbolic_handlers: dict = {}


class _Tracing:
    """How many traces are running (in any thread). While one is, every call takes the general path, which
    asks ``current_program`` whether this thread is tracing: then even ops on eager Tensors (parameters) or
    with no inputs at all (random ops) are recorded, not computed once and frozen into the program."""

    active = 0
    current_program = None  # set by the program layer: () -> the program this thread is building, or None


tracing = _Tracing()


def register_symbolic(value_type: type, handler) -> None:
    """``handler(op, inputs, attrs)`` runs instead of a kernel when any input is a ``value_type``."""
    _symbolic_handlers[value_type] = handler


# -- the @of.op decorator ------------------------------------------------------------------------------------

def op(signature: str, traits=(), *, inplace=None, replace: bool = False, infer=None):
    """Define an op from its signature; the decorated function becomes its CPU kernel (all dtypes).

    Returns the ``OpDef``, whose ``.kernel``, ``.infer``, ``.grad``, ``.check`` and ``.samples`` methods
    complete the definition, and which is callable like ``opforge.ops.<name>``.
    """
    schema = parse_signature(signature)

    def define(kernel_fn) -> OpDef:
        code = getattr(kernel_fn, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(kernel_fn)
        opdef = OpDef(schema, traits, inplace=inplace, doc=inspect.getdoc(kernel_fn) or "", defined_at=where)
        _check_kernel_signature(opdef, kernel_fn)
        opdef.add_kernel(kernel_fn, "cpu", None)
        if infer is not None:
            opdef.infer(infer)
        opdef.fn = _generate_api(opdef)
        registry.add(opdef, replace=replace)
        return opdef

    return define


def _check_kernel_signature(opdef: OpDef, fn) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or ufunc: trust it
    try:
        extra = {name: None for name in ("rng", "out") if name in sig.parameters}
        sig.bind(*(None for _ in opdef.inputs), **{p.name: None for p in opdef.attrs}, **extra)
    except TypeError as e:
        wanted = ", ".join(opdef.input_names)
        attrs = ", ".join(p.name for p in opdef.attrs)
        raise SchemaError(
            f"kernel of op '{opdef.name}' must take the inputs ({wanted}) positionally"
            f"{' and the attrs (' + attrs + ') by keyword' if attrs else ''}; it has the signature "
            f"{fn.__name__}{sig}: {e}"
        ) from None


# -- generating the functional API ----------------------------------------------------------------------------

_ATTR_FAST_TYPE = {"int": "int", "float": "float", "bool": "bool", "str": "str"}


def _generate_api(opdef: OpDef):
    """Write and compile the function ``opforge.ops.<name>`` for this op."""
    schema = opdef.schema
    params, star = [], False
    for p in schema.params:
        if p.keyword_only and not star:
            params.append("*")
            star = True
        params.append(f"{p.name}=_of_default_{p.name}" if p.has_default else p.name)

    lines = [f"def {opdef.name}({', '.join(params)}):"]
    env = {
        "_of_op": opdef, "_of_T": Tensor, "_of_nd": np.ndarray, "_of_asarray": np.asarray,
        "_of_new": _new, "_of_gs": _grad_state, "_of_general": _general, "_of_find": _find_kernel,
        "_of_fail": _kernel_failed, "_of_rng": _generator, "_of_tracing": tracing,
        "_of_check": check_attr, "_of_bad_dtype": _bad_dtype, "_of_wrap": _wrap_outputs,
    }
    for p in schema.params:
        if p.has_default:
            env[f"_of_default_{p.name}"] = p.default
    for p in schema.attrs:
        env[f"_of_p_{p.name}"] = p
        fast = _ATTR_FAST_TYPE.get(p.type) if not p.is_list else None
        cond = f"type({p.name}) is not {fast}" if fast else "True"
        if p.optional:
            cond = f"{p.name} is not None and {cond}" if fast else f"{p.name} is not None"
        lines.append(f"    if {cond}:")
        lines.append(f"        {p.name} = _of_check(_of_p_{p.name}, {p.name}, {opdef.name!r})")
    attrs = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in schema.attrs) + "}"
    inputs_src = "(" + "".join(f"{p.name}, " for p in schema.inputs) + ")"
    lines.append("    if _of_tracing.active:")
    lines.append(f"        return _of_general(_of_op, {inputs_src}, {attrs})")
    lines.append("    if _of_op.validate is not None:")
    lines.append(f"        _of_op.validate({attrs})")
    inputs = schema.inputs
    tuple_src = "(" + "".join(f"{p.name}, " for p in inputs) + ")"

    plain = inputs and all(not p.is_list and not p.optional for p in inputs)
    opdef.fast_path = bool(plain and not any(o.is_list for o in opdef.outputs))
    if opdef.fast_path:
        first = inputs[0].name
        cond = " and ".join(f"type({p.name}) is _of_T" for p in inputs)
        cond += "".join(f" and {p.name}._device is {first}._device" for p in inputs[1:])
        lines.append(f"    if {cond}:")
        for p in inputs:
            if p.dtypes is not None:
                env[f"_of_dt_{p.name}"] = p.dtypes
                lines.append(f"        if {p.name}._data.dtype not in _of_dt_{p.name}:")
                lines.append(f"            _of_bad_dtype(_of_op, {p.name!r}, {p.name})")
        if "elementwise" in opdef.traits and len(inputs) > 1:  # NumPy would broadcast: the trait says same shape
            same = " or ".join(f"{p.name}._data.shape != {first}._data.shape" for p in inputs[1:])
            lines.append(f"        if {same}:")
            lines.append(f"            _of_fail(_of_op, {tuple_src}, {attrs}, None)")
        lines.append("        try:")
        lines.append(f"            _of_k = _of_op.kernel_table[{first}._device][{first}._data.dtype]")
        lines.append("        except KeyError:")
        lines.append(f"            _of_k = _of_find(_of_op, {first}._device, {first}._data.dtype)")
        kw = "".join(f", {p.name}={p.name}" for p in schema.attrs)
        args = ", ".join(f"{p.name}._data" for p in inputs)
        lines.append("        try:")
        lines.append(f"            _of_out = _of_k({args}{kw}{', rng=_of_rng()' if 'random' in opdef.traits else ''})")
        lines.append("        except Exception as _of_e:")
        lines.append(f"            _of_fail(_of_op, {tuple_src}, {attrs}, _of_e)")
        if "no_grad" not in opdef.traits:
            needs = " or ".join(f"{p.name}._requires_grad" for p in inputs if p.differentiable)
            if needs:
                lines.append(f"        if _of_gs.enabled and ({needs}):")
                lines.append(f"            return _of_op.record({tuple_src}, {attrs}, _of_out)")
        if len(opdef.outputs) == 1:
            lines.append("        if type(_of_out) is not _of_nd:")
            lines.append("            _of_out = _of_asarray(_of_out)")
            lines.append(f"        return _of_new(_of_out, False, None, 0, {first}._device)")
        else:
            lines.append(f"        return _of_wrap(_of_op, _of_out, {first}._device)")
    lines.append(f"    return _of_general(_of_op, {tuple_src}, {attrs})")
    source = "\n".join(lines) + "\n"

    filename = f"<opforge.ops.{opdef.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    exec(compile(source, filename, "exec"), env)
    fn = env[opdef.name]
    fn.__module__ = "opforge.ops"
    fn.__qualname__ = opdef.name
    fn.__doc__ = _docstring(opdef)
    fn.__signature__ = _python_signature(opdef)
    fn.opdef = opdef
    fn.source = source
    _set_record(opdef)
    opdef.rule_listeners.append(_set_record)
    if len(opdef.outputs) > 1:
        opdef.result_type = namedtuple(f"{opdef.name}_result", opdef.output_names)
    return fn


def _python_signature(opdef: OpDef) -> inspect.Signature:
    kinds = inspect.Parameter
    params = []
    for p in opdef.schema.params:
        kind = kinds.KEYWORD_ONLY if p.keyword_only else kinds.POSITIONAL_OR_KEYWORD
        annotation = {"Tensor": "Tensor", "int": "int", "float": "float", "bool": "bool", "str": "str",
                      "dtype": "dtype"}[p.type]
        if p.is_list:
            annotation = f"list[{annotation}]"
        if p.optional:
            annotation += " | None"
        default = (list(p.default) if isinstance(p.default, tuple) else p.default) if p.has_default \
            else kinds.empty
        params.append(kinds(p.name, kind, default=default, annotation=annotation))
    ret = "Tensor" if len(opdef.outputs) == 1 else f"tuple[{', '.join('Tensor' for _ in opdef.outputs)}]"
    return inspect.Signature(params, return_annotation=ret)


def _docstring(opdef: OpDef) -> str:
    parts = [str(opdef.schema)]
    if opdef.doc:
        parts.append(opdef.doc)
    if opdef.traits:
        parts.append("Traits: " + ", ".join(sorted(opdef.traits)) + ".")
    parts.append(f"Defined at {opdef.defined_at}.")
    return "\n\n".join(parts)


# -- the parts the generated code calls ------------------------------------------------------------------------

def _find_kernel(opdef: OpDef, device: str, dtype):
    kernel = opdef.find_kernel(device, dtype)
    opdef.kernel_table.setdefault(device, {})[dtype] = kernel.fn
    return kernel.fn


def _bad_dtype(opdef: OpDef, name: str, value) -> None:
    p = opdef.schema.param(name)
    raise ArgumentError(
        f"{opdef.name}(): argument '{name}' expected dtype {' or '.join(map(str, p.dtypes))}, "
        f"got {value.dtype}"
    )


def _kernel_failed(opdef: OpDef, inputs: tuple, attrs: dict, error: Exception | None):
    """Explain a call the kernel failed on (or, with ``error`` None, one the shape rule must refuse)."""
    if isinstance(error, OpforgeError):
        raise error
    specs = [[Spec(t.shape, t.dtype) for t in v] if isinstance(v, list) else
             (None if v is None else Spec(v.shape, v.dtype)) for v in inputs]
    opdef.check_shapes(specs, attrs, error)


def _wrap_outputs(opdef: OpDef, out, device: str):
    """Kernel results -> Tensors, shaped as the schema says (one, a list, or a named tuple)."""
    if len(opdef.outputs) == 1:
        return _wrap_one(opdef.outputs[0], out, device, opdef)
    if not isinstance(out, (tuple, list)) or len(out) != len(opdef.outputs):
        raise OpforgeError(
            f"kernel of op '{opdef.name}' must return {len(opdef.outputs)} arrays "
            f"{list(opdef.output_names)}, returned {describe(out)}"
        )
    return opdef.result_type(*(_wrap_one(o, v, device, opdef) for o, v in zip(opdef.outputs, out)))


def _wrap_one(output, value, device, opdef):
    if output.is_list:
        if not isinstance(value, (list, tuple)):
            raise OpforgeError(f"kernel of op '{opdef.name}' must return a list for output '{output.name}'")
        return [_new(np.asarray(v), False, None, 0, device) for v in value]
    return _new(value if type(value) is np.ndarray else np.asarray(value), False, None, 0, device)


def _record(opdef: OpDef, inputs: tuple, attrs: dict, out):
    """Wrap the outputs of a call that autograd must see, and link them to a new graph Node."""
    flat, in_layout = [], []
    for p, v in zip(opdef.inputs, inputs):
        if p.is_list:
            in_layout.append(len(v))
            flat.extend((t, p.differentiable) for t in v)
        else:
            in_layout.append(-1)
            flat.append((v, p.differentiable))
    edges = []
    for t, differentiable in flat:
        if t is None or not differentiable or not (t._requires_grad):
            edges.append(None)
        elif t._node is not None:
            edges.append((t._node, t._index))
        else:
            edges.append((t, -1))
    device = next(t for t, _ in flat if t is not None)._device
    outs, out_layout = _flatten_outputs(opdef, out)
    rule = opdef.grad_rule
    saved, saved_out = {}, {}
    if rule is not None:
        for name, i in rule.saved_inputs:
            saved[name] = inputs[i]
        for name, i in rule.saved_outputs:
            start, count, _ = flat_ranges(out_layout)[i]
            saved_out[name] = [(k, outs[k]) for k in range(start, start + count)]
    node = Node(
        opdef, attrs, tuple(edges), tuple(in_layout),
        tuple(None if t is None else (t._data.shape, t._data.dtype) for t, _ in flat),
        out_layout, tuple((a.shape, a.dtype) for a in outs), saved, saved_out,
    )
    tensors = [_new(a, True, node, i, device) if D.is_floating(a.dtype) else _new(a, False, None, 0, device)
               for i, a in enumerate(outs)]
    return _restructure(opdef, tensors, out_layout)


def _set_record(opdef: OpDef) -> None:
    """Give the op its ``record(inputs, attrs, out)``: generated straight-line code when every input is a
    differentiable Tensor and there is one output (most ops), else the general ``_record``."""
    inputs = opdef.inputs
    plain = (inputs and all(not p.is_list and not p.optional and p.differentiable for p in inputs)
             and len(opdef.outputs) == 1 and not opdef.outputs[0].is_list)
    if not plain:
        opdef.record = lambda inputs, attrs, out: _record(opdef, inputs, attrs, out)
        return
    rule = opdef.grad_rule
    names = [p.name for p in inputs]
    edge = "(None if not {0}._requires_grad else ({0}._node, {0}._index) if {0}._node is not None else ({0}, -1))"
    saved = "{" + ", ".join(f"{n!r}: {names[i]}" for n, i in (rule.saved_inputs if rule else ())) + "}"
    saved_out = "{" + ", ".join(f"{n!r}: [(0, out)]" for n, _ in (rule.saved_outputs if rule else ())) + "}"
    source = "\n".join([
        "def record(inputs, attrs, out):",
        f"    {', '.join(names)}, = inputs",
        "    if type(out) is not _of_nd:",
        "        out = _of_asarray(out)",
        "    if out.dtype.kind != 'f' and out.dtype is not _of_bf16:",  # D.is_floating, inlined
        f"        return _of_new(out, False, None, 0, {names[0]}._device)",
        "    node = _of_Node(_of_op, attrs, (" + "".join(edge.format(n) + ", " for n in names) + "), _of_layout,",
        "                    (" + "".join(f"({n}._data.shape, {n}._data.dtype), " for n in names) + "),",
        f"                    (-1,), ((out.shape, out.dtype),), {saved}, {saved_out})",
        f"    return _of_new(out, True, node, 0, {names[0]}._device)",
    ]) + "\n"
    env = {"_of_op": opdef, "_of_nd": np.ndarray, "_of_asarray": np.asarray, "_of_new": _new, "_of_Node": Node,
           "_of_layout": (-1,) * len(inputs), "_of_bf16": D.bfloat16}
    exec(compile(source, f"<opforge.record.{opdef.name}>", "exec"), env)
    opdef.record = env["record"]
    opdef.record_source = source


def _flatten_outputs(opdef: OpDef, out):
    if len(opdef.outputs) == 1:
        out = (out,)
    if not isinstance(out, (tuple, list)) or len(out) != len(opdef.outputs):
        raise OpforgeError(
            f"kernel of op '{opdef.name}' must return {len(opdef.outputs)} arrays, returned {describe(out)}"
        )
    flat, layout = [], []
    for o, v in zip(opdef.outputs, out):
        if o.is_list:
            layout.append(len(v))
            flat.extend(np.asarray(a) for a in v)
        else:
            layout.append(-1)
            flat.append(v if type(v) is np.ndarray else np.asarray(v))
    return flat, tuple(layout)


def _restructure(opdef: OpDef, flat: list, layout: tuple):
    """Flat list of per-output values -> the op's result shape (a value, a list, or a named tuple)."""
    result = split_by_layout(flat, layout)
    if len(result) == 1:
        return result[0]
    return opdef.result_type(*result)


def _general(opdef: OpDef, inputs: tuple, attrs: dict):
    """The slow path: symbolic inputs, Python scalars and arrays, lists of tensors, devices, no inputs."""
    if _symbolic_handlers:
        for v in inputs:
            for item in v if isinstance(v, (list, tuple)) else (v,):
                handler = _symbolic_handlers.get(type(item))
                if handler is not None:
                    return handler(opdef, inputs, attrs)
        if tracing.active and tracing.current_program() is not None:
            return next(iter(_symbolic_handlers.values()))(opdef, inputs, attrs)
    inputs = _coerce_inputs(opdef, inputs)
    if opdef.fast_path and all(t._device is inputs[0]._device for t in inputs):
        return opdef.fn(**dict(zip(opdef.input_names, inputs)), **attrs)  # now all Tensors: the fast path
    tensors = [t for v in inputs for t in (v if isinstance(v, list) else (v,)) if t is not None]
    if tensors:
        device, dtype = tensors[0]._device, tensors[0]._data.dtype
        for t in tensors[1:]:
            if t._device != device:
                raise ArgumentError(
                    f"{opdef.name}(): inputs are on different devices: '{device}' and '{t._device}'"
                )
    else:
        device, dtype = "cpu", attrs.get("dtype") or D.DEFAULT_FLOAT
    for p, v in zip(opdef.inputs, inputs):
        if p.dtypes is not None:
            for t in v if isinstance(v, list) else (v,):
                if t is not None and t._data.dtype not in p.dtypes:
                    _bad_dtype(opdef, p.name, t)
    kernel = opdef.find_kernel(device, dtype)
    arrays = [[t._data for t in v] if isinstance(v, list) else (None if v is None else v._data) for v in inputs]
    extra = {"rng": _generator()} if kernel.takes_rng else {}
    try:
        out = kernel.fn(*arrays, **attrs, **extra)
    except Exception as e:
        _kernel_failed(opdef, inputs, attrs, e)
    if (
        "no_grad" not in opdef.traits
        and _grad_state.enabled
        and any(p.differentiable and t is not None and t._requires_grad
                for p, v in zip(opdef.inputs, inputs) for t in (v if isinstance(v, list) else (v,)))
    ):
        return opdef.record(inputs, attrs, out)
    flat, layout = _flatten_outputs(opdef, out)
    return _restructure(opdef, [_new(a, False, None, 0, device) for a in flat], layout)


def _coerce_inputs(opdef: OpDef, inputs: tuple) -> tuple:
    """Python scalars, arrays and lists in tensor slots become Tensors; anything else is refused here."""
    peers = {v._data.dtype for v in inputs if type(v) is Tensor}
    peer = (peers.pop() if len(peers) == 1 else D.promote(*peers)) if peers else None
    out = []
    for p, v in zip(opdef.inputs, inputs):
        if p.is_list:
            if not isinstance(v, (list, tuple)):
                raise ArgumentError(f"{opdef.name}(): argument '{p.name}' expected a list of Tensors, "
                                    f"got {describe(v)}")
            out.append([_as_tensor(opdef, f"{p.name}[{i}]", t, peer) for i, t in enumerate(v)])
        elif v is None:
            if not p.optional:
                raise ArgumentError(f"{opdef.name}(): argument '{p.name}' expected Tensor, got None")
            out.append(None)
        else:
            out.append(_as_tensor(opdef, p.name, v, peer))
    return tuple(out)


def _as_tensor(opdef: OpDef, name: str, value, peer) -> Tensor:
    if type(value) is Tensor or isinstance(value, Tensor):
        return value
    if type(value) in (bool, int, float):  # a Python number is weak: it takes its peer's dtype
        return _new(np.asarray(value, dtype=D.scalar_dtype(value, peer)))
    if isinstance(value, (np.ndarray, np.generic, list, tuple)):  # NumPy values keep their dtype
        from .creation import as_array

        try:
            return _new(as_array(value))
        except ArgumentError as e:
            raise ArgumentError(f"{opdef.name}(): argument '{name}': {e}") from None
    raise ArgumentError(f"{opdef.name}(): argument '{name}' expected Tensor, got {describe(value)}")


__all__ = ["op", "register_symbolic"]
