"""Never silently different from PyTorch (issue 27): a call written as PyTorch writes it means what it means there,
or fails naming the difference. PyTorch is the oracle; docs/pytorch.md lists what was checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opforge as of


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
