"""The program data model: a ``Program`` holds blocks of ``OpDesc``s over ``VarDesc``s.

An ``OpDesc`` names its op type, its inputs and outputs (schema argument name -> list of variable names) and its
attrs; it carries no code. The same registered op definition runs it (kernel), infers its shapes (infer rule) and
differentiates it (gradient rule), exactly as in eager mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.devices import CPU
from ..core.spec import Dim, Elem, Spec

FORMAT_VERSION = 1


@dataclass
class VarDesc:
    name: str
    spec: Spec  # dims may be None (known at run time)
    persistable: bool = False  # a parameter (or optimizer state): lives across runs, in the executor's scope
    stop_gradient: bool = False  # append_backward never differentiates through it

    def __str__(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.spec.shape)
        return f"{self.name}: {self.spec.dtype}[{dims}]"


@dataclass
class OpDesc:
    type: str
    inputs: dict  # schema input name -> [var names] ([] for a missing Tensor?, several for Tensor[])
    outputs: dict  # schema output name -> [var names]
    attrs: dict
    role: str = "forward"  # "forward", or "backward" for ops that append_backward emitted

    def input_names(self) -> list:
        return [n for names in self.inputs.values() for n in names]

    def output_names(self) -> list:
        return [n for names in self.outputs.values() for n in names]

    def value_reads(self) -> list:
        """The variables whose values the op's attrs read as sizes (``Elem``s: a shape computed in the program): the
        op depends on them as on its inputs, though the executor reads them when it plans a run, not at the op."""
        return sorted({v.var for value in self.attrs.values()
                       for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, Elem)})


def format_attr(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, Dim):
        return repr(value)
    return repr(value)


@dataclass
class Block:
    vars: dict = field(default_factory=dict)  # name -> VarDesc
    ops: list = field(default_factory=list)

    def var(self, name: str) -> VarDesc:
        return self.vars[name]

    def format_op(self, op: OpDesc) -> str:
        def side(slots):
            parts = []
            for key, names in slots.items():
                shown = ", ".join(str(self.vars[n]) for n in names) if names else "None"
                parts.append(f"{key}=[{shown}]" if len(names) > 1 else f"{key}={shown}")
            return ", ".join(parts)

        attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in op.attrs.items())
        outs = ", ".join(str(self.vars[n]) for n in op.output_names())
        role = "  # backward" if op.role == "backward" else ""
        return f"{outs} = {op.type}({side(op.inputs)}{'; ' + attrs if attrs else ''}){role}"


class Program:
    """A program of op descriptions: what ``of.trace`` records and ``of.append_backward`` extends."""

    def __init__(self, device=CPU, name: str = "program"):
        self.device = device  # where the program's values live and its kernels run
        self.name = name  # what it was traced from (a function's name): its plans' code is named after it
        self.blocks = [Block()]
        self.feeds: list[str] = []  # variable names given to Executor.run
        # feed -> the narrower dtype it is declared in, held here in its variable's wider one (an imported ONNX
        # model's int8 or float8 input, held as int64 or float32): Executor.run takes arrays of that dtype, and
        # refuses values that are not values of it, as ONNX Runtime refuses a feed of another type
        self.feed_dtypes: dict = {}
        self.outputs: dict = {}  # result name -> variable name
        self.values: dict = {}  # persistable or constant variable name -> initial array
        self.backward_requests: list = []  # (loss, wrt, no_grad, {wrt: its gradient}) of each append_backward
        self.grad_names: dict = {}  # variable name -> its gradient's variable name
        self.updates: dict = {}  # persistable variable name -> variable holding its new value after a run
        self._counter = 0
        self._tensor_vars: dict = {}  # id(eager Tensor) -> (the Tensor, its variable name)

    @property
    def block(self) -> Block:
        return self.blocks[0]

    def fresh_name(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}.{self._counter}"

    def add_var(self, name: str, spec: Spec, persistable=False, stop_gradient=False) -> VarDesc:
        desc = VarDesc(name, Spec(tuple(spec.shape), spec.dtype), persistable, stop_gradient)
        self.block.vars[name] = desc
        return desc

    def parameters(self) -> list[str]:
        return [v.name for v in self.block.vars.values() if v.persistable]

    def __str__(self) -> str:
        block = self.block
        lines = [f"program (format {FORMAT_VERSION}): {len(block.ops)} ops"]
        lines.append("  feeds:  " + ", ".join(str(block.vars[n]) for n in self.feeds))
        params = [str(v) for v in block.vars.values() if v.persistable]
        if params:
            lines.append("  params: " + ", ".join(params))
        for op in block.ops:
            lines.append("  " + block.format_op(op))
        if self.outputs:
            lines.append("  outputs: " + ", ".join(f"{k}={v}" for k, v in self.outputs.items()))
        if self.updates:
            lines.append("  updates: " + ", ".join(f"{k} <- {v}" for k, v in self.updates.items()))
        return "\n".join(lines)

    __repr__ = __str__

    def save(self, path) -> None:
        """Write the program as versioned JSON at ``path`` and its values beside it (``.npz``), atomically."""
        from .serialize import save

        save(self, path)

    @staticmethod
    def load(path) -> Program:
        """Read a saved program; every op and attr is validated against the registered schemas."""
        from .serialize import load

        return load(path)
