"""Export: a Program (traced from a function, or given) becomes an ONNX model.

Each op says how it lowers to ONNX in its own definition (``@op.onnx``, next to its kernel and gradient rule); this
module only walks the program and hands each op's mapping a builder, ``Graph``, through which it emits nodes. The
mapping gets the builder, the op's inputs as ``Value``s (ONNX value names with the Spec we know) and the op's attrs,
exactly as the op's kernel gets arrays and attrs, and returns its outputs as ``Value``s.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np

from .._version import __version__
from ..core import dtypes as D
from ..core.errors import ArgumentError, OpforgeError, describe
from ..core.files import atomic_write
from ..core.opdef import registry
from ..core.spec import Dim, Elem, Spec
from ..program.desc import Program
from ..program.trace import trace

DEFAULT_OPSET = 21
MIN_OPSET = 17  # what many runtimes in the field still run; Graph.reduce writes Reduce*'s axes as each opset wants
MAX_OPSET = 23  # the newest opset the pinned ONNX Runtime runs every op we emit at


class OnnxExportError(OpforgeError, ValueError):
    """A program that cannot be written as ONNX: an op with no mapping, or attrs its mapping cannot express."""


# The ops that have no ONNX form, and why (docs/onnx.md lists them; tests/test_onnx_export.py fails on any other op
# without a mapping). Besides these, the dedicated gradient ops (``_GRADIENT_OP``) have none: a model is exported
# for inference, and a program's backward ops fall away.
_NO_FACTORIZATION = "ONNX has no matrix inverse, linear solve or factorization op (only Det)"
_ONE_DEVICE = "a collective across ranks: an ONNX model runs in one process"
_TRAINING = "an optimizer's update, a training step: ONNX models are exported for inference"
_SPECIAL = "ONNX has no special functions but Erf, and a composition of its ops would not keep their accuracy"
_SAMPLING = ("a draw from opforge's seeded generator: ONNX's Multinomial draws from the runtime's own, so an exported "
             "model would not give the same samples (and of.manual_seed would not reach it)")
NOT_EXPORTABLE = {
    **dict.fromkeys(["linalg_inv", "linalg_solve", "linalg_cholesky", "linalg_qr", "linalg_svd",
                     "linalg_eigh", "linalg_lu_factor", "lu_unpack", "cholesky_solve", "linalg_pinv",
                     "linalg_slogdet", "linalg_matrix_exp"], _NO_FACTORIZATION),
    **dict.fromkeys(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"], _ONE_DEVICE),
    **dict.fromkeys(["sgd_momentum_buffer", "sgd_update", "adam_exp_avg", "adam_exp_avg_sq", "adam_update"],
                    _TRAINING),
    **dict.fromkeys(["erfc", "erfinv", "lgamma", "digamma", "polygamma", "i0", "special_i1"], _SPECIAL),
    "multinomial": _SAMPLING,
}
_GRADIENT_OP = re.compile(r"_grad(_grad|_input|_weight)?$")  # relu_grad, max_pool_grad_grad, conv_grad_input


_LIBRARY = str(Path(__file__).resolve().parents[1])


def not_exportable(opdef) -> str | None:
    """Why the library's op ``opdef`` has no ONNX form, or None if it should have one (a user's op always may)."""
    if not opdef.defined_at.startswith(_LIBRARY):
        return None
    if opdef.name in NOT_EXPORTABLE:
        return NOT_EXPORTABLE[opdef.name]
    if _GRADIENT_OP.search(opdef.name):
        return "a gradient op: ONNX models are exported for inference (the backward pass falls away)"
    return None


def elem_type(dtype: np.dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


# Nodes whose result dtype is not their first input's (what Graph.op gives an output by default).
_RESULT_DTYPE = {t: D.int64 for t in ("Shape", "Size", "ArgMax", "ArgMin", "NonZero")} | {
    t: D.bool_ for t in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor",
                         "IsNaN", "IsInf")}


class Value:
    """An ONNX value while exporting: its name in the graph and, where known, its Spec (None dims: run time)."""

    __slots__ = ("name", "spec")

    def __init__(self, name: str, spec: Spec | None = None):
        self.name = name
        self.spec = spec

    @property
    def dtype(self) -> np.dtype:
        return self.spec.dtype

    @property
    def shape(self) -> tuple:
        return self.spec.shape

    @property
    def ndim(self) -> int:
        return len(self.spec.shape)

    def __repr__(self) -> str:
        return f"Value({self.name!r}, {self.spec})"


class Graph:
    """The builder an op's ONNX mapping writes through: ``g.op(...)`` adds a node, ``g.const(...)`` a constant.

    ``g.opset`` is the opset being written; ``g.outputs`` the Specs of the op being lowered (a mapping that must
    cast to the op's result dtype reads it there); ``g.needed`` whether the model reads each of them (a mapping may
    return None for one it does not: the states a sequence op keeps for its backward pass); ``g.unsupported(why)``
    refuses an attr combination clearly.
    """

    def __init__(self, opset: int, program: Program):
        from onnx import helper

        self._helper = helper
        self.opset = opset
        self.nodes: list = []
        self.initializers: dict = {}  # name -> array
        self._consts: dict = {}  # (dtype, shape, bytes) -> name
        self._names: set = set(program.block.vars)
        self._counter = 0
        self.values: dict = {}  # our variable name -> Value
        self.outputs: list = []
        self.needed: list = []
        self._sources: dict = {}  # ONNX value name -> (our op, its input Values, its attrs)
        self.current = ""  # the op being lowered, for messages

    # -- for mappings ---------------------------------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        while True:
            self._counter += 1
            name = f"{hint}_{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    def op(self, op_type: str, *inputs, outputs: int = 1, spec: Spec | None = None, **attrs):
        """Add a node; return its output Value (a tuple when ``outputs`` > 1). The output's Spec is ``spec`` or,
        by default, the first input's (right for elementwise nodes; give ``spec`` where a later step reads it).
        None inputs are ONNX's missing optional inputs; None attrs are left out; bools become ints."""
        names = []
        for v in inputs:
            if v is None:
                names.append("")
            elif isinstance(v, Value):
                names.append(v.name)
            else:
                raise OnnxExportError(f"{self.current}: ONNX mapping passed {describe(v)} to {op_type}; "
                                      "inputs are Values (make constants with g.const)")
        while names and names[-1] == "":
            names.pop()
        outs = [self.fresh(op_type) for _ in range(outputs)]
        clean = {}
        for k, v in attrs.items():
            if v is None:
                continue
            if isinstance(v, bool):
                v = int(v)
            elif isinstance(v, tuple):
                v = [int(e) if isinstance(e, bool) else e for e in v]
            clean[k] = v
        self.nodes.append(self._helper.make_node(op_type, names, outs, name=self.fresh(f"n_{op_type}"), **clean))
        if spec is None and outputs == 1:
            typed = inputs[1:] if op_type == "Where" else inputs  # Where's first input is its bool condition
            spec = next((v.spec for v in typed if isinstance(v, Value)), None)
            if spec is not None and op_type in _RESULT_DTYPE:
                spec = Spec((spec.ndim,) if op_type == "Shape" else spec.shape, _RESULT_DTYPE[op_type])
        values = [Value(n, spec if outputs == 1 else None) for n in outs]
        return values[0] if outputs == 1 else tuple(values)

    def const(self, value, dtype=None) -> Value:
        """A constant: a Constant node, shared by every use of the same value (initializers are parameters, which
        an importer may train; a constant is not one)."""
        from onnx import numpy_helper

        array = np.asarray(value, dtype=dtype)
        if array.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
            array = array.astype(np.float32)
        key = (array.dtype.str, array.shape, array.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self._consts[key] = self.fresh("const")
            self.nodes.append(self._helper.make_node("Constant", [], [name], name=self.fresh("n_Constant"),
                                                     value=numpy_helper.from_array(array)))
        return Value(name, Spec(array.shape, array.dtype))

    def filled(self, shape: Value, value, dtype) -> Value:
        """A tensor of the (1-d int64) ``shape``, every element ``value`` of ``dtype`` (ConstantOfShape)."""
        from onnx import numpy_helper

        fill = numpy_helper.from_array(np.array([value], dtype=dtype))
        return self.op("ConstantOfShape", shape, value=fill, spec=Spec((), np.dtype(dtype)))

    def call(self, op_name: str, *inputs, **attrs):
        """The ONNX mapping of another op (``g.call("log1p", x)``): compositions reuse mappings, not copy them."""
        return registry.get(op_name).onnx_fn(self, *inputs, **attrs)

    def scalar(self, value, like: Value) -> Value:
        """A 0-d constant of ``like``'s dtype."""
        return self.const(np.asarray(value, dtype=like.dtype))

    def ints(self, values) -> Value:
        """A 1-d int64 tensor of ``values`` (a shape, axes, pads); a ``Dim`` (a run-time size) is read from the
        shape of its variable, so the model stays valid for every size."""
        values = tuple(values)
        if not any(isinstance(v, Dim) for v in values):
            return self.const(np.array(values, dtype=np.int64).reshape(len(values)))
        parts = []
        for v in values:
            if isinstance(v, Elem):  # an element of a shape the program computes
                flat = self.op("Reshape", self.cast(self.values[v.var], D.int64), self.const(np.array([-1], np.int64)),
                               spec=Spec((None,), D.int64))
                part = self.op("Slice", flat, self.const(np.array([v.axis], np.int64)),
                               self.const(np.array([v.axis + 1], np.int64)), spec=Spec((1,), D.int64))
                parts.append(part if v.sign > 0 else self.op("Neg", part, spec=Spec((1,), D.int64)))
            elif isinstance(v, Dim):
                source = self.values[v.var]
                axis = v.axis % len(source.shape)
                parts.append(self.op("Shape", source, start=axis, end=axis + 1, spec=Spec((1,), D.int64)))
            else:
                parts.append(self.const(np.array([v], dtype=np.int64)))
        return self.op("Concat", *parts, axis=0)

    def cast(self, x: Value, dtype) -> Value:
        """``x`` as ``dtype`` (no node when it already is)."""
        dtype = np.dtype(dtype)
        if x.spec is not None and x.dtype == dtype:
            return x
        shape = x.spec.shape if x.spec is not None else None
        return self.op("Cast", x, to=elem_type(dtype), spec=None if shape is None else Spec(shape, dtype))

    def reduce(self, op_type: str, x: Value, axis, keepdim: bool, spec: Spec | None = None) -> Value:
        """A Reduce* node over ``axis`` (None: every axis; (): none, as NumPy's ``axis=()``). ReduceSum takes its
        axes as an input from opset 13 on, the other Reduce* from 18 on; before that they are an attribute."""
        axes_as_input = op_type == "ReduceSum" or self.opset >= 18
        if axis is None:
            return self.op(op_type, x, keepdims=keepdim, spec=spec)
        if not axis:
            if not axes_as_input:  # no noop_with_empty_axes before 18: reducing over no axis changes nothing
                return self.op("Identity", x, spec=spec)
            return self.op(op_type, x, keepdims=keepdim, noop_with_empty_axes=1, spec=spec)
        axes = [a % max(x.ndim, 1) for a in axis]
        if not axes_as_input:
            return self.op(op_type, x, keepdims=keepdim, axes=axes, spec=spec)
        return self.op(op_type, x, self.ints(axes), keepdims=keepdim, spec=spec)

    def exact(self, value: float) -> bool:
        """Whether ``value`` survives as an ONNX float attribute (float32): float64 exports need it exact."""
        return float(np.float32(value)) == float(value)

    def source(self, value: Value):
        """(op name, input Values, attrs) of the op of ours whose result ``value`` is, or None (a feed, a parameter,
        a constant): a mapping may write a node of its own over that op's inputs (an ONNX LSTM over the input
        projection's x and weights). The producer's nodes stay only if something else reads them."""
        return self._sources.get(value.name)

    def unsupported(self, why: str) -> OnnxExportError:
        return OnnxExportError(f"{self.current}: cannot be written as ONNX opset {self.opset}: {why}")


# -- the walk over a program ---------------------------------------------------------------------------------------


def _needed_ops(program: Program) -> list:
    """The ops the outputs depend on (backward and optimizer ops fall away)."""
    needed = set(program.outputs.values())
    kept = []
    for op in reversed(program.block.ops):
        if any(n in needed for n in op.output_names()):
            kept.append(op)
            needed.update(op.input_names(), op.value_reads())
    return kept[::-1]


def _value_info(helper, name: str, spec: Spec, dims=None):
    shape = dims if dims is not None else [d for d in spec.shape]
    return helper.make_tensor_value_info(name, elem_type(spec.dtype), shape)


def program_to_onnx(program: Program, opset: int = DEFAULT_OPSET, name: str = "opforge", rename=None):
    """The ONNX ModelProto of ``program``'s outputs (checked by ``onnx.checker`` with full shape inference).
    ``rename`` maps variable names to the names their initializers get (a module's parameter names)."""
    import onnx
    from onnx import helper, numpy_helper

    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ArgumentError(f"onnx.export(): opset must be an int from {MIN_OPSET} to {MAX_OPSET}, got {opset!r}")
    if not program.outputs:
        raise OnnxExportError("onnx.export(): the program has no outputs")
    block = program.block
    g = Graph(opset, program)
    inputs = []
    for n in program.feeds:
        spec = block.vars[n].spec
        g.values[n] = Value(n, spec)
        dims = [f"{n}_dim{i}" if d is None else d for i, d in enumerate(spec.shape)]
        inputs.append(_value_info(helper, n, spec, dims))
    ops = _needed_ops(program)
    used = {n for op in ops for n in (*op.input_names(), *op.value_reads())} | set(program.outputs.values())
    rename = {k: v for k, v in (rename or {}).items() if v not in block.vars}
    for n, array in program.values.items():
        if n in used and block.vars[n].persistable:  # parameters and state: initializers
            g.values[n] = Value(rename.get(n, n), block.vars[n].spec)
            g.initializers[rename.get(n, n)] = array
        elif n in used:  # a constant of the traced code
            g.values[n] = g.const(array)
    for i, op in enumerate(ops):
        opdef = registry.get(op.type)
        g.current = f"op #{i} {op.type} -> {', '.join(op.output_names())}"
        if opdef.onnx_fn is None and not_exportable(opdef):
            raise OnnxExportError(f"onnx.export(): op '{op.type}' has no ONNX form: {not_exportable(opdef)}")
        if opdef.onnx_fn is None:
            raise OnnxExportError(
                f"onnx.export(): op '{op.type}' (defined at {opdef.defined_at}) has no ONNX mapping; give it one "
                f"with @{op.type}.onnx, a function (g, <inputs>, <attrs>) that emits ONNX nodes through g "
                "(docs/onnx.md shows how)")
        args = []
        for p in opdef.inputs:
            names = op.inputs[p.name]
            if p.is_list:
                args.append([g.values[n] for n in names])
            else:
                args.append(g.values[names[0]] if names else None)
        g.outputs = [block.vars[n].spec for n in op.output_names()]
        g.needed = [n in used for n in op.output_names()]
        result = opdef.onnx_fn(g, *args, **op.attrs)
        flat = []
        for o, r in zip(opdef.outputs, result if len(opdef.outputs) > 1 else (result,)):
            flat.extend(r if o.is_list else [r])
        if len(flat) != len(op.output_names()) or not all(
                isinstance(v, Value) or (v is None and not needed) for v, needed in zip(flat, g.needed)):
            raise OnnxExportError(f"{g.current}: the ONNX mapping of '{op.type}' must return "
                                  f"{len(op.output_names())} Value(s) (None only for those the model does not read), "
                                  f"returned {describe(result)}")
        for n, v in zip(op.output_names(), flat):
            if v is not None:
                g.values[n] = Value(v.name, block.vars[n].spec)
                g._sources.setdefault(v.name, (op.type, args, dict(op.attrs)))  # a mapping may pass a Value on
    read = _drop_unread_nodes(g, {g.values[var].name for var in program.outputs.values()})
    outputs = _name_outputs(g, program, helper)
    initializers = [numpy_helper.from_array(np.asarray(a), n) for n, a in g.initializers.items() if n in read]
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opforge",
                              producer_version=_version())
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))  # what older runtimes read
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # our bug, not the user's: say which model and why
        raise OnnxExportError(f"onnx.export(): the written model fails onnx.checker: {e}") from None
    return model


def _drop_unread_nodes(g: Graph, read: set) -> set:
    """Remove the nodes nothing reads (a mapping that wrote a node over its input's producer leaves them); return
    the names the graph reads."""
    kept = []
    for node in reversed(g.nodes):
        if any(o in read for o in node.output):
            kept.append(node)
            read.update(node.input)
    g.nodes[:] = kept[::-1]
    return read


def _name_outputs(g: Graph, program: Program, helper) -> list:
    """Graph outputs carry the program's output names: the producing node's output is renamed where it can be,
    else an Identity node gives the name."""
    produced = {o: node for node in g.nodes for o in node.output}
    taken = set(program.feeds) | set(g.initializers)
    outputs, renamed = [], {}
    for key, var in program.outputs.items():
        value = g.values[var]
        source = renamed.get(value.name, value.name)
        if source in produced and key not in taken and key not in renamed.values() and source not in renamed:
            for node in g.nodes:
                node.input[:] = [key if n == source else n for n in node.input]
                node.output[:] = [key if n == source else n for n in node.output]
            renamed[source] = key
        elif source != key:
            if key in taken or key in renamed.values():
                raise OnnxExportError(f"onnx.export(): output name {key!r} is also the name of an input, a "
                                      "parameter or another output; rename it")
            g.nodes.append(helper.make_node("Identity", [source], [key], name=g.fresh("n_Identity")))
        taken.add(key)
        outputs.append(_value_info(helper, key, program.block.vars[var].spec))
    return outputs


def _version() -> str:
    return __version__


# -- the public call -----------------------------------------------------------------------------------------------


def _specs_for(fn, inputs) -> dict:
    params = list(inspect.signature(fn).parameters)
    if isinstance(inputs, dict):
        given = dict(inputs)
    elif isinstance(inputs, (list, tuple)) and not isinstance(inputs, Spec):
        if len(inputs) > len(params):
            raise ArgumentError(f"onnx.export(): {len(inputs)} inputs for a function of {len(params)} arguments")
        given = dict(zip(params, inputs))
    else:
        given = {params[0]: inputs} if params else {}
    specs = {}
    for name, v in given.items():
        if isinstance(v, Spec):
            specs[name] = v
        elif hasattr(v, "shape") and hasattr(v, "dtype"):
            specs[name] = Spec(tuple(v.shape), D.as_dtype(v.dtype, op="onnx.export", arg=name))
        else:
            raise ArgumentError(f"onnx.export(): input '{name}' expected a Spec, a Tensor or an array, "
                                f"got {describe(v)}")
    return specs


def export(model, path=None, inputs=None, *, opset: int = DEFAULT_OPSET, name: str | None = None):
    """Write ``model`` — a Program, a function or an ``nn.Module`` — as an ONNX model; return the ModelProto.

    ``inputs`` gives the Specs (or example tensors) of the function's arguments: one, a tuple in order, or a dict by
    name; a ``None`` dim in a Spec becomes a named dynamic dim (``x_dim0``). A module is traced in eval mode
    (dropout off, batch norm on its running statistics). Parameters become initializers. Writes ``path`` atomically
    when given.
    """
    from ..nn import Module

    if isinstance(model, Program):
        if inputs is not None:
            raise ArgumentError("onnx.export(): a Program has its feeds already; pass no inputs")
        program = model
    elif callable(model):
        fn = model.forward if isinstance(model, Module) else model
        if inputs is None:
            raise ArgumentError("onnx.export(): give the inputs' Specs (or example tensors) to trace the function")
        names = getattr(model, "input_names", None)  # a module taking *inputs by name (an imported OnnxModule)
        if names is not None and not isinstance(inputs, dict):
            inputs = dict(zip(names, inputs if isinstance(inputs, (list, tuple)) and not isinstance(inputs, Spec)
                              else [inputs]))
            fn = model.forward
        was_training = isinstance(model, Module) and model.training
        if was_training:
            model.eval()
        try:
            program = trace(fn, **_specs_for(fn, inputs))
        finally:
            if was_training:
                model.train()
    else:
        raise ArgumentError(f"onnx.export(): expected a Program, a function or a module, got {describe(model)}")
    rename = {}
    if isinstance(model, Module):  # initializers named as the module's parameters and buffers ("0.weight")
        known = program._tensor_vars
        named = [*model.named_parameters(), *model.named_buffers()]
        rename = {known[id(t)][1]: key for key, t in named if id(t) in known and known[id(t)][0] is t}
    proto = program_to_onnx(program, opset, name or _graph_name(model), rename)
    if path is not None:
        data = proto.SerializeToString()
        atomic_write(str(path), lambda f: f.write(data))
    return proto


def _graph_name(model) -> str:
    text = type(model).__name__ if not inspect.isfunction(model) else model.__name__
    return re.sub(r"\W", "_", text) or "opforge"
