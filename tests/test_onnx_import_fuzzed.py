"""Models the long ONNX import fuzz (tests/test_fuzz_onnx.py, OPFORGE_FUZZ=long) found wrong or crashing, minimized:
each must give what ONNX's reference and ONNX Runtime give, or be refused by name with an OnnxImportError."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from test_onnx_import_ops import model_of  # noqa: E402

import opforge as of  # noqa: E402
from opforge.onnx import OnnxImportError  # noqa: E402


def info(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def test_max_unpool_writes_an_element_two_overlapping_windows_picked_once():
    # MaxPool with kernel 3 and stride 1 picks the same maximum in several windows; unpooling must put it back once
    # (written, as ONNX's reference, ONNX Runtime and torch's max_unpool2d do), not the sum of its copies
    from onnx.reference import ReferenceEvaluator

    model = model_of([
        helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[3, 3], strides=[1, 1]),
    ], [info("x", [1, 1, 5, 5])], [info("y", [1, 1, 5, 5])])  # (one channel: the reference's MaxPool counts its
    # Indices in each channel's plane, not over the whole tensor as the spec and ONNX Runtime do)
    x = np.random.default_rng(0).standard_normal((1, 1, 5, 5)).astype(np.float32)
    y = of.Executor(of.onnx.load(model.SerializeToString())).run({"x": x})["y"]
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y[y != 0], x[y != 0])  # each value put back is the input's own
    ort = pytest.importorskip("onnxruntime")
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, theirs)


@pytest.mark.parametrize("op, inputs, attrs, attribute", [
    ("Attention", ["q", "key", "v"], {"is_causal": 3}, "is_causal"),  # ONNX Runtime: not causal; the reference: causal
    ("Unique", ["x"], {"sorted": 10**12}, "sorted"),  # ONNX Runtime: unsorted; ONNX's reference: sorted
    ("TopK", ["x", "k"], {"largest": 2}, "largest"),
])
def test_flags_other_than_0_or_1_are_refused_by_name(op, inputs, attrs, attribute):
    outputs = ["y", "i"] if op == "TopK" else ["y"]
    k = helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.INT64, [1], [2]))
    nodes = [k, helper.make_node(op, inputs, outputs, **attrs)]
    model = model_of(nodes, [info(n, [1, 2, 3, 4]) for n in inputs if n != "k"], [info(n, None) for n in outputs])
    with pytest.raises(OnnxImportError, match=f"attribute '{attribute}' is a flag, 0 or 1; got {attrs[attribute]}"):
        of.onnx.load(model.SerializeToString())


def test_celu_with_an_alpha_its_formula_cannot_divide_by_is_refused():
    for alpha in (float("nan"), 0.0):
        model = model_of([helper.make_node("Celu", ["x"], ["y"], alpha=alpha)], [info("x", [3])], [info("y", [3])])
        with pytest.raises(OnnxImportError, match=r"Celu.*alpha=(nan|0\.0) is not supported"):
            of.onnx.load(model.SerializeToString())


def test_sizes_that_ask_for_a_huge_constant_are_refused_before_it_is_made():
    causal = model_of([helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)],
                      [info(n, [1, 1, 10**9, 8]) for n in "qkv"], [info("y", None)])
    rnn = model_of([helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=10**12)],  # (W and R of size 4)
                   [info("x", [1, 3, 2]), info("w", [1, 4, 2]), info("r", [1, 4, 4])], [info("y", None)], opset=22)
    for model in (causal, rnn):
        with pytest.raises(OnnxImportError, match="past the 1048576 bytes the constants computed at load may take"):
            of.onnx.load(model.SerializeToString(), max_constant_bytes=1 << 20)


def test_an_einsum_over_more_dims_than_letters_is_refused():
    model = model_of([helper.make_node("Einsum", ["x"], ["y"], equation="...->...")],
                     [info("x", [1] * 60)], [info("y", None)])
    with pytest.raises(OnnxImportError, match="needs more than the 52 letters to name every dim"):
        of.onnx.load(model.SerializeToString())


def test_an_output_of_more_dims_than_an_array_can_have_is_refused():
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    model = model_of([helper.make_node("Constant", [], ["axes"], value=axes),
                      helper.make_node("Unsqueeze", ["x", "axes"], ["y"])], [info("x", [1] * 64)], [info("y", None)])
    with pytest.raises(OnnxImportError, match="output 'y' would have 65 dims, past the 64 an array can have"):
        of.onnx.load(model.SerializeToString())


def test_conv_integer_runs_compiled_as_onnxruntime():
    # (its round-then-cast-to-int32 tail, on outputs this large, reached the native backend's fusion, which has no C
    # type for int32)
    rng = np.random.default_rng(0)
    model = model_of([helper.make_node("ConvInteger", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                     [info("x", [1, 1, 64, 64], TensorProto.UINT8), info("w", [2, 1, 3, 3], TensorProto.UINT8)],
                     [info("y", [1, 2, 64, 64], TensorProto.INT32)], opset=10)
    feeds = {"x": rng.integers(0, 255, (1, 1, 64, 64), np.uint8), "w": rng.integers(0, 255, (2, 1, 3, 3), np.uint8)}
    y = of.Executor(of.onnx.load(model.SerializeToString())).run(feeds)["y"]
    ort = pytest.importorskip("onnxruntime")
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, want)
