"""Never silently different from PyTorch (issue 27): a call written as PyTorch writes it means what it means there,
or fails naming the difference. PyTorch is the oracle; docs/pytorch.md lists what was checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F


def same(ours, theirs, rtol=1e-6):
    """Equal values and dtypes (a torch dtype compares by name)."""
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
    ours = ours.numpy() if isinstance(ours, of.Tensor) else np.asarray(ours)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_allclose(ours, theirs, rtol=rtol)


# -- transpose swaps two dims ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, dims", [((2, 3), (0, 1)), ((2, 3), (1, 0)), ((2, 3, 4), (0, 1)),
                                         ((2, 3, 4), (-1, 0)), ((2, 3, 4, 5), (1, 3)), ((3,), (0, 0))])
def test_transpose_swaps_two_dims_as_torch(shape, dims):
    array = np.random.default_rng(0).standard_normal(shape)
    x = of.tensor(array, requires_grad=True)
    t = torch.tensor(array, requires_grad=True)
    y, u = x.transpose(*dims), t.transpose(*dims)
    same(y, u)
    same(x.transpose(dim0=dims[0], dim1=dims[1]), t.transpose(dim0=dims[0], dim1=dims[1]))
    weights = np.random.default_rng(1).standard_normal(u.shape)
    (y * of.tensor(weights)).sum().backward()
    (u * torch.tensor(weights)).sum().backward()
    same(x.grad, t.grad)


def test_transpose_keeps_numpys_forms_that_torch_lacks_and_refuses_the_rest():
    x = of.randn(2, 3, 4)
    assert x.transpose().shape == (4, 3, 2)  # no argument: reversed (NumPy, and .T)
    assert x.transpose((2, 0, 1)).shape == (4, 2, 3)  # one tuple of all axes: NumPy's permutation
    same(x.permute(2, 0, 1), torch.tensor(x.numpy()).permute(2, 0, 1))
    same(x.permute((2, 0, 1)), torch.tensor(x.numpy()).permute((2, 0, 1)))
    with pytest.raises(of.ArgumentError, match=r"transpose\(\): takes two dims to swap.*permute"):
        x.transpose(2, 0, 1)
    with pytest.raises(of.ShapeError, match=r"transpose\(\): dim 3 is out of range for a tensor of rank 3"):
        x.transpose(0, 3)


# -- max(dim) and min(dim) give (values, indices) ----------------------------------------------------------------

_TIES = np.array([[1.0, 3.0, 3.0, -2.0], [np.nan, 0.5, np.nan, 7.0], [4.0, 4.0, 4.0, 4.0]])


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, False), (-1, True), (0, True)])
def test_max_and_min_along_a_dim_give_values_and_indices_as_torch(name, dim, keepdim):
    x = of.tensor(_TIES, requires_grad=True)
    t = torch.tensor(_TIES, requires_grad=True)
    ours, theirs = getattr(x, name)(dim, keepdim), getattr(t, name)(dim, keepdim)
    same(ours.values, theirs.values)
    same(ours.indices, theirs.indices)
    same(ours[1], theirs[1])  # output.max(1)[1]: the indices, by position too
    values, indices = getattr(x, name)(dim=dim, keepdim=keepdim)  # unpacks as torch's
    same(values, theirs.values)
    same(indices, theirs.indices)
    weights = np.arange(1.0, 1.0 + theirs.values.numel()).reshape(theirs.values.shape)
    (ours.values * of.tensor(weights)).sum().backward()  # the gradient goes to the chosen index only
    (theirs.values * torch.tensor(weights)).sum().backward()
    same(x.grad, t.grad)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_other_forms_as_torch(name):
    x, t = of.tensor(_TIES, requires_grad=True), torch.tensor(_TIES, requires_grad=True)
    same(getattr(x, name)(), getattr(t, name)())  # no dim: the value, a 0-d tensor
    finite = np.nan_to_num(_TIES)
    x, t = of.tensor(finite, requires_grad=True), torch.tensor(finite, requires_grad=True)
    getattr(x, name)().backward()
    getattr(t, name)().backward()
    same(x.grad, t.grad)  # ties share the gradient evenly
    other = np.full(4, 2.0)
    same(getattr(x, name)(of.tensor(other)), getattr(t, name)(torch.tensor(other)))  # elementwise
    ints = np.array([[3, 1], [2, 9]])
    same(getattr(of.tensor(ints), name)(1).indices, getattr(torch.tensor(ints), name)(1).indices)
    zero_d = getattr(of.tensor(2.5), name)(0)
    same(zero_d.values, getattr(torch.tensor(2.5), name)(0).values)
    same(zero_d.indices, getattr(torch.tensor(2.5), name)(0).indices)
    same(getattr(x, "a" + name)(axis=(0, 1)), getattr(t, "a" + name)(dim=(0, 1)))
    with pytest.raises(of.ArgumentError, match=rf"{name}\(\): dim must be one int.*a{name}"):
        getattr(x, name)((0, 1))


def test_sort_and_topk_give_named_values_and_indices_as_torch():
    x, t = of.tensor(_TIES), torch.tensor(_TIES)
    distinct = np.random.default_rng(0).standard_normal((3, 5))  # torch leaves the order of topk's ties open
    for ours, theirs in ((F.sort(x, axis=1), t.sort(dim=1, stable=True)),
                         (F.sort(x, axis=0, descending=True), t.sort(dim=0, descending=True, stable=True)),
                         (F.topk(of.tensor(distinct), k=2), torch.tensor(distinct).topk(2))):
        same(ours.values, theirs.values)
        same(ours.indices, theirs.indices)


# -- F.dropout returns a Tensor ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, shape", [("dropout", (40, 50)), ("dropout1d", (8, 30, 5)),
                                         ("dropout2d", (8, 30, 2, 2)), ("dropout3d", (8, 30, 2, 1, 2))])
def test_functional_dropouts_return_a_tensor_as_torch(name, shape):
    array = np.random.default_rng(0).uniform(1, 2, shape)
    x = of.tensor(array, requires_grad=True)
    of.manual_seed(0)
    y = getattr(F, name)(x, 0.3)  # torch's positional form: (input, p, training=True)
    u = getattr(torch.nn.functional, name)(torch.tensor(array), 0.3)
    assert type(y) is of.Tensor and type(u) is torch.Tensor and y.shape == tuple(u.shape) and y.dtype == x.dtype
    kept = y.numpy() != 0
    assert abs(kept.mean() - 0.7) < 0.1
    np.testing.assert_allclose(y.numpy()[kept], array[kept] / 0.7)
    y.sum().backward()  # backward uses the forward's draw
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 1 / 0.7, 0.0))
    same(getattr(F, name)(of.tensor(array), 0.3, False), getattr(torch.nn.functional, name)(torch.tensor(array), 0.3,
                                                                                              False))
    z = of.tensor(array)
    assert getattr(F, name)(z, p=0.5, inplace=True) is z and (z.numpy() == 0).any()  # written into z, as torch


def test_dropout_layers_and_compiled_dropout_give_tensors():
    x = of.randn(4, 6, 3, 3)
    for layer in (of.nn.Dropout(0.5), of.nn.Dropout2d(0.5), of.nn.Dropout(0.5, inplace=True)):
        assert type(layer(of.randn(4, 6, 3, 3))) is of.Tensor
        assert layer.eval()(x) is x
    step = of.compile(lambda t: F.dropout(t, 0.5) * 2)
    assert type(step(x)) is of.Tensor and step(x).shape == x.shape
