"""torch's forms that still differed after the torch-forms work landed, against torch: ``linspace``/``logspace``
with an integer dtype (torch makes start and end integers first: the values differed silently) and the method
``Tensor.equal`` (missing)."""

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
