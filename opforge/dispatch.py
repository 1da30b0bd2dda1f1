"""Give every declared op its callable, and every op call its meaning through one boundary.

**The functional API.** ``make_functions`` *generates* ``opforge.ops.<name>`` for each declared op (see
``opforge.core.declare``) as real Python source, once: the function has the schema's exact signature, type-checks
attrs inline, asks one cheap question ("is the innermost interpreter eager?", ``opforge.core.interpreters``) and,
when every input is a Tensor on one device, runs a straight-line path to the kernel. Everything unusual (Python
scalars, arrays, ``Tensor[]`` inputs, symbolic values, errors) goes through ``run_eagerly``, so the fast path stays
short. ``install`` makes this module the function maker and gives ``EAGER`` its meaning; ``opforge/__init__.py``
calls it once, right after this module loads.

**One home per decision.** The kernel a call runs is ``OpDef.kernel_for``'s choice, on both paths here, in replay
and in the executor; what may come in a tensor slot, and what a Python number or array becomes there, is
``coerce_inputs``'s rule, for eager calls, tracing and sharding alike.
"""

from __future__ import annotations

import os
import weakref
from types import FunctionType, MappingProxyType

import numpy as np

from .core import codegen, floating_point
from .core import dtypes as D
from .core.declare import give_functions
from .core.devices import default_device
from .core.errors import ArgumentError, OpforgeError, SchemaError, describe, out_of_memory
from .core.grad_mode import _mode as _grad_mode
from .core.interpreters import EAGER, EagerInterpreter, Interpreter, _innermost, current_interpreter, interpreting
from .core.opdef import OpDef, flat_ranges, split_by_layout
from .core.schema import check_attr
from .core.spec import Dim, Spec
from .tensor import (
    Node,
    Tensor,
    TensorOps,
    _epoch,
    as_array,
    note_view,
    note_write,
    tensor_source,
    wrap,
    wrap_output,
)


def install() -> None:
    """Make this module the giver of op functions (to the ops declared so far, and to each one declared after)
    and of ``EAGER``'s meaning. Called once, by ``opforge/__init__.py``."""
    EAGER.bind(_apply_eagerly, _assign_in_place)
    give_functions(make_functions)


def make_functions(opdef: OpDef) -> None:
    """Give a declared op its function (``opforge.ops.<name>``) and the code that records its calls for autograd;
    both are written again when its gradient rule changes (the rule says what a recorded call keeps)."""
    opdef.fn = _generate_api(opdef)
    _generate_attach(opdef)
    opdef.rule_listeners += [_generate_attach, _generate_api]  # a plain op's function runs attach's lines


def _apply_eagerly(op: OpDef, inputs: tuple, attrs: dict):
    """``EAGER.apply``: run the call now (its attrs checked as every call's are)."""
    if op.validate is not None:
        op.validate(attrs)
    return _run_eagerly(op, inputs, attrs)


def _assign_in_place(target: Tensor, value) -> None:
    """``EAGER.assign``: write ``value`` into ``target``'s memory now, counting the write."""
    data = value._data if isinstance(value, Tensor) else target._device.from_host(np.asarray(value))
    if tuple(data.shape) != target.shape:
        raise ArgumentError(f"assign(): value of shape {tuple(data.shape)} for a tensor of shape {target.shape}")
    target._device.copy_into(target._data, data)
    note_write(target._data, "an in-place update (assign)")  # what saved the old value must not backward


_debug = False  # set_debug(): every eager call checks its kernel's outputs against the op's shape rule
_api_functions: weakref.WeakSet = weakref.WeakSet()  # every generated API function (set_debug turns off their fast
#                                                     paths)


def set_debug(enabled: bool = True) -> bool:
    """Debug mode (also ``OPFORGE_DEBUG=1`` in the environment): every eager op call checks that its kernel
    returned what the op's shape rule says — shapes and dtypes — and raises ``SchemaError`` at the call if not,
    which catches a custom op whose kernel disagrees with its trait or ``@op.infer`` (``check_op`` always checks
    this). It costs each call the shape rule: the generated fast paths are off meanwhile. Returns the previous
    setting."""
    global _debug
    previous, _debug = _debug, bool(enabled)
    for fn in _api_functions:
        fn.__globals__["_of_eager"] = None if _debug else EAGER  # no interpreter is None: all take the checked path
    return previous


def owner_of(values) -> Interpreter:
    """The interpreter that values belong to: a program's tracer for its variables (even after the trace ended),
    ``EAGER`` for Tensors. ``of.grad`` asks it, since differentiating depends on what the values are."""
    return _symbolic_owner(values) or EAGER


def _symbolic_owner(values) -> Interpreter | None:
    for v in values:
        for item in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(item, TensorOps) and type(item) is not Tensor:
                return item.interpreter
    return None


# -- generating the functional API ----------------------------------------------------------------------------

_ATTR_FAST_TYPE = {"int": "int", "float": "float", "bool": "bool", "str": "str"}


# The code of an op's function until its first call, which writes and compiles the function's source
# (_compile_api) and gives the function that code: the function object stays the one ``opforge.ops`` and every
# importer hold. A process calls few of the ops: writing and compiling all of them took 70 of the 350 ms of
# ``import opforge``, and a rule given after the op's definition (most) would have them written twice.
_UNCOMPILED = next(c for c in compile("def _(*args, **kwargs):\n    return _of_compile()(*args, **kwargs)\n",
                                      "<opforge.ops>", "exec").co_consts if hasattr(c, "co_code"))


def _attr_checks(opdef: OpDef, env: dict) -> list:
    """Lines that type-check (and normalise) each attr; a value already of the exact type skips the call."""
    lines = []
    for p in opdef.attrs:
        env[f"_of_p_{p.name}"] = p
        check = f"{p.name} = _of_check(_of_p_{p.name}, {p.name}, {opdef.name!r})"
        fast = _ATTR_FAST_TYPE.get(p.type) if not p.is_list else None
        cond = f"type({p.name}) is not {fast}" if fast else None
        if p.optional:
            cond = f"{p.name} is not None" + (f" and {cond}" if cond else "")
        lines += [f"    if {cond}:", f"        {check}"] if cond else [f"    {check}"]
    return lines


def _fast_path(opdef: OpDef, env: dict, inputs_src: str, attrs_src: str) -> list:
    """The straight-line path for calls whose inputs are all Tensors on the first input's device."""
    inputs = opdef.inputs
    first = inputs[0].name

    def given(p, expr):  # an expression about a Tensor? input that holds when it is None
        return f"({p.name} is None or {expr})" if p.optional else expr

    cond = " and ".join(given(p, f"type({p.name}) is _of_T") for p in inputs)
    cond += "".join(" and " + given(p, f"{p.name}._device is {first}._device") for p in inputs[1:])
    device = "_of_d"
    lines = [f"    if {cond}:", f"        _of_d = {first}._device"]
    checks = {}  # input -> the lines refusing a dtype its parameter does not allow
    for p in inputs:
        if p.dtypes is not None:
            env[f"_of_dt_{p.name}"] = frozenset(p.dtypes)  # hashing beats comparing with each allowed dtype
            test = f"{p.name}._data.dtype not in _of_dt_{p.name}"
            checks[p.name] = [f"        if {f'{p.name} is not None and ' if p.optional else ''}{test}:",
                              f"            _of_bad_dtype(_of_op, {p.name!r}, {p.name})"]
    # The kernel table holds only dtypes of the first input that passed its check (_find_kernel adds them after
    # it): a hit needs no check of its own, a miss makes it first, as before any other input's.
    lines += [
        "        try:",
        f"            _of_k = _of_op.kernel_table[{device}.name][{first}._data.dtype]",
        "        except KeyError:",
        *["    " + line for line in checks.pop(first, [])],
        f"            _of_k = _of_find(_of_op, {device}, {first}._data.dtype)",
    ]
    lines += [line for p in inputs for line in checks.get(p.name, [])]
    if "same_dtype" in opdef.traits and len(inputs) > 1:  # NumPy would promote: the trait says one float dtype
        differ = " or ".join(f"({p.name} is not None and {p.name}._data.dtype is not {first}._data.dtype)"
                             if p.optional else f"{p.name}._data.dtype is not {first}._data.dtype"
                             for p in inputs[1:])
        lines += [f"        if {differ}:", f"            _of_same_dtype(_of_op, {inputs_src})"]
    if "elementwise" in opdef.traits and len(inputs) > 1:  # NumPy would broadcast: the trait says same shape
        same = " or ".join(f"{'(' + p.name + ' is not None and ' if p.optional else ''}"
                           f"{p.name}._data.shape != {first}._data.shape{')' if p.optional else ''}"
                           for p in inputs[1:])
        lines += [f"        if {same}:", f"            _of_fail(_of_op, {inputs_src}, {attrs_src}, None)"]
    args = ", ".join(f"None if {p.name} is None else {p.name}._data" if p.optional else f"{p.name}._data"
                     for p in inputs)
    kw = "".join(f", {p.name}={p.name}" for p in opdef.attrs)
    rng = f", rng={device}.generator()" if "random" in opdef.traits else ""
    needs = "" if "no_grad" in opdef.traits else " or ".join(
        f"({p.name} is not None and {p.name}._requires_grad)" if p.optional else f"{p.name}._requires_grad"
        for p in inputs if p.differentiable)
    saving = bool(opdef.saves and needs)  # the kernel gets a dict for its residuals when the call is recorded
    if saving:
        lines += [f"        _of_save = {{}} if _of_gm.enabled and ({needs}) else None"]
    call = f"_of_k({args}{kw}{rng}{', save=_of_save' if saving else ''})"
    if rng:  # a random kernel would draw again: it runs quiet from the start (see core/floating_point.py)
        lines += ["        try:", "            with _of_quiet():", f"                _of_out = {call}"]
    else:  # a floating-point warning a user's filter made an error: the kernel again, quiet (no cost until then;
        # no closure either: one would make every name it reads a cell, slower to read in the whole function)
        again_kw = ", ".join(f"{p.name!r}: {p.name}" for p in opdef.attrs) + (", 'save': _of_save" if saving else "")
        lines += ["        try:", f"            _of_out = {call}", "        except _of_fp_errors:",
                  f"            _of_out = _of_again(_of_op, {inputs_src}, {attrs_src}, _of_k, ({args},), "
                  f"{{{again_kw.lstrip(', ')}}})"]
    lines += ["        except Exception as _of_e:", f"            _of_fail(_of_op, {inputs_src}, {attrs_src}, _of_e)"]
    # a plain op records its call with attach's own lines, in place (its function is written again when its rule
    # changes: the rule says what the Node keeps); the others call their attach
    if needs:
        lines.append("        if _of_save is not None:" if saving else f"        if _of_gm.enabled and ({needs}):")
        if _plain(opdef):
            lines += _attach_lines(opdef, env, 12, y="_of_out", attrs=attrs_src,
                                   residuals="_of_save" if saving else "None", device=device)
        else:
            lines.append(f"            return _of_op.attach({inputs_src}, {attrs_src}, _of_out"
                         f"{', _of_save' if saving else ''})")
    if len(opdef.outputs) == 1:  # wrap(), written out: a call less on every op
        lines += [f"        if type(_of_out) is not {device}.array_type:",
                  f"            _of_out = {device}.array(_of_out)",
                  *tensor_source("_of_t", "_of_out", device, indent=8),
                  "        return _of_t"]
    else:
        lines.append(f"        return _of_wrap_all(_of_op, _of_out, {device})")
    return lines


# Keywords of NumPy and PyTorch that mean one of our attrs: an op whose signature does not declare them as a second
# spelling (``int axis/dim``: where torch has the argument) tells a call using one the name to use.
_RENAMED = {"dim": "axis", "keepdims": "keepdim"}


def _generate_api(opdef: OpDef):
    """Give the op its function ``opforge.ops.<name>``, or have the one it has take on the op's current rule (a
    plain op's function records its calls with lines written for the rule). Either way its code is written and
    compiled at its next call (_UNCOMPILED); ``fn.source`` then holds it."""
    inputs = opdef.inputs
    opdef.fast_path = bool(inputs and not inputs[0].optional and not any(p.is_list for p in inputs)
                           and not any(o.is_list for o in opdef.outputs) and opdef.out_device is None)
    fn = opdef.fn
    if fn is not None:
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = _UNCOMPILED, None, None
        return fn
    fn = FunctionType(_UNCOMPILED, {"_of_compile": lambda: _compile_api(opdef)}, opdef.name)
    _api_functions.add(fn)
    fn.__module__ = "opforge.ops"
    fn.__qualname__ = opdef.name
    fn.__doc__ = opdef.__doc__
    fn.__signature__ = opdef.__signature__
    fn.opdef = opdef
    return fn


def _compile_api(opdef: OpDef):
    fn = opdef.fn
    source = api_source(opdef, fn.__globals__)
    compiled = codegen.define(source, "ops", opdef.name, fn.__globals__, opdef.name)
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = compiled.__code__, compiled.__defaults__, compiled.__kwdefaults__
    fn.source = source
    return fn


def api_source(opdef: OpDef, env: dict | None = None) -> str:
    """The source of the op's function, as it is written now; ``env`` gets the names it reads."""
    env = {} if env is None else env
    schema = opdef.schema
    # A required argument with a second spelling (gather's axis/dim) may come under either name, so Python cannot
    # require it: it and the positional arguments after it default to _of_absent, and a line asks for them.
    first_open = next((i for i, p in enumerate(schema.params)
                       if p.alias and not p.has_default and not p.keyword_only), len(schema.params))
    params, star, required = [], False, []
    for i, p in enumerate(schema.params):
        if p.keyword_only and not star:
            params.append("*")
            star = True
        if p.has_default:
            params.append(f"{p.name}=_of_default_{p.name}")
        elif i >= first_open or (p.alias and not p.keyword_only):
            params.append(f"{p.name}=_of_absent")
            required.append(p)
        else:
            params.append(p.name)
    names = {p.name for p in schema.params} | {p.alias for p in schema.params if p.alias}
    aliases = [(p.alias, p.name) for p in schema.params if p.alias]
    renamed = [(alias, ours) for alias, ours in _RENAMED.items() if ours in names and alias not in names]
    params += ([] if star or not (aliases or renamed) else ["*"]) + \
        [f"{alias}=_of_absent" for alias, _ in aliases + renamed]
    env.update({
        "_of_op": opdef, "_of_T": Tensor, "_of_wrap": wrap, "_of_gm": _grad_mode,
        "_of_eager": None if _debug else EAGER, "_of_innermost": _innermost.get, "_of_run": _run_eagerly,
        "_of_find": _find_kernel, "_of_fail": _kernel_failed, "_of_check": check_attr, "_of_bad_dtype": _bad_dtype,
        "_of_wrap_all": _wrap_outputs, "_of_absent": _ABSENT, "_of_renamed": _renamed, "_of_spelled": _spelled,
        "_of_same_dtype": check_same_dtype, "_of_new": object.__new__, "_of_quiet": floating_point.quiet,
        "_of_fp_errors": floating_point.ERRORS, "_of_again": _again,
    })
    for p in schema.params:
        if p.has_default:
            env[f"_of_default_{p.name}"] = p.default
    spellings = []  # resolve each second spelling: one test per call when it is not used
    for p in schema.params:
        if p.alias and p in required:
            spellings += [f"    if {p.name} is _of_absent or {p.alias} is not _of_absent:",
                          f"        {p.name} = _of_spelled(_of_op, {p.name!r}, {p.name}, {p.alias})"]
        elif p.alias:  # a default: both given is caught unless the first is given as its default object itself
            spellings += [f"    if {p.alias} is not _of_absent:",
                          f"        {p.name} = _of_spelled(_of_op, {p.name!r}, {p.name}, {p.alias})"]
        elif p in required:
            spellings += [f"    if {p.name} is _of_absent:", f"        _of_spelled(_of_op, {p.name!r}, {p.name})"]
    attrs_src = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in schema.attrs) + "}"
    inputs_src = "(" + "".join(f"{p.name}, " for p in schema.inputs) + ")"
    lines = [f"def {opdef.name}({', '.join(params)}):",
             *[f"    if {alias} is not _of_absent:\n        _of_renamed(_of_op, {alias!r}, {ours!r})"
               for alias, ours in renamed],
             *spellings,
             *_attr_checks(opdef, env),
             "    _of_i = _of_innermost()",
             "    if _of_i is not _of_eager:",
             f"        return _of_i.apply(_of_op, {inputs_src}, {attrs_src})",
             "    if _of_op.validate is not None:",
             f"        _of_op.validate({attrs_src})"]
    eager = len(lines)
    if opdef.fast_path:
        lines += _fast_path(opdef, env, inputs_src, attrs_src)
    lines.append(f"    return _of_run(_of_op, {inputs_src}, {attrs_src})")
    if "view" in opdef.traits and schema.inputs:  # its eager results share memory with its first input: noted
        env["_of_note_view"] = note_view
        first = schema.inputs[0].name
        lines[eager:] = [f"{line.partition('return ')[0]}return _of_note_view({first}, "
                         f"{line.partition('return ')[2]}, _of_op, {attrs_src})"
                         if line.lstrip().startswith("return ") else line for line in lines[eager:]]
    return "\n".join(lines) + "\n"


# -- linking results into the autograd graph ---------------------------------------------------------------------

def _generate_attach(opdef: OpDef) -> None:
    """Give the op its ``attach(inputs, attrs, out)``: generated straight-line code when no input is a list and
    there is one output (most ops), else the general ``_attach``. Regenerated when the gradient rule changes,
    since the rule's parameter names say which inputs and outputs the Node keeps.

    The straight-line code is compiled at the first call of ``attach_args``, not here: the op's own function
    records its calls with these lines written into it, so other callers (few) are left."""
    if not _plain(opdef):
        opdef.attach = lambda inputs, attrs, out, residuals=None: _attach(opdef, inputs, attrs, out, residuals)
        return

    def attach_args(*args):  # until the first recorded call (a caller that kept it gets the compiled one after)
        current = opdef.attach_args
        return (_compile_attach(opdef) if current is attach_args else current)(*args)

    opdef.attach_args = attach_args  # its inputs as arguments, no tuple (the op's own function runs its lines)
    opdef.attach = lambda inputs, attrs, out, residuals=None: opdef.attach_args(*inputs, attrs, out, residuals)


def _compile_attach(opdef: OpDef):
    """The op's straight-line attach, compiled; it replaces the stand-in in ``opdef.attach_args``."""
    env = {"_of_op": opdef, "_of_wrap": wrap, "_of_new": object.__new__, "_of_T": Tensor}
    names = "".join(p.name + ", " for p in opdef.inputs)
    source = "\n".join([f"def attach_args({names}_of_attrs, _of_y, _of_residuals=None):",
                        *_attach_lines(opdef, env, indent=4)]) + "\n"
    attach_args = codegen.define(source, "attach", opdef.name, env, "attach_args")
    opdef.attach_args = attach_args
    return attach_args


def _attach_lines(opdef: OpDef, env: dict, indent: int, y: str = "_of_y", attrs: str = "_of_attrs",
                  residuals: str = "_of_residuals", device: str | None = None) -> list:
    """The body of a plain op's attach: it links ``y``, the kernel's result for the inputs (under their schema
    names), ``attrs`` and ``residuals`` (expressions or names) into the graph and returns the output Tensor.
    ``device``: a name already holding the first input's device. The op's function runs these same lines, with
    its own names, in place of a call to attach (a call less on every recorded op); ``env`` gets the names they
    read."""
    inputs = opdef.inputs
    rule = opdef.grad_rule
    names = [p.name for p in inputs]
    env.update({"_of_Node": Node, "_of_layout": (-1,) * len(inputs), "_of_out_layout": (-1,), "_of_bf16": D.bfloat16,
                "_of_epoch": _epoch, "_of_nothing": _NOTHING})

    def edge(p):
        if not p.differentiable:
            return "None"
        n = p.name
        edge = f"(None if not {n}._requires_grad else ({n}._node, {n}._index) if {n}._node is not None else ({n}, -1))"
        return f"(None if {n} is None else {edge})" if p.optional else edge

    def meta(p):
        n = p.name
        return f"(None if {n} is None else ({n}._data.shape, {n}._data.dtype))" if p.optional \
            else f"({n}._data.shape, {n}._data.dtype)"

    # A Node keeps its saved outputs in tuples, and one shared empty mapping when its rule saves nothing: lists and
    # dicts per Node made Python's cyclic collector work through every recorded graph (bench/run.py's chain of 200
    # small ops: 4.8 -> 3.9 µs per op forward+backward, three alternating runs of its worker each).
    saved = "{" + ", ".join(f"{n!r}: {names[i]}" for n, i in (rule.saved_inputs if rule else ())) + "}"
    saved = "_of_nothing" if saved == "{}" else saved
    saved_out = "{" + ", ".join(f"{n!r}: ((0, {y}),)" for n, _ in (rule.saved_outputs if rule else ())) + "}"
    saved_out = "_of_nothing" if saved_out == "{}" else saved_out
    # Node(...) and wrap_output(...) written out field by field: a tenth of a µs less per recorded call (a third
    # of what recording adds to a small op); tests/test_autograd.py checks that they set what the two set. Every
    # name but the inputs' has the _of_ prefix, so that no input name can shadow it.
    lines = [] if device else [f"_of_device = {names[0]}._device"]
    device = device or "_of_device"
    lines += [
        f"if type({y}) is not {device}.array_type:",
        f"    {y} = {device}.array({y})",
        f"_of_dtype = {y}.dtype",
        "if _of_dtype.kind != 'f' and _of_dtype is not _of_bf16:",  # D.is_floating, inlined
        f"    return _of_wrap({y}, {device})",
        "_of_node = _of_new(_of_Node)",
        "_of_node.op = _of_op",
        f"_of_node.attrs = {attrs}",
        "_of_node.edges = (" + "".join(edge(p) + ", " for p in inputs) + ")",
        "_of_node.in_layout = _of_layout",
        "_of_node.in_meta = (" + "".join(meta(p) + ", " for p in inputs) + ")",
        "_of_node.out_layout = _of_out_layout",
        f"_of_node.out_meta = (({y}.shape, _of_dtype),)",
        f"_of_node.saved = {saved}",
        f"_of_node.saved_out = {saved_out}",
        f"_of_node.device = {device}",
        "_of_node.epoch = _of_epoch[0]",
        f"_of_node.residuals = {residuals}",
        *(line[4:] for line in tensor_source("_of_t", y, device, "_of_node")),
        "return _of_t",
    ]
    return [" " * indent + line for line in lines]


def _plain(opdef: OpDef) -> bool:
    """An op whose recorded calls the generated straight-line attach links: no list input, the first input not
    optional, one output (not a list), on its inputs' device."""
    inputs = opdef.inputs
    return bool(inputs and not inputs[0].optional and not any(p.is_list for p in inputs)
                and len(opdef.outputs) == 1 and not opdef.outputs[0].is_list and opdef.out_device is None)


_NOTHING = MappingProxyType({})  # what a Node saves when its rule needs nothing: one shared, read-only mapping


def _attach(opdef: OpDef, inputs: tuple, attrs: dict, out, residuals: dict | None = None):
    """Wrap the outputs of a call that autograd must see, and link them to a new graph Node (any schema)."""
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
        if t is None or not differentiable or not t._requires_grad:
            edges.append(None)
        elif t._node is not None:
            edges.append((t._node, t._index))
        else:
            edges.append((t, -1))
    device = next(t for t, _ in flat if t is not None)._device if opdef.out_device is None else \
        opdef.out_device(attrs)
    outs, out_layout = _flatten_outputs(opdef, out, device)
    rule = opdef.grad_rule
    saved, saved_out = {}, {}
    if rule is not None:
        for name, i in rule.saved_inputs:
            saved[name] = inputs[i]
        for name, i in rule.saved_outputs:
            start, count, _ = flat_ranges(out_layout)[i]
            saved_out[name] = tuple((k, outs[k]) for k in range(start, start + count))
    node = Node(
        opdef, attrs, tuple(edges), tuple(in_layout),
        tuple(None if t is None else (t._data.shape, t._data.dtype) for t, _ in flat),
        out_layout, tuple((a.shape, a.dtype) for a in outs), saved, saved_out, device, residuals,
    )
    tensors = [wrap_output(a, node, i, device) if D.is_floating(a.dtype) else wrap(a, device)
               for i, a in enumerate(outs)]
    return _restructure(opdef, tensors, out_layout)


# -- the eager path for every call the fast path does not take ------------------------------------------------------

def _run_eagerly(opdef: OpDef, inputs: tuple, attrs: dict):
    """Symbolic inputs, Python scalars and arrays, lists of tensors, optional inputs, no inputs at all."""
    symbolic = _symbolic_owner(inputs)
    if symbolic is not None:
        return symbolic.apply(opdef, inputs, attrs)
    inputs, device, kernel = prepare_call(opdef, inputs, attrs)
    return finish_call(opdef, inputs, attrs, device, kernel)


def prepare_call(opdef: OpDef, inputs: tuple, attrs: dict):
    """The checks of an eager call and its kernel: returns the inputs as Tensors (or lists of them, or None), the
    device the call runs on and the ``Kernel`` chosen for it. ``finish_call`` runs it. (The backward pass's replay
    of gradient rules, ``autodiff.replay``, records what these two decide, so a replayed call is this call.)"""
    inputs, device = _coerce_inputs(opdef, inputs)
    tensors = [t for v in inputs for t in (v if isinstance(v, list) else (v,)) if t is not None]
    for p, v in zip(opdef.inputs, inputs):
        if p.dtypes is not None:
            for t in v if isinstance(v, list) else (v,):
                if t is not None and t._data.dtype not in p.dtypes:
                    _bad_dtype(opdef, p.name, t)
    if "same_dtype" in opdef.traits:
        check_same_dtype(opdef, inputs)
    if "elementwise" in opdef.traits and len(tensors) > 1:  # as the fast path: the trait says same shape, and a
        shape = tensors[0]._data.shape                       # lifted scalar must not broadcast where a 0-d Tensor
        if any(t._data.shape != shape for t in tensors[1:]):  # is refused
            _kernel_failed(opdef, inputs, attrs, None)
    return inputs, device, opdef.kernel_for(device, [t._data.dtype for t in tensors[:1]], attrs)


def finish_call(opdef: OpDef, inputs: tuple, attrs: dict, device, kernel):
    """Run ``kernel`` on the prepared ``inputs``; link the outputs into the autograd graph if they need it."""
    arrays = [[t._data for t in v] if isinstance(v, list) else (None if v is None else v._data) for v in inputs]
    extra = {"rng": device.generator()} if kernel.takes_rng else {}
    recorded = (
        "no_grad" not in opdef.traits
        and _grad_mode.enabled
        and any(p.differentiable and t is not None and t._requires_grad
                for p, v in zip(opdef.inputs, inputs) for t in (v if isinstance(v, list) else (v,)))
    )
    if opdef.saves:
        extra["save"] = {} if recorded else None
    run = kernel.bind(device)
    try:
        if kernel.takes_rng:  # a random kernel would draw again: it runs quiet from the start
            with floating_point.quiet():
                out = run(*arrays, **attrs, **extra)
        else:
            out = run(*arrays, **attrs, **extra)
    except floating_point.ERRORS:  # a floating-point warning a user's filter made an error: again, quiet
        out = _again(opdef, inputs, attrs, run, arrays, {**attrs, **extra})
    except Exception as e:
        _kernel_failed(opdef, inputs, attrs, e)
    if opdef.out_device is not None:
        device = opdef.out_device(attrs)
    if _debug:
        _check_outputs(opdef, inputs, attrs, out, device)
    if recorded:
        return opdef.attach(inputs, attrs, out, extra.get("save"))
    flat, layout = _flatten_outputs(opdef, out, device)
    return _restructure(opdef, [wrap(a, device) for a in flat], layout)


def _coerce_inputs(opdef: OpDef, inputs: tuple):
    """The inputs of an eager call as Tensors on the inputs' device (which must be one; the default device if none
    has one), by ``coerce_inputs``'s rule. Returns them and that device."""
    device, first = None, None
    for p, v in zip(opdef.inputs, inputs):
        for t in v if p.is_list and isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, Tensor):
                if device is None:
                    device, first = t._device, p.name
                elif t._device is not device:
                    raise ArgumentError(
                        f"{opdef.name}(): inputs are on different devices: argument '{first}' is on '{device}', "
                        f"argument '{p.name}' on '{t._device}'"
                    )
    device = device or default_device()
    return tuple(coerce_inputs(opdef, inputs, _as_is, lambda arg, array: wrap(device.from_host(array), device))), \
        device


def _as_is(arg: str, value):
    return value


def coerce_inputs(opdef: OpDef, inputs: tuple, take, lift) -> list:
    """What may come in each tensor slot of a call, and what it becomes: the one rule of eager calls, tracing and
    sharding. Returns one entry per schema input — ``take(arg, value)`` of a tensor (an eager Tensor, a program
    variable), ``lift(arg, array)`` of a Python number, NumPy value or nested list of numbers made a host array (a
    Python number takes the dtype it gets beside the call's tensors, ``core.dtypes.scalar_dtype``), a list of them
    for a ``Tensor[]`` input, None for an absent optional one — and refuses anything else, naming the op and the
    argument (``arg``: the argument's name, ``xs[2]`` inside a list)."""
    peers = [v.dtype for slot in inputs for v in (slot if isinstance(slot, (list, tuple)) else (slot,))
             if isinstance(v, TensorOps)]
    peer = (peers[0] if len(peers) == 1 else D.promote(*peers)) if peers else None
    out = []
    for p, v in zip(opdef.inputs, inputs):
        if p.is_list:
            if not isinstance(v, (list, tuple)):
                raise ArgumentError(f"{opdef.name}(): argument '{p.name}' expected a list of Tensors, "
                                    f"got {describe(v)}")
            out.append([_coerce(opdef, f"{p.name}[{i}]", t, peer, take, lift) for i, t in enumerate(v)])
        elif v is None:
            if not p.optional:
                raise ArgumentError(f"{opdef.name}(): argument '{p.name}' expected Tensor, got None")
            out.append(None)
        else:
            out.append(_coerce(opdef, p.name, v, peer, take, lift))
    return out


def _coerce(opdef: OpDef, arg: str, value, peer, take, lift):
    if isinstance(value, TensorOps):
        return take(arg, value)
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        value = value.item()  # a NumPy number is a number, as in PyTorch
    if type(value) in (bool, int, float):  # a number is weak: it takes its peer's dtype (core.dtypes)
        return lift(arg, scalar_array(opdef, arg, value, peer))
    if isinstance(value, Dim):  # an int known only at run time (x.shape[i] in a program): computed from shapes
        scalar = getattr(current_interpreter(), "size_scalar", None)
        if scalar is not None:
            return take(arg, scalar(value, D.scalar_dtype(0, peer)))  # (of the dtype a Python int would take)
    if isinstance(value, (np.ndarray, np.generic)) or (
            isinstance(value, (list, tuple)) and not any(isinstance(v, TensorOps) for v in value)):
        try:  # NumPy values keep their dtype; nested lists of numbers become an array
            return lift(arg, as_array(value))
        except ArgumentError as e:
            raise ArgumentError(f"{opdef.name}(): argument '{arg}': {e}") from None
    if isinstance(value, (list, tuple)):
        raise ArgumentError(f"{opdef.name}(): argument '{arg}' expected Tensor, got a {type(value).__name__} "
                            f"holding tensors (a multi-output op's result? pick one of its outputs)")
    raise ArgumentError(f"{opdef.name}(): argument '{arg}' expected Tensor, got {describe(value)}")


def scalar_array(opdef: OpDef, name: str, value, peer) -> np.ndarray:
    """A Python number in a tensor slot as a 0-d array of the dtype it takes next to ``peer``; an int that dtype
    cannot hold (2**63 beside int64, 10**400 anywhere) is refused here rather than wrap around or overflow."""
    dtype = D.scalar_dtype(value, peer)
    try:
        return np.asarray(value, dtype=dtype)
    except OverflowError:
        shown = value if value.bit_length() <= 128 else f"of {value.bit_length()} bits"  # str() of a huge int fails
        raise ArgumentError(f"{opdef.name}(): argument '{name}' is the Python int {shown}, which {dtype} cannot "
                            "hold: pass a float, or a NumPy array of the dtype you mean") from None


# -- the parts the generated code calls ------------------------------------------------------------------------

_ABSENT = object()  # the default of a renamed keyword (dim=...): it was not given


def _spelled(opdef: OpDef, name: str, value, alias=_ABSENT):
    """The value of argument ``name`` given under its second spelling (``dim=`` for ``axis``): refuses a call that
    gives both, or neither where it is required."""
    p = opdef.schema.param(name)
    given = value is not _ABSENT and not (p.has_default and value is p.default)
    if given and alias is not _ABSENT:
        raise ArgumentError(f"{opdef.name}(): argument '{name}' is given twice, as {name}= and as {p.alias}= "
                            "(two spellings of one argument)")
    if alias is not _ABSENT:
        return alias
    if value is _ABSENT:
        spelled = f" (or {p.alias}=)" if p.alias else ""
        raise ArgumentError(f"{opdef.name}(): missing required argument '{name}'{spelled}")
    return value


def _renamed(opdef: OpDef, alias: str, ours: str):
    raise ArgumentError(f"{opdef.name}(): no argument '{alias}': this op (which torch does not have under that "
                        f"name) calls it {ours}=")


def check_same_dtype(opdef: OpDef, values) -> None:
    """The trait ``same_dtype``: floating inputs must share one dtype (PyTorch's matmul, linear and conv refuse a
    float32 weight with float64 data rather than compute in float64). ``values`` have a ``dtype`` (or are None)."""
    floats = [(p.name, v.dtype) for p, v in zip(opdef.inputs, values)
              if v is not None and not p.is_list and hasattr(v, "dtype") and D.is_floating(v.dtype)]
    for name, dtype in floats[1:]:
        if dtype != floats[0][1]:
            raise ArgumentError(
                f"{opdef.name}(): argument '{floats[0][0]}' is {floats[0][1]} but argument '{name}' is {dtype}; "
                f"the floating inputs of {opdef.name} must have one dtype: convert one of them "
                f"(x.to({str(dtype)!r}), or model.to({str(floats[0][1])!r}) for a layer's parameters)"
            )


def _find_kernel(opdef: OpDef, device, dtype):
    """The fast path's kernel for a first input of ``dtype`` on ``device``, kept in the op's kernel table."""
    fn = opdef.kernel_for(device, (dtype,), None).bind(device)
    opdef.kernel_table.setdefault(device.name, {})[dtype] = fn
    return fn


def _bad_dtype(opdef: OpDef, name: str, value) -> None:
    p = opdef.schema.param(name)
    raise ArgumentError(
        f"{opdef.name}(): argument '{name}' expected dtype {' or '.join(map(str, p.dtypes))}, "
        f"got {value.dtype}"
    )


# Exceptions that say something about the kernel's code or the machine, not about the call's inputs: passed on as
# they are (with a note naming the op), never explained as a shape mistake.
_NOT_ABOUT_INPUTS = (NameError, ImportError, NotImplementedError, RecursionError, SyntaxError)


def _again(opdef: OpDef, inputs: tuple, attrs: dict, kernel, args, kwargs: dict):
    """The kernel run again, quiet, after a floating-point exception of NumPy's that a user's warnings filter or
    np.errstate made an error (it is a pure function of its inputs: the same outputs); its other errors explained
    as any kernel's."""
    try:
        with floating_point.quiet():
            return kernel(*args, **kwargs)
    except Exception as e:
        _kernel_failed(opdef, inputs, attrs, e)


def _kernel_failed(opdef: OpDef, inputs: tuple, attrs: dict, error: Exception | None):
    """Explain a call the kernel failed on (or, with ``error`` None, one the shape rule must refuse)."""
    if isinstance(error, OpforgeError):
        raise error
    if isinstance(error, _NOT_ABOUT_INPUTS):
        error.add_note(f"(raised by the kernel of op '{opdef.name}', defined at {opdef.defined_at})")
        raise error
    specs = [[Spec(t.shape, t.dtype) for t in v] if isinstance(v, list) else
             (None if v is None else Spec(v.shape, v.dtype)) for v in inputs]
    if isinstance(error, MemoryError):  # NumPy's or CuPy's: named with the op, the shapes and the bytes
        raise out_of_memory(opdef, specs, attrs, error) from None
    opdef.check_shapes(specs, attrs, error)


def _check_outputs(opdef: OpDef, inputs: tuple, attrs: dict, out, device) -> None:
    """Debug mode: the kernel's outputs must have the shapes and dtypes the op's shape rule gives."""
    specs = [[Spec(t.shape, t.dtype) for t in v] if isinstance(v, list) else
             (None if v is None else Spec(v.shape, v.dtype)) for v in inputs]
    expected = opdef.infer_specs(specs, attrs)
    flat, layout = _flatten_outputs(opdef, out, device)
    want = [s for o, e in zip(opdef.outputs, expected) for s in (e if o.is_list else [e])]
    rule = "its @infer rule" if opdef.infer_fn is not None else \
        f"its trait '{next(t for t in ('elementwise', 'broadcast') if t in opdef.traits)}'"
    names = [o.name if n < 0 else f"{o.name}[{i}]" for o, n in zip(opdef.outputs, layout) for i in range(abs(n))]
    for name, array, spec in zip(names, flat, want):
        if tuple(array.shape) != tuple(spec.shape) or array.dtype != spec.dtype:
            raise SchemaError(
                f"{opdef.name}(): the kernel (defined at {opdef.defined_at}) returned shape {tuple(array.shape)} and "
                f"dtype {array.dtype} for output '{name}', but {rule} says shape {tuple(spec.shape)} and dtype "
                f"{spec.dtype} (checked because of of.set_debug(True))"
            )


def _wrap_outputs(opdef: OpDef, out, device):
    """Kernel results -> Tensors, shaped as the schema says (one, a list, or a named tuple)."""
    flat, layout = _flatten_outputs(opdef, out, device)
    return _restructure(opdef, [wrap(a, device) for a in flat], layout)


def _flatten_outputs(opdef: OpDef, out, device):
    """A kernel's result -> (one array of ``device`` per output tensor, the output layout)."""
    if len(opdef.outputs) == 1:
        out = (out,)
    if not isinstance(out, (tuple, list)) or len(out) != len(opdef.outputs):
        raise OpforgeError(
            f"kernel of op '{opdef.name}' must return {len(opdef.outputs)} arrays "
            f"{list(opdef.output_names)}, returned {describe(out)}"
        )
    flat, layout = [], []
    for o, v in zip(opdef.outputs, out):
        if o.is_list:
            if not isinstance(v, (list, tuple)):
                raise OpforgeError(f"kernel of op '{opdef.name}' must return a list for output '{o.name}'")
            layout.append(len(v))
            flat.extend(device.array(a) for a in v)
        else:
            layout.append(-1)
            flat.append(device.array(v))
    return flat, tuple(layout)


def _restructure(opdef: OpDef, flat: list, layout: tuple):
    """Flat list of per-output values -> the op's result shape (a value, a list, or a named tuple)."""
    result = split_by_layout(flat, layout)
    if len(result) == 1:
        return result[0]
    return opdef.result_type(*result)


if os.environ.get("OPFORGE_DEBUG", "") not in ("", "0"):
    set_debug(True)

# The interpreter stack lives in core (opforge.core.interpreters); its names are here too, where they always were.
__all__ = ["EAGER", "EagerInterpreter", "Interpreter", "check_same_dtype", "coerce_inputs", "current_interpreter",
           "install", "interpreting", "make_functions", "owner_of", "set_debug"]
