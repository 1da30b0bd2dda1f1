"""Models PyTorch writes as ONNX — an MLP, a CNN, LSTM and GRU encoders, a Transformer encoder layer, attention —
with both of torch's exporters: TorchScript's (``dynamo=False``, opset 17, dynamic axes) and the one torch now
recommends (``dynamo=True``: torch.export's graph, onnxscript's decompositions, opset 20, ``dynamic_shapes``). Each
imports, runs at other sizes than the export's and matches torch (values, and the input's gradient) and the ONNX
runtime. The dynamic-shape idioms of both exporters are in test_onnx_dynamic.py."""

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from test_onnx_dynamic import dynamo_export  # noqa: E402

import opforge as of  # noqa: E402

nn = torch.nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


class Recurrent(nn.Module):  # the sequence of outputs of a 2-layer bidirectional encoder
    def __init__(self, kind):
        super().__init__()
        self.rnn = getattr(nn, kind)(4, 5, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class CausalAttention(nn.Module):  # torch's dynamo exporter writes ONNX's Attention node from opset 23 on
    def forward(self, q):
        return nn.functional.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))


# (the module, the input's shape at export, at run, its dynamic dims)
MODELS = {
    "mlp": (lambda: nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)),
            (2, 4), (5, 4), (0,)),
    "cnn": (_cnn, (2, 1, 8, 8), (3, 1, 10, 12), (0, 2, 3)),
    "lstm": (lambda: Recurrent("LSTM"), (2, 6, 4), (3, 7, 4), (0, 1)),
    "rnn": (lambda: Recurrent("RNN"), (2, 6, 4), (3, 7, 4), (0, 1)),
    "gru": (lambda: Recurrent("GRU"), (2, 6, 4), (3, 7, 4), (0, 1)),
    "transformer_encoder_layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                  (2, 5, 8), (3, 7, 8), (0, 1)),
    "attention": (Attention, (2, 5, 8), (3, 7, 8), (0, 1)),
    "causal_sdpa": (CausalAttention, (2, 2, 5, 4), (3, 2, 7, 4), (0, 2)),
}
DYNAMO_OPSET = {"causal_sdpa": 23}  # (else torch's choice, 20: the Attention node is opset 23's)
# Dims that stay fixed: (the dim, what refuses it dynamic, the refusal) per exporter; the model is checked with the
# dim fixed (and the refusal asserted: when it goes, this says to test the dim dynamic)
FIXED = {("rnn", "dynamo"): (1, "torch.export specializes nn.RNN's sequence length (it unrolls the steps)",
                             r"inferred a static shape|specialized it to be a constant"),
         ("rnn", "torchscript"): (1, "opforge imports ONNX's RNN (tanh) as cells unrolled over a known number of "
                                     "steps (LSTM and GRU are layer ops, over any length)",
                                  r"RNN cell \(unrolled over the steps\) over a sequence length known only at run "
                                  "time")}

# What torch's TorchScript exporter cannot write, or writes for the export's sizes only (ONNX Runtime refuses the
# model at other sizes too): checked at the export's sizes, or skipped with torch's reason.
TORCHSCRIPT_FIXED_SIZES = {"attention": "nn.MultiheadAttention's (L, B·heads, d) Reshape holds the export's L and B"}
TORCHSCRIPT_FAILS = {"transformer_encoder_layer": "torch 2.13's TorchScript exporter fails in "
                                                  "scaled_dot_product_attention: 'is_causal' must be bool, not Tensor"}


def _export(name, exporter):
    """(torch's module, the model, the dims it keeps dynamic)."""
    make, shape, _, dims = MODELS[name]
    torch.manual_seed(0)
    module = make().double().eval()  # float64: values and gradients to 1e-10
    x = torch.randn(*shape, dtype=torch.float64)
    if exporter == "dynamo":
        options = {"input_names": ["x"], "output_names": ["y"]}
        options.update({"opset_version": DYNAMO_OPSET[name]} if name in DYNAMO_OPSET else {})
        if (name, exporter) in FIXED:
            with pytest.raises(Exception, match=FIXED[name, exporter][2]):
                dynamo_export(module, (x,), [dims], **options)
            dims = tuple(d for d in dims if d != FIXED[name, exporter][0])
        return module, dynamo_export(module, (x,), [dims], **options), dims
    if name in TORCHSCRIPT_FAILS:
        with pytest.raises(Exception, match="is_causal"):  # (when torch mends it, this says to test the model)
            torch.onnx.export(module, (x,), io.BytesIO(), dynamo=False, opset_version=17)
        pytest.skip(TORCHSCRIPT_FAILS[name])
    if (name, exporter) in FIXED:
        with pytest.raises(of.onnx.OnnxImportError, match=FIXED[name, exporter][2]):
            of.onnx.load(_torchscript_export(module, x, dims))
        dims = tuple(d for d in dims if d != FIXED[name, exporter][0])
    return module, _torchscript_export(module, x, dims), dims


def _torchscript_export(module, x, dims):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": list(dims)})
    return onnx.load_from_string(f.getvalue())


def _runtime(proto, feed):
    """(the output, its tolerance) of ONNX Runtime, or of ONNX's reference evaluator where ORT has no float64 kernel
    (Conv, LSTM, GRU, Erf); the evaluator's Erf (GELU's) is float32-accurate, and so is ORT's float64 Attention
    (5e-8 from torch's values, where the reference evaluator is within 1e-15)."""
    try:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        attention = any(n.op_type == "Attention" for n in proto.graph.node)
        return session.run(None, feed)[0], (1e-6, 1e-7) if attention else (1e-10, 1e-12)
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e) and "does not support double" not in str(e):
            raise
    from onnx.reference import ReferenceEvaluator

    erf = any(n.op_type in ("Erf", "Gelu") for n in proto.graph.node)
    return ReferenceEvaluator(proto).run(None, feed)[0], (1e-6, 1e-7) if erf else (1e-10, 1e-12)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(MODELS))
def test_models_torch_exports_import_and_match_torch_and_onnx_runtime(name, exporter):
    module, proto, dims = _export(name, exporter)
    _, export_shape, run_shape, _ = MODELS[name]
    run_shape = tuple(n if i in dims else e for i, (n, e) in enumerate(zip(run_shape, export_shape)))
    if exporter == "torchscript" and name in TORCHSCRIPT_FIXED_SIZES:  # at other sizes ORT and opforge refuse it
        feed = {proto.graph.input[0].name: np.zeros(run_shape)}
        with pytest.raises(Exception, match=r"[Rr]eshape"):
            ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        with pytest.raises(of.OpforgeError, match="reshape"):
            of.Executor(of.onnx.load(proto)).run(feed)
        run_shape = export_shape
    x = np.random.default_rng(1).standard_normal(run_shape)
    t = torch.tensor(x, requires_grad=True)
    want = module(t)
    weight = np.random.default_rng(2).standard_normal(tuple(want.shape))
    (want * torch.tensor(weight)).sum().backward()
    want = want.detach().numpy()
    feed = {proto.graph.input[0].name: x}

    program = of.onnx.load(proto)
    assert [d is None for d in program.block.vars[proto.graph.input[0].name].spec.shape] == \
        [i in dims for i in range(len(run_shape))]  # the dynamic dims stay unknown
    got = next(iter(of.Executor(program).run(feed).values()))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    theirs, (rtol, atol) = _runtime(proto, feed)
    np.testing.assert_allclose(got, theirs, rtol=rtol, atol=atol)

    net = of.onnx.load_module(proto)  # eagerly, with the input's gradient
    xo = of.tensor(x, requires_grad=True)
    y = net(xo)
    y = y if not isinstance(y, dict) else next(iter(y.values()))
    (y * of.tensor(weight)).sum().backward()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xo.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-11)

    # a program traced with the dynamic dims unknown, differentiated by append_backward
    def loss(x):
        y = net(x)
        y = y if not isinstance(y, dict) else next(iter(y.values()))
        return {"y": y, "loss": (y * of.tensor(weight)).sum()}

    traced = of.trace(loss, x=of.Spec(tuple(None if i in dims else d for i, d in enumerate(run_shape)), x.dtype))
    of.append_backward(traced, traced.outputs["loss"], wrt=["x"])
    out = of.Executor(traced).run(x=x)
    np.testing.assert_allclose(out["y"], want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["x@GRAD"], t.grad.numpy(), rtol=1e-9, atol=1e-11)
