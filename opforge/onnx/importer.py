"""Import: an ONNX model becomes a Program of our ops, which the Executor runs and ``append_backward`` differentiates.

The model is read as data (protobuf, no pickle, external data from files inside the model's folder only, no custom
ops: nothing in it is executed), checked,
and then *traced*: each node's importer (``importers.py``, keyed by ONNX op type) calls our ops on program
variables, exactly as a traced function does, so every node becomes one or several OpDescs checked by the ops' own
shape rules. Float initializers become trainable parameters; integer and bool ones (shapes, indices) constants.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np

from ..core import dtypes as D
from ..core.errors import OpforgeError, describe
from ..core.spec import Dim, Spec
from ..creation import tensor
from ..nn.module import Module
from ..program.desc import Program
from ..program.trace import Variable, trace, tracing_program
from ..tensor import Tensor
from .shapes import FOLD_ELEMENTS, NotAtImport, constant, from_shapes, shape_variable, sizes_of, value_at_import
from .types import (
    _DTYPES,
    _TYPE_NAMES,
    HELD,
    LOW_FLOATS,
    NARROW,
    NeedsConstant,
    OnnxImportError,
    Seq,
    dtype_of,
    round_to,
    stored_dtype,
    type_name,
    value_kind,
    wrap,
)

CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}  # ONNX ops with subgraphs, inlined at import (importers.py)
MAX_NESTING = 16  # subgraphs in subgraphs: checked (and imported) recursively, so bounded
MAX_UNROLLED = 4096  # iterations of Loops and Scans a model's import may unroll, all together
MAX_CONSTANT_BYTES = 1 << 30  # load()'s default bound on the constants it computes from sizes the file gives
MAX_RANK = 64  # NumPy's


class Node:
    """What an importer sees of one ONNX node: its attributes (each read is recorded, so that an attribute no
    importer read is refused by name), its inputs as program variables or constants, and the opset."""

    def __init__(self, proto, opset: int, env: dict, importer, narrow: dict | None = None, graphs=None):
        self.proto = proto
        self._graphs = graphs  # what runs a subgraph's nodes (If, Loop, Scan): the _Parsed model
        self.narrow = narrow or {}  # value name -> its narrow ONNX type (held as int64 or float32: types.HELD)
        self.op_type = proto.op_type
        self.opset = opset
        self.name = _node_name(proto)
        self.env = env
        self._importer = importer
        self._attrs = {a.name: a for a in proto.attribute}
        self.read: set = set()

    # -- what importers call -------------------------------------------------------------------------------------

    def where(self) -> str:
        return f"node {self.name!r} ({self.op_type}, opset {self.opset})"

    def unsupported(self, what: str) -> OnnxImportError:
        return OnnxImportError(f"{self.where()}: {what} is not supported")

    def attr(self, name: str, default=None):
        """The attribute's value (ints, floats, strings as str, lists as tuples, tensors as arrays), or default."""
        from onnx import helper, numpy_helper

        self.read.add(name)
        a = self._attrs.get(name)
        if a is None:
            return default
        if a.ref_attr_name:
            raise self.unsupported(f"attribute {name!r} referring to a function's attribute")
        field = _SCALAR_FIELDS.get(a.type)
        if field is not None and not a.HasField(field):  # protobuf would read its default: 0, "" or an empty tensor
            raise OnnxImportError(f"{self.where()}: attribute {name!r} is declared "
                                  f"{a.AttributeType.Name(a.type)} but holds no value")
        if a.type == a.TENSOR:
            return self._importer.array(a.t, f"{self.where()}: attribute {name!r}")
        if a.type == a.SPARSE_TENSOR:
            raise self.unsupported(f"attribute {name!r} (a sparse tensor)")
        value = helper.get_attribute_value(a)
        try:
            if isinstance(value, bytes):
                return value.decode("utf-8")
            if isinstance(value, list):
                return tuple(v.decode("utf-8") if isinstance(v, bytes) else v for v in value)
        except UnicodeDecodeError:
            raise OnnxImportError(f"{self.where()}: attribute {name!r} holds a string that is not valid UTF-8") \
                from None
        del numpy_helper
        if name in _FLAGS and value not in (0, 1):  # (what a runtime makes of keepdims=7 is its own guess)
            raise OnnxImportError(f"{self.where()}: attribute {name!r} is a flag, 0 or 1; got {value}")
        return value

    def axes(self, axes, rank: int, what: str = "axes") -> list:
        """``axes`` in [0, rank), each once: ONNX allows -rank to rank - 1 and no repeats, and refuses the rest
        (taking them modulo rank would read axis 4096 as some axis)."""
        if any(isinstance(a, Dim) for a in axes):
            raise self.unsupported(f"{what} computed at run time")
        axes = [int(a) for a in axes]
        if any(not -rank <= a < rank for a in axes) or len(set(a % rank for a in axes)) < len(axes):
            raise OnnxImportError(f"{self.where()}: {what} {axes[:MAX_RANK]} must be distinct axes of a rank-{rank} "
                                  f"tensor (from {-rank} to {rank - 1})")
        return [a % rank for a in axes]

    def has(self, i: int) -> bool:
        return i < len(self.proto.input) and self.proto.input[i] != ""

    @property
    def count(self) -> int:
        return len(self.proto.input)

    def input(self, i: int):
        """Input ``i`` as something our ops take (a Variable or a constant Tensor); None when it is absent."""
        if not self.has(i):
            return None
        return self.operand(self.env[self.proto.input[i]], self.proto.input[i])

    def operand(self, value, name: str):
        """A value of the import (a Variable, an array or a shape known at import) as something our ops take."""
        if isinstance(value, np.ndarray) and value.dtype == object:
            if value.ndim != 1 and any(isinstance(d, Dim) for d in value.reshape(-1).tolist()):
                return shape_variable(value)
            value = tuple(value.reshape(-1).tolist())
        if isinstance(value, tuple):  # a shape known only symbolically
            if any(isinstance(d, Dim) for d in value):
                return shape_variable(value)  # used as data: computed in the program
            value = np.array(value, np.int64)
        if isinstance(value, np.ndarray):
            return self._importer.constant(name, value)
        return value

    def run_graph(self, graph, bound: dict) -> list:
        """Subgraph ``graph`` (a branch, a loop's body) inlined here: its nodes imported on the values of the
        enclosing scope, its inputs given by ``bound`` (name -> value); the values of its outputs."""
        return self._graphs.run_graph(graph, self.env, bound)

    def inputs(self) -> list:
        return [self.input(i) for i in range(self.count) if self.has(i)]

    def const(self, i: int, what: str = "") -> np.ndarray | None:
        """The value of input ``i`` when it is known at import (an initializer, a Constant, shape arithmetic)."""
        if not self.has(i):
            return None
        value = self.env[self.proto.input[i]]
        if isinstance(value, np.ndarray) and value.dtype == object:
            value = tuple(value.reshape(-1).tolist())
        if isinstance(value, tuple):
            if any(isinstance(d, Dim) for d in value):
                raise self.unsupported(f"input {what or i} holding sizes known only at run time here")
            return np.array(value, np.int64)
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, Tensor):  # computed eagerly (load_module): its value is known
            return value.numpy()
        initial = self._importer.initial.get(self.proto.input[i])
        if initial is not None:
            return initial
        needed, reads = self.proto.input[i], ""
        if isinstance(value, Variable):
            try:
                return value_at_import(value)
            except NotAtImport as e:
                if e.name in value.program.feeds and e.name != needed:  # (binding that graph input gives it)
                    needed, reads = e.name, f", computed from graph input {e.name!r},"
        raise NeedsConstant(f"{self.where()}: input {what or i} ({self.proto.input[i]!r}){reads} is computed or fed "
                            "at run time; opforge needs it at load: make it a constant (an initializer or a Constant "
                            "node), or bind its value with onnx.load(..., bind={name: value})", needed)

    def known(self, i: int) -> bool:
        """Whether input ``i``'s value is known at import (``const`` gives it), not computed in the program."""
        value = self.env[self.proto.input[i]]
        if self.proto.input[i] in self._importer.initial or (isinstance(value, Tensor) and
                                                               not isinstance(value, Variable)):
            return True
        return isinstance(value, (tuple, np.ndarray)) and not _symbolic_dims(value)

    def from_shapes(self, i: int) -> bool:
        """Whether input ``i`` is an integer variable computed from shapes and constants alone, which an op's attr
        may read (the executor computes it when it plans a run for the feeds' shapes)."""
        value = self.env[self.proto.input[i]]
        return isinstance(value, Variable) and value.dtype.kind in "iu" and from_shapes(value)

    def ints(self, i: int, what: str = "") -> tuple | None:
        """Input ``i`` as a tuple of ints, with ``Dim``s for sizes known only at run time (a shape). ONNX gives such
        lists (shapes, axes, pads, repeats) as 1-D tensors, and refuses others (a 2-D one was read flattened)."""
        if not self.has(i):
            return None
        value = self.env[self.proto.input[i]]
        if len(self.spec(i).shape) != 1:
            raise OnnxImportError(f"{self.where()}: input {what or i} ({self.proto.input[i]!r}) must be a 1-D tensor "
                                  f"of ints, got shape {self.spec(i).shape}")
        if isinstance(value, np.ndarray) and value.dtype == object:
            return tuple(value.reshape(-1).tolist())
        if isinstance(value, tuple):
            return value
        if self.from_shapes(i) and value.spec.shape[0] is not None:
            return sizes_of(value)  # computed from shapes in the program: read when the executor plans a run
        return tuple(int(v) for v in np.asarray(self.const(i, what)).reshape(-1))

    def spec(self, i: int) -> Spec:
        value = self.env[self.proto.input[i]]
        if isinstance(value, tuple):
            return Spec((len(value),), D.int64)
        if isinstance(value, Variable):
            return value.spec  # (its unknown dims None)
        if isinstance(value, np.ndarray) and value.dtype == object:  # sizes, some known only at run time
            return Spec(value.shape, D.int64)
        return Spec(tuple(value.shape), value.dtype)  # an array or a Tensor

    def shape(self, i: int) -> tuple:
        """Input ``i``'s shape, a ``Dim`` for each size known only at run time."""
        value = self.env[self.proto.input[i]]
        if isinstance(value, Variable):
            return value.shape
        return self.spec(i).shape

    @property
    def outputs(self) -> int:
        return len(self.proto.output)

    def allocate(self, shape, dtype) -> tuple:
        """``shape`` checked, before an array of it is made, against what load() lets constants take."""
        return self._importer.allocate(shape, dtype, self.where())


_SCALAR_FIELDS = {1: "f", 2: "i", 3: "s", 4: "t"}  # AttributeProto FLOAT, INT, STRING, TENSOR: the field set
_FLAGS = {"keepdims", "noop_with_empty_axes", "select_last_index", "transA", "transB", "reverse", "exclusive",
          "ceil_mode", "count_include_pad", "storage_order", "training_mode", "is_test", "spatial", "allowzero",
          "upper", "detect_negative", "detect_positive", "broadcast", "saturate", "is_causal", "sorted",
          "largest", "interleaved"}  # ints ONNX defines as 0 or 1


class Importer:
    def __init__(self, model, max_constant_bytes: int = MAX_CONSTANT_BYTES, folder: Path | None = None):
        self.model = model
        self.folder = folder  # where external data is read from (the model file's folder), or None
        self.initial: dict = {}  # float initializer name -> its value (read when a node needs a constant)
        self._constants: dict = {}  # name -> read-only Tensor: one program constant per ONNX value
        self.max_constant_bytes = max_constant_bytes
        self.constant_bytes = 0  # what the constants computed so far hold
        self.unrolled = 0  # the loop and scan iterations unrolled so far, all loops together (nested ones multiply)

    def unroll(self, where: str) -> None:
        """Count one more iteration of a Loop or Scan unrolled at load, against ``MAX_UNROLLED`` for the model."""
        self.unrolled += 1
        if self.unrolled > MAX_UNROLLED:
            raise OnnxImportError(f"{where}: loops and scans unrolled at load past {MAX_UNROLLED} iterations in all "
                                  "(nested ones multiply) are not supported")

    def allocate(self, shape, dtype, where: str) -> tuple:
        """Count a constant the import computes (ConstantOfShape, Range, EyeLike, shape arithmetic) against
        ``max_constant_bytes``, all such constants together, before it is made: its size comes from the file."""
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_RANK or any(d < 0 for d in shape):
            raise OnnxImportError(f"{where}: a constant of shape {list(shape[:MAX_RANK + 1])} (negative sizes or "
                                  f"more than {MAX_RANK} dims) cannot be made")
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if self.constant_bytes + size > self.max_constant_bytes:
            raise OnnxImportError(f"{where}: a constant of shape {shape} {np.dtype(dtype)} takes {size} bytes, past "
                                  f"the {self.max_constant_bytes} bytes the constants computed at load may take "
                                  f"together ({self.constant_bytes} taken); onnx.load(..., max_constant_bytes=n) "
                                  "raises the limit")
        self.constant_bytes += size
        return shape

    def array(self, proto, what: str) -> np.ndarray:
        from onnx import numpy_helper

        dtype_of(proto.data_type, f"{what}: tensor {proto.name!r}")
        external = _external(proto, what, self.folder)
        if external is not None:  # read into a copy that holds its data
            path, offset, size = external
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(size)
            held = type(proto)()
            held.CopyFrom(proto)
            held.ClearField("external_data")
            held.data_location = held.DEFAULT
            held.raw_data = data
            proto = held
        try:
            array = numpy_helper.to_array(proto)
        except Exception as e:
            raise OnnxImportError(f"{what}: tensor {proto.name!r} is malformed: {e}") from None
        expected = tuple(proto.dims)
        if array.shape != expected:
            raise OnnxImportError(f"{what}: tensor {proto.name!r} holds {array.size} values for shape {expected}")
        return np.array(array, dtype=_DTYPES[proto.data_type])  # a writable copy of our own

    def constant(self, name: str, value: np.ndarray):
        t = self._constants.get(name)
        # (a module imported once runs on inputs of many shapes: a value computed from their shapes changes)
        if t is None or t.dtype != value.dtype or not np.array_equal(t.numpy(), value):
            t = self._constants[name] = constant(value)  # a constant of the program, not state
        return t


def _read(source):
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray)):
        data, where = bytes(source), "the given bytes"
    elif isinstance(source, (str, Path)):
        where = str(source)
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise OnnxImportError(f"onnx.load(): cannot read {where}: {e}") from None
    else:
        raise OnnxImportError(f"onnx.load(): expected a path, bytes or an onnx.ModelProto, got {describe(source)}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise OnnxImportError(f"onnx.load(): {where} is not an ONNX model (truncated or damaged protobuf: {e})") \
            from None
    if not model.HasField("graph"):
        raise OnnxImportError(f"onnx.load(): {where} holds no graph: not an ONNX model, or an empty one")
    return model


def _opset(model) -> int:
    import onnx

    if not 3 <= model.ir_version <= onnx.IR_VERSION:  # (0: not set)
        raise OnnxImportError(f"onnx.load(): the model declares IR version {model.ir_version}; opforge reads IR "
                              f"versions 3 to {onnx.IR_VERSION} (onnx {onnx.__version__}); older models have no "
                              "opset versions (onnx.version_converter updates them)")
    versions = {}
    for o in model.opset_import:
        versions[o.domain or "ai.onnx"] = o.version
    if not model.opset_import:  # (reading it as opset 1, as IR version 2 did, would give other numbers)
        raise OnnxImportError(f"onnx.load(): the model (IR version {model.ir_version}) imports no opset: the "
                              "meaning of its ops is unknown")
    if "ai.onnx" not in versions:
        raise OnnxImportError(f"onnx.load(): the model imports no ai.onnx opset (it imports {sorted(versions)})")
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= versions["ai.onnx"] <= newest:
        raise OnnxImportError(f"onnx.load(): the model imports ai.onnx opset {versions['ai.onnx']}; opsets run from 1 "
                              f"to {newest} (onnx {onnx.__version__})")
    return versions["ai.onnx"]


def _node_name(node) -> str:
    return node.name or (node.output[0] if node.output else "?")


def _check(model, opset: int, folder: Path | None = None):
    """Refuse what is not valid ONNX, or not what opforge imports, before anything in the model is read: each node
    must be of a type we import, read only names assigned before it (no cycles), assign names no one else does, and
    pass ``onnx.checker``'s check against its op's schema (its number of inputs and outputs, its attributes and their
    types); each tensor must hold the data its dims say. Refused before the checker sees them: names that are not
    UTF-8 (protobuf hands them over as bytes), data in external files but for files inside the model's folder
    (``_external``), and anything that nests (subgraphs, functions, training graphs, sequence or map types), which
    opforge does not import and the checker walks recursively, down to a C stack overflow for a graph nested
    thousands deep."""
    from onnx import IR_VERSION, checker

    from .importers import IMPORTERS  # (they import this module's helpers)

    def text(value, what):
        if not isinstance(value, str):
            raise OnnxImportError(f"onnx.load(): {what} {bytes(value[:80])!r} is not valid UTF-8")

    ctx = checker.C.CheckerContext()
    ctx.ir_version = model.ir_version or IR_VERSION
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import} or {"": opset}

    def valid(check, proto, where):
        try:
            check(proto, ctx)
        except Exception as e:  # (a ValidationError, or whatever else the checker meets: the file is what is wrong)
            raise OnnxImportError(f"{where}: not valid ONNX: {str(e).strip().splitlines()[0][:1000]}") from None

    def stripped(node):
        """``node`` with each subgraph's nodes replaced by Constants giving its outputs: what the checker checks of
        a control-flow node itself (its subgraphs' nodes are checked one by one, with the names they see)."""
        from onnx import helper

        copy = type(node)()
        copy.CopyFrom(node)
        for a in copy.attribute:
            if a.HasField("g"):
                a.g.ClearField("node")
                a.g.node.extend(helper.make_node("Constant", [], [o.name], value=helper.make_tensor(o.name, 1, [], [0]))
                                for o in a.g.output
                                if o.name not in {i.name for i in a.g.input})
        return copy

    def check_values(values, where):
        for vi in values:
            text(vi.name, "value name")
            if not value_kind(vi.type):
                raise OnnxImportError(f"{where}: value {vi.name!r} is a {vi.type.WhichOneof('value')}; opforge "
                                      "imports tensors, sequences of tensors and optionals of those")

    def check_nodes(nodes, defined: set, depth: int):
        for node in nodes:
            for value in (node.name, node.op_type, node.domain, *node.input, *node.output):
                text(value, f"node {node.name!r}: its name, op type, domain or a value name")
            where = f"node {_node_name(node)!r} ({node.op_type}, opset {opset})"
            if node.domain not in ("", "ai.onnx"):
                raise OnnxImportError(f"node {_node_name(node)!r} ({node.domain}::{node.op_type}): ops of domain "
                                      f"{node.domain!r} are not supported (custom or ML ops)")
            if node.op_type not in IMPORTERS:
                raise OnnxImportError(f"{where}: ONNX op {node.op_type} is not supported (docs/onnx.md lists the ops "
                                      "opforge imports)")
            for i in node.input:
                if i and i not in defined:
                    raise OnnxImportError(f"{where}: input {i!r} is neither a graph input, an initializer nor the "
                                          "output of an earlier node (a missing initializer, or nodes out of order)")
            for a in node.attribute:
                text(a.name, f"{where}: attribute name")
                if a.graphs or a.type_protos or (a.HasField("g") and node.op_type not in CONTROL_FLOW) or (
                        a.HasField("tp") and node.op_type != "Optional"):  # (Optional's type: an empty one's)
                    raise OnnxImportError(f"{where}: attribute {a.name!r} holds a subgraph or a type: not supported")
                for t in [a.t, *a.tensors]:
                    _external(t, f"{where}: attribute {a.name!r}", None)
                if a.HasField("g"):  # a branch or a loop's body: its nodes see the names defined before this node
                    if depth >= MAX_NESTING:
                        raise OnnxImportError(f"{where}: subgraphs nested more than {MAX_NESTING} deep are not "
                                              "supported")
                    sub = a.g
                    check_values([*sub.input, *sub.output], f"{where}: attribute {a.name!r}")
                    for t in sub.initializer:
                        text(t.name, "initializer name")
                        _external(t, f"{where}: attribute {a.name!r}: initializer", None)
                        valid(checker.check_tensor, t, f"{where}: attribute {a.name!r}: initializer {t.name!r}")
                    if sub.sparse_initializer:
                        raise OnnxImportError(f"{where}: attribute {a.name!r}: sparse initializers are not supported")
                    inner = defined | {vi.name for vi in sub.input} | {t.name for t in sub.initializer}
                    check_nodes(sub.node, inner, depth + 1)
                    produced = inner | {o for m in sub.node for o in m.output}
                    for vi in sub.output:
                        if vi.name not in produced:
                            raise OnnxImportError(f"{where}: attribute {a.name!r}: subgraph output {vi.name!r} is "
                                                  "produced by no node, input or initializer")
            for o in node.output:
                if o in defined:
                    raise OnnxImportError(f"{where}: output {o!r} is a name already given to a graph input, an "
                                          "initializer or another output (ONNX names each value once)")
                if o:
                    defined.add(o)
            valid(checker.check_node, stripped(node) if node.op_type in CONTROL_FLOW else node, where)

    graph = model.graph
    if model.functions or model.training_info:
        raise OnnxImportError("onnx.load(): model-local functions and training information are not supported")
    for o in model.opset_import:
        text(o.domain, "opset domain")
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        text(vi.name, "value name")
        if not value_kind(vi.type):
            raise OnnxImportError(f"onnx.load(): value {vi.name!r} is a {vi.type.WhichOneof('value')} (of "
                                  f"{str(vi.type).split()[0]}); opforge imports tensors, sequences of tensors and "
                                  "optionals of those")
    for names, what in (([vi.name for vi in graph.input], "graph input"), ([t.name for t in graph.initializer],
                                                                          "initializer")):
        if len(set(names)) != len(names):
            raise OnnxImportError(f"onnx.load(): two {what}s are named "
                                  f"{next(n for n in names if names.count(n) > 1)!r}")
    for t in graph.initializer:
        text(t.name, "initializer name")
        if _external(t, "initializer", folder) is None:  # (the checker looks for external files in the cwd)
            valid(checker.check_tensor, t, f"initializer {t.name!r}")
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    check_nodes(graph.node, defined, 0)
    for vi in graph.output:
        if vi.name not in defined:
            raise OnnxImportError(f"onnx.load(): graph output {vi.name!r} is produced by no node, input or initializer")


def _external(t, what: str, folder: Path | None):
    """None for a tensor that holds its data; for one that keeps it in a file, (the file, offset, byte count),
    checked before anything is read: a file inside the model's folder (a relative path without '..', resolving,
    symlinks followed, inside the folder), holding at that offset as many bytes as the tensor's dims say."""
    from pathlib import PurePath

    if not (t.data_location == t.EXTERNAL or t.external_data):
        return None
    name = f"{what}: tensor {t.name!r}"
    if folder is None:
        raise OnnxImportError(f"{name} keeps its data in an external file; load the model from its path (the file "
                              "is read from the model's folder), or pass a ModelProto with the data loaded")
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    relative = PurePath(location)
    if not location or relative.is_absolute() or relative.anchor or ".." in relative.parts:
        raise OnnxImportError(f"{name} keeps its data in {location!r}: opforge reads external data from files "
                              "inside the model's folder only (a relative path, no '..')")
    root = folder.resolve()
    path = (folder / relative).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise OnnxImportError(f"{name} keeps its data in {location!r}, which is not a file inside the model's "
                              f"folder {str(folder)!r} (a symlink out of it, a folder, or missing)")
    dtype_of(t.data_type, name)
    dtype = stored_dtype(t.data_type)
    if len(t.dims) > MAX_RANK or any(d < 0 for d in t.dims):
        raise OnnxImportError(f"{name} has dims {list(t.dims)[:MAX_RANK + 1]}")
    size = math.prod(t.dims) * dtype.itemsize
    try:
        offset = int(info.get("offset", 0))
        length = int(info.get("length", size))
    except ValueError:
        raise OnnxImportError(f"{name}: external data offset {info.get('offset')!r} or length "
                              f"{info.get('length')!r} is not a number") from None
    available = path.stat().st_size
    if length != size or offset < 0 or offset + size > available:
        raise OnnxImportError(f"{name} of dims {list(t.dims)} ({dtype}) takes {size} bytes; its external data "
                              f"says {length} bytes at offset {offset} of {location!r}, a file of {available} bytes")
    return path, offset, size


def _value_spec(vi, what: str) -> Spec:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        raise OnnxImportError(f"{what} {vi.name!r} is a {t.WhichOneof('value') or 'value of no type'}; opforge "
                              "imports tensors only")
    dtype = dtype_of(t.tensor_type.elem_type, f"{what} {vi.name!r}")
    if not t.tensor_type.HasField("shape"):
        raise OnnxImportError(f"{what} {vi.name!r} has no shape (not even a rank); opforge needs the rank")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]
    if len(dims) > MAX_RANK or any(d is not None and d < 0 for d in dims) or \
            math.prod(d for d in dims if d is not None) * dtype.itemsize >= 2**63:
        raise OnnxImportError(f"{what} {vi.name!r} has shape {dims[:MAX_RANK + 1]}: no tensor has negative sizes, "
                              f"more than {MAX_RANK} dims or more bytes than 2**63")
    return Spec(tuple(dims), dtype)


class _Parsed:
    """A model read and checked: its opset, initializer arrays, feeds (name -> Spec), bound inputs and outputs."""

    def __init__(self, source, bind=None, max_constant_bytes: int = MAX_CONSTANT_BYTES):
        self.model = _read(source)
        folder = Path(source).parent if isinstance(source, (str, Path)) else None
        self.opset = _opset(self.model)
        _check(self.model, self.opset, folder)
        graph = self.graph = self.model.graph
        self.importer = Importer(self.model, max_constant_bytes, folder)
        if graph.sparse_initializer:
            raise OnnxImportError("onnx.load(): sparse initializers are not supported")
        self.arrays = {t.name: self.importer.array(t, "initializer") for t in graph.initializer}
        self.bound = {}
        for vi in graph.input:
            if value_kind(vi.type) != "tensor" and vi.name not in self.arrays:  # (a sequence or an optional)
                if not bind or vi.name not in bind:
                    raise NeedsConstant(f"onnx.load(): graph input {vi.name!r} is a {value_kind(vi.type)}; opforge "
                                        "needs its value at load: bind it with onnx.load(..., bind={name: value})",
                                        vi.name)
                self.bound[vi.name] = _bound_value(vi, bind[vi.name])
                continue
            if bind and vi.name in bind and vi.name not in self.arrays:
                spec = _value_spec(vi, "graph input")
                value = np.asarray(bind[vi.name])
                if not spec.matches(Spec(value.shape, value.dtype)):
                    raise OnnxImportError(f"onnx.load(): bound value for input {vi.name!r} is {describe(value)}, "
                                          f"the model declares {spec}")
                self.bound[vi.name] = value
        self.feeds = {vi.name: _value_spec(vi, "graph input") for vi in graph.input if vi.name not in self.arrays
                      and vi.name not in self.bound}
        self.names = {*self.arrays, *self.feeds, *(o for n in graph.node for o in n.output)}
        self.outputs = [vi.name for vi in graph.output]
        self.kinds = {vi.name: value_kind(vi.type) for vi in graph.output}
        self.narrow = _narrow_types(self.model, self.opset)
        # BatchNormalization's running mean and variance: state, not trained (buffers of load_module)
        self.statistics = {i for n in graph.node if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx")
                           for i in n.input[3:5] if i in self.arrays}
        self.declared = {vi.name: vi.type.tensor_type.elem_type for vi in graph.output}  # (0: not declared)

    def declared_feeds(self) -> dict:
        """Feed name -> the dtype the model declares it in, for the feeds held in a wider one (int8 as int64, float8
        as float32: ``types.HELD``)."""
        types = {vi.name: vi.type.tensor_type.elem_type for vi in self.graph.input}
        return {name: HELD[types[name]] for name in self.feeds if types.get(name) in HELD}

    def check_declared(self, inputs: dict) -> None:
        """Refuse an eager input whose values are not values of the (narrower) type the model declares for it."""
        for name, dtype in self.declared_feeds().items():
            value = inputs.get(name)
            if not isinstance(value, Tensor):
                continue
            host = value.numpy()
            fits = host.astype(dtype).astype(host.dtype)
            same = (fits == host) | (np.isnan(fits) & np.isnan(host)) if host.dtype.kind == "f" else fits == host
            if not same.all():
                bad = host.reshape(-1)[np.flatnonzero(~same.reshape(-1))[0]].item()
                raise OnnxImportError(f"OnnxModule(): input {name!r} is declared {dtype} (held as {host.dtype}), "
                                      f"and holds {bad!r}, which is not a value of {dtype}; convert the data first "
                                      "(ONNX Runtime refuses an input of another type)")

    def run(self, inputs: dict, params: dict) -> dict:
        """The graph applied to ``inputs`` (by name) with float initializers ``params`` (by name): our ops are
        called on them, so this runs eagerly on Tensors and records a program on Variables."""
        imp = self.importer
        imp.unrolled = 0
        env: dict = dict(inputs) | self.bound | dict(params)
        for name, array in self.arrays.items():
            if array.dtype.kind == "f":
                imp.initial[name] = array
            else:
                env[name] = array
        self._run_nodes(self.graph.node, env)
        result = {}
        for name in self.outputs:
            value = env[name]
            if value is None or isinstance(value, Seq):  # an empty optional: no output; a sequence: one each
                if self.kinds[name] == "tensor":
                    raise OnnxImportError(f"onnx.load(): graph output {name!r} is declared a tensor; the graph gives "
                                          f"{'an empty optional' if value is None else 'a sequence'}")
                for k, element in enumerate(value or ()):
                    result[f"{name}[{k}]"] = imp.constant(f"{name}[{k}]", element) \
                        if isinstance(element, np.ndarray) else element
                continue
            if _symbolic(value):  # a shape known only at run time: computed in the program
                value = shape_variable(value) if _symbolic_dims(value) else np.array(value, np.int64)
            if isinstance(value, np.ndarray):
                value = imp.constant(name, value)
            declared = self.declared.get(name)
            if declared and dtype_of(declared, f"onnx.load(): graph output {name!r}") != value.dtype:
                raise OnnxImportError(f"onnx.load(): graph output {name!r} is declared {_DTYPES[declared]}; the "
                                      f"graph gives {value.dtype}")
            result[name] = value
        return result

    def run_graph(self, graph, env: dict, bound: dict) -> list:
        """Subgraph ``graph`` inlined: its nodes imported on a copy of ``env`` (the enclosing scope's values) with its
        initializers and ``bound`` (its inputs' values) added; the values of its outputs."""
        inner = dict(env)
        for t in graph.initializer:  # (a subgraph's float initializers are constants, not parameters)
            inner[t.name] = self.importer.array(t, "subgraph initializer")
        inner.update(bound)
        self._run_nodes(graph.node, inner)
        return [inner[vi.name] for vi in graph.output]

    def _run_nodes(self, nodes, env: dict) -> None:
        from .importers import IMPORTERS  # (they import this module's helpers)

        imp = self.importer
        for proto in nodes:
            n = Node(proto, self.opset, env, imp, self.narrow, self)
            _check_types(n)
            known = _fold(n)
            if known is not None:  # shape arithmetic on values known at import: computed now, not recorded
                env[proto.output[0]] = _wrap_narrow(n, proto.output[0], known)
                continue
            try:
                result = IMPORTERS[proto.op_type](n)
            except OnnxImportError:
                raise
            except OpforgeError as e:
                raise OnnxImportError(f"{n.where()}: {e}") from None
            except (ValueError, TypeError, IndexError, KeyError, ArithmeticError) as e:
                raise OnnxImportError(f"{n.where()}: cannot be imported: {type(e).__name__}: {e}") from None
            unread = sorted(set(n._attrs) - n.read)
            if unread:
                raise n.unsupported(f"attribute(s) {unread}")
            # (a tuple is a shape, a Seq a sequence: one output each)
            results = result if isinstance(result, list) and not isinstance(result, Seq) else [result]
            wanted = list(proto.output)
            if len(results) < len([o for o in wanted if o]):
                raise n.unsupported(f"output(s) {wanted[len(results):]}")
            for name, value in zip(wanted, results):
                shape = getattr(value, "shape", None)
                if isinstance(shape, tuple) and len(shape) > MAX_RANK:  # (no array of it can be made at run)
                    raise OnnxImportError(f"{n.where()}: output {name!r} would have {len(shape)} dims, past the "
                                          f"{MAX_RANK} an array can have")
                if name:
                    env[name] = _wrap_narrow(n, name, value)


def load(source, bind: dict | None = None, *, max_constant_bytes: int = MAX_CONSTANT_BYTES) -> Program:
    """An ONNX model (a path, bytes or a ``ModelProto``) as a Program.

    Graph inputs become feeds (a dynamic dim becomes ``None``), float initializers trainable parameters (their
    ONNX names are their variable names), nodes our ops. ``of.Executor(program).run(...)`` runs it;
    ``of.append_backward`` differentiates it. An op, attribute or type we do not map is an ``OnnxImportError``
    naming the node, its op type and opset; so is a malformed file. Nothing in the file is executed.

    ``bind`` gives values for graph inputs that our ops need at load (a shape, axes, pads fed at run time): those
    inputs become constants and the program is specialised on them.

    The model must be valid ONNX (``onnx.checker``), checked before anything in it is read. Constants the import
    computes from sizes the file gives (ConstantOfShape, Range, EyeLike, shape arithmetic) may take
    ``max_constant_bytes`` together (1 GiB by default), checked before each is made; initializers hold their data in
    the file, and must hold as much as their dims say.
    """
    parsed = _Parsed(source, bind, max_constant_bytes)

    def build(**variables):
        program = tracing_program()
        # Our fresh names are "<op>.<n>": start n past any such number in the model's names, so none collides. (A
        # number of 19 digits or more is past any count of ops, and past the digits Python's int() reads.)
        numbers = [int(m.group(1)) for n in parsed.names if (m := re.search(r"\.(\d{1,18})$", n))]
        program._counter = max([program._counter, *numbers]) + 1
        params = {}
        for name, array in parsed.arrays.items():
            if array.dtype.kind == "f":
                program.add_var(name, Spec(array.shape, array.dtype), persistable=True,
                                stop_gradient=name in parsed.statistics)
                program.values[name] = array
                params[name] = Variable(program, name)
        return parsed.run(variables, params)

    try:
        program = trace(build, **parsed.feeds)
    except OnnxImportError:
        raise
    except OpforgeError as e:
        raise OnnxImportError(f"onnx.load(): {e}") from None
    program.feed_dtypes.update(parsed.declared_feeds())
    return program


def load_module(source, bind: dict | None = None, *, max_constant_bytes: int = MAX_CONSTANT_BYTES) -> OnnxModule:
    """An ONNX model as an ``nn.Module``: its float initializers are the module's parameters (named as in the model),
    and calling it runs the graph's nodes as our ops, eagerly or inside ``of.compile``/``of.trace``. This is how an
    imported model is fine-tuned with an optimizer, as any module (examples/onnx_finetune.py). The model is checked
    as ``load`` checks it."""
    return OnnxModule(_Parsed(source, bind, max_constant_bytes))


class OnnxModule(Module):
    """An imported ONNX graph: ``module(x, ...)`` takes the graph's inputs in order (or by name) and returns its
    output (a dict by ONNX name when there are several)."""

    def __init__(self, parsed: _Parsed):
        super().__init__()
        self._parsed = parsed
        self._onnx_names = {}  # ONNX initializer name -> our attribute (ONNX names may hold dots)
        self._onnx_buffers = {}  # the same for BatchNormalization's running statistics, buffers
        for name, array in parsed.arrays.items():
            if array.dtype.kind == "f":
                if name in parsed.statistics:
                    attr = f"b{len(self._onnx_buffers)}"
                    self.register_buffer(attr, tensor(array))
                    self._onnx_buffers[name] = attr
                else:
                    attr = f"p{len(self._onnx_names)}"
                    setattr(self, attr, tensor(array, requires_grad=True))
                    self._onnx_names[name] = attr

    @property
    def input_names(self) -> list:
        return list(self._parsed.feeds)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, attr in self._onnx_names.items():
            yield prefix + name, getattr(self, attr)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, attr in self._onnx_buffers.items():
            yield prefix + name, getattr(self, attr)

    def forward(self, *args, **kwargs):
        inputs = dict(zip(self._parsed.feeds, args)) | kwargs
        missing = set(self._parsed.feeds) - set(inputs)
        if missing:
            raise OnnxImportError(f"OnnxModule(): missing input(s) {sorted(missing)}")
        self._parsed.check_declared(inputs)
        try:
            state = {n: getattr(self, a) for n, a in [*self._onnx_names.items(), *self._onnx_buffers.items()]}
            out = self._parsed.run(inputs, state)
        except OnnxImportError:
            raise
        except OpforgeError as e:
            raise OnnxImportError(f"OnnxModule(): {e}") from None
        return next(iter(out.values())) if len(out) == 1 else out


_FOLDABLE = {"Identity", "Concat", "Gather", "Unsqueeze", "Squeeze", "Slice", "Cast", "Reshape", "Add", "Sub", "Mul",
             "Div", "Neg", "Size", "Transpose", "Mod"}


def _fold(n: Node):
    """A node over integer values known at import (constants, and shapes whose run-time sizes are ``Dim``s): its
    value, computed here, as an array, or a tuple when it holds Dims; None when it is not such a node. torch's pad
    chains (Constant → ConstantOfShape → Concat → Reshape → Slice → Transpose → Reshape → Cast) fold whole."""
    if n.op_type not in _FOLDABLE or n.outputs != 1 or not all(
            isinstance(n.env.get(i), (tuple, np.ndarray)) for i in n.proto.input if i):
        return None
    raw = [n.env[i] if i else None for i in n.proto.input]
    raw = [tuple(v.reshape(-1).tolist()) if isinstance(v, np.ndarray) and v.dtype == object and v.ndim == 1 else v
           for v in raw]
    if not any(_symbolic(v) for v in raw) and not all(
            v is None or (v.dtype.kind in "iub" and (v.ndim <= 1 or v.size <= FOLD_ELEMENTS)) for v in raw):
        return None  # constant data (not a shape, nor a few sizes): the executor folds it
    values = [None if v is None else np.array(v, dtype=object) if isinstance(v, tuple) else v for v in raw]
    symbolic = any(_symbolic(v) for v in raw)
    x = values[0]
    t = n.op_type
    if t == "Concat":  # (the one folded op whose result outgrows its inputs: one input given many times)
        n.allocate((sum(np.size(v) for v in values),), np.int64)
    try:
        if t == "Identity":
            y = x
        elif t == "Size":
            y = np.array(x.size, np.int64)
        elif t == "Neg" and not symbolic:
            y = -x
        elif t == "Concat":
            y = np.concatenate(values, axis=n.attr("axis", 0))
        elif t == "Gather":
            y = np.take(x, np.asarray(values[1], np.int64), axis=n.attr("axis", 0))
        elif t in ("Unsqueeze", "Squeeze"):
            axes = n.attr("axes") if n.opset < 13 else (None if len(values) < 2 else values[1])
            axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
            if t == "Squeeze":
                y = np.squeeze(x, axis=None if not axes else tuple(axes))
            else:
                y = x
                for a in sorted(n.axes(axes, x.ndim + len(axes))):
                    y = np.expand_dims(y, a)
        elif t == "Slice" and n.opset >= 10:  # (Python's slicing clamps as ONNX's Slice does)
            starts, ends = (np.asarray(v).reshape(-1).tolist() for v in values[1:3])
            axes = values[3] if len(values) > 3 and values[3] is not None else range(len(starts))
            axes = n.axes(np.asarray(axes).reshape(-1).tolist(), x.ndim)
            steps = values[4] if len(values) > 4 and values[4] is not None else [1] * len(starts)
            steps = np.asarray(steps).reshape(-1).tolist()
            if not len(starts) == len(ends) == len(axes) == len(steps):
                return None  # (the Slice importer says what is wrong)
            index = [slice(None)] * x.ndim
            for a, start, end, step in zip(axes, starts, ends, steps):
                index[a] = slice(int(start), int(end), int(step))
            y = x[tuple(index)]
        elif t == "Transpose":
            perm = n.attr("perm")
            y = np.transpose(x, None if perm is None else list(perm))
        elif t == "Cast" and (n.attr("to") in (6, 7) or (not symbolic and n.attr("to") in _DTYPES and
                              np.dtype(_DTYPES[n.attr("to")]).kind in "iub")):
            n.attr("saturate")
            y = x if symbolic else x.astype(_DTYPES[n.attr("to")])
        elif t == "Reshape" and not symbolic:
            y = x.reshape([int(d) for d in values[1]])
        elif t in ("Add", "Sub", "Mul", "Div") and not symbolic:
            op = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}.get(t)
            y = op(x, values[1]) if op else (np.trunc(x / values[1]).astype(x.dtype) if x.dtype.kind in "iu"
                                             else x / values[1])
        elif t == "Mod" and not symbolic and np.all(values[1] != 0):  # torch's unflatten: Mod(dim, rank) → Slice
            y = (np.fmod if n.attr("fmod", 0) else np.mod)(x, values[1])
        else:
            return None
    except (ValueError, IndexError, TypeError, OpforgeError):
        return None
    n.read.update(a.name for a in n.proto.attribute)
    if isinstance(y, np.generic):  # (NumPy's 0-d arithmetic gives a scalar: an array of its dtype, int32 kept)
        y = np.asarray(y)
    y = y if isinstance(y, np.ndarray) else np.array(y, dtype=object)
    if y.dtype == object:
        if not any(isinstance(d, Dim) for d in y.reshape(-1).tolist()):
            return y.astype(np.int64)
        return tuple(y.tolist()) if y.ndim == 1 else y  # a 0-d run-time size stays a 0-d object array
    return y


def _check_types(n: Node):
    """Each input's dtype must be one the op's schema allows, and the inputs of one type parameter must agree:
    ONNX refuses Add(float32, float64) and a float axis for CumSum, where our ops would promote or truncate."""
    import onnx

    schema = onnx.defs.get_schema(n.op_type, n.opset, "")  # (the checker found it)
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    seen = {}
    for i in range(n.count if schema.inputs else 0):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)]
        if n.has(i) and (n.env[n.proto.input[i]] is None or isinstance(n.env[n.proto.input[i]], Seq)):
            continue  # (a sequence, or an empty optional: their importers check them)
        if not n.has(i):  # an input left out: optional ones only (the checker tells single ones; not variadic ones)
            if formal.option == variadic:
                raise OnnxImportError(f"{n.where()}: input {i} is left out (''); {n.op_type} takes a list of inputs "
                                      "with no gaps")
            continue
        dtype = n.spec(i).dtype
        narrow = n.narrow.get(n.proto.input[i])
        dtype = HELD[narrow] if narrow else dtype
        name = f"tensor({type_name(narrow) if narrow else _TYPE_NAMES.get(dtype, dtype.name)})"
        param = formal.type_str
        if name not in allowed.get(param, {param}):
            raise OnnxImportError(f"{n.where()}: input {i} ({n.proto.input[i]!r}) is {dtype}, which its type "
                                  f"{param} does not allow ({', '.join(sorted(allowed.get(param, {param})))})")
        homogeneous = i < len(schema.inputs) - 1 or formal.option != variadic or formal.is_homogeneous
        if homogeneous and seen.setdefault(param, (i, dtype))[1] != dtype:
            first = seen[param][0]
            raise OnnxImportError(f"{n.where()}: inputs {first} and {i} are {seen[param][1]} and {dtype}; ONNX "
                                  f"wants them of one type ({param})")


def _symbolic_dims(v) -> bool:
    return _symbolic(v) and any(isinstance(d, Dim) for d in np.asarray(v, dtype=object).reshape(-1).tolist())


def _symbolic(v) -> bool:
    return isinstance(v, tuple) or (isinstance(v, np.ndarray) and v.dtype == object)


# ONNX ops whose result stays in the range of its narrow integer input (no wrapping needed after them)
_KEEP_RANGE = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice",
               "Gather", "GatherElements", "GatherND", "Max", "Min", "Clip", "Where", "Expand", "Tile", "MaxPool",
               "ReduceMax", "ReduceMin", "TopK", "Constant", "Relu", "DepthToSpace", "SpaceToDepth", "Trilu",
               "ScatterElements", "ScatterND", "Scatter", "Sign", "QuantizeLinear", "DynamicQuantizeLinear",
               "BitwiseAnd", "BitwiseOr", "BitwiseXor"}


def _wrap_narrow(n: Node, name: str, value):
    """``value``, the output ``name`` of node ``n``, wrapped into its narrow ONNX type's range where it has one (its
    int64 result may have left it: uint8 250 + 10 is 4 in ONNX), or rounded to its low-precision float type (a
    Cast's float32 result)."""
    elem = n.narrow.get(name)
    if value is None or isinstance(value, Seq):
        return value
    if elem in LOW_FLOATS:
        if n.op_type in _KEEP_RANGE or isinstance(value, tuple):
            return value
        return round_to(value, elem, _ops(), saturate=bool(n.attr("saturate", 1)))
    if elem is None or n.op_type in _KEEP_RANGE or isinstance(value, tuple) or \
            (isinstance(value, np.ndarray) and value.dtype.kind not in "iu"):
        return value
    if getattr(value, "dtype", None) is not None and value.dtype.kind not in "iu":
        return value
    F = _ops()
    if n.op_type == "Resize":  # (ONNX's reference saturates a resized integer image)
        info = ml_dtypes.iinfo(NARROW[elem])
        return F.clip(value, min=int(info.min), max=int(info.max))
    return wrap(value, elem, F)


def _bound_value(vi, value):
    """A value bound to a sequence or optional graph input: a Seq of arrays (in the types opforge holds), one
    array, or None; checked against the declared element type."""
    kind = value_kind(vi.type)
    if kind == "optional":
        inner = vi.type.optional_type.elem_type
        if value is None:
            return None
        kind, vi_type = value_kind(inner), inner
    else:
        vi_type = vi.type
    where = f"onnx.load(): bound value for input {vi.name!r}"
    elem = (vi_type.sequence_type.elem_type if kind == "sequence" else vi_type).tensor_type.elem_type
    dtype = dtype_of(elem, where) if elem else None

    def held(array):
        array = np.asarray(array)
        if elem in HELD:
            array = array.astype(_DTYPES[elem])
        if dtype is not None and array.dtype != dtype:
            raise OnnxImportError(f"{where} holds {describe(array)}; the model declares {_DTYPES[elem]} elements")
        return array

    if kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise OnnxImportError(f"{where}: expected a list of arrays (a sequence), got {describe(value)}")
        return Seq(held(v) for v in value)
    return held(value)


def _narrow_types(model, opset: int) -> dict:
    """Value name -> ONNX type, for the values of narrow integer types (``types.NARROW``): the graph's inputs and
    initializers as declared, each node's outputs as its op's schema gives them (an output of an input's type
    parameter takes that input's type; Cast, CastLike, Constant and the quantizers say theirs)."""
    types: dict = {}
    _graph_types(model.graph, opset, types)
    return {name: elem for name, elem in types.items() if elem in HELD}


def _graph_types(graph, opset: int, types: dict) -> None:
    """``_narrow_types`` of one graph, and of its nodes' subgraphs (which see its values), into ``types``."""
    import onnx

    types |= {vi.name: vi.type.tensor_type.elem_type for vi in graph.input}
    types |= {t.name: t.data_type for t in graph.initializer}
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                _graph_types(a.g, opset, types)
        attrs = {a.name: a for a in node.attribute}
        given = [types.get(i) for i in node.input]
        t = node.op_type
        if t == "Cast":
            outs = [attrs["to"].i if "to" in attrs else None]
        elif t == "CastLike":
            outs = [given[1] if len(given) > 1 else None]
        elif t in ("Constant", "ConstantOfShape"):
            value = attrs.get("value")
            outs = [value.t.data_type if value is not None and value.HasField("t") else None]
        elif t == "QuantizeLinear":
            dtype = attrs["output_dtype"].i if "output_dtype" in attrs and attrs["output_dtype"].i else None
            outs = [dtype or (given[2] if len(given) > 2 and node.input[2] else 2)]
        elif t == "DynamicQuantizeLinear":
            outs = [2, 1, 2]
        else:
            try:
                schema = onnx.defs.get_schema(t, opset, "")
            except onnx.defs.SchemaError:
                continue
            params = [f.type_str for f in schema.inputs]
            outs = []
            for formal in schema.outputs:
                first = next((i for i, p in enumerate(params) if p == formal.type_str), None)
                outs.append(given[first] if first is not None and first < len(given) else None)
        if t in ("If", "Loop", "Scan"):  # their outputs: the body's (a Loop's after its condition)
            body = next((a.g for a in node.attribute if a.HasField("g")), None)
            skip = 1 if t == "Loop" else 0
            outs = [types.get(vi.name) or vi.type.tensor_type.elem_type or None for vi in body.output[skip:]] \
                if body is not None else []
        for name, elem in zip(node.output, outs):
            if name and elem is not None:
                types[name] = elem


def _ops():
    from .. import ops

    return ops
