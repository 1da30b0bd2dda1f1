"""Fuzzing ``of.onnx.load`` with hostile ONNX models: small valid models mutated — fields removed, sizes blown up,
types swapped, names garbled (thousands of digits, invalid UTF-8), nodes reordered into cycles, op types swapped,
opsets changed, subgraphs nested thousands deep, bytes damaged — and some changed in ways that keep them valid (other
weights, other attribute values).

Each model must load or end in an ``OnnxImportError``: never a raw exception, a hang (a watchdog per case) or a huge
allocation (a memory ceiling, and a small ``max_constant_bytes``: what the file asks for is checked against the
limit before it is made). What loads is run on feeds of its inputs' Specs, ending in outputs or an ``OpforgeError``;
ONNX Runtime, in a process of its own, is the oracle: where it runs the model too, the outputs must agree, or else be
those of ONNX's reference implementation (``onnx.reference``, the third opinion: ONNX Runtime's deviations seen are
listed above ``compare``); a model it refuses and we run is counted, and printed with ``-s``: what it refused for.
``make test`` runs a seeded sample over hand-made seeds and an exported model; ``OPFORGE_FUZZ=long`` many more, seeded
by ONNX's own node-test models too.
``OPFORGE_FUZZ_DUMP=folder`` saves each failing case there (``case<k>.onnx`` and its feeds, ``case<k>.npz``), to be
rerun alone.
"""

from __future__ import annotations

import collections
import copy
import os

import ml_dtypes
import numpy as np
import pytest
from fuzzing import LONG, SEED, CaseHung, count, hard_deadline, memory_ceiling, mutate_bytes, quiet, watchdog

onnx = pytest.importorskip("onnx")
from onnx import AttributeProto, TensorProto, helper, numpy_helper  # noqa: E402

import opforge as of  # noqa: E402
from opforge import nn  # noqa: E402
from opforge.core import dtypes as D  # noqa: E402
from opforge.onnx import OnnxImportError  # noqa: E402
from opforge.onnx.importers import IMPORTERS  # noqa: E402

LIMIT = 8 << 20  # max_constant_bytes in these cases: past it, a case must be refused before anything is allocated
BAD_UTF8 = "@@not-utf-8@@"  # a placeholder name; its bytes become invalid UTF-8 once the model is serialized
GARBLED = ["", "9" * 5000, "x." + "9" * 5000, "n" * 100_000, "a\0b", BAD_UTF8, "relu.1", ".", "🙂", "x"]
HUGE = [10**12, 2**62, 2**63 - 1, -1, -(2**63), 0, 10**9, 4096, 65]
ELEM_TYPES = [0, 2, 3, 8, 13, 17, 999, -1, *range(1, 17)]
OPSETS = [1, 6, 7, 9, 11, 12, 13, 17, 18, 21, 23, 24, 99, 10**9, 0, -1]
ti = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def seeds() -> list:
    """Small valid models over the ops that make constants, shape arithmetic, and the usual layers."""
    node = helper.make_node
    one = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])
    making = _model([
        node("ConstantOfShape", ["shape"], ["c"], value=one),
        node("Add", ["x", "c"], ["a"]),
        node("Range", ["start", "limit", "delta"], ["r"]),
        node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        node("Reshape", ["rf", "shape"], ["rr"]),
        node("Mul", ["a", "rr"], ["m"]),
        node("EyeLike", ["m"], ["eye"], k=1),
        node("Tile", ["eye", "reps"], ["t"]),
        node("Expand", ["bias", "eshape"], ["e"]),
        node("Constant", [], ["k"], value=helper.make_tensor("kv", TensorProto.FLOAT, [1], [2.0])),
        node("Mul", ["e", "k"], ["ek"]),
        node("Identity", ["t"], ["ti"]),
        node("Slice", ["ti", "starts", "ends"], ["sl"]),
        node("Add", ["sl", "ek"], ["y"]),
    ], [ti("x", TensorProto.FLOAT, [2, 3])], [ti("y", TensorProto.FLOAT, [2, 3])],
        [_const("shape", np.array([2, 3], np.int64)), _const("start", np.int64(0)), _const("limit", np.int64(6)),
         _const("delta", np.int64(1)), _const("reps", np.array([2, 1], np.int64)),
         _const("bias", np.ones(3, np.float32)), _const("eshape", np.array([2, 3], np.int64)),
         _const("starts", np.array([0], np.int64)), _const("ends", np.array([2], np.int64))])
    shapes = _model([
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n", "axes0"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["flat"]),
        node("Gemm", ["flat", "w", "b"], ["g"], transB=1, alpha=0.5),
        node("Relu", ["g"], ["h"]),
        node("Softmax", ["h"], ["p"], axis=-1),
        node("Squeeze", ["p1", "axes"], ["p2"]),
        node("Unsqueeze", ["p", "axes"], ["p1"]),
        node("ReduceSum", ["p2", "axes"], ["y"], keepdims=1),
    ], [ti("x", TensorProto.FLOAT, ["batch", 2, 3])], [ti("y", TensorProto.FLOAT, ["batch", 1])],
        [_const("zero", np.int64(0)), _const("axes0", np.array([0], np.int64)),
         _const("axes", np.array([1], np.int64)),
         _const("minus1", np.array([-1], np.int64)), _const("w", np.ones((4, 6), np.float32)),
         _const("b", np.zeros(4, np.float32))], opset=18)
    shapes.graph.node.insert(8, shapes.graph.node.pop(9))  # (Unsqueeze before the Squeeze that reads it)
    layers = _model([
        node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        node("MaxPool", ["c"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        node("Pad", ["mp", "pads"], ["pd"], mode="constant"),
        node("Split", ["pd"], ["s0", "s1"], axis=1),
        node("Concat", ["s1", "s0"], ["cat"], axis=1),
        node("Transpose", ["cat"], ["tr"], perm=[0, 1, 3, 2]),
        node("LeakyRelu", ["tr"], ["lr"], alpha=0.1),
        node("Flatten", ["lr"], ["fl"], axis=1),
        node("Gather", ["fl", "index"], ["ga"], axis=1),
        node("CumSum", ["ga", "axis"], ["cs"]),
        node("Where", ["mask", "cs", "cs2"], ["wh"]),
        node("Neg", ["cs"], ["cs2"]),
    ], [ti("x", TensorProto.FLOAT, [1, 1, 4, 4])], [ti("wh", TensorProto.FLOAT, [1, 3])],
        [_const("w", np.ones((2, 1, 3, 3), np.float32)), _const("pads", np.zeros(8, np.int64)),
         _const("index", np.array([0, 2, 5], np.int64)), _const("axis", np.int64(1)),
         _const("mask", np.array([True, False, True]))], opset=13)
    layers.graph.node.insert(10, layers.graph.node.pop(11))
    old = _model([
        node("Unsqueeze", ["x"], ["u"], axes=[0]),
        node("Slice", ["u"], ["s"], starts=[0], ends=[1], axes=[1]),
        node("Pad", ["s"], ["p"], pads=[0, 0, 1, 0, 0, 1], value=0.5),
        node("Softmax", ["p"], ["y"], axis=1),
    ], [ti("x", TensorProto.FLOAT, [2, 3])], [ti("y", TensorProto.FLOAT, [1, 1, 5])], opset=9)
    of.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3), nn.Softmax(-1))
    exported = of.onnx.export(mlp, None, of.Spec((None, 4), "float32"))
    models = [making, shapes, layers, old, exported]
    for m in models:
        onnx.checker.check_model(m)  # seeds are valid ONNX: what the mutations break, they break
    return models


def node_test_seeds() -> list:
    """ONNX's own node-test models of the ops we import (hundreds of small valid models, ~6 s to generate)."""
    from opforge.onnx import conformance

    return [c.model for c in conformance.selected(conformance.node_cases())]


# -- the mutations ------------------------------------------------------------------------------------------------

def _names(graph) -> list:
    return sorted({*(v.name for v in graph.input), *(t.name for t in graph.initializer),
                   *(o for n in graph.node for o in n.output), *(i for n in graph.node for i in n.input)} - {""})


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))] if len(seq) else None


def _rename_everywhere(graph, old, new):
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.name == old:
            vi.name = new
    for t in graph.initializer:
        if t.name == old:
            t.name = new
    for n in graph.node:
        n.input[:] = [new if i == old else i for i in n.input]
        n.output[:] = [new if o == old else o for o in n.output]


def _attr_values(rng):
    return _pick(rng, [1.5, 3, "big", [1, 2], [0.5, 2.5], ["a", "b"], np.ones((2, 2), np.float32), 10**12, -1,
                       [10**12] * 3, [], float("nan"), b"\xff\xfe"])


def _make_attr(name, value):
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    return helper.make_attribute(name, value, attr_type=AttributeProto.INTS if value == [] else None)


def _wrong_kind(a, rng):
    """``a`` given a type that does not match its value, or another value of another type under its name."""
    if rng.integers(2):
        a.type = int(_pick(rng, [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 13]))
    else:
        a.CopyFrom(_make_attr(a.name, _attr_values(rng)))


def _blow_attr(a, rng):
    if a.type == AttributeProto.INT:
        a.i = int(_pick(rng, HUGE))
    elif a.type == AttributeProto.INTS and len(a.ints):
        if rng.integers(4) == 0:
            a.ints[:] = [1] * 100_000
        else:
            a.ints[int(rng.integers(len(a.ints)))] = int(_pick(rng, HUGE))
    elif a.type == AttributeProto.FLOAT:
        a.f = float(_pick(rng, [float("nan"), float("inf"), -1e38, 3e38, 0.0, -0.0]))
    elif a.type == AttributeProto.TENSOR:
        a.t.dims[:] = [int(_pick(rng, HUGE)) for _ in range(max(len(a.t.dims), 1))]
    else:
        _wrong_kind(a, rng)


def _array(t):
    """The initializer's values, or None when an earlier mutation left it unreadable."""
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None


def _blow_initializer(t, rng):
    kind = rng.integers(4)
    if kind == 0:  # dims claiming more (or fewer, or negative) values than it holds
        t.dims[:] = [int(_pick(rng, HUGE)) for _ in range(int(rng.integers(1, 4)))]
    elif kind == 1 and t.data_type in (TensorProto.INT64, TensorProto.INT32) and _array(t) is not None:
        array = _array(t)  # a shape, a count or an index
        big = np.full(array.shape, _pick(rng, [10**12, 10**9, 2**31 - 1, -(10**12), -1]) if array.ndim
                      else _pick(rng, [10**12, 10**9, -1]))
        t.CopyFrom(numpy_helper.from_array(big.astype(array.dtype, casting="unsafe"), t.name))
    elif kind == 2:
        t.data_type = int(_pick(rng, ELEM_TYPES))
    else:  # its data gone, or in another field
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
            t.ClearField(field)
        if rng.integers(2):
            t.int64_data.extend([7] * int(rng.integers(1, 5)))


def _blow_input(vi, rng):
    tt = vi.type.tensor_type
    kind = rng.integers(5)
    if kind == 0 and len(tt.shape.dim):
        dim = tt.shape.dim[int(rng.integers(len(tt.shape.dim)))]
        dim.dim_value = int(_pick(rng, HUGE))
    elif kind == 1:
        for _ in range(int(_pick(rng, [1, 60, 70, 10_000]))):
            tt.shape.dim.add().dim_value = 1
    elif kind == 2:
        tt.elem_type = int(_pick(rng, ELEM_TYPES))
    elif kind == 3:
        tt.ClearField("shape")
    else:
        vi.ClearField("type")


def _nest(node, rng):
    """A subgraph attribute nested thousands deep (built in place: deeper than protobuf parses)."""
    a = node.attribute.add()
    a.name, a.type = _pick(rng, ["then_branch", "body", "x"]), AttributeProto.GRAPH
    g = a.g
    for _ in range(int(_pick(rng, [3, 200, 5000]))):
        inner = g.node.add()
        inner.op_type = "If"
        sub = inner.attribute.add()
        sub.name, sub.type = "then_branch", AttributeProto.GRAPH
        g = sub.g


MUTATIONS = ["drop input", "extra input", "drop output", "extra output", "drop attribute", "extra attribute",
             "attribute type", "attribute size", "drop node", "duplicate node", "shuffle nodes", "cycle", "op type",
             "drop initializer", "initializer", "graph input", "graph output", "name", "rename", "opset",
             "values", "values", "nudge"]  # (the last ones keep the model valid: its outputs are compared)


def mutate_model(m, rng) -> str:
    """One random change to ``m`` (in place); returns what it was."""
    g = m.graph
    kind = _pick(rng, MUTATIONS)
    nodes = list(g.node)
    node = _pick(rng, nodes)
    names = _names(g)
    if node is None and kind not in ("drop initializer", "initializer", "graph input", "graph output", "name",
                                     "rename", "opset"):
        kind = "opset"
    if kind == "drop input" and len(node.input):
        j = int(rng.integers(len(node.input)))
        if rng.integers(2):
            del node.input[j]
        else:
            node.input[j] = ""
    elif kind == "extra input":
        node.input.append(_pick(rng, [*names, ""]))
    elif kind == "drop output" and len(node.output):
        del node.output[int(rng.integers(len(node.output)))]
    elif kind == "extra output":
        node.output.append(_pick(rng, [f"extra{rng.integers(9)}", "", *names]))
    elif kind == "drop attribute" and len(node.attribute):
        del node.attribute[int(rng.integers(len(node.attribute)))]
    elif kind == "extra attribute":
        name = _pick(rng, ["alpha", "axis", "axes", "perm", "to", "value", "kernel_shape", "pads", "mode", "k"])
        node.attribute.append(_make_attr(name, _attr_values(rng)))
    elif kind == "attribute type" and len(node.attribute):
        _wrong_kind(_pick(rng, node.attribute), rng)
    elif kind == "attribute size" and len(node.attribute):
        _blow_attr(_pick(rng, node.attribute), rng)
    elif kind == "drop node":
        g.node.remove(node)
    elif kind == "duplicate node":
        g.node.insert(int(rng.integers(len(nodes) + 1)), copy.deepcopy(node))
    elif kind == "shuffle nodes":
        order = rng.permutation(len(nodes))
        g.ClearField("node")
        g.node.extend([nodes[i] for i in order])
    elif kind == "cycle" and len(node.input):  # an input read from this node's own output or a later node's
        later = [o for n in nodes[nodes.index(node):] for o in n.output]
        node.input[int(rng.integers(len(node.input)))] = _pick(rng, later) or "nobody"
    elif kind == "op type":
        node.op_type = _pick(rng, sorted(IMPORTERS))
    elif kind == "drop initializer" and len(g.initializer):
        del g.initializer[int(rng.integers(len(g.initializer)))]
    elif kind == "initializer" and len(g.initializer):
        _blow_initializer(_pick(rng, g.initializer), rng)
    elif kind == "graph input" and len(g.input):
        _blow_input(_pick(rng, g.input), rng)
    elif kind == "graph output" and len(g.output):
        g.output[int(rng.integers(len(g.output)))].name = _pick(rng, [*names, "nobody"])
    elif kind == "name":  # one occurrence garbled: a dangling or colliding name
        where = _pick(rng, [*[(n.input, j) for n in nodes for j in range(len(n.input))],
                            *[(n.output, j) for n in nodes for j in range(len(n.output))]])
        if where is not None:
            where[0][where[1]] = _pick(rng, [*GARBLED, *names])
        elif len(g.input):
            g.input[0].name = _pick(rng, GARBLED)
    elif kind == "rename" and names:  # a name changed everywhere: the same model, to be loaded as it was
        _rename_everywhere(g, _pick(rng, names), _pick(rng, [n for n in GARBLED if n] + [f"v.{rng.integers(99)}"]))
    elif kind == "opset":
        m.opset_import[0].version = int(_pick(rng, OPSETS))
    elif kind == "values" and len(g.initializer):  # other values of the same shape and type
        t = _pick(rng, g.initializer)
        array = _array(t)
        if array is not None and array.dtype.kind == "f":
            t.CopyFrom(numpy_helper.from_array(rng.standard_normal(array.shape).astype(array.dtype), t.name))
    elif kind == "nudge":  # a float attribute scaled: still valid, another result
        floats = [a for n in nodes for a in n.attribute if a.type == AttributeProto.FLOAT]
        if floats:
            _pick(rng, floats).f *= float(_pick(rng, [2.0, 0.5, -1.0, 0.0]))
    return kind


def hostile(seed_model, rng):
    """A mutated copy of ``seed_model`` as bytes (or as a ModelProto when it holds what protobuf cannot serialize),
    and the list of mutations made."""
    m = onnx.ModelProto()
    m.CopyFrom(seed_model)
    if rng.integers(8) == 0:  # damaged bytes
        return mutate_bytes(m.SerializeToString(), rng), ["bytes"]
    kinds = [mutate_model(m, rng) for _ in range(1 + int(rng.binomial(2, 0.3)))]
    if rng.integers(20) == 0 and len(m.graph.node):  # last: protobuf copies no message nested this deep
        _nest(m.graph.node[int(rng.integers(len(m.graph.node)))], rng)
        kinds.append("nest")
    try:
        data = m.SerializeToString()
    except Exception:  # (nested deeper than protobuf encodes)
        return m, kinds
    if BAD_UTF8.encode() in data:
        data = data.replace(BAD_UTF8.encode(), b"\xff" * len(BAD_UTF8))
    return data, kinds


# -- running the cases -----------------------------------------------------------------------------------------

def _feeds(program, rng) -> dict | None:
    feeds = {}
    for name in program.feeds:
        spec = program.block.vars[name].spec
        shape = tuple(2 if d is None else d for d in spec.shape)
        if np.prod(shape, dtype=float) > 1e6:
            return None  # a model that asks for huge inputs: loading it was the test
        if spec.dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            feeds[name] = rng.integers(0, 2, shape).astype(spec.dtype)
    return feeds


def load_and_run(source, rng, oracle: Oracle, case: dict | None = None) -> str:
    """How the case ended: 'refused', 'failed at run' (an OpforgeError), 'not run' (inputs too big), or what
    ``compare`` says of the outputs; anything else raises. ``case`` gets the feeds made (for ``_dump``)."""
    try:
        program = of.onnx.load(source, max_constant_bytes=LIMIT)
    except OnnxImportError:
        return "refused"
    feeds = _feeds(program, rng)
    if feeds is None:
        return "not run"
    if case is not None:
        case["feeds"] = feeds
    try:
        ours = of.Executor(program).run(feeds)
    except of.OpforgeError:
        return "failed at run"
    return compare(source, feeds, ours, oracle)


FLOAT8 = {f"tensor({name})": getattr(ml_dtypes, name.replace("float8", "float8_"))
          for name in ("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz")}


def _run_in_onnxruntime(data: bytes, feeds: dict):
    """(In the oracle's process.) The model's outputs by name, or why ONNX Runtime refused it."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # (its warnings on hostile models, by the thousand: errors only)
    try:
        session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
        outputs = session.run(None, feeds)
        return {o.name: value.view(FLOAT8[o.type]).astype(np.float32) if o.type in FLOAT8 else value  # (as bytes)
                for o, value in zip(session.get_outputs(), outputs)}
    except Exception as e:
        return str(e).splitlines()[0][:120] if str(e) else type(e).__name__


def _run_in_reference(data: bytes, feeds: dict):
    """(In the oracle's process.) The model's outputs by name from ONNX's own reference implementation (the third
    opinion where ONNX Runtime and we differ), or why it refused."""
    from onnx.reference import ReferenceEvaluator

    try:
        model = onnx.load_from_string(data)
        return dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))
    except Exception as e:
        return str(e).splitlines()[0][:120] if str(e) else type(e).__name__


def _own_ceiling():
    """(The oracle's process starts under the test's memory ceiling: it gets one of its own.)"""
    import resource

    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


class Oracle:
    """ONNX Runtime in a process of its own: a model it crashes on (it segfaults on a variadic Min given an empty
    input name) or hangs on ends that process, not the test."""

    def __init__(self):
        self.pool = None
        self.refusals = collections.Counter()  # why it refused models we ran (its own limits, or our leniency)

    def run(self, data: bytes, feeds: dict, runner=_run_in_onnxruntime):
        import concurrent.futures
        import multiprocessing

        if self.pool is None:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("fork"),
                initializer=_own_ceiling if os.path.exists("/proc/self/statm") else None)
        try:
            return self.pool.submit(runner, data, feeds).result(timeout=60)
        except Exception as e:  # (it crashed or hung: a fresh process for the next model)
            self.close()
            return f"crashed: {type(e).__name__}"

    def close(self):
        if self.pool is not None:
            for process in list(self.pool._processes.values()):  # (a hung one would not exit by itself)
                process.kill()
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


SCATTERS = {"ScatterElements", "ScatterND", "Scatter"}  # random indices repeat, and with reduction="none" ONNX
# leaves what repeated indices write undefined

# Where ONNX Runtime (1.32, CPU) and we differ, ONNX's reference implementation decides: the case passes when our
# outputs are the reference's. The deviations of ONNX Runtime from the spec and the reference seen on mutated models:
# - Attention (opset 23+), qk_matmul_output_mode=2: a masked score is -FLT_MAX (-3.4e38), not the spec's -inf;
# - Attention with a huge scale (3e38): the spec's √scale on Q and on K each overflows Q·Kᵀ to inf (NaN out of the
#   softmax, as the reference gives); ONNX Runtime's finite outputs scale otherwise;
# - CausalConvWithState, LinearAttention: float32 sums in another order, differing past rtol=1e-4 where they cancel.
# And float16 (bfloat16) results of a chain of ops differ by a few units in the last place where its kernels
# accumulate in float32 and ours round each op's result (as the reference does): those are compared to their type's
# precision.
TOLERANCE = {np.dtype(np.float16): 4e-3, np.dtype(D.bfloat16): 3e-2}  # rtol = atol; others: rtol 1e-4, atol 1e-5


def _undefined(model) -> bool:
    """Whether ONNX leaves the model's result open on random indices: a scatter that writes repeated ones."""
    return any(node.op_type in SCATTERS and all(a.name != "reduction" or a.s in (b"", b"none") for a in node.attribute)
               for node in model.graph.node)


def _differs(ours: dict, theirs: dict):
    """The first of our outputs that ``theirs`` lacks or holds other values for, and how; None when all agree."""
    for name, value in ours.items():
        tol = TOLERANCE.get(np.dtype(value.dtype)) if hasattr(value, "dtype") else None
        rtol, atol = (tol, tol) if tol else (1e-4, 1e-5)
        if name not in theirs or np.shape(value) != np.shape(theirs[name]) or \
                not np.allclose(value, theirs[name], rtol=rtol, atol=atol, equal_nan=True):
            return f"output {name!r}: {np.shape(value)} vs {np.shape(theirs.get(name))}, {str(value)[:200]} vs " \
                   f"{str(theirs.get(name))[:200]}"
    return None


def compare(source, feeds: dict, ours: dict, oracle: Oracle) -> str:
    """What ONNX Runtime makes of a model we ran: 'same as onnxruntime', 'same as the reference' (where ONNX Runtime
    differs), or (it refused the model, or crashed) 'onnxruntime refused: why'. Different outputs raise: a silently
    different result."""
    if any(v.dtype == D.bfloat16 for v in feeds.values()):
        return "not compared (bfloat16)"  # (onnxruntime's Python API takes no bfloat16 arrays)
    model = source if isinstance(source, onnx.ModelProto) else onnx.load_from_string(source)
    if _undefined(model):
        return "not compared (random indices)"
    data = source if isinstance(source, bytes) else source.SerializeToString()
    theirs = oracle.run(data, feeds)
    if isinstance(theirs, str):
        oracle.refusals[theirs[:90]] += 1
        return "onnxruntime refused"
    difference = _differs(ours, theirs)
    if difference is None:
        return "same as onnxruntime"
    reference = oracle.run(data, feeds, _run_in_reference)
    if isinstance(reference, dict) and _differs(ours, reference) is None:
        return "same as the reference"
    why = _differs(ours, reference) if isinstance(reference, dict) else f"it refused: {reference}"
    raise AssertionError(f"differs from onnxruntime's: {difference}; and from the reference's: {why}")


def _dump(k: int, source, case: dict):
    """(``OPFORGE_FUZZ_DUMP``) A failing case's model and feeds, saved to be rerun alone."""
    folder = os.environ.get("OPFORGE_FUZZ_DUMP")
    if not folder or isinstance(source, onnx.ModelProto):
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"case{k}.onnx"), "wb") as f:
        f.write(source)
    np.savez(os.path.join(folder, f"case{k}.npz"), **case.get("feeds", {}))


def fuzz(models, n: int, seed: int):
    """``n`` hostile cases made from ``models``; returns the outcomes (a Counter), the problems, and why ONNX Runtime
    refused the models we ran that it did not (a Counter)."""
    rng = np.random.default_rng(seed)
    outcomes, problems = collections.Counter(), []
    oracle = Oracle()
    with memory_ceiling(1 << 30), quiet(), hard_deadline(count(300, 3000)):
        for k in range(n):
            source, kinds = hostile(models[k % len(models)], rng)
            what, case = f"#{k} ({', '.join(kinds)})", {}
            try:
                with watchdog(30, lambda what=what: what):
                    outcomes[load_and_run(source, rng, oracle, case)] += 1
            except CaseHung as e:
                oracle.close()
                problems.append(str(e))
            except Exception as e:  # a raw exception, or outputs other than onnxruntime's
                problems.append(f"{what}: {type(e).__name__}: {str(e)[:300]}")
                outcomes[f"problem: {type(e).__name__}"] += 1
                _dump(k, source, case)
    oracle.close()
    return outcomes, problems, oracle.refusals


def _report(outcomes, problems, refusals, n):
    print(f"\n{n} hostile ONNX models: {dict(outcomes)}\nonnxruntime refused, of those we ran: "
          f"{dict(refusals.most_common(12))}")
    assert not problems, f"{len(problems)} of {n} cases failed:\n" + "\n".join(problems[:40])


def test_fuzz_onnx_load():
    n = count(600, 20_000)
    outcomes, problems, refusals = fuzz(seeds(), n, SEED)
    _report(outcomes, problems, refusals, n)
    assert outcomes["same as onnxruntime"] > n // 10, outcomes  # enough mutations keep a model that runs


@pytest.mark.skipif(not LONG, reason="a longer fuzz run: OPFORGE_FUZZ=long")
def test_fuzz_onnx_load_from_onnx_node_tests():
    models = node_test_seeds()
    n = 10 * len(models)
    outcomes, problems, refusals = fuzz(models, n, SEED + 1)
    _report(outcomes, problems, refusals, n)
