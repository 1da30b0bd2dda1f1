"""Generate the op reference (``docs/ops.md``) and typed stubs (``opforge/ops/__init__.pyi``) from the registry.

Nothing here is written by hand: every line comes from an op's ``OpDef`` — its schema, kernel docstring,
traits, kernels and gradient rule — so the reference cannot drift from the code (``tests/test_docs.py``
fails when a generated file is stale; ``python -m opforge.cli docs`` rewrites both).

*Differentiable to order N* is derived from the gradient rules, not measured numerically: running the
backward pass of each of an op's samples (with ``create_graph=True``) shows which ops it records — its
rule's ops, and ``sum_to`` where the engine sums a broadcast gradient down. An op without a rule (or with
the ``no_grad`` trait) has order 0; otherwise order(op) = 1 + the least order among those ops, and an op
whose backward records no op at all, or only ops that lead back to rules, is differentiable to any order.
This is cheap (no finite differences), so the staleness test can recompute it; that the derivatives are
*right* is what ``check_op`` verifies numerically, to order 2, for every op (``tests/test_conformance.py``).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import os
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from .autodiff import grad
from .core import dtypes as D
from .core.opdef import TRAITS, OpDef, registry
from .core.schema import Param
from .tensor import Tensor, wrap
from .testing.conformance import _flat, _materialize, call_op, default_samples

ROOT = Path(__file__).resolve().parent.parent  # the checkout: docs/ and opforge/ live here
DOCS = Path("docs/ops.md")
STUB = Path("opforge/ops/__init__.pyi")
LIBRARY = "opforge.ops."  # the library's op families are the modules of this package
COMMAND = "python -m opforge.cli docs"


# -- what the registry says --------------------------------------------------------------------------------------

def module_of(opdef: OpDef) -> str:
    """The module that defines the op: where its first kernel (the decorated function) lives."""
    fn = next(iter(opdef.kernels.values())).fn
    return getattr(fn, "__module__", None) or opdef.defined_at


def library_ops() -> list[OpDef]:
    """The library's ops (not tests' or users'), by family module, then in the order they are defined."""
    ops = [op for op in registry if module_of(op).startswith(LIBRARY)]
    return sorted(ops, key=lambda op: (module_of(op), _line(op)))


def _line(opdef: OpDef) -> int:
    tail = opdef.defined_at.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def recorded_ops(opdef: OpDef) -> set[str]:
    """Names of the ops the backward pass of ``opdef`` records, over its samples (see the module docstring)."""
    rng = np.random.default_rng(0)
    samples = list(opdef.samples_fn(rng)) if opdef.samples_fn else list(default_samples(opdef, rng))
    found: set[str] = set()
    for sample in samples:
        args, kwargs = _materialize(opdef, sample, np.float64, requires_grad=True)
        leaves = [t for v in [*args, *kwargs.values()] for t in (v if isinstance(v, list) else [v])
                  if isinstance(t, Tensor) and t.requires_grad]
        outs = [y for y in _flat(call_op(opdef, args, kwargs)) if y.requires_grad]
        if not outs or not leaves:
            continue
        forward = {y._node for y in outs}
        seeds = [wrap(rng.standard_normal(y.shape).astype(y.dtype), requires_grad=True) for y in outs]
        grads = grad(outs, leaves, grad_outputs=seeds, create_graph=True, allow_unused=True)
        stack = [g._node for g in grads if g is not None and g._node is not None]
        seen = set()
        while stack:  # every node between the gradients and the forward node / leaves
            node = stack.pop()
            if node in seen or node in forward:
                continue
            seen.add(node)
            found.add(node.op.name)
            stack += [edge[0] for edge in node.edges if edge is not None and edge[1] >= 0]
    return found


def differentiation_orders(ops) -> dict:
    """op name -> (order, recorded op names): order is an int, ``math.inf`` or None (the samples failed)."""
    recorded: dict = {}
    orders: dict = {}
    todo = [op.name for op in ops]
    while todo:  # trace the ops, and the ops their backward records, and so on
        name = todo.pop()
        if name in orders:
            continue
        op = registry.get(name)
        if not op.differentiable:
            orders[name] = 0
            continue
        try:
            recorded[name] = recorded_ops(op)
        except Exception:  # a broken op: the conformance tests report it; here its order stays unknown
            recorded[name] = None
            orders[name] = None
            continue
        orders[name] = math.inf
        todo += sorted(recorded[name])
    changed = True
    while changed:  # orders only fall from inf, and none is below 0: this ends
        changed = False
        for name, names in recorded.items():
            if names is None:
                continue
            below = [orders[n] for n in names]
            new = None if None in below else 1 + min(below, default=math.inf)
            if new != orders[name]:
                orders[name], changed = new, True
    return {op.name: (orders[op.name], recorded.get(op.name)) for op in ops}


def _kernels_text(opdef: OpDef) -> str:
    allowed = opdef.inputs[0].dtypes if opdef.inputs and opdef.inputs[0].dtypes else D.SUPPORTED
    by_device: dict = {}
    for (device, dtype), _ in opdef.kernels.items():
        by_device.setdefault(device, []).append(dtype)
    parts = []
    for device, dtypes in by_device.items():
        named = [str(d) for d in dtypes if d is not None]
        if any(d is None for d in dtypes):  # (not ``None in dtypes``: NumPy's float64 dtype compares equal to None)
            rest = [str(d) for d in allowed if str(d) not in named]
            named.append(("every allowed dtype" if not named else "others") + (f" ({', '.join(rest)})" if rest else ""))
        parts.append(f"`{'every device (takes xp)' if device is None else device}`: {', '.join(named)}")
    return "; ".join(parts)


def _devices_text(opdef: OpDef) -> str:
    """Where the op runs beyond the host: its kernels on a device whose arrays follow CuPy's rules (the strict test
    device, ``opforge.testing.strict``, checks each op there), or the leak that keeps it on the CPU."""
    from .testing import strict

    leak = strict.NOT_YET_CLEAN.get(opdef.name)
    if leak is not None:
        return f"CPU only so far (on a CuPy-like device it leaks to the host: {leak})"
    return "CPU, and CuPy-like devices (checked on the strict test device)"


def _order_text(opdef: OpDef, order, recorded) -> str:
    if "no_grad" in opdef.traits:
        return "no — trait `no_grad`: outputs never require grad"
    if opdef.grad_rule is None:
        return "no — no gradient rule"
    if order is None:
        return "has a rule; its order could not be derived (calling it on its samples failed)"
    via = f"; its backward records {', '.join(f'`{n}`' for n in sorted(recorded))}" if recorded else \
        "; its backward records no op"
    return ("to any order" if order == math.inf else f"to order {order}") + via


# -- docs/ops.md --------------------------------------------------------------------------------------------------

def render_markdown(ops=None) -> str:
    ops = library_ops() if ops is None else list(ops)
    orders = differentiation_orders(ops)
    families: dict = {}
    for op in ops:
        families.setdefault(module_of(op), []).append(op)
    out = [
        "# Op reference",
        "",
        f"<!-- Generated from the op registry by `{COMMAND}`; do not edit (tests/test_docs.py checks it). -->",
        "",
        f"{len(ops)} ops in {len(families)} families. Each op is defined once, in its family's module: signature, "
        "kernel, shape rule, gradient rule and samples together. The test suite runs `opforge.testing.check_op` on "
        "every one: inferred shapes against the kernel, float32 against float64, first and second derivatives "
        "against central differences, and wrong calls.",
        "",
        "*Differentiable* says how many times autograd can differentiate the op: its gradient rule is written "
        "with ops, so the order is one more than the least order among the ops its backward records (the rule's "
        "ops, and `sum_to` where a broadcast gradient is summed down), and *any order* when those ops lead only "
        "back to ops with rules. It is derived from the rules, not measured; `check_op` verifies the first two "
        "orders numerically.",
        "",
        "Traits: " + "; ".join(f"`{t}` — {TRAITS[t]}" for t in sorted(TRAITS)) + ".",
        "",
        "## Contents",
        "",
    ]
    for module, members in families.items():
        short = module.removeprefix(LIBRARY)
        out.append(f"- [{short}](#{short}): " + ", ".join(f"[`{op.name}`](#{op.name})" for op in members))
    for module, members in families.items():
        short = module.removeprefix(LIBRARY)
        path = _module_path(module)
        out += ["", f"## {short}", ""]
        summary = _module_summary(module)
        out += [f"[`{path}`](../{path}){(' — ' + summary) if summary else ''}"]
        for op in members:
            out += _render_op(op, *orders[op.name])
    functions = library_functions()
    if functions:
        out += ["", "## Functions written with ops", "",
                "Functions of `opforge.ops` that have no schema of their own: each calls ops (its gradients are "
                "theirs) and is defined in its family's module, beside them (`opforge.core.declare.function`).", ""]
        for name, fn in functions:
            first = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())
            out += [f"- `{name}{inspect.signature(fn)}` ([`{_module_path(fn.__module__)}`]"
                    f"(../{_module_path(fn.__module__)})): {first}"]
    return "\n".join(out) + "\n"


def library_functions() -> list:
    """(name, function) of the library's functions written with ops (``registry.functions``), by name."""
    return sorted((name, fn) for name, fn in registry.functions.items() if fn.__module__.startswith(LIBRARY))


def _module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _module_summary(module: str) -> str:
    doc = inspect.getdoc(importlib.import_module(module)) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _render_op(op: OpDef, order, recorded) -> list:
    lines = ["", f"### {op.name}", "", "```text", str(op.schema), "```", ""]
    if op.doc:
        lines += [op.doc, ""]
    lines.append(f"- **Traits:** {', '.join(f'`{t}`' for t in sorted(op.traits)) or 'none'}")
    if op.inplace:
        lines.append("- **In place:** " + ", ".join(f"`{o}` may reuse `{i}`'s buffer" for o, i in op.inplace.items()))
    lines.append(f"- **Kernels:** {_kernels_text(op)}")
    lines.append(f"- **Devices:** {_devices_text(op)}")
    shape_rule = "its own infer rule" if op.infer_fn is not None else \
        f"trait `{'elementwise' if 'elementwise' in op.traits else 'broadcast'}`"
    lines.append(f"- **Shapes and dtypes:** {shape_rule}" + ("; attrs validated by a check function"
                                                             if op.check_fn is not None else ""))
    grad_needs = ""
    if op.grad_rule is not None and "no_grad" not in op.traits:
        rule = op.grad_rule
        kept = [n for n, _ in (*rule.saved_inputs, *rule.saved_outputs)]
        grad_needs = f" (the rule keeps {', '.join(f'`{n}`' for n in kept)} alive)" if kept else \
            " (the rule keeps no tensor alive)"
    lines.append(f"- **Gradient rule:** {'yes' + grad_needs if op.grad_rule is not None else 'none'}")
    lines.append(f"- **Differentiable:** {_order_text(op, order, recorded)}")
    return lines


# -- .pyi stubs ---------------------------------------------------------------------------------------------------

_HEADER = '''"""Typed stubs for ``{module}``, generated from the op registry; do not edit.

Regenerate with `{command}`.
"""

{imports}
import numpy as np
{blank}from opforge.tensor import Tensor

_TensorLike: TypeAlias = Tensor | np.ndarray | float  # dispatch turns arrays and Python numbers into Tensors
_DTypeLike: TypeAlias = str | np.dtype | type

def __getattr__(name: str) -> Any: ...  # {getattr_note}
'''
_BUILTINS = {"int", "float", "bool", "str", "list"}  # names the stubs use that an op could shadow
_ATTR_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "dtype": "_DTypeLike"}


def ops_of_module(module) -> list:
    """(attribute name, OpDef) for each op that ``module`` (or a submodule of it) defines and binds to a name."""
    name = module.__name__
    found = []
    for attr, value in vars(module).items():
        opdef = value if isinstance(value, OpDef) else getattr(value, "opdef", None)
        if attr.startswith("_") or not isinstance(opdef, OpDef) or opdef.name not in registry:
            continue
        home = module_of(opdef)
        if home == name or home.startswith(name + "."):
            found.append((attr, opdef))
    return sorted(found, key=lambda item: (module_of(item[1]), _line(item[1]), item[0]))


def render_stub(entries, module: str = "opforge.ops") -> str:
    """A ``.pyi`` declaring each (name, OpDef) entry as a typed function; a module ``__getattr__`` keeps
    every other attribute of the module usable (as Any)."""
    library = module == "opforge.ops"
    taken = ({name for name, _ in entries} | ({n for n, _ in library_functions()} if library else set())) & _BUILTINS
    body, family = [], None
    for name, op in entries:
        if module_of(op) != family:
            family = module_of(op)
            body.append(f"# -- {family}\n")
        body.append(_stub_function(name, op, taken))
    if library:
        for name, fn in library_functions():
            body.append(_stub_untyped(name, fn))
    text = "\n".join(body)
    imports = ["import builtins"] if taken else []  # `def float(...)` would shadow float: write builtins.float
    if "Sequence[" in text:
        imports.append("from collections.abc import Sequence")
    typing = ["Any", *(["NamedTuple"] if "(NamedTuple):" in text else []), "TypeAlias"]
    imports.append(f"from typing import {', '.join(typing)}\n")
    header = _HEADER.format(
        module=module, command=COMMAND if library else f"opforge stubs --module {module}", imports="\n".join(imports),
        blank="\n" if library else "",  # opforge is first-party only in its own stubs
        getattr_note="ops defined at run time (yours) are attributes too" if library else
        "the module's other names, untyped")
    return (header + "\n" + text).rstrip("\n") + "\n"


def _type(text: str, taken: set) -> str:
    return f"builtins.{text}" if text in taken else text  # an op named like a builtin shadows it in the stub


def _param_type(p: Param, taken: set) -> str:
    if p.is_tensor:
        text = "Sequence[_TensorLike]" if p.is_list else "_TensorLike"
    else:
        base = _ATTR_TYPES[p.type]
        base = base if base.startswith("_") else _type(base, taken)
        text = f"Sequence[{base}] | {base}" if p.is_list else base
        text += f" | {_type('str', taken)}" if p.or_str else ""
    return text + (" | None" if p.optional else "")


def _default(value) -> str:
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "..."
    if isinstance(value, tuple):
        items = [_default(v) for v in value]
        return "..." if "..." in items else "[" + ", ".join(items) + "]"
    if isinstance(value, np.dtype):
        return repr(str(value))
    return "..."


def _stub_function(name: str, op: OpDef, taken: set) -> str:
    params, star = [], False
    for p in op.schema.params:
        if p.keyword_only and not star:
            params.append("*")
            star = True
        text = f"{p.name}: {_param_type(p, taken)}"
        if p.has_default:
            text += f" = {_default(p.default)}"
        params.append(text)
    aliases = [p for p in op.schema.params if p.alias]
    params += ["*"] if aliases and not star else []
    params += [f"{p.alias}: {_param_type(p, taken)}{'' if p.optional else ' | None'} = None" for p in aliases]
    tensor = _type("Tensor", taken)
    lines = []
    if len(op.outputs) == 1:
        ret = f"{_type('list', taken)}[{tensor}]" if op.outputs[0].is_list else tensor
    else:
        ret = f"_{name}_result"
        lines += [f"class {ret}(NamedTuple):"]
        lines += [f"    {o.name}: {_type('list', taken)}[{tensor}]" if o.is_list else f"    {o.name}: {tensor}"
                  for o in op.outputs]
        lines.append("")
    head = f"def {name}({', '.join(params)}) -> {ret}:"
    if len(head) > 120:
        head = f"def {name}(\n" + "".join(f"    {p},\n" for p in params) + f") -> {ret}:"
    first = (op.doc or str(op.schema)).strip().split("\n\n")[0]
    doc = textwrap.fill(" ".join(first.split()).replace('"""', "'''").replace("\\", "\\\\"), 112,
                        initial_indent="    \"\"\"", subsequent_indent="    ")
    lines += [head, doc + ('"""' if "\n" not in doc else '\n    """'), ""]
    return "\n".join(lines)


def _stub_untyped(name: str, fn) -> str:
    """A function written with ops (no schema): its parameters as Python states them, typed Any."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not any(x.startswith("*") for x in params):
            params.append("*")
        params.append(p.name + ("" if p.default is p.empty else f"={_default(p.default)}"))
    first = " ".join((inspect.getdoc(fn) or name).split("\n\n")[0].split())
    doc = textwrap.fill(first.replace('"""', "'''").replace("\\", "\\\\"), 112, initial_indent="    \"\"\"",
                        subsequent_indent="    ")
    closing = '"""' if "\n" not in doc else '\n    """'
    head = f"def {name}({', '.join(params)}) -> Any:"
    if len(head) > 120:
        head = f"def {name}(\n" + "".join(f"    {p},\n" for p in params) + ") -> Any:"
    return "\n".join([head, doc + closing, ""])


# -- writing and checking -------------------------------------------------------------------------------------------

def generated(root: Path = ROOT) -> dict:
    """Path -> the text it should hold: the reference and the library's stubs."""
    from . import ops as ops_package

    return {root / DOCS: render_markdown(), root / STUB: render_stub(ops_of_module(ops_package))}


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same directory, then ``os.replace``: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def stale(files: dict) -> list:
    """(path, a short unified diff) for each file whose contents differ from what it should hold."""
    out = []
    for path, text in files.items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old != text:
            diff = difflib.unified_diff((old or "").splitlines(), text.splitlines(), "on disk", "generated",
                                        lineterm="", n=1)
            out.append((path, "(missing)" if old is None else "\n".join(list(diff)[:40])))
    return out
