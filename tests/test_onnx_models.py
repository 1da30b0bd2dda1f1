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


@pytest.mark.parametrize("name", MODELS)
def test_exported_model_matches_onnx_runtime_at_two_batch_sizes(name, tmp_path):
    make, spec, batch, rtol = MODELS[name]
    model = make()
    path = tmp_path / f"{name}.onnx"
    proto = of.onnx.export(model, path, spec)
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
