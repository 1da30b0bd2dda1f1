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
