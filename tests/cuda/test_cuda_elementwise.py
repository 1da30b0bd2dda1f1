"""``opforge.core.cuda.Elementwise``: a C body run 16 bytes at a time over contiguous arrays, else as CuPy's
ElementwiseKernel; both give the body's values."""

import numpy as np
import pytest

from opforge.core.cuda import Elementwise

LEAKY = Elementwise("test_leaky", ["x"], ["y"], "y = x > 0 ? x : alpha * x;", ["alpha"])
GRAD = Elementwise("test_leaky_two", ["x", "dy"], ["dx", "twice"], "dx = x > 0 ? dy : alpha * dy; twice = 2 * x;",
                   ["alpha"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("size", [1, 3, 4, 7, 1000, 1 << 20, (1 << 20) + 5])
def test_the_vector_path_gives_the_bodys_values(cupy, dtype, size):
    x = np.random.default_rng(0).standard_normal(size).astype(dtype)
    y = LEAKY(cupy.asarray(x), alpha=0.1).get()
    np.testing.assert_array_equal(y, np.where(x > 0, x, x.dtype.type(0.1) * x))
    dx, twice = GRAD(cupy.asarray(x), cupy.asarray(x[::-1].copy()), alpha=0.1)
    np.testing.assert_array_equal(dx.get(), np.where(x > 0, x[::-1], x.dtype.type(0.1) * x[::-1]))
    np.testing.assert_array_equal(twice.get(), 2 * x)


def test_strided_broadcast_and_other_dtypes_take_the_general_kernel(cupy):
    x = np.random.default_rng(1).standard_normal((64, 33)).astype(np.float32)
    got = LEAKY(cupy.asarray(x)[:, ::2], alpha=0.2).get()
    np.testing.assert_array_equal(got, np.where(x[:, ::2] > 0, x[:, ::2], np.float32(0.2) * x[:, ::2]))
    half = x.astype(np.float16)
    np.testing.assert_allclose(LEAKY(cupy.asarray(half), alpha=0.2).get().astype(np.float32),
                               np.where(half > 0, half, np.float16(0.2) * half).astype(np.float32), rtol=1e-3)
    out = cupy.empty((64, 33), np.float32)
    assert LEAKY(cupy.asarray(x), alpha=0.2, out=out) is out
    offset = cupy.asarray(np.concatenate([[0.0], x.reshape(-1)]).astype(np.float32))[1:]  # 4 bytes off alignment
    np.testing.assert_array_equal(LEAKY(offset, alpha=0.2).get(), np.where(x > 0, x, np.float32(0.2) * x).reshape(-1))
