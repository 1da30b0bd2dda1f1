"""Models the long ONNX import fuzz (tests/test_fuzz_onnx.py, OPFORGE_FUZZ=long) found wrong or crashing, minimized:
each must give what ONNX's reference and ONNX Runtime give, or be refused by name with an OnnxImportError."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import opforge as of  # noqa: E402
from opforge.onnx import OnnxImportError  # noqa: E402


def model_of(nodes, inputs, outputs, opset=23):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


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
