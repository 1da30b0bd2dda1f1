"""ONNX importers of ops added for coverage, checked against PyTorch (values and gradients through the imported
program) and ONNX Runtime, beyond ONNX's node tests (tests/test_onnx_backend.py)."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper  # noqa: E402

import opforge as of  # noqa: E402


def model_of(nodes, inputs, outputs, opset=23):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def info(name, dims, elem=TensorProto.DOUBLE):
    return helper.make_tensor_value_info(name, elem, dims)


def run(model, feeds, wrt=()):
    """The imported program's outputs on ``feeds`` (run by the Executor), and the gradients of the sum of its first
    output by the inputs ``wrt`` (the model run eagerly as a module)."""
    program = of.onnx.load(model)
    out = of.Executor(program).run(feeds)
    grads = {}
    if wrt:
        tensors = {k: of.tensor(v, requires_grad=k in wrt) for k, v in feeds.items()}
        y = of.onnx.load_module(model)(**tensors)
        (y if not isinstance(y, dict) else next(iter(y.values()))).sum().backward()
        grads = {k: tensors[k].grad.numpy() for k in wrt}
    return [out[name] for name in program.outputs], grads


def onnxruntime_outputs(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_attention_matches_torch_values_and_gradients():
    # grouped-query attention (4 query heads over 2 key/value heads), a key cache, causal, 3-D inputs
    b, q_len, past, kv_len, heads, kv_heads, size = 2, 3, 2, 3, 4, 2, 5
    rng = np.random.default_rng(0)
    feeds = {"q": rng.normal(size=(b, q_len, heads * size)), "k": rng.normal(size=(b, kv_len, kv_heads * size)),
             "v": rng.normal(size=(b, kv_len, kv_heads * size)), "pk": rng.normal(size=(b, kv_heads, past, size)),
             "pv": rng.normal(size=(b, kv_heads, past, size))}
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "present_k", "present_v"],
                            is_causal=1, q_num_heads=heads, kv_num_heads=kv_heads)
    model = model_of([node], [info("q", [b, q_len, heads * size]), info("k", [b, kv_len, kv_heads * size]),
                              info("v", [b, kv_len, kv_heads * size]), info("pk", [b, kv_heads, past, size]),
                              info("pv", [b, kv_heads, past, size])],
                     [info("y", None), info("present_k", None), info("present_v", None)])
    (y, present_k, _), grads = run(model, feeds, wrt=("q", "k", "pv"))

    t = {k: torch.tensor(v, requires_grad=True) for k, v in feeds.items()}
    def heads_of(x, n):
        return x.reshape(b, -1, n, size).transpose(1, 2)
    k_all = torch.cat([t["pk"], heads_of(t["k"], kv_heads)], 2)
    v_all = torch.cat([t["pv"], heads_of(t["v"], kv_heads)], 2)
    # bottom-right causal: query i (after the cache) sees keys up to past + i
    allowed = torch.arange(past + kv_len)[None, :] <= torch.arange(q_len)[:, None] + past
    want = torch.nn.functional.scaled_dot_product_attention(
        heads_of(t["q"], heads), k_all.repeat_interleave(2, 1), v_all.repeat_interleave(2, 1), attn_mask=allowed)
    want = want.transpose(1, 2).reshape(b, q_len, -1)
    want.sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(present_k, k_all.detach().numpy())
    for name in ("q", "k", "pv"):
        np.testing.assert_allclose(grads[name], t[name].grad.numpy(), rtol=1e-9, atol=1e-12)
    for got, ort in zip((y, present_k), onnxruntime_outputs(model, feeds)):  # (its double kernel rounds as float)
        np.testing.assert_allclose(got, ort, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_len", [3, 2])
def test_attention_masks_and_scores_output_match_onnx(mask_len):
    # a float mask (one shorter than the keys: the rest is masked out), softcap, the scores after the mask (mode 2);
    # against ONNX's reference, and ONNX Runtime where it takes the case (it refuses a short mask)
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(1, 2, 3, 4)) for _ in range(3))
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y", "", "", "scores"], softcap=2.0,
                            qk_matmul_output_mode=2, scale=0.3)
    model = model_of([node], [info("q", [1, 2, 3, 4]), info("k", [1, 2, 3, 4]), info("v", [1, 2, 3, 4]),
                              info("mask", [3, mask_len])], [info("y", None), info("scores", None)])
    feeds = {"q": q, "k": k, "v": v, "mask": rng.normal(size=(3, mask_len))}
    got = run(model, feeds)[0]
    for g, want in zip(got, ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)
    if mask_len == 3:
        for g, want in zip(got, onnxruntime_outputs(model, feeds)):
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("elem", [TensorProto.INT64, TensorProto.DOUBLE])
def test_mod_matches_torch(fmod, elem):
    dtype = np.int64 if elem == TensorProto.INT64 else np.float64
    x = np.array([7, -7, 7, -7, 0, 5, -6], dtype)
    y = np.array([3, 3, -3, -3, 2, 5, 4], dtype)
    if dtype == np.float64:
        x, y = x + 0.25, y * 1.5
    model = model_of([helper.make_node("Mod", ["x", "y"], ["z"], fmod=fmod)], [info("x", [7], elem),
                                                                                info("y", [7], elem)],
                     [info("z", [7], elem)])
    (z,), _ = run(model, {"x": x, "y": y})
    want = (torch.fmod if fmod else torch.remainder)(torch.tensor(x), torch.tensor(y)).numpy()
    np.testing.assert_array_equal(z, want) if dtype == np.int64 else np.testing.assert_allclose(z, want, rtol=1e-12)
    assert z.dtype == dtype


@pytest.mark.parametrize("mode, transform, antialias, torch_mode", [
    ("linear", "pytorch_half_pixel", 0, "bilinear"),
    ("cubic", "half_pixel", 0, "bicubic"),
    ("linear", "align_corners", 0, "bilinear-corners"),
    ("cubic", "pytorch_half_pixel", 1, "bicubic-antialias"),
    ("nearest", "asymmetric", 0, "nearest"),
])
@pytest.mark.parametrize("size", [(7, 3), (2, 9)])
def test_resize_matches_torch_interpolate_values_and_gradients(mode, transform, antialias, torch_mode, size):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 3, 5, 4))
    kw = {"mode": mode, "coordinate_transformation_mode": transform}
    if mode == "cubic":
        kw["cubic_coeff_a"] = -0.75  # torch's bicubic
    if mode == "nearest":
        kw["nearest_mode"] = "floor"  # torch's "nearest"
    if antialias:  # torch's antialiased bicubic: PIL's (a = -0.5, the taps inside the image only)
        kw.update(antialias=1, cubic_coeff_a=-0.5, exclude_outside=1)
    sizes = onnx.numpy_helper.from_array(np.array(size, np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], axes=[2, 3], **kw)
    graph = helper.make_graph([node], "g", [info("x", [2, 3, 5, 4])], [info("y", None)], initializer=[sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    (y,), grads = run(model, {"x": x}, wrt=("x",))
    t = torch.tensor(x, requires_grad=True)
    name = torch_mode.split("-")[0]
    options = {"align_corners": "corners" in torch_mode} if name != "nearest" else {}
    want = torch.nn.functional.interpolate(t, size=size, mode=name, antialias=bool(antialias), **options)
    want.sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["x"], t.grad.numpy(), rtol=1e-9, atol=1e-12)


# -- validity -----------------------------------------------------------------------------------------------------


def softmax_model():
    return model_of([helper.make_node("Softmax", ["x"], ["y"])], [info("x", [2, 3, 4])], [info("y", [2, 3, 4])],
                    opset=13)


@pytest.mark.parametrize("ir_version", [2, 1, 0])
def test_a_model_without_opset_import_is_refused(ir_version):
    # read as opset 1, Softmax would normalise over the dims from axis 1 on, flattened, not over the last one
    m = softmax_model()
    m.ClearField("opset_import")
    m.ir_version = ir_version
    with pytest.raises(of.onnx.OnnxImportError, match=r"IR version|imports no opset"):
        of.onnx.load(m)


@pytest.mark.parametrize("ir_version", [0, 2, 1000, -5])
def test_ir_versions_out_of_range_are_refused(ir_version):
    m = softmax_model()
    m.ir_version = ir_version
    with pytest.raises(of.onnx.OnnxImportError, match=f"declares IR version {ir_version}; opforge reads IR versions 3"):
        of.onnx.load(m)


def batchnorm_model():
    rng = np.random.default_rng(3)
    arrays = {"scale": rng.uniform(0.5, 2, 3), "bias": rng.normal(size=3), "mean": rng.normal(size=3),
              "var": rng.uniform(0.5, 2, 3)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])
    graph = helper.make_graph([node], "g", [info("x", [2, 3, 4])], [info("y", [2, 3, 4])],
                              initializer=[onnx.numpy_helper.from_array(v, k) for k, v in arrays.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), arrays


def test_batchnorm_running_statistics_are_buffers_not_parameters():
    model, arrays = batchnorm_model()
    net = of.onnx.load_module(model)
    assert [n for n, _ in net.named_parameters()] == ["scale", "bias"]
    assert [n for n, _ in net.named_buffers()] == ["mean", "var"]
    x = np.random.default_rng(4).normal(size=(2, 3, 4))
    y = net(of.tensor(x))
    want = (x - arrays["mean"][:, None]) / np.sqrt(arrays["var"][:, None] + 1e-5) * arrays["scale"][:, None] + \
        arrays["bias"][:, None]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12)
    y.sum().backward()
    assert all(b.grad is None for b in net.buffers())
    program = of.onnx.load(model)  # append_backward's default: the trainable parameters only
    assert {v.name for v in program.block.vars.values() if v.persistable and not v.stop_gradient} == {"scale", "bias"}


def external_model(tmp_path):
    from onnx.external_data_helper import convert_model_to_external_data

    w = np.arange(6, dtype=np.float64).reshape(2, 3)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [info("x", [2, 3])],
                              [info("y", [2, 3])], initializer=[onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save_model(model, tmp_path / "m.onnx")
    return onnx.load_model(tmp_path / "m.onnx", load_external_data=False), w


def test_external_data_inside_the_models_folder_is_read(tmp_path):
    _, w = external_model(tmp_path)
    x = np.ones((2, 3))
    out = of.Executor(of.onnx.load(tmp_path / "m.onnx")).run({"x": x})["y"]
    np.testing.assert_array_equal(out, x + w)
    np.testing.assert_array_equal(of.onnx.load_module(str(tmp_path / "m.onnx"))(of.tensor(x)).numpy(), x + w)


def _retarget(tmp_path, model, **entries):
    t = model.graph.initializer[0]
    for e in t.external_data:
        if e.key in entries:
            e.value = str(entries.pop(e.key))
    for k, v in entries.items():
        t.external_data.add(key=k, value=str(v))
    onnx.save_model(model, tmp_path / "m.onnx")
    with pytest.raises(of.onnx.OnnxImportError) as e:
        of.onnx.load(tmp_path / "m.onnx")
    return str(e.value)


def test_external_data_outside_the_folder_or_of_the_wrong_size_is_refused(tmp_path):
    model, _ = external_model(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "secret").write_bytes(b"\0" * 48)
    sub = tmp_path / "sub"
    onnx.save_model(model, sub / "m.onnx")
    assert "no '..'" in _retarget(sub, model, location="../secret")
    assert "no '..'" in _retarget(tmp_path, model, location=str(tmp_path / "secret"))  # absolute
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    (sub / "link").symlink_to(tmp_path / "secret")
    assert "not a file inside the model's folder" in _retarget(sub, model, location="link")
    assert "takes 48 bytes" in _retarget(tmp_path, model, location="weights.bin", length=40)
    assert "takes 48 bytes" in _retarget(tmp_path, model, location="weights.bin", length=48, offset=8)
    model.graph.initializer[0].ClearField("external_data")
    model.graph.initializer[0].external_data.add(key="location", value="weights.bin")
    with pytest.raises(of.onnx.OnnxImportError, match="load the model from its path"):
        of.onnx.load(model)  # a ModelProto: no folder to read from


# -- ops by composition, against torch (values and gradients) ------------------------------------------------------

def _single(op, x_shape, opset=21, inputs=(), **attrs):
    """A model of one node of ``op`` over x (float64) and constant ``inputs`` (initializers)."""
    names = ["x", *[f"c{i}" for i in range(len(inputs))]]
    graph = helper.make_graph([helper.make_node(op, names, ["y"], **attrs)], "g", [info("x", x_shape)],
                              [info("y", None)],
                              initializer=[onnx.numpy_helper.from_array(v, f"c{i}") for i, v in enumerate(inputs)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


F_ = torch.nn.functional
_CASES = {
    "LRN": (lambda: _single("LRN", [2, 6, 3, 3], size=3, alpha=0.25, beta=0.75, bias=1.5),
            lambda t: F_.local_response_norm(t, 3, alpha=0.25, beta=0.75, k=1.5), (2, 6, 3, 3)),
    "LpPool": (lambda: _single("LpPool", [2, 3, 6, 5], p=3, kernel_shape=[2, 3], strides=[2, 1]),
               lambda t: F_.lp_pool2d(t.abs(), 3, (2, 3), stride=(2, 1)), (2, 3, 6, 5)),
    "AveragePool dilated": (
        lambda: _single("AveragePool", [1, 2, 7, 7], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]),
        lambda t: F_.conv2d(F_.pad(t, (1, 1, 1, 1)), torch.full((2, 1, 2, 2), 0.25, dtype=t.dtype), dilation=2,
                            groups=2) / F_.conv2d(F_.pad(torch.ones_like(t), (1, 1, 1, 1)),
                                                  torch.full((2, 1, 2, 2), 0.25, dtype=t.dtype), dilation=2,
                                                  groups=2), (1, 2, 7, 7)),
    "DepthToSpace CRD": (lambda: _single("DepthToSpace", [2, 8, 2, 3], blocksize=2, mode="CRD"),
                         lambda t: F_.pixel_shuffle(t, 2), (2, 8, 2, 3)),
    "SpaceToDepth CRD": (lambda: _single("SpaceToDepth", [2, 2, 4, 6], opset=28, blocksize=2, mode="CRD"),
                         lambda t: F_.pixel_unshuffle(t, 2), (2, 2, 4, 6)),
    "GatherND": (lambda: _single("GatherND", [3, 4, 2], inputs=[np.array([[[2, 1]], [[-1, 0]]], np.int64)]),
                 lambda t: t[torch.tensor([[2], [-1]]), torch.tensor([[1], [0]])], (3, 4, 2)),
    "CumProd exclusive reverse": (
        lambda: _single("CumProd", [3, 4], opset=26, inputs=[np.array(1, np.int64)], exclusive=1, reverse=1),
        lambda t: torch.cat([torch.ones(3, 1, dtype=t.dtype), t.flip(1)[:, :-1]], 1).cumprod(1).flip(1),
        (3, 4)),
    "Asinh": (lambda: _single("Asinh", [5]), torch.asinh, (5,)),
    "Atanh": (lambda: _single("Atanh", [5]), torch.atanh, (5,)),
    "Acosh": (lambda: _single("Acosh", [5]), lambda t: torch.acosh(t.abs() + 1.5), (5,)),
    "Swish": (lambda: _single("Swish", [5], opset=24, alpha=0.5), lambda t: t * torch.sigmoid(0.5 * t), (5,)),
    "Det": (lambda: _single("Det", [2, 3, 3]), torch.linalg.det, (2, 3, 3)),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_composed_importers_match_torch(name):
    make, reference, shape = _CASES[name]
    x = np.random.default_rng(5).uniform(-0.9, 0.9, shape)
    if name == "Acosh":  # its domain: x >= 1
        x = np.abs(x) + 1.5
    (y,), grads = run(make(), {"x": x}, wrt=("x",))
    t = torch.tensor(x if name != "Acosh" else x - 1.5, requires_grad=True)
    want = reference(t)
    want.sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(grads["x"], t.grad.numpy(), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_recurrent_layers_exported_by_torch_import_with_gradients(cell, bidirectional, tmp_path):
    torch.manual_seed(0)
    layer = getattr(torch.nn, cell)(4, 5, num_layers=2, bidirectional=bidirectional).double()
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    torch.onnx.export(layer, (x,), tmp_path / "m.onnx", dynamo=False, input_names=["x"])
    module = of.onnx.load_module(str(tmp_path / "m.onnx"))
    got = module(of.tensor(x.numpy()))
    got = got if not isinstance(got, dict) else next(iter(got.values()))
    want = layer(x)[0]
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-12)
    got.sum().backward()
    want.sum().backward()
    ours = dict(module.named_parameters())
    # the exporter renames the weights and reorders their gate blocks (ONNX's order): the gradient of layer 0's
    # input weights, directions stacked, holds torch's values, in another order
    onnx_w = next(p for p in ours.values() if p.shape[-1] == 4 and p.shape[0] == (2 if bidirectional else 1))
    want_grads = [layer.weight_ih_l0.grad, *([layer.weight_ih_l0_reverse.grad] if bidirectional else [])]
    np.testing.assert_allclose(np.sort(onnx_w.grad.numpy().reshape(-1)),
                               np.sort(torch.cat(want_grads).numpy().reshape(-1)), rtol=1e-9, atol=1e-12)


# -- narrow integer types ------------------------------------------------------------------------------------------

def _backend_and_onnxruntime(model, feeds):
    from opforge.onnx.backend import OpforgeBackend

    ours = OpforgeBackend.prepare(model).run(feeds)
    return ours, onnxruntime_outputs(model, feeds)


@pytest.mark.parametrize("elem, dtype", [(TensorProto.UINT8, np.uint8), (TensorProto.INT8, np.int8),
                                         (TensorProto.UINT16, np.uint16), (TensorProto.INT16, np.int16),
                                         (TensorProto.UINT32, np.uint32)])
def test_narrow_integers_wrap_after_each_op_as_onnxruntime(elem, dtype):
    # (x + y) // 2 and (x - y) * 3: each result wraps in the type before the next op reads it (uint8: 250 + 10
    # is 4, halved 2, where int64 arithmetic would give 130)
    info = np.iinfo(dtype)
    x = np.array([info.max - 5, info.min, 7, info.max], dtype)
    y = np.array([10, 3, 2, info.max], dtype)
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Div", ["s", "two"], ["half"]),
             helper.make_node("Sub", ["x", "y"], ["d"]), helper.make_node("Mul", ["d", "three"], ["m"]),
             helper.make_node("Cast", ["half"], ["f"], to=TensorProto.FLOAT)]
    consts = [onnx.numpy_helper.from_array(np.array(2, dtype), "two"),
              onnx.numpy_helper.from_array(np.array(3, dtype), "three")]
    graph = helper.make_graph(nodes, "g", [info_of("x", elem), info_of("y", elem)],
                              [info_of("half", elem), info_of("m", elem), info_of("f", TensorProto.FLOAT)],
                              initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ours, theirs = _backend_and_onnxruntime(model, {"x": x, "y": y})
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def info_of(name, elem):
    return helper.make_tensor_value_info(name, elem, [4])


# -- low-precision types: 4- and 2-bit integers, float8 and float4 ---------------------------------------------------

_EVERY_HALF = np.frombuffer(np.arange(1 << 16, dtype=np.uint16).tobytes(), np.float16)  # each float16, NaNs and infs


_FLOAT8 = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
           TensorProto.FLOAT4E2M1]
_SMALL_INTS = [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2]


@pytest.mark.parametrize("to, saturate", [(t, s) for t in _FLOAT8 for s in (0, 1)] + [(t, None) for t in _SMALL_INTS])
def test_casts_to_low_precision_types_match_onnx_reference(to, saturate):
    # every float16 value (and float32 ones past float16's range and below its subnormals), cast to the type, then
    # to float32 and back: opforge holds the type in a wider one and rounds as ONNX's reference does (ml_dtypes)
    from onnx.reference import ReferenceEvaluator

    x = np.concatenate([_EVERY_HALF.astype(np.float32), np.float32([1e9, -1e9, 3e-10, -3e-10, 448.5, -57400.0])])
    if to in _SMALL_INTS:  # (integers that wrap: ONNX leaves a cast of a fraction or a NaN to these open)
        x = np.round(x[np.isfinite(x) & (np.abs(x) < 100)])
    attrs = {} if saturate is None else {"saturate": saturate}
    nodes = [helper.make_node("Cast", ["x"], ["low"], to=to, **attrs),
             helper.make_node("Cast", ["low"], ["y"], to=TensorProto.FLOAT)]
    model = model_of(nodes, [info("x", [len(x)], TensorProto.FLOAT)],
                     [info("low", [len(x)], to), info("y", [len(x)], TensorProto.FLOAT)], opset=25)
    from opforge.onnx.backend import OpforgeBackend

    low, y = OpforgeBackend.prepare(model).run([x])
    want_low, want_y = ReferenceEvaluator(model).run(None, {"x": x})
    assert low.dtype == want_low.dtype
    np.testing.assert_array_equal(low.astype(np.float32), want_low.astype(np.float32))  # (NaN equals NaN here)
    np.testing.assert_array_equal(y, want_y)
    number = ~np.isnan(want_y)  # (and -0 is -0 but in the "fnuz" types; a NaN's sign means nothing)
    np.testing.assert_array_equal(np.signbit(y[number]), np.signbit(want_y[number]))


def test_float8_quantize_and_int4_dequantize_match_onnx_reference():
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 8)) * 300).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z8"], ["q8"], saturate=1),
             helper.make_node("DequantizeLinear", ["q8", "s", "z8"], ["d8"]),
             helper.make_node("QuantizeLinear", ["x", "s4", "z4"], ["q4"], axis=1),
             helper.make_node("DequantizeLinear", ["q4", "s4", "z4"], ["d4"], axis=1)]
    inits = [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             helper.make_tensor("z8", TensorProto.FLOAT8E4M3FN, [], [0.0]),
             onnx.numpy_helper.from_array(rng.uniform(20, 90, 8).astype(np.float32), "s4"),
             helper.make_tensor("z4", TensorProto.INT4, [8], [0, 1, -1, 2, 0, 0, 3, -8])]
    graph = helper.make_graph(nodes, "g", [info("x", [3, 8], TensorProto.FLOAT)],
                              [info("q8", [3, 8], TensorProto.FLOAT8E4M3FN), info("d8", [3, 8], TensorProto.FLOAT),
                               info("q4", [3, 8], TensorProto.INT4), info("d4", [3, 8], TensorProto.FLOAT)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    from opforge.onnx.backend import OpforgeBackend

    ours = OpforgeBackend.prepare(model).run([x])
    for got, want in zip(ours, ReferenceEvaluator(model).run(None, {"x": x})):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_a_quantized_qdq_model_matches_onnxruntime():
    # QuantizeLinear/DequantizeLinear around a convolution, per-channel int8 weights (as quantization tools write)
    rng = np.random.default_rng(6)
    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    consts = {"w": w, "w_scale": rng.uniform(0.01, 0.05, 4).astype(np.float32), "w_zero": np.zeros(4, np.int8),
              "x_scale": np.array(0.02, np.float32), "x_zero": np.array(128, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zero"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["y", "x_scale", "x_zero"], ["yq"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("yq", TensorProto.UINT8, [1, 4, 5, 5])],
                              initializer=[onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = rng.uniform(-2, 2, (1, 3, 5, 5)).astype(np.float32)
    (ours,), (theirs,) = _backend_and_onnxruntime(model, {"x": x})
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_of_uint8_matches_onnxruntime(direction):
    x = np.array([1, 200, 255, 16, 7], np.uint8)
    y = np.array([1, 2, 7, 3, 0], np.uint8)
    graph = helper.make_graph([helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)], "g",
                              [helper.make_tensor_value_info(k, TensorProto.UINT8, [5]) for k in "xy"],
                              [helper.make_tensor_value_info("z", TensorProto.UINT8, [5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (ours,), (theirs,) = _backend_and_onnxruntime(model, {"x": x, "y": y})
    np.testing.assert_array_equal(ours, theirs)
    assert ours.dtype == np.uint8


@pytest.mark.parametrize("op, torch_fn", [
    ("HannWindow", torch.hann_window), ("BlackmanWindow", torch.blackman_window),
    ("HammingWindow", lambda *a, **k: torch.hamming_window(*a, alpha=25 / 46, beta=21 / 46, **k)),  # ONNX's α, β
])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_torch(op, torch_fn, periodic):
    size = onnx.numpy_helper.from_array(np.array(10, np.int64), "size")
    graph = helper.make_graph([helper.make_node(op, ["size"], ["y"], periodic=periodic,
                                                output_datatype=TensorProto.DOUBLE)], "g", [],
                              [info("y", [10])], initializer=[size])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (y,), _ = run(model, {})
    np.testing.assert_allclose(y, torch_fn(10, periodic=bool(periodic), dtype=torch.float64).numpy(), atol=1e-12)


def test_causal_conv_with_state_matches_torch_with_gradients():
    rng = np.random.default_rng(7)
    x, w, past = (rng.normal(size=s).astype(np.float32) for s in ((2, 3, 6), (3, 1, 4), (2, 3, 3)))  # (float only)
    node = helper.make_node("CausalConvWithState", ["x", "w", "", "past"], ["y", "state"], activation="silu")
    f32 = TensorProto.FLOAT
    model = model_of([node], [info("x", [2, 3, 6], f32), info("w", [3, 1, 4], f32), info("past", [2, 3, 3], f32)],
                     [info("y", None, f32), info("state", None, f32)], opset=27)
    (y, state), grads = run(model, {"x": x, "w": w, "past": past}, wrt=("x", "w"))
    t = {k: torch.tensor(v, requires_grad=True) for k, v in {"x": x, "w": w, "past": past}.items()}
    want = F_.silu(F_.conv1d(torch.cat([t["past"], t["x"]], 2), t["w"], groups=3))
    want.sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, np.concatenate([past, x], 2)[:, :, -3:])
    for k in ("x", "w"):
        np.testing.assert_allclose(grads[k], t[k].grad.numpy(), rtol=1e-5, atol=1e-6)


def test_qlinear_matmul_and_matmul_integer_match_onnxruntime():
    rng = np.random.default_rng(8)
    a, b = rng.integers(0, 256, (3, 5)).astype(np.uint8), rng.integers(0, 256, (5, 4)).astype(np.uint8)
    consts = {"a_scale": np.array(0.03, np.float32), "a_zero": np.array(120, np.uint8),
              "b_scale": np.array(0.02, np.float32), "b_zero": np.array(130, np.uint8),
              "y_scale": np.array(0.5, np.float32), "y_zero": np.array(100, np.uint8)}
    nodes = [helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale",
                                                "y_zero"], ["y"]),
             helper.make_node("MatMulInteger", ["a", "b", "a_zero", "b_zero"], ["i"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 5]),
                                           helper.make_tensor_value_info("b", TensorProto.UINT8, [5, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [3, 4]),
                               helper.make_tensor_value_info("i", TensorProto.INT32, [3, 4])],
                              initializer=[onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    ours, theirs = _backend_and_onnxruntime(model, {"a": a, "b": b})
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_matches_torch_values_and_gradients(mode, padding, align):
    rng = np.random.default_rng(9)
    x, grid = rng.normal(size=(2, 3, 4, 5)), rng.uniform(-1.3, 1.3, (2, 3, 6, 2))
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    model = model_of([node], [info("x", [2, 3, 4, 5]), info("grid", [2, 3, 6, 2])], [info("y", None)], opset=22)
    (y,), grads = run(model, {"x": x, "grid": grid}, wrt=("x", "grid") if mode != "nearest" else ("x",))
    t = {k: torch.tensor(v, requires_grad=True) for k, v in {"x": x, "grid": grid}.items()}
    want = F_.grid_sample(t["x"], t["grid"], mode={"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode),
                          padding_mode=padding, align_corners=bool(align))
    want.sum().backward()
    if mode == "cubic" and padding == "border":
        # ONNX clamps a coordinate past the border before taking its taps, torch clamps the taps only: ONNX's
        # reference is the oracle of the values here, torch of the gradients where no coordinate is past it
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, {"x": x, "grid": grid})[0]  # (its coordinates in float32)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        return
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-9, atol=1e-12)
    for k in grads:
        np.testing.assert_allclose(grads[k], t[k].grad.numpy(), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_matches_torch_with_gradients(align):
    theta = np.random.default_rng(10).normal(size=(2, 2, 3))
    size = onnx.numpy_helper.from_array(np.array([2, 3, 4, 5], np.int64), "size")
    graph = helper.make_graph([helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)],
                              "g", [info("theta", [2, 2, 3])], [info("grid", None)], initializer=[size])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    (grid,), _ = run(model, {"theta": theta})
    t = torch.tensor(theta, requires_grad=True)
    want = F_.affine_grid(t, [2, 3, 4, 5], align_corners=bool(align))
    (want * torch.arange(want.numel(), dtype=t.dtype).reshape(want.shape)).sum().backward()
    np.testing.assert_allclose(grid, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    module = of.onnx.load_module(model)  # a weighted sum, so that each grid element's gradient counts
    th = of.tensor(theta, requires_grad=True)
    (module(th) * of.tensor(np.arange(want.numel(), dtype=np.float64).reshape(want.shape))).sum().backward()
    np.testing.assert_allclose(th.grad.numpy(), t.grad.numpy(), rtol=1e-10)


def test_col2im_with_pads_matches_torch_fold():
    x = np.random.default_rng(11).normal(size=(1, 2 * 2 * 3, 12))
    consts = [onnx.numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
              (("image", [4, 5]), ("block", [2, 3]))]
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], pads=[1, 0, 1, 1], strides=[2, 1])
    graph = helper.make_graph([node], "g", [info("x", [1, 12, 12])], [info("y", None)], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (y,), _ = run(model, {"x": x})
    padded = F_.fold(torch.tensor(x), (6, 6), (2, 3), stride=(2, 1))  # the image padded (1, 1) and (0, 1)
    np.testing.assert_allclose(y, padded[:, :, 1:5, 0:5].numpy(), rtol=1e-12)


def test_batchnorm_training_mode_matches_torch_and_onnx():
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(12)
    x = rng.normal(size=(4, 3, 5))
    stats = {"scale": rng.uniform(0.5, 2, 3), "bias": rng.normal(size=3), "mean": rng.normal(size=3),
             "var": rng.uniform(0.5, 2, 3)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"],
                            training_mode=1, momentum=0.75)
    model = model_of([node], [info("x", [4, 3, 5]), *(info(k, [3]) for k in stats)],
                     [info("y", None), info("rm", None), info("rv", None)], opset=15)
    feeds = {"x": x, **stats}
    (y, rm, rv), grads = run(model, feeds, wrt=("x", "scale"))
    t = {k: torch.tensor(v, requires_grad=k in ("x", "scale")) for k, v in feeds.items()}
    running_mean = t["mean"].clone()
    want = F_.batch_norm(t["x"], running_mean, t["var"].clone(), t["scale"], t["bias"], training=True,
                         momentum=0.25)
    want.sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rm, running_mean.numpy(), rtol=1e-12)
    for k in ("x", "scale"):
        np.testing.assert_allclose(grads[k], t[k].grad.numpy(), rtol=1e-8, atol=1e-10)
    # the running variance: ONNX's takes the batch's biased variance (torch's the unbiased one)
    np.testing.assert_allclose(rv, ReferenceEvaluator(model).run(None, feeds)[2], rtol=1e-12)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_match_onnxruntime(storage_order):
    x = np.random.default_rng(13).normal(size=(2, 3, 5, 6)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                            storage_order=storage_order)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 3, 3]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    ours, theirs = _backend_and_onnxruntime(model, {"x": x})
    for got, want in zip(ours, theirs):
        np.testing.assert_array_equal(got, want)


def test_maxpool_then_maxunpool_matches_torch_with_gradients():
    x = np.random.default_rng(14).normal(size=(2, 3, 4, 6))
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "g", [info("x", [2, 3, 4, 6])], [info("y", [2, 3, 4, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    (y,), grads = run(model, {"x": x}, wrt=("x",))
    t = torch.tensor(x, requires_grad=True)
    pooled, index = F_.max_pool2d(t, 2, 2, return_indices=True)
    want = F_.max_unpool2d(pooled, index, 2, 2)
    want.sum().backward()
    np.testing.assert_array_equal(y, want.detach().numpy())
    np.testing.assert_array_equal(grads["x"], t.grad.numpy())


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reducing_an_empty_group_gives_the_identity_as_onnxruntime(op):
    x = np.zeros((2, 0, 4), np.float32)
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 4])], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (ours,), (theirs,) = _backend_and_onnxruntime(model, {"x": x})
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("reduction", ["max", "min", "mul"])
def test_scatter_reductions_match_onnxruntime(reduction):
    # repeated (and negative) indices: each place reduces every update sent to it together with the data's value
    rng = np.random.default_rng(12)
    x = rng.normal(size=(4, 5))
    index = np.array([[0, 1, -1, 1, 3], [2, 2, 0, -4, 1]], np.int64)
    src = rng.normal(size=(2, 5))
    elements = model_of([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0, reduction=reduction)],
                        [info("x", [4, 5]), info("i", [2, 5], TensorProto.INT64), info("u", [2, 5])],
                        [info("y", [4, 5])], opset=18)
    feeds = {"x": x, "i": index, "u": src}
    (ours,), _ = run(elements, feeds)
    np.testing.assert_allclose(ours, onnxruntime_outputs(elements, feeds)[0], rtol=1e-12)
    rows = np.array([[1], [3], [1], [0]], np.int64)
    updates = rng.normal(size=(4, 5))
    nd = model_of([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
                  [info("x", [4, 5]), info("i", [4, 1], TensorProto.INT64), info("u", [4, 5])], [info("y", [4, 5])],
                  opset=18)
    feeds = {"x": x, "i": rows, "u": updates}
    (ours,), _ = run(nd, feeds)
    np.testing.assert_allclose(ours, onnxruntime_outputs(nd, feeds)[0], rtol=1e-12)


@pytest.mark.parametrize("sorted_, axis", [(1, None), (0, None), (0, 1), (1, -2)])
def test_unique_matches_onnxruntime(sorted_, axis):
    x = np.array([[3.0, 1.0, 3.0, 2.0], [0.5, 2.0, 0.5, 2.0], [3.0, 1.0, 3.0, 2.0]])
    attrs = {"sorted": sorted_} | ({} if axis is None else {"axis": axis})
    model = model_of([helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs)],
                     [info("x", [3, 4])], [info("y", None), *(info(k, None, TensorProto.INT64)
                                                              for k in ("first", "inverse", "counts"))], opset=11)
    ours, _ = run(model, {"x": x})
    for got, want in zip(ours, onnxruntime_outputs(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode, indices", [("linear", None), ("linear", [0, 3]), ("circular", [3, 5])])
def test_tensor_scatter_matches_onnxruntime(mode, indices):
    # a cache of 6 positions along axis 2, 3 new ones written at each batch item's index (wrapping when circular)
    rng = np.random.default_rng(14)
    feeds = {"cache": rng.normal(size=(2, 2, 6, 3)), "update": rng.normal(size=(2, 2, 3, 3))}
    inputs = [info("cache", [2, 2, 6, 3]), info("update", [2, 2, 3, 3])]
    if indices is not None:
        feeds["at"] = np.array(indices, np.int64)
        inputs.append(info("at", [2], TensorProto.INT64))
    node = helper.make_node("TensorScatter", list(feeds), ["y"], mode=mode, axis=2)
    model = model_of([node], inputs, [info("y", [2, 2, 6, 3])], opset=24)
    (ours,), _ = run(model, feeds)
    np.testing.assert_array_equal(ours, onnxruntime_outputs(model, feeds)[0])


# -- sequences and optionals -----------------------------------------------------------------------------------------

def _sequence_model():
    # x split into 4 rows, the last one erased, x's row 0 doubled inserted at the front, rows concatenated
    nodes = [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=0),
             helper.make_node("SequenceErase", ["seq"], ["shorter"]),
             helper.make_node("SequenceAt", ["seq", "zero"], ["first"]),
             helper.make_node("Add", ["first", "first"], ["twice"]),
             helper.make_node("SequenceInsert", ["shorter", "twice", "zero"], ["longer"]),
             helper.make_node("ConcatFromSequence", ["longer"], ["y"], axis=0),
             helper.make_node("SequenceLength", ["longer"], ["n"])]
    graph = helper.make_graph(nodes, "g", [info("x", [4, 3])], [info("y", [4, 3]), info("n", [], TensorProto.INT64)],
                              initializer=[onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_sequence_ops_match_onnxruntime_and_torch_gradients():
    x = np.random.default_rng(13).normal(size=(4, 3))
    model = _sequence_model()
    (y, length), grads = run(model, {"x": x}, wrt=("x",))
    want = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(y, want[0])
    assert length == want[1] == 4
    xt = torch.tensor(x, requires_grad=True)
    rows = list(torch.split(xt, 1, dim=0))[:-1]
    torch.cat([rows[0] + rows[0], *rows], dim=0).sum().backward()
    np.testing.assert_array_equal(grads["x"], xt.grad.numpy())


def test_a_sequence_input_is_bound_at_load_and_a_sequence_output_gives_one_output_each():
    seq_info = helper.make_tensor_sequence_value_info
    nodes = [helper.make_node("SequenceInsert", ["s", "x"], ["t"]), helper.make_node("Identity", ["t"], ["out"])]
    model = model_of(nodes, [seq_info("s", TensorProto.DOUBLE, None), info("x", [2])],
                     [seq_info("out", TensorProto.DOUBLE, None)], opset=18)
    with pytest.raises(of.onnx.OnnxImportError, match="graph input 's' is a sequence; opforge needs its value at "
                                                      "load: bind it"):
        of.onnx.load(model)
    program = of.onnx.load(model, bind={"s": [np.ones(3), np.zeros(1)]})
    out = of.Executor(program).run({"x": np.array([5.0, 6.0])})
    assert list(out) == ["out[0]", "out[1]", "out[2]"]
    np.testing.assert_array_equal(out["out[2]"], [5.0, 6.0])
    with pytest.raises(of.onnx.OnnxImportError, match=r"bound value for input 's' holds .*float32.* float64"):
        of.onnx.load(model, bind={"s": [np.ones(3, np.float32)]})
    from opforge.onnx.backend import OpforgeBackend

    at = onnx.numpy_helper.from_array(np.array(-1, np.int64), "at")  # (-1: before the last element)
    model.graph.initializer.append(at)
    model.graph.node[0].input.append("at")
    feeds = {"s": [np.ones(2), np.zeros(2)], "x": np.array([1.0, 2.0])}
    ours = OpforgeBackend.prepare(model).run(feeds)
    theirs = onnxruntime_outputs(model, feeds)
    assert len(ours[0]) == len(theirs[0]) == 3
    for got, want in zip(ours[0], theirs[0]):
        np.testing.assert_array_equal(got, want)


def test_an_empty_optional_read_is_refused_naming_the_node():
    nodes = [helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(TensorProto.DOUBLE, [2])),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    model = model_of(nodes, [], [info("has", [], TensorProto.BOOL), info("y", [2])], opset=18)
    with pytest.raises(of.onnx.OnnxImportError, match=r"\(OptionalGetElement, opset 18\): the optional 'o' is "
                                                      "empty"):
        of.onnx.load(model)
    model.graph.node.pop()
    model.graph.output.pop()
    (has,), _ = run(model, {})
    assert has.dtype == np.bool_ and not has


# -- control flow: inlined at load ---------------------------------------------------------------------------------

def _loop_model():
    # y <- y * x + i for i in 0..3 (the trip count an initializer), each iteration's y also a scan output
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.DOUBLE),
         helper.make_node("Mul", ["y_in", "x"], ["yx"]), helper.make_node("Add", ["yx", "i_f"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"])], "body",
        [info("i", [], TensorProto.INT64), info("cond_in", [], TensorProto.BOOL), info("y_in", [3])],
        [info("cond_out", [], TensorProto.BOOL), info("y_out", [3]), info("scan", [3])])
    node = helper.make_node("Loop", ["trips", "", "y0"], ["y", "ys"], body=body)
    graph = helper.make_graph([node], "g", [info("x", [3]), info("y0", [3])], [info("y", [3]), info("ys", [4, 3])],
                              initializer=[onnx.numpy_helper.from_array(np.array(4, np.int64), "trips")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


def _scan_model():
    # s <- tanh(s + x[:, t]) over t = 4..0 (axis 1, reversed); each step's s stacked along axis 0
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["a"]),
                              helper.make_node("Tanh", ["a"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["step"])], "body",
                             [info("s_in", [2, 3]), info("x_t", [2, 3])],
                             [info("s_out", [2, 3]), info("step", [2, 3])])
    node = helper.make_node("Scan", ["s0", "x"], ["s", "steps"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1])
    return model_of([node], [info("s0", [2, 3]), info("x", [2, 5, 3])], [info("s", [2, 3]), info("steps", [5, 2, 3])],
                    opset=16)


def test_loop_is_unrolled_matching_onnxruntime_and_torch_gradients():
    rng = np.random.default_rng(8)
    feeds = {"x": rng.uniform(0.5, 1.5, 3), "y0": rng.normal(size=3)}
    model = _loop_model()
    (y, ys), grads = run(model, feeds, wrt=("x", "y0"))
    want = onnxruntime_outputs(model, feeds)
    np.testing.assert_allclose(y, want[0], rtol=1e-12)
    np.testing.assert_allclose(ys, want[1], rtol=1e-12)
    x, yt = (torch.tensor(feeds[k], requires_grad=True) for k in ("x", "y0"))
    out = yt
    for i in range(4):
        out = out * x + i
    out.sum().backward()
    np.testing.assert_allclose(grads["x"], x.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads["y0"], yt.grad.numpy(), rtol=1e-12)


def test_scan_is_unrolled_matching_onnxruntime_and_torch_gradients():
    rng = np.random.default_rng(9)
    feeds = {"s0": rng.normal(size=(2, 3)), "x": rng.normal(size=(2, 5, 3))}
    model = _scan_model()
    (s, steps), grads = run(model, feeds, wrt=("x", "s0"))
    want = onnxruntime_outputs(model, feeds)
    np.testing.assert_allclose(s, want[0], rtol=1e-12)
    np.testing.assert_allclose(steps, want[1], rtol=1e-12)
    st, xt = (torch.tensor(feeds[k], requires_grad=True) for k in ("s0", "x"))
    out = st
    for t in reversed(range(5)):
        out = torch.tanh(out + xt[:, t])
    out.sum().backward()
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads["s0"], st.grad.numpy(), rtol=1e-12)


def _if_model(else_shape=(3,)):
    then = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"])], "then", [], [info("t", [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e0"]),
                               helper.make_node("Expand", ["e0", "shape"], ["e"])], "else", [], [info("e", None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [info("c", [], TensorProto.BOOL), info("x", [3])], [info("y", None)],
                              initializer=[onnx.numpy_helper.from_array(np.array(else_shape, np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_a_condition_fed_at_run_time_matches_onnxruntime(cond):
    # the condition a feed: both branches are imported, the output chosen by where (the backend would bind it)
    x = np.array([1.5, -2.0, 3.0])
    feeds = {"c": np.array(cond), "x": x}
    program = of.onnx.load(_if_model())
    (y,) = of.Executor(program).run(feeds).values()
    np.testing.assert_array_equal(y, onnxruntime_outputs(_if_model(), feeds)[0])
    (bound,) = of.Executor(of.onnx.load(_if_model(), bind={"c": np.array(cond)})).run({"x": x}).values()
    np.testing.assert_array_equal(bound, y)


def test_control_flow_that_cannot_be_inlined_is_refused_naming_the_node():
    with pytest.raises(of.onnx.OnnxImportError, match=r"\(If, opset 16\): a condition known only at run time whose "
                                                      r"branches give output 0 of other shapes"):
        of.onnx.load(_if_model(else_shape=(2, 3)))
    model = _loop_model()
    model.graph.ClearField("initializer")
    model.graph.input.append(info("trips", [], TensorProto.INT64))
    with pytest.raises(of.onnx.OnnxImportError, match=r"\(Loop, opset 16\): input M \(the loop is unrolled at load\) "
                                                      r"\('trips'\) is computed or fed at run time"):
        of.onnx.load(model)
    bound = of.onnx.load(model, bind={"trips": np.array(2, np.int64)})  # (bound: unrolled twice)
    out = of.Executor(bound).run({"x": np.full(3, 2.0), "y0": np.ones(3)})
    np.testing.assert_array_equal(out["y"], [5.0, 5.0, 5.0])  # (1·2 + 0)·2 + 1
    with pytest.raises(of.onnx.OnnxImportError, match="loops and scans unrolled at load past 4096 iterations"):
        of.onnx.load(model, bind={"trips": np.array(5000, np.int64)})


def test_a_trip_count_computed_from_a_huge_constant_is_not_computed_at_load():
    # ReduceSum(Expand(1, [2**31])): the count is not computed at load (it would allocate 2**31 values first)
    model = _loop_model()
    model.graph.ClearField("initializer")
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array([1 << 31], np.int64), "big"),
                                    onnx.numpy_helper.from_array(np.array([1], np.int64), "one")])
    model.graph.node.insert(0, helper.make_node("Expand", ["one", "big"], ["ones"]))
    model.graph.node.insert(1, helper.make_node("ReduceSum", ["ones"], ["trips"], keepdims=0))
    with pytest.raises(of.onnx.OnnxImportError, match=r"input M .* is computed or fed at run time"):
        of.onnx.load(model)


def test_subgraphs_nested_past_the_limit_are_refused():
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [], [info("z", [2])])
    body = leaf
    for k in range(20):
        body = helper.make_graph([helper.make_node("If", ["c"], [f"z{k}"], then_branch=body, else_branch=leaf)],
                                 f"b{k}", [], [info(f"z{k}", [2])])
    m = model_of([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=leaf)],
                 [info("c", [], TensorProto.BOOL), info("x", [2])], [info("y", [2])])
    with pytest.raises(of.onnx.OnnxImportError, match="subgraphs nested more than 16 deep are not supported"):
        of.onnx.load(m)


@pytest.mark.parametrize("mels, dft, rate, low, high", [(8, 16, 8192, 0.0, 4096.0), (5, 64, 16000, 100.0, 7000.0)])
def test_mel_weight_matrix_matches_onnx_reference(mels, dft, rate, low, high):
    from onnx.reference import ReferenceEvaluator

    values = {"m": np.array(mels, np.int64), "d": np.array(dft, np.int64), "r": np.array(rate, np.int64),
              "lo": np.array(low, np.float32), "hi": np.array(high, np.float32)}
    graph = helper.make_graph([helper.make_node("MelWeightMatrix", list(values), ["y"])], "g", [],
                              [info("y", None, TensorProto.FLOAT)],
                              initializer=[onnx.numpy_helper.from_array(v, k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (y,), _ = run(model, {})
    np.testing.assert_allclose(y, ReferenceEvaluator(model).run(None, {})[0], rtol=1e-6)


def test_lstm_over_a_sequence_length_known_at_run_time():
    # lstm_layer needs no static length: the program runs any sequence length (the unrolled cells need one)
    rng = np.random.default_rng(15)
    w, r = rng.normal(size=(1, 16, 3)).astype(np.float32), rng.normal(size=(1, 16, 4)).astype(np.float32)
    node = helper.make_node("LSTM", ["x", "w", "r"], ["y", "h"], hidden_size=4)
    f32 = TensorProto.FLOAT  # (ONNX Runtime's LSTM takes float32 only)
    graph = helper.make_graph([node], "g", [info("x", ["t", 2, 3], f32)], [info("y", None, f32), info("h", None, f32)],
                              initializer=[onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(r, "r")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    exe = of.Executor(of.onnx.load(model))
    for steps in (2, 5):
        x = rng.normal(size=(steps, 2, 3)).astype(np.float32)
        got = exe.run({"x": x})
        for name, want in zip(("y", "h"), onnxruntime_outputs(model, {"x": x})):
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
