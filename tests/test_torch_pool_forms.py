"""torch's call forms of max pooling with indices and of adaptive pooling to sizes with None, against torch:
``F.max_pool{1,2,3}d(..., return_indices=True)`` (values, indices and gradients; ceil_mode, padding, dilation),
``nn.MaxPool{nd}d`` and ``F.max_unpool{nd}d`` on what they give, eager and compiled; ``F.adaptive_avg_pool{nd}d`` and
``F.adaptive_max_pool{nd}d`` with None in ``output_size``, and the errors of a wrong ``output_size``."""

import re

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F

TF = torch.nn.functional


def distinct(rng, *shape):
    """float64 values all different (no tie in any window: indices and gradients are well defined)."""
    size = int(np.prod(shape))
    return rng.permutation(size).reshape(shape) / size - 0.5


# (spatial shape, kernel_size, stride, padding, dilation, ceil_mode)
POOLS = [
    ((9,), 3, None, 0, 1, False),
    ((10,), 3, 2, 1, 2, True),
    ((7, 6), 2, None, 0, 1, False),
    ((7, 8), (3, 2), (2, 1), (1, 0), (1, 2), True),
    ((5, 5), 3, 2, 1, 1, True),
    ((4, 5, 6), 2, None, 0, 1, False),
    ((5, 4, 6), (2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), True),
]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize(("spatial", "kernel", "stride", "padding", "dilation", "ceil"), POOLS)
def test_max_pool_return_indices_as_torch(spatial, kernel, stride, padding, dilation, ceil, batched):
    nd = len(spatial)
    x = distinct(np.random.default_rng(nd), *((2, 3) if batched else (3,)), *spatial)
    tx, ox = torch.tensor(x, requires_grad=True), of.tensor(x, requires_grad=True)
    theirs = getattr(TF, f"max_pool{nd}d")(tx, kernel, stride, padding, dilation, ceil, True)
    dy = np.random.default_rng(7).standard_normal(tuple(theirs[0].shape))
    ours = getattr(F, f"max_pool{nd}d")(ox, kernel, stride, padding, dilation, ceil, True)  # positional, as torch
    by_name = getattr(F, f"max_pool{nd}d")(of.tensor(x), kernel, stride, padding, dilation, ceil_mode=ceil,
                                           return_indices=True)
    for got in (ours, by_name):
        assert len(got) == 2
        np.testing.assert_array_equal(got[0].numpy(), theirs[0].detach().numpy())
        np.testing.assert_array_equal(got[1].numpy(), theirs[1].numpy())
        assert got[1].dtype == of.int64
    (want,) = torch.autograd.grad(theirs[0], tx, torch.tensor(dy))
    (got,) = of.grad(ours[0], [ox], grad_outputs=of.tensor(dy))
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    values = getattr(F, f"max_pool{nd}d")(of.tensor(x), kernel, stride, padding, dilation, ceil)  # values only
    np.testing.assert_array_equal(values.numpy(), theirs[0].detach().numpy())
    compiled = of.compile(lambda t: getattr(F, f"max_pool{nd}d")(t, kernel, stride, padding, dilation, ceil,
                                                                 return_indices=True))(of.tensor(x))
    for g, w in zip(compiled, theirs):
        np.testing.assert_array_equal(g.numpy(), w.detach().numpy())


def test_max_pool_with_indices_gradient_numerically():
    x = of.tensor(distinct(np.random.default_rng(0), 1, 2, 5, 6), requires_grad=True)
    of.testing.gradcheck(lambda t: F.max_pool2d(t, 3, 2, 1, 1, True, True)[0], [x])


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_unpool_of_max_pool_with_indices_as_torch(nd):
    x = distinct(np.random.default_rng(nd), 2, 3, *(6,) * nd)
    want = getattr(TF, f"max_unpool{nd}d")(*getattr(TF, f"max_pool{nd}d")(torch.tensor(x), 2, return_indices=True), 2)
    got = getattr(F, f"max_unpool{nd}d")(*getattr(F, f"max_pool{nd}d")(of.tensor(x), 2, return_indices=True), 2)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    pool, unpool = getattr(nn, f"MaxPool{nd}d")(2, return_indices=True), getattr(nn, f"MaxUnpool{nd}d")(2)
    np.testing.assert_array_equal(unpool(*pool(of.tensor(x))).numpy(), want.numpy())


def test_max_pool_indices_export_to_onnx():
    onnxruntime = pytest.importorskip("onnxruntime")
    x = distinct(np.random.default_rng(3), 1, 2, 6, 7).astype(np.float32)

    def pool(x):
        y, i = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        return {"y": y, "i": i}

    proto = of.onnx.export(pool, inputs=of.Spec(x.shape, "float32"))
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    y, i = TF.max_pool2d(torch.tensor(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(got["y"], y.numpy())
    np.testing.assert_array_equal(got["i"], i.numpy())


# -- adaptive pooling: None in output_size ---------------------------------------------------------------------------

ADAPTIVE = [  # (torch takes None in the sizes of 2-D and 3-D pooling only)
    ((2, 3, 7, 5), (None, 3)),
    ((2, 3, 7, 5), [4, None]),
    ((3, 7, 5), (None, None)),  # unbatched
    ((1, 2, 4, 3, 7), (None, 2, None)),
    ((2, 4, 3, 5), (2, None, 3)),  # unbatched 3-d
]


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize(("shape", "size"), ADAPTIVE)
def test_adaptive_pool_none_keeps_the_dim_as_torch(kind, shape, size):
    nd = len(size)
    x = distinct(np.random.default_rng(len(shape)), *shape)
    name = f"adaptive_{kind}_pool{nd}d"
    tx, ox = torch.tensor(x, requires_grad=True), of.tensor(x, requires_grad=True)
    want, got = getattr(TF, name)(tx, size), getattr(F, name)(ox, size)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-15)
    dy = np.random.default_rng(1).standard_normal(tuple(want.shape))
    (wg,) = torch.autograd.grad(want, tx, torch.tensor(dy))
    (gg,) = of.grad(got, [ox], grad_outputs=of.tensor(dy))
    np.testing.assert_allclose(gg.numpy(), wg.numpy(), rtol=1e-12, atol=1e-15)
    layer = getattr(nn, f"Adaptive{kind.capitalize()}Pool{nd}d")(size)
    np.testing.assert_allclose(layer(of.tensor(x)).numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-15)
    compiled = of.compile(lambda t: getattr(F, name)(t, size))(of.tensor(x))
    np.testing.assert_allclose(compiled.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize(("size", "message"), [
    ([1, 2, 3], r"argument 'output_size' must be an int or 2 ints \(None: keep the input's size\), got \[1, 2, 3\]"),
    ("2", r"argument 'output_size' must be an int or 2 ints .*got '2'"),
    ((2.5, 2), r"argument 'output_size' must be an int or 2 ints .*got \(2.5, 2\)"),
    ((True, 2), r"argument 'output_size' must be an int or 2 ints .*got \(True, 2\)"),
])
def test_adaptive_pool_bad_output_size_names_the_function(kind, size, message):
    with pytest.raises(of.ShapeError, match=rf"adaptive_{kind}_pool2d\(\): {message}"):
        getattr(F, f"adaptive_{kind}_pool2d")(of.tensor(np.ones((1, 2, 4, 4))), size)


@pytest.mark.parametrize("kind", ["avg", "max"])
@pytest.mark.parametrize(("nd", "size"), [(1, None), (1, (None,)), (1, [None]), (2, None), (3, None)])
def test_adaptive_pool_refuses_the_nones_torch_refuses(kind, nd, size):
    """torch refuses output_size None alone and a None in 1-D pooling's size: so do the functions and the layers."""
    x = of.tensor(np.ones((1, 2, *(4,) * nd)))
    keep = r" \(None: keep the input's size\)" if nd > 1 else ""
    with pytest.raises(of.ShapeError, match=rf"adaptive_{kind}_pool{nd}d\(\): argument 'output_size' must be an int "
                                            rf"or {nd} ints{keep}, got {re.escape(repr(size))}"):
        getattr(F, f"adaptive_{kind}_pool{nd}d")(x, size)
    layer = getattr(nn, f"Adaptive{kind.capitalize()}Pool{nd}d")
    with pytest.raises(of.ArgumentError, match=rf"Adaptive{kind.capitalize()}Pool{nd}d\(\): argument 'output_size'"):
        layer(size)
    with pytest.raises(Exception):  # noqa: B017 -- torch's own error, of whatever type it raises
        getattr(TF, f"adaptive_{kind}_pool{nd}d")(torch.ones(1, 2, *(4,) * nd), size)


def test_adaptive_pool_none_over_a_size_known_only_at_run_time_is_refused():
    with pytest.raises(of.ShapeError, match=r"adaptive_avg_pool2d\(\): output_size \(None, 2\) keeps a spatial dim "
                                            r"whose size is known only at run time"):
        of.trace(lambda x: F.adaptive_avg_pool2d(x, (None, 2)), x=of.Spec((1, 2, None, 4), "float64"))


@pytest.mark.parametrize("called, call", [
    ("max_pool2d", lambda: F.max_pool2d(of.randn(3), 2)),
    ("max_pool2d", lambda: F.max_pool2d(of.randn(1, 3, 4, 4), 2, stride=-1, return_indices=True)),
    ("max_pool1d", lambda: F.max_pool1d(of.randn(2, 3, 4, 5), 2)),
    ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(of.randn(3), 2)),
    ("adaptive_max_pool1d", lambda: F.adaptive_max_pool1d(of.randn(3), 2, return_indices=True)),
    ("dropout", lambda: F.dropout(of.randn(2, 3), p=2.0)),
    ("dropout2d", lambda: F.dropout2d(of.randn(3), p=0.5)),
    ("batch_norm", lambda: F.batch_norm(of.randn(2, 3), of.zeros(4), of.ones(4))),
    ("instance_norm", lambda: F.instance_norm(of.randn(3))),
    ("scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(of.randn(2, 3), of.randn(2, 4),
                                                                             of.randn(2, 3))),
])
def test_a_torch_functions_errors_name_the_function_called_not_its_op(called, call):
    """torch's F.max_pool2d is the op max_pool2d_values (or _with_indices) here, F.dropout the op dropout_with_mask,
    F.batch_norm batch_norm_with_stats...: their errors said "max_pool2d_values(): ...", a name the user never
    wrote."""
    with pytest.raises(of.OpforgeError) as e:
        call()
    assert str(e.value).startswith(f"{called}(): "), str(e.value)
