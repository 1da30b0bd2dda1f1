"""Parse an op signature string into a ``Schema``, once, at definition time.

Grammar (whitespace is free)::

    signature := NAME "(" [param ("," param)*] ")" "->" outputs
    param     := "*"  |  ["nograd"] type NAME ["/" NAME] ["=" default]
    type      := "Tensor" ["<" DTYPE ("|" DTYPE)* ">"] ["?" | "[]"]
               | ("int" | "float" | "bool" | "str" | "dtype") ["[]"] ["|" "str"] ["?"]
    outputs   := output | "(" output ("," output)* ")"
    output    := "Tensor" ["<" DTYPE ("|" DTYPE)* ">"] ["[]"] [NAME]
    default   := number | "string" | True | False | None | "[" [default ("," default)*] "]"

``nograd`` marks a tensor input that never receives a gradient (a mask, an index). Integer and bool
tensors never receive one anyway. ``Tensor<int32|int64>`` restricts the dtypes an input accepts
(group names ``floating``, ``integer``, ``number``, ``all`` work too). ``|str`` lets an attr take a string
too, a named setting in place of numbers (``int[]|str padding=[0]`` takes ``padding="same"``); the op's
check says which strings it accepts. ``NAME/ALIAS`` gives an argument a second spelling that a call may use instead
(``int axis/dim=-1``: NumPy's ``axis=`` and PyTorch's ``dim=`` are one parameter, declared once); kernels, rules and
programs know it by its first name.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field

import numpy as np

from . import dtypes as D
from .errors import ArgumentError, SchemaError, describe
from .spec import Dim

ATTR_TYPES = ("int", "float", "bool", "str", "dtype")
_RESERVED = ("out", "rng", "needs_input_grad")  # names a kernel or rule gets from the framework

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<arrow>->) | (?P<list>\[\]) |
        (?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?inf) |
        (?P<string>"[^"]*"|'[^']*') |
        (?P<name>[A-Za-z_][A-Za-z_0-9]*) |
        (?P<punct>[(),*=?<>|/\[\]])
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Param:
    """One argument of an op: a tensor input or an attribute."""

    name: str
    type: str  # "Tensor" or one of ATTR_TYPES
    is_list: bool = False
    optional: bool = False
    keyword_only: bool = False
    has_default: bool = False
    default: object = None
    dtypes: tuple | None = None  # allowed dtypes of a tensor input, None = any supported
    differentiable: bool = True
    or_str: bool = False  # an attr that may also be a string ("int[]|str")
    alias: str | None = None  # a second spelling a call may use ("int axis/dim": dim= is axis=)

    @property
    def is_tensor(self) -> bool:
        return self.type == "Tensor"

    @property
    def type_text(self) -> str:
        text = self.type
        if self.dtypes is not None:
            text += "<" + "|".join(map(str, self.dtypes)) + ">"
        text += ("[]" if self.is_list else "") + ("|str" if self.or_str else "")
        return text + ("?" if self.optional else "")


@dataclass(frozen=True)
class Output:
    name: str
    is_list: bool = False
    dtypes: tuple | None = None


@dataclass(frozen=True)
class Schema:
    name: str
    params: tuple
    outputs: tuple
    text: str = field(compare=False)

    @property
    def inputs(self) -> tuple:
        return tuple(p for p in self.params if p.is_tensor)

    @property
    def attrs(self) -> tuple:
        return tuple(p for p in self.params if not p.is_tensor)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def __str__(self) -> str:
        parts, star = [], False
        for p in self.params:
            if p.keyword_only and not star:
                parts.append("*")
                star = True
            text = ("nograd " if p.is_tensor and not p.differentiable else "") + f"{p.type_text} {p.name}"
            text += f"/{p.alias}" if p.alias else ""
            if p.has_default:
                text += "=" + _format_default(p.default)
            parts.append(text)
        outs = [f"Tensor{'[]' if o.is_list else ''} {o.name}" for o in self.outputs]
        ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
        return f"{self.name}({', '.join(parts)}) -> {ret}"


def _format_default(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_format_default, value)) + "]"
    if isinstance(value, np.dtype):
        return f'"{value}"'
    return repr(value)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = []  # (kind, value, offset)
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                self.fail("unexpected character", len(text) - len(text[pos:].lstrip()))
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def fail(self, message: str, offset: int | None = None):
        if offset is None:
            offset = self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text)
        raise SchemaError(f"{message}\n  {self.text}\n  {' ' * offset}^")

    def peek(self, value: str | None = None, kind: str | None = None) -> bool:
        if self.i >= len(self.tokens):
            return False
        k, v, _ = self.tokens[self.i]
        return (value is None or v == value) and (kind is None or k == kind)

    def take(self, value: str | None = None, kind: str | None = None, what: str = "") -> str:
        if not self.peek(value, kind):
            got = f"'{self.tokens[self.i][1]}'" if self.i < len(self.tokens) else "the end"
            self.fail(f"expected {what or repr(value) or kind}, got {got}")
        self.i += 1
        return self.tokens[self.i - 1][1]

    def offset(self) -> int:
        return self.tokens[self.i][2] if self.i < len(self.tokens) else len(self.text)

    def dtype_list(self) -> tuple:
        allowed: list = []
        self.take("<")
        while True:
            at = self.offset()
            name = self.take(kind="name", what="a dtype name")
            if name not in D.GROUPS:
                self.fail(f"unknown dtype '{name}'; known: {', '.join(D.GROUPS)}", at)
            allowed += [d for d in D.GROUPS[name] if d not in allowed]
            if not self.peek("|"):
                break
            self.take("|")
        self.take(">", what="'>' or '|'")
        return tuple(allowed)

    def default(self):
        kind, value, _ = self.tokens[self.i] if self.i < len(self.tokens) else (None, None, None)
        if self.peek("["):
            self.take("[")
            items = []
            while not self.peek("]"):
                items.append(self.default())
                if not self.peek("]"):
                    self.take(",", what="',' or ']'")
            self.take("]")
            return tuple(items)
        if self.peek(kind="list"):
            self.take(kind="list")
            return ()
        if kind == "number":
            self.i += 1
            return float(value) if any(c in value for c in ".eEn") else int(value)
        if kind == "string":
            self.i += 1
            return value[1:-1]
        if kind == "name" and value in ("True", "False", "None"):
            self.i += 1
            return {"True": True, "False": False, "None": None}[value]
        self.fail("expected a default value (number, string, True, False, None or [...])")

    def parse(self) -> Schema:
        name = self.take(kind="name", what="the op name")
        if keyword.iskeyword(name):
            self.fail(f"op name '{name}' is a Python keyword", 0)
        self.take("(", what="'(' after the op name")
        params: list[Param] = []
        keyword_only = False
        seen_default = False
        while not self.peek(")"):
            if self.peek("*"):
                if keyword_only:
                    self.fail("'*' given twice")
                self.take("*")
                keyword_only = True
            else:
                params.append(self.param(keyword_only, seen_default, params))
                seen_default = seen_default or (params[-1].has_default and not keyword_only)
            if not self.peek(")"):
                self.take(",", what="',' or ')'")
        self.take(")")
        self.take("->", what="'->' and the outputs")
        outputs = self.outputs()
        if self.i != len(self.tokens):
            self.fail("unexpected text after the outputs")
        names = [o.name for o in outputs]
        if len(set(names)) != len(names):
            self.fail(f"output names repeat: {names}", len(self.text))
        return Schema(name, tuple(params), tuple(outputs), self.text)

    def param(self, keyword_only: bool, seen_default: bool, params: list) -> Param:
        differentiable = True
        if self.peek("nograd"):
            self.take("nograd")
            differentiable = False
        at = self.offset()
        type_name = self.take(kind="name", what="a type (Tensor, int, float, bool, str, dtype)")
        if type_name != "Tensor" and type_name not in ATTR_TYPES:
            self.fail(f"unknown type '{type_name}'; expected Tensor, int, float, bool, str or dtype", at)
        if not differentiable and type_name != "Tensor":
            self.fail("'nograd' applies to Tensor inputs only", at)
        allowed = self.dtype_list() if type_name == "Tensor" and self.peek("<") else None
        is_list = optional = or_str = False
        if self.peek(kind="list"):
            self.take(kind="list")
            is_list = True
        if self.peek("|") and type_name not in ("Tensor", "str"):
            self.take("|")
            self.take("str", what="'str' (the one type an attr may take besides its own)")
            or_str = True
        if self.peek("?"):
            if type_name == "Tensor" and is_list:
                self.fail("'Tensor[]?' is not supported: pass an empty list instead")
            self.take("?")
            optional = True
        at = self.offset()
        pname = self.take(kind="name", what="an argument name")
        if keyword.iskeyword(pname) or pname.startswith("_of_") or pname in _RESERVED:
            self.fail(f"'{pname}' cannot be an argument name", at)
        alias, at_alias = None, at
        if self.peek("/"):
            self.take("/")
            at_alias = self.offset()
            alias = self.take(kind="name", what="a second spelling of the argument's name")
            if keyword.iskeyword(alias) or alias.startswith("_of_") or alias in _RESERVED or alias == pname:
                self.fail(f"'{alias}' cannot be a spelling of '{pname}'", at_alias)
        for spelling, offset in ((pname, at), (alias, at_alias)):
            if spelling is not None and any(spelling in (p.name, p.alias) for p in params):
                self.fail(f"argument '{spelling}' is given twice", offset)
        has_default, default = False, None
        if self.peek("="):
            self.take("=")
            at = self.offset()
            has_default, default = True, self.default()
            if default is None:
                optional = True
            elif type_name == "Tensor":
                self.fail("a Tensor input can only default to None", at)
            else:
                probe = Param(pname, type_name, is_list, optional, or_str=or_str)
                try:
                    default = check_attr(probe, default, "signature")
                except ArgumentError as e:
                    self.fail(f"default of '{pname}' does not fit its type: {e}", at)
        elif seen_default and not keyword_only:
            self.fail(f"argument '{pname}' without a default follows one with a default", at)
        return Param(pname, type_name, is_list, optional, keyword_only, has_default, default,
                     allowed, differentiable, or_str, alias)

    def outputs(self) -> tuple:
        grouped = self.peek("(")
        if grouped:
            self.take("(")
        outs = []
        while True:
            at = self.offset()
            self.take("Tensor", what="'Tensor' (outputs are tensors)")
            allowed = self.dtype_list() if self.peek("<") else None
            is_list = False
            if self.peek(kind="list"):
                self.take(kind="list")
                is_list = True
            name = None
            if self.peek(kind="name"):
                name = self.take(kind="name")
                if keyword.iskeyword(name):
                    self.fail(f"'{name}' cannot be an output name", at)
            outs.append((name, is_list, allowed))
            if not grouped or not self.peek(","):
                break
            self.take(",")
        if grouped:
            self.take(")", what="',' or ')'")
        default_names = ["out"] if len(outs) == 1 else [f"out{i}" for i in range(len(outs))]
        return tuple(Output(n or d, is_list, allowed) for (n, is_list, allowed), d in zip(outs, default_names))


def parse_signature(text: str) -> Schema:
    """Parse ``text`` into a Schema; a SchemaError shows the text with a caret under the fault."""
    if not isinstance(text, str):
        raise SchemaError(f"an op signature must be a string, got {describe(text)}")
    return _Parser(text).parse()


# --- attribute checking: one function per attr type, used for defaults and for every call ---------------

def _where(op: str, p: Param) -> str:
    return f"{op}(): argument '{p.name}'"


def _scalar(op: str, p: Param, value, kind: str):
    if kind == "int":
        if isinstance(value, Dim):  # a run-time size inside a program (see Spec.Dim)
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
    elif kind == "float":
        if isinstance(value, Dim):  # a size known at run time stands where its int would (of.arange(x.shape[1]))
            return value
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            try:
                return float(value)
            except OverflowError:  # an int beyond the float range (10**400): no float can hold it
                raise ArgumentError(f"{_where(op, p)} expected {p.type_text}, got an int too large for a float "
                                    f"({int(value).bit_length()} bits)") from None
    elif kind == "bool":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
    elif kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "dtype":
        return D.as_dtype(value, op=op, arg=p.name)
    raise ArgumentError(f"{_where(op, p)} expected {p.type_text}, got {describe(value)}")


def check_attr(p: Param, value, op: str):
    """Type-check and normalise one attribute value (lists become tuples)."""
    if value is None:
        if p.optional:
            return None
        raise ArgumentError(f"{_where(op, p)} expected {p.type_text}, got None")
    if p.or_str and isinstance(value, str):
        return value
    if not p.is_list:
        return _scalar(op, p, value, p.type)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return (_scalar(op, p, value, p.type),)  # a lone number where a list is expected: [number]
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        try:
            return tuple(_scalar(op, p, v, p.type) for v in value)
        except ArgumentError:
            raise ArgumentError(f"{_where(op, p)} expected {p.type_text}, got {describe(value)}") from None
    raise ArgumentError(f"{_where(op, p)} expected {p.type_text}, got {describe(value)}")
