"""Hostile ONNX files (issue 30): each ends in an ``OnnxImportError`` naming what is wrong, raised before anything the
file asks for is allocated; what ONNX itself deems invalid is refused, not read some way of our own (where ONNX
Runtime refuses a model, a model we run anyway means nothing anyone agreed on). ``test_fuzz_onnx.py`` throws
thousands of mutated models at the same loader."""

import numpy as np
import pytest
from fuzzing import memory_ceiling

onnx = pytest.importorskip("onnx")
from onnx import AttributeProto, TensorProto, helper, numpy_helper  # noqa: E402

import opforge as of  # noqa: E402
from opforge.onnx import OnnxImportError  # noqa: E402

FLOAT, DOUBLE, INT64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64
node = helper.make_node


def model_of(nodes, inputs, outputs, initializers=(), opset=21):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def info(name, dims, elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def error(source, **kwargs) -> str:
    """The OnnxImportError loading ``source`` raises, under a memory ceiling: an attempt to allocate what the file
    asks for is a MemoryError, which fails the test."""
    with memory_ceiling(1 << 30), pytest.raises(OnnxImportError) as caught:
        of.onnx.load(source, **kwargs)
    return str(caught.value)


def relu_model(x="x", y="y", **attrs):
    return model_of([node("Relu", [x], [y], name="r", **attrs)], [info(x, [2])], [info(y, [2])])


# -- what the file sizes, checked before it is made ----------------------------------------------------------------

_FLOAT_RANGE = [const("a", 0.0, np.float32), const("b", 1e15, np.float32), const("d", 1.0, np.float32)]


@pytest.mark.parametrize(("nodes", "inputs", "outputs", "inits"), [
    ([node("ConstantOfShape", ["s"], ["y"], name="n")], [], [info("y", [10**12])], [const("s", [10**12])]),
    ([node("ConstantOfShape", ["s"], ["y"], name="n")], [], [info("y", [10**9])], [const("s", [10**9])]),
    ([node("Range", ["a", "b", "d"], ["y"], name="n")], [], [info("y", [None])], _FLOAT_RANGE),
    ([node("Range", ["a", "b", "d"], ["y"], name="n")], [], [info("y", [None], INT64)],
     [const("a", 0), const("b", 2**62), const("d", 1)]),
    ([node("EyeLike", ["x"], ["y"], name="n")], [info("x", [10**6, 10**6])], [info("y", [10**6, 10**6])], []),
    ([node("Concat", ["big"] * 200, ["y"], name="n", axis=0)], [], [info("y", [None], INT64)],
     [const("big", np.arange(10**6))]),  # 8 MB in the file, 1.6 GB once concatenated
], ids=["ConstantOfShape 4 TB", "ConstantOfShape 4 GB", "Range 0..1e15", "Range 0..2**62", "EyeLike 1e6 x 1e6",
        "Concat of one input 200 times"])
def test_a_constant_sized_by_the_file_is_checked_against_the_limit_before_it_is_made(nodes, inputs, outputs, inits):
    message = error(model_of(nodes, inputs, outputs, inits))
    assert message.startswith("node 'n' (") and "max_constant_bytes" in message, message
    assert "past the 1073741824 bytes" in message


def test_max_constant_bytes_bounds_the_constants_made_at_load_together():
    one = helper.make_tensor("v", FLOAT, [1], [1.5])
    m = model_of([node("ConstantOfShape", ["s"], ["a"], name="a", value=one),
                  node("ConstantOfShape", ["s"], ["b"], name="b", value=one), node("Add", ["a", "b"], ["y"])],
                 [], [info("y", [100])], [const("s", [100])])
    message = error(m, max_constant_bytes=700)  # 400 bytes each: the second is one too many
    assert message.startswith("node 'b' (ConstantOfShape") and "(400 taken)" in message
    program = of.onnx.load(m, max_constant_bytes=800)
    np.testing.assert_array_equal(of.Executor(program).run({})["y"], np.full(100, 3.0, np.float32))


# -- names ---------------------------------------------------------------------------------------------------------

def test_a_name_with_thousands_of_digits_loads_and_runs():
    name = "y." + "9" * 5000  # past the digits Python's int() reads
    program = of.onnx.load(relu_model(y=name))
    out = of.Executor(program).run({"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(out[name], [0.0, 2.0])


@pytest.mark.parametrize("where", ["value", "node", "op type", "attribute name", "attribute value"])
def test_a_name_or_string_that_is_not_utf8_is_refused(where):
    m = model_of([node("Gelu", ["x"], ["YYYY"], name="NNNN", approximate="AAAA")], [info("x", [2])],
                 [info("YYYY", [2])])
    placeholder = {"value": b"YYYY", "node": b"NNNN", "op type": b"Gelu", "attribute name": b"approximate",
                   "attribute value": b"AAAA"}[where]
    data = m.SerializeToString().replace(placeholder, b"\xff" * len(placeholder))
    assert "not valid UTF-8" in error(data)


# -- what ONNX's schemas say: inputs, outputs, attributes -----------------------------------------------------------

@pytest.mark.parametrize(("nodes", "expected"), [
    ([node("Cast", [], ["y"], name="n", to=FLOAT)],
     "node 'n' (Cast, opset 21): not valid ONNX: Node(n) with schema(::Cast:21) has input size 0"),
    ([node("Identity", [], ["y"], name="n")], "has input size 0 not in range [min=1, max=1]"),
    ([node("Add", ["x", "x", "x"], ["y"], name="n")], "has input size 3 not in range [min=2, max=2]"),
    ([node("Relu", ["x"], [], name="n"), node("Relu", ["x"], ["y"])], "has output size 0 not in range"),
    ([node("Max", ["x", "", "x"], ["y"], name="n")], "node 'n' (Max, opset 21): input 1 is left out"),
    ([node("LeakyRelu", ["x"], ["y"], name="n", alpha="big")],
     "Mismatched attribute type in 'n : alpha'. Expected: 'FLOAT'"),
    ([node("ReduceSum", ["x"], ["y"], name="n", keepdims=7)], "attribute 'keepdims' is a flag, 0 or 1; got 7"),
], ids=["Cast without input", "Identity without input", "Add of three", "Relu without output", "Max with a gap",
        "alpha a string", "keepdims=7"])
def test_a_node_its_op_schema_refuses_is_refused(nodes, expected):
    assert expected in error(model_of(nodes, [info("x", [2])], [info("y", [2])]))


def test_an_attribute_declared_with_no_value_is_refused():
    # protobuf reads the absent field as its default: alpha 0.0, silently
    m = model_of([node("LeakyRelu", ["x"], ["y"], name="n", alpha=0.5)], [info("x", [2])], [info("y", [2])])
    m.graph.node[0].attribute[0].ClearField("f")
    assert "attribute 'alpha' is declared FLOAT but holds no value" in error(m)


# -- the graph: each name assigned once, before it is read -----------------------------------------------------------

@pytest.mark.parametrize(("nodes", "inits", "expected"), [
    ([node("Relu", ["x"], ["y"], name="a"), node("Neg", ["x"], ["y"], name="b")], [],
     "node 'b' (Neg, opset 21): output 'y' is a name already given"),
    ([node("Neg", ["x"], ["x"], name="a"), node("Relu", ["x"], ["y"])], [], "output 'x' is a name already given"),
    ([node("Add", ["x", "w"], ["y"])], [const("w", [1.0, 2.0], np.float32), const("w", [3.0, 4.0], np.float32)],
     "two initializers are named 'w'"),
    ([node("Relu", ["b"], ["a"], name="a"), node("Relu", ["a"], ["y"], name="y")], [],
     "node 'a' (Relu, opset 21): input 'b' is neither a graph input, an initializer nor the output of an earlier"),
], ids=["two nodes write y", "a node writes a graph input", "two initializers of one name", "a cycle"])
def test_a_graph_that_names_a_value_twice_or_reads_it_first_is_refused(nodes, inits, expected):
    assert expected in error(model_of(nodes, [info("x", [2])], [info("y", [2])], inits))


@pytest.mark.parametrize("dims", [[-3], [2**62, 2**62], [1] * 65], ids=["negative", "2**124 elements", "65 dims"])
def test_a_graph_input_of_no_possible_shape_is_refused(dims):
    m = model_of([node("Relu", ["x"], ["y"])], [info("x", dims)], [info("y", dims)])
    assert "graph input 'x' has shape" in error(m)


def test_a_subgraph_nested_thousands_deep_is_refused_before_anything_walks_it():
    """onnx.checker walks subgraphs recursively: one nested 5,000 deep (built in place: deeper than protobuf
    parses) overflowed the C stack, a segfault, had it reached the checker."""
    m = relu_model()
    attribute = m.graph.node[0].attribute.add()
    attribute.name, attribute.type = "then_branch", AttributeProto.GRAPH
    graph = attribute.g
    for _ in range(5000):
        inner = graph.node.add()
        inner.op_type = "If"
        sub = inner.attribute.add()
        sub.name, sub.type = "then_branch", AttributeProto.GRAPH
        graph = sub.g
    assert "attribute 'then_branch' holds a subgraph or a type: not supported" in error(m)


@pytest.mark.parametrize(("opset", "ir_version", "expected"), [
    (99, None, "imports ai.onnx opset 99; opsets run from 1 to"),
    (None, 8, "the model (IR version 8) imports no opset"),  # (an opset 1 model only when of IR version 2)
])
def test_an_opset_that_does_not_exist_is_refused(opset, ir_version, expected):
    m = relu_model()
    if opset is None:
        m.ClearField("opset_import")
        m.ir_version = ir_version
    else:
        m.opset_import[0].version = opset
    assert expected in error(m)


# -- what ONNX refuses and our ops would take another way --------------------------------------------------------

_X = [info("x", [2, 3])]


@pytest.mark.parametrize(("nodes", "inputs", "outputs", "inits", "expected"), [
    ([node("Add", ["x", "d"], ["y"], name="n")], _X, [info("y", [2, 3])], [const("d", 1.0, np.float64)],
     "inputs 0 and 1 are float32 and float64; ONNX wants them of one type (T)"),  # ours promotes
    ([node("CumSum", ["x", "axis"], ["y"], name="n")], _X, [info("y", [2, 3])], [const("axis", 1.0, np.float64)],
     "input 1 ('axis') is float64, which its type T2 does not allow"),  # ours truncated it
    ([node("Unsqueeze", ["x", "axes"], ["y"], name="n")], _X, [info("y", [2, 3, 1])], [const("axes", [4096])],
     "axes [4096] must be distinct axes of a rank-3 tensor"),  # taken modulo the rank: axis 1
    ([node("Slice", ["x", "s", "e", "axes"], ["y"], name="n")], _X, [info("y", [1, 3])],
     [const("s", [0]), const("e", [1]), const("axes", [4096])], "axes [4096] must be distinct axes"),
    ([node("Squeeze", ["x", "axes"], ["y"], name="n")], _X, [info("y", [2, 3])], [const("axes", [0])],
     "squeezing axes [0] of a tensor of shape (2, 3)"),  # ours (PyTorch's) leaves a dim not of size 1
    ([node("Split", ["x"], ["a", "b"], name="n", axis=1)], _X, [info("a", [2, 2]), info("b", [2, 1])], [],
     "a Split with neither a split input nor num_outputs"),  # from opset 18
    ([node("Clip", ["x", "", "hi"], ["y"], name="n")], _X, [info("y", [2, 3])],
     [const("hi", [[1.0, 2.0, 3.0]], np.float32)], "a bound of shape (1, 3) (Clip's bounds are scalars)"),
    ([node("LpNormalization", ["x"], ["y"], name="n", p=65)], _X, [info("y", [2, 3])], [], "p=65"),
    ([node("Gemm", ["v", "w"], ["y"], name="n")], [info("v", [3])], [info("y", [2])],
     [const("w", np.ones((2, 3)), np.float32)], "inputs of shapes (3,) and (2, 3) (Gemm takes matrices)"),
    ([node("ArgMax", ["x"], ["y"], name="n", axis=1)], _X, [info("y", [2, 1])], [],
     "graph output 'y' is declared float32; the graph gives int64"),
    ([node("Tile", ["x", "r"], ["y"], name="n")], _X, [info("y", [4, 3])], [const("r", [[2, 1]])],
     "input repeats ('r') must be a 1-D tensor of ints, got shape (1, 2)"),  # read flattened
    ([node("Tile", ["x", "r"], ["y"], name="n")], _X, [info("y", [2, 6])], [const("r", [2])],
     "1 repeats for an input of rank 2"),  # NumPy's tile: repeats of the trailing dims
], ids=["Add float32 float64", "CumSum float axis", "Unsqueeze axis 4096", "Slice axis 4096", "Squeeze a dim of 2",
        "Split without num_outputs", "Clip tensor bound", "LpNormalization p=65", "Gemm of a vector",
        "output of another type", "Tile 2-D repeats", "Tile too few repeats"])
def test_what_onnx_refuses_is_refused_not_read_our_way(nodes, inputs, outputs, inits, expected):
    assert expected in error(model_of(nodes, inputs, outputs, inits))


@pytest.mark.parametrize(("nodes", "expected"), [
    ([node("Conv", ["x", "w"], ["y"], name="n", kernel_shape=[1, 3])], "kernel_shape [1, 3] with weights of shape"),
    ([node("AveragePool", ["x"], ["y"], name="n", kernel_shape=[3, 3], pads=[1] * 6)],
     "pads=[1, 1, 1, 1, 1, 1] (6 values; 4 wanted)"),
    ([node("ConvTranspose", ["x", "w"], ["y"], name="n", output_shape=[1, 1, 6, 6])],
     "output_shape=[1, 1, 6, 6] (2 sizes wanted)"),
], ids=["Conv kernel_shape", "AveragePool pads", "ConvTranspose output_shape"])
def test_window_attributes_of_the_wrong_length_are_refused(nodes, expected):
    m = model_of(nodes, [info("x", [1, 1, 4, 4])], [info("y", [1, 1, 4, 4])],
                 [const("w", np.ones((1, 1, 3, 3)), np.float32)])
    assert expected in error(m)


@pytest.mark.parametrize("reduction", ["big", ""])
def test_a_loss_with_a_reduction_onnx_lacks_is_refused(reduction):
    # with class weights, an unknown reduction was read as "mean"
    m = model_of([node("SoftmaxCrossEntropyLoss", ["x", "t", "w"], ["y"], name="n", reduction=reduction)],
                 [info("x", [3, 5]), info("t", [3], INT64)], [info("y", [])], [const("w", np.ones(5), np.float32)])
    assert f"reduction={reduction!r} (none, sum or mean)" in error(m)


def test_integer_div_truncates_exactly_and_refuses_division_by_zero():
    """Integer Div went through float32 (2**40 + 1 came back as 2**40) and turned a division by zero into
    whatever the cast of inf gives; ONNX Runtime computes it in integers and refuses the zero."""
    import onnxruntime

    m = model_of([node("Div", ["x", "y"], ["z"])], [info("x", [4], INT64), info("y", [4], INT64)],
                 [info("z", [4], INT64)])
    x, y = np.array([2**40 + 1, -7, 7, -7]), np.array([1, 2, -2, -2])
    got = of.Executor(of.onnx.load(m)).run({"x": x, "y": y})["z"]
    session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, session.run(None, {"x": x, "y": y})[0])
    np.testing.assert_array_equal(got, [2**40 + 1, -3, -3, 3])
    with pytest.raises(of.OpforgeError, match="by zero"):
        of.Executor(of.onnx.load(m)).run({"x": x, "y": np.array([1, 0, 1, 1])})
