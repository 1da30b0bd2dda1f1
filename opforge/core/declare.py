"""Declaring an op: ``@of.op(signature)`` makes its ``OpDef`` from the signature and the decorated kernel.

Declaring is core's job and needs nothing above core, so the op library (``opforge.ops``) imports core alone. What
makes an op *callable* — its generated function ``opforge.ops.<name>``, which runs kernels on Tensors, and the code
that records calls for autograd — is built on Tensor, above core: ``opforge.dispatch`` gives it, as the one function
maker (``give_functions``), to every op declared before it loaded and to each one declared after.
"""

from __future__ import annotations

import inspect

from .errors import SchemaError
from .opdef import OpDef, registry
from .schema import parse_signature

_function_maker = None  # (OpDef) -> None: gives a declared op its function; opforge.dispatch's, once it loaded


def op(signature: str, traits=(), *, inplace=None, saves=(), replace: bool = False, infer=None, out_device=None):
    """Define an op from its signature; the decorated function becomes its kernel for every dtype — a "cpu"
    kernel, or, if it takes ``xp`` (its device's array module), a kernel for every device.

    Returns the ``OpDef``, whose ``.kernel``, ``.infer``, ``.grad``, ``.check`` and ``.samples`` methods
    complete the definition, and which is callable like ``opforge.ops.<name>`` (``help()`` and
    ``inspect.signature`` on it show the op's own signature). ``out_device(attrs)``, for an op that moves data,
    gives the device its outputs live on (by default, its inputs'). ``saves`` names arrays the kernel may leave
    for the gradient rule when the call is recorded (see ``OpDef.saves``).
    """
    schema = parse_signature(signature)

    def define(kernel_fn) -> OpDef:
        code = getattr(kernel_fn, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(kernel_fn)
        opdef = OpDef(schema, traits, inplace=inplace, saves=saves, doc=inspect.getdoc(kernel_fn) or "",
                      defined_at=where, out_device=out_device)
        check_kernel_signature(opdef, kernel_fn)
        opdef.add_kernel(kernel_fn, None, None)
        if infer is not None:
            opdef.infer(infer)
        opdef.__signature__, opdef.__doc__, opdef.__name__ = python_signature(opdef), docstring(opdef), opdef.name
        if _function_maker is not None:
            _function_maker(opdef)
        registry.add(opdef, replace=replace)
        return opdef

    return define


def function(fn):
    """Publish ``fn`` in ``opforge.ops`` beside the ops: a function of the functional API written with ops that has
    no schema of its own, such as torch's ``F.dropout`` (the ``y`` of the op ``dropout_with_mask``, whose mask
    stays inside). Its gradients are its ops'; it is defined in its family module, next to them."""
    registry.add_function(fn)
    return fn


def give_functions(maker) -> None:
    """Make ``maker`` the one that gives each declared op its function: now, to every op declared so far that has
    none, and from now on at each declaration (``opforge.dispatch``'s, bound once as opforge loads)."""
    global _function_maker
    _function_maker = maker
    for opdef in registry:
        if opdef.fn is None:
            maker(opdef)
            registry.announce(opdef)  # opforge.ops publishes the function


def check_kernel_signature(opdef: OpDef, fn) -> None:
    """A kernel takes the op's inputs positionally and its attrs by keyword (plus any of rng, out, xp, save)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or ufunc: trust it
    try:
        extra = {name: None for name in ("rng", "out", "xp", "save") if name in sig.parameters}
        sig.bind(*(None for _ in opdef.inputs), **{p.name: None for p in opdef.attrs}, **extra)
    except TypeError as e:
        wanted = ", ".join(opdef.input_names)
        attrs = ", ".join(p.name for p in opdef.attrs)
        raise SchemaError(
            f"kernel of op '{opdef.name}' must take the inputs ({wanted}) positionally"
            f"{' and the attrs (' + attrs + ') by keyword' if attrs else ''}; it has the signature "
            f"{fn.__name__}{sig}: {e}"
        ) from None


def python_signature(opdef: OpDef) -> inspect.Signature:
    """The op's signature as Python states it (what ``inspect.signature`` and ``help`` show of its function)."""
    kinds = inspect.Parameter
    params, aliases = [], []
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
        if p.alias:  # its second spelling (dim= for axis=), by keyword
            none = "" if p.optional else " | None"
            aliases.append(kinds(p.alias, kinds.KEYWORD_ONLY, default=None, annotation=annotation + none))
    params += aliases
    ret = "Tensor" if len(opdef.outputs) == 1 else f"tuple[{', '.join('Tensor' for _ in opdef.outputs)}]"
    return inspect.Signature(params, return_annotation=ret)


def docstring(opdef: OpDef) -> str:
    """The op's docstring: its schema, the kernel's docstring, its traits and where it was defined."""
    parts = [str(opdef.schema)]
    if opdef.doc:
        parts.append(opdef.doc)
    if opdef.traits:
        parts.append("Traits: " + ", ".join(sorted(opdef.traits)) + ".")
    parts.append(f"Defined at {opdef.defined_at}.")
    return "\n\n".join(parts)


__all__ = ["check_kernel_signature", "docstring", "function", "give_functions", "op", "python_signature"]
