"""ONNX import: models round-trip, run in the Executor, train with append_backward; bad files give clear errors."""

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import opforge as of  # noqa: E402
from opforge import ops as F  # noqa: E402
from opforge.onnx import OnnxImportError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import char_transformer  # noqa: E402
import demo  # noqa: E402


def model_of(nodes, inputs, outputs, initializers=(), opset=21):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor_info(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


@pytest.mark.parametrize("name", ["digits_cnn", "char_transformer"])
def test_exported_models_round_trip(name):
    if name == "digits_cnn":
        model, spec = demo.make_model(), of.Spec((None, 1, 8, 8), "float32")
        batch = np.random.default_rng(0).uniform(0, 1, (6, 1, 8, 8)).astype(np.float32)
    else:
        model, spec = char_transformer.make_model(30), of.Spec((None, char_transformer.BLOCK), "int64")
        batch = np.random.default_rng(0).integers(0, 30, (3, char_transformer.BLOCK))
    model.eval()
    program = of.onnx.load(of.onnx.export(model, None, spec).SerializeToString())
    assert set(program.parameters()) == {k for k, _ in model.named_parameters()}  # names kept
    got = of.Executor(program).run({program.feeds[0]: batch})["out"]
    with of.no_grad():
        want = model(of.tensor(batch)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_append_backward_on_an_imported_program_gives_eager_gradients():
    model = demo.make_model()
    specs = {"x": of.Spec((None, 1, 8, 8), "float32"), "labels": of.Spec((None,), "int64")}
    proto = of.onnx.export(lambda x, labels: {"loss": F.cross_entropy(model(x), labels)}, None, specs)
    program = of.onnx.load(proto)
    grads = of.append_backward(program, program.outputs["loss"])
    assert len(grads) == len(list(model.parameters()))
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 1, (8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    out = of.Executor(program).run({"x": x, "labels": y})
    eager = F.cross_entropy(model(of.tensor(x)), of.tensor(y))
    eager.backward()
    np.testing.assert_allclose(out["loss"], eager.item(), rtol=1e-5)
    for name, p in zip(grads, model.parameters()):  # initializers in the order the parameters were traced
        np.testing.assert_allclose(out[name], p.grad.numpy(), rtol=1e-4, atol=1e-6)  # named as run names them


def test_an_imported_module_trains_compiled():
    model = demo.make_model()
    net = of.onnx.load_module(of.onnx.export(model, None, of.Spec((None, 1, 8, 8), "float32")))
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in model.named_parameters()]
    opt = of.optim.SGD(net.parameters(), lr=0.1)

    def step(x, y):
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = of.compile(step)
    rng = np.random.default_rng(0)
    x, y = of.tensor(rng.uniform(0, 1, (16, 1, 8, 8)).astype(np.float32)), of.tensor(rng.integers(0, 10, 16))
    first = step(x, y).item()  # eagerly, then compiled
    losses = [compiled(x, y).item() for _ in range(20)]
    assert losses[-1] < first


def test_dynamic_dims_and_shape_arithmetic_import():
    # x.view(x.size(0), -1) as PyTorch writes it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    m = model_of(nodes, [tensor_info("x", ["batch", 2, 3])], [tensor_info("y", ["batch", 6])], inits)
    program = of.onnx.load(m)
    assert program.block.vars["x"].spec.shape == (None, 2, 3)
    exe = of.Executor(program)
    for n in (1, 4):
        x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
        np.testing.assert_array_equal(exe.run({"x": x})["y"], x.reshape(n, 6))


def _error(source) -> str:
    with pytest.raises(OnnxImportError) as e:
        of.onnx.load(source)
    return str(e.value)


def test_malformed_files_give_clear_errors(tmp_path):
    good = of.onnx.export(demo.make_model(), None, of.Spec((None, 1, 8, 8), "float32")).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(good[: len(good) // 2])
    assert "truncated or damaged" in _error(path)
    assert "cannot read" in _error(tmp_path / "missing.onnx")
    assert "not an ONNX model" in _error(b"\x00\x01garbage" * 10) or "holds no graph" in _error(b"\x00\x01garbage")
    assert "expected a path" in _error(42)
    # an initializer that is missing: the node's input is produced by nothing
    m = model_of([helper.make_node("Add", ["x", "w"], ["y"])], [tensor_info("x", [2])], [tensor_info("y", [2])])
    message = _error(m)
    assert "'w'" in message and "Add" in message and "missing initializer" in message
    # a type opforge lacks
    m = model_of([helper.make_node("Relu", ["x"], ["y"])], [tensor_info("x", [2], TensorProto.UINT8)],
                 [tensor_info("y", [2], TensorProto.UINT8)])
    assert "uint8" in _error(m)
    # an initializer whose data does not fit its dims
    bad = numpy_helper.from_array(np.ones(4, np.float32), "w")
    bad.dims[:] = [5]
    m = model_of([helper.make_node("Add", ["x", "w"], ["y"])], [tensor_info("x", [5])], [tensor_info("y", [5])],
                 [bad])
    assert "'w'" in _error(m)


def test_unsupported_ops_and_attributes_name_node_type_and_opset():
    m = model_of([helper.make_node("DFT", ["x"], ["y"], name="dft1")], [tensor_info("x", [2, 2, 1])],
                 [tensor_info("y", [None])], opset=19)
    message = _error(m)
    assert "'dft1'" in message and "DFT" in message and "opset 19" in message and "not supported" in message
    m = model_of([helper.make_node("Relu", ["x"], ["y"], name="r", fancy=3)], [tensor_info("x", [2])],
                 [tensor_info("y", [2])])
    message = _error(m)
    assert "'r'" in message and "Relu" in message and "fancy" in message
    m = model_of([helper.make_node("MaxPool", ["x"], ["y"], name="p", kernel_shape=[2, 2], storage_order=1)],
                 [tensor_info("x", [1, 1, 6, 6])], [tensor_info("y", [1, 1, 5, 5])])
    assert "storage_order" in _error(m)
    m = model_of([helper.make_node("Relu", ["x"], ["y"], domain="com.example")], [tensor_info("x", [2])],
                 [tensor_info("y", [2])])
    assert "com.example" in _error(m)


def test_loading_never_executes_code(tmp_path, monkeypatch):
    # the loader parses protobuf only: no pickle, no eval, no external files
    import builtins
    import pickle

    def refuse(*a, **k):
        raise AssertionError("code execution while loading")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(builtins, "eval", refuse)
    t = numpy_helper.from_array(np.ones(2, np.float32), "w")
    t.data_location = TensorProto.EXTERNAL
    from onnx.external_data_helper import set_external_data

    set_external_data(t, location="../../etc/passwd")
    m = model_of([helper.make_node("Add", ["x", "w"], ["y"])], [tensor_info("x", [2])], [tensor_info("y", [2])], [t])
    assert "external file" in _error(m)
    program = of.onnx.load(model_of([helper.make_node("Relu", ["x"], ["y"])], [tensor_info("x", [2])],
                                    [tensor_info("y", [2])]))
    assert [op.type for op in program.block.ops] == ["relu"]


def test_export_refuses_an_op_without_mapping():
    @of.op("onnx_test_unmapped(Tensor x) -> Tensor y", traits=["elementwise"])
    def unmapped(x):
        return x * 2

    try:
        with pytest.raises(of.onnx.OnnxExportError, match=r"onnx_test_unmapped.*@onnx_test_unmapped\.onnx"):
            of.onnx.export(lambda x: unmapped(x), None, of.Spec((2,), "float32"))
    finally:
        of.registry.remove("onnx_test_unmapped")


def test_import_opforge_does_not_import_onnx():
    import subprocess

    code = "import sys, opforge; print('onnx' in sys.modules, 'onnxruntime' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_finetune_example_runs():
    import subprocess

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "examples/onnx_finetune.py"], cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fine-tuned on all ten digits" in done.stdout


def test_an_input_declared_narrower_than_opforge_holds_it_takes_only_values_of_its_type(tmp_path):
    # an int8 input is held as int64: 300 fed there was added as 300 (ONNX Runtime refuses an int64 feed); a float8
    # input is held as float32: 0.3 was used as 0.3. Now each feed takes arrays of the declared type, or values of it
    import ml_dtypes
    import onnxruntime as ort

    from opforge.onnx import load, load_module
    from opforge.program.serialize import load as load_program
    from opforge.program.serialize import save as save_program

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g",
                              [helper.make_tensor_value_info(n, TensorProto.INT8, [2]) for n in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.INT8, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    a, b = np.array([100, -100], np.int8), np.array([100, 1], np.int8)
    want = ort.InferenceSession(model).run(None, {"a": a, "b": b})[0]
    program = load(model)
    exe = of.Executor(program)
    np.testing.assert_array_equal(exe.run({"a": a, "b": b})["c"], want)  # the declared type, as ONNX Runtime
    np.testing.assert_array_equal(exe.run({"a": a.astype(np.int64), "b": b.astype(np.int64)})["c"], want)
    with pytest.raises(of.ArgumentError, match=r"feed 'a' is declared int8 .* holds 300, which is not a value of int8"):
        exe.run({"a": np.array([300, 0]), "b": b.astype(np.int64)})
    with pytest.raises(OnnxImportError, match=r"input 'a' is declared int8 .* holds 300"):
        load_module(model)(of.tensor(np.array([300, 0])), of.tensor(b.astype(np.int64)))
    save_program(program, tmp_path / "p.json")
    with pytest.raises(of.ArgumentError, match="not a value of int8"):
        of.Executor(load_program(tmp_path / "p.json")).run({"a": np.array([0, -129]), "b": b.astype(np.int64)})

    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    exe = of.Executor(load(model))
    x = np.array([0.5, 2.0, np.nan], np.float32)
    np.testing.assert_array_equal(exe.run({"x": x.astype(ml_dtypes.float8_e4m3fn)})["y"], x)
    np.testing.assert_array_equal(exe.run({"x": x})["y"], x)
    with pytest.raises(of.ArgumentError, match="not a value of float8_e4m3fn"):
        exe.run({"x": np.array([0.3, 1.0, 2.0], np.float32)})
