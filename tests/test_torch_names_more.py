"""torch's forms that still differed after the torch-forms work landed, against torch: ``linspace``/``logspace``
with an integer dtype (torch makes start and end integers first: the values differed silently), and the methods
``Tensor.equal``, ``Tensor.allclose`` and ``ravel`` (missing)."""

import numpy as np
import pytest
import torch

import opforge as of


@pytest.mark.parametrize(("start", "end", "steps"), [(-3.3, 7.1, 11), (0, 10, 4), (5.9, -5.9, 7), (2.5, 2.5, 3),
                                                     (0.5, 9.99, 6)])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_integer_linspace_and_logspace_as_torch(start, end, steps, dtype):
    for name in ("linspace", "logspace"):
        want = getattr(torch, name)(start, end, steps, dtype=getattr(torch, dtype)).numpy()
        got = getattr(of, name)(start, end, steps, dtype=dtype).numpy()
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_equal_method_as_torch():
    a = np.random.default_rng(0).standard_normal((3, 4))
    for x, y in [(a, a), (a, a + 1e-9), (a, a[:1]), (np.array([np.nan]), np.array([np.nan]))]:
        want = torch.tensor(x).equal(torch.tensor(y))
        assert of.tensor(x).equal(of.tensor(y)) is want and of.equal(of.tensor(x), of.tensor(y)) is want


def test_allclose_method_and_ravel_as_torch():
    a = np.random.default_rng(1).standard_normal((3, 4))
    for x, y, kwargs in [(a, a + 1e-9, {}), (a, a + 1e-3, {}), (a, a + 1e-3, {"atol": 1e-2}), (a, a[:1], {}),
                         (np.array([np.nan]), np.array([np.nan]), {"equal_nan": True})]:
        want = torch.tensor(x).allclose(torch.tensor(y), **kwargs)
        assert of.tensor(x).allclose(of.tensor(y), **kwargs) is want
        assert of.allclose(of.tensor(x), of.tensor(y), **kwargs) is want
    with pytest.raises(of.ArgumentError, match=r"allclose\(\): input and other must have one dtype"):
        of.tensor(a).allclose(of.tensor(a.astype(np.float32)))
    with pytest.raises(RuntimeError):
        torch.tensor(a).allclose(torch.tensor(a.astype(np.float32)))
    t = of.tensor(a, requires_grad=True)
    for got in (t.ravel(), of.ravel(t)):
        np.testing.assert_array_equal(got.numpy(), torch.tensor(a).ravel().numpy())
    (g,) = of.grad(of.ops.sum(t.ravel() * of.tensor(np.arange(12.0))), [t])
    np.testing.assert_array_equal(g.numpy(), np.arange(12.0).reshape(3, 4))
