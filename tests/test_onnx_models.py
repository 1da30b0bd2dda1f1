"""Whole models through ONNX: exported models run in ONNX Runtime as in opforge, at two batch sizes."""

import sys
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import opforge as of  # noqa: E402
from opforge import nn  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

import char_transformer  # noqa: E402
import demo  # noqa: E402


def session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def mlp():
    of.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32, dtype="float64"), nn.Tanh(),
                         nn.Linear(32, 10, dtype="float64"))


MODELS = {  # name: (make the model, the input Spec, make a batch of n, rtol)
    "digits_cnn": (demo.make_model, of.Spec((None, 1, 8, 8), "float32"),
                   lambda rng, n: rng.uniform(0, 1, (n, 1, 8, 8)).astype(np.float32), 1e-5),
    "mlp": (mlp, of.Spec((None, 1, 8, 8), "float64"), lambda rng, n: rng.uniform(0, 1, (n, 1, 8, 8)), 1e-10),
    "char_transformer": (lambda: char_transformer.make_model(40), of.Spec((None, char_transformer.BLOCK), "int64"),
                         lambda rng, n: rng.integers(0, 40, (n, char_transformer.BLOCK)), 1e-5),
}


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
@pytest.mark.parametrize("name", MODELS)
def test_exported_model_matches_onnx_runtime_at_two_batch_sizes(name, opset, tmp_path):
    make, spec, batch, rtol = MODELS[name]
    model = make()
    path = tmp_path / f"{name}.onnx"
    proto = of.onnx.export(model, path, spec, opset=opset)
    onnx.checker.check_model(str(path), full_check=True)
    feed = proto.graph.input[0].name
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == f"{feed}_dim0"  # the batch: dynamic
    assert len(proto.graph.initializer) >= len(list(model.parameters()))
    model.eval()
    rng = np.random.default_rng(0)
    run = session(proto)
    for n in (3, 17):
        x = batch(rng, n)
        with of.no_grad():
            want = model(of.tensor(x)).numpy()
        (got,) = run.run(None, {feed: x})
        assert got.shape == want.shape and got.dtype == want.dtype
        # Two runtimes sum in different orders: an element near 0 has no relative precision left, so the absolute
        # tolerance is rtol times the output's scale.
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


import word_lstm  # noqa: E402


def _node_types(proto) -> set:
    return {node.op_type for node in proto.graph.node}


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
def test_word_lstm_language_model_with_its_state_matches_onnx_runtime(opset):
    # the model of examples/word_lstm.py, reading and returning the LSTM's state (h, c): the cell states every step
    # are read (c_n), so the steps are written out; a window of 5 words, any number of streams
    model = word_lstm.make_model(50, hidden=8, layers=2)
    model.eval()

    def step(x, h, c):
        logits, (h2, c2) = model(x, (h, c))
        return {"logits": logits, "h_n": h2, "c_n": c2}

    specs = {"x": of.Spec((5, None), "int64"), "h": of.Spec((2, None, 8), "float32"),
             "c": of.Spec((2, None, 8), "float32")}
    proto = of.onnx.export(step, None, specs, opset=opset)
    run = session(proto)
    rng = np.random.default_rng(0)
    for n in (1, 4):
        feeds = {"x": rng.integers(0, 50, (5, n)), "h": rng.standard_normal((2, n, 8)).astype(np.float32),
                 "c": rng.standard_normal((2, n, 8)).astype(np.float32)}
        with of.no_grad():
            want = step(*(of.tensor(feeds[k]) for k in ("x", "h", "c")))
        for (name, w), got in zip(want.items(), run.run(None, feeds)):
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers_are_onnx_lstm_and_gru_nodes(kind, opset):
    # a bidirectional 2-layer encoder read by its outputs: one ONNX node per layer and direction, any length and
    # batch size
    of.manual_seed(0)
    rnn = getattr(nn, kind)(3, 4, num_layers=2, bidirectional=True)
    rnn.eval()
    proto = of.onnx.export(lambda x: {"y": rnn(x)[0]}, None, of.Spec((None, None, 3), "float32"), opset=opset)
    assert sum(node.op_type == kind for node in proto.graph.node) == 4
    # the input projections are the nodes' own input weights (W_ih in ONNX's gate order), not MatMuls before them
    assert not {"MatMul", "Gemm"} & _node_types(proto)
    run = session(proto)
    rng = np.random.default_rng(0)
    for t, n in ((7, 1), (2, 3)):
        x = rng.standard_normal((t, n, 3)).astype(np.float32)
        with of.no_grad():
            want = rnn(of.tensor(x))[0].numpy()
        (got,) = run.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_sequence_ops_as_onnx_nodes_over_run_time_lengths_and_packed_batches(kind, reverse):
    # lstm_layer/gru_layer read by y alone: one node over any number of steps; batch_sizes (a packed batch) become
    # ONNX's sequence_lens, and the rows past their length keep their state as ours do (ONNX writes zeros there)
    t, n, h, k = None, 3, 2, 4 if kind == "lstm" else 3
    specs = {"gx": of.Spec((t, n, k * h), "float32"), "h0": of.Spec((n, h), "float32"),
             "c0": of.Spec((n, h), "float32"), "w": of.Spec((k * h, h), "float32"),
             "b": of.Spec((k * h,), "float32"), "sizes": of.Spec((t,), "int64")}

    def fn(gx, h0, c0, w, b, sizes):
        if kind == "lstm":
            return {"y": of.ops.lstm_layer(gx, h0, c0, w, sizes, reverse=reverse)[0]}
        return {"y": of.ops.gru_layer(gx, h0, w, b, sizes, reverse=reverse)[0]}

    program = of.trace(fn, **specs)
    proto = of.onnx.export(program)
    assert kind.upper() in _node_types(proto)
    run = session(proto)
    rng = np.random.default_rng(0)
    for sizes in ([3, 3, 3, 3, 3], [3, 2, 2, 1], [1]):
        feeds = {name: rng.standard_normal([len(sizes) if d is None else d for d in spec.shape]).astype(np.float32)
                 for name, spec in specs.items() if name != "sizes"}
        feeds["sizes"] = np.array(sizes, np.int64)
        feeds = {name: feeds[name] for name in (i.name for i in proto.graph.input)}
        want = of.Executor(program).run(feeds)["y"]
        (got,) = run.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(sizes))


def image_model():
    # a classifier and a decoder over images of any size: ConvTranspose, Upsample, PixelShuffle, channel dropout
    # (off in eval), batch norm and a global average pooling head
    of.manual_seed(0)
    features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout2d(0.2),
                             nn.ConvTranspose2d(8, 8, 2, stride=2, groups=2), nn.Upsample(scale_factor=2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.PixelShuffle(2), nn.MaxPool2d(2))
    return nn.Sequential(features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))


@pytest.mark.parametrize("opset", [17, of.onnx.DEFAULT_OPSET])
def test_image_model_over_any_image_size_matches_onnx_runtime(opset):
    model = image_model()
    model.eval()
    proto = of.onnx.export(model, None, of.Spec((None, 3, None, None), "float32"), opset=opset)
    assert {"ConvTranspose", "Resize"} <= _node_types(proto)
    run = session(proto)
    rng = np.random.default_rng(0)
    for shape in ((2, 3, 5, 7), (1, 3, 8, 4)):
        x = rng.standard_normal(shape).astype(np.float32)
        with of.no_grad():
            want = model(of.tensor(x)).numpy()
        (got,) = run.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_exported_recurrent_layers_give_torchs_outputs_in_onnx_runtime(kind):
    # an outsider against an outsider: the ONNX nodes' gate order and GRU's reset convention are torch's
    torch = pytest.importorskip("torch")
    of.manual_seed(0)
    ours = getattr(nn, kind)(3, 4, num_layers=2, bidirectional=True)
    ours.eval()
    theirs = getattr(torch.nn, kind)(3, 4, num_layers=2, bidirectional=True)
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in ours.state_dict().items()})
    proto = of.onnx.export(lambda x: {"y": ours(x)[0]}, None, of.Spec((6, None, 3), "float32"))
    x = np.random.default_rng(0).standard_normal((6, 2, 3)).astype(np.float32)
    (got,) = session(proto).run(None, {"x": x})
    with torch.no_grad():
        want = theirs(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
