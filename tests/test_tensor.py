"""The eager Tensor: creation, dtypes, conversion without copies, operators and methods."""

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F


def test_python_numbers_become_float32_and_int64_numpy_keeps_its_dtype():
    assert of.tensor(1.5).dtype == of.float32
    assert of.tensor([[1.0, 2.0]]).dtype == of.float32
    assert of.tensor(3).dtype == of.int64
    assert of.tensor([True, False]).dtype == of.bool_
    assert of.tensor(np.ones(2, np.float64)).dtype == of.float64
    assert of.tensor(np.ones(2, np.int32)).dtype == of.int32
    assert of.tensor([1, 2], dtype="float64").dtype == of.float64


def test_unsupported_data_is_refused_clearly():
    with pytest.raises(of.ArgumentError, match="dtype uint8 is not supported"):
        of.tensor(np.ones(2, np.uint8))
    with pytest.raises(of.ArgumentError, match="cannot make a tensor"):
        of.tensor(["a", "b"])
    with pytest.raises(of.GradientError, match="only floating-point tensors can require grad"):
        of.tensor([1, 2], requires_grad=True)


def test_python_scalars_take_the_dtype_of_the_tensor_they_meet():
    x32 = of.tensor([1.0, 2.0])
    assert (x32 * 2).dtype == of.float32 and (2.5 * x32).dtype == of.float32
    x64 = of.tensor(np.array([1.0]))
    assert (x64 + 1.5).dtype == of.float64
    i32 = of.tensor(np.array([1, 2], np.int32))
    assert (i32 + 1).dtype == of.int32
    assert (i32 * 2.5).dtype == of.float32  # a float meets int32: the default float dtype (PyTorch's promotion)


def test_creation_functions_are_seeded_ops():
    of.manual_seed(7)
    a = of.randn(3, 4)
    b = of.rand(2, dtype=of.float64)
    of.manual_seed(7)
    assert np.array_equal(a.numpy(), of.randn(3, 4).numpy())
    assert np.array_equal(b.numpy(), of.rand(2, dtype=of.float64).numpy())
    assert a.shape == (3, 4) and a.dtype == of.float32 and b.dtype == of.float64
    assert of.zeros(2, 3).numpy().sum() == 0 and of.ones((2, 3)).shape == (2, 3)
    assert of.full((2,), 7).dtype == of.int64 and of.full((2,), 0.5).numpy().tolist() == [0.5, 0.5]
    assert of.arange(5).numpy().tolist() == [0, 1, 2, 3, 4] and of.arange(5).dtype == of.int64
    assert of.arange(0, 1, 0.25).numpy().tolist() == [0, 0.25, 0.5, 0.75]
    assert of.zeros(2, requires_grad=True).requires_grad


def test_numpy_and_array_and_dlpack_share_memory():
    x = of.tensor([1.0, 2.0, 3.0])
    assert x.numpy() is x.numpy()
    assert np.shares_memory(np.asarray(x), x.numpy())
    t = torch.from_dlpack(x)
    assert t.data_ptr() == x.numpy().ctypes.data
    n = np.from_dlpack(x)
    assert np.shares_memory(n, x.numpy())
    assert np.array(x, copy=True) is not x.numpy()


def test_properties():
    x = of.tensor(np.zeros((2, 3)))
    assert (x.shape, x.dtype, x.ndim, x.size, x.device) == ((2, 3), of.float64, 2, 6, "cpu")
    assert of.tensor(4.5).item() == 4.5 and float(of.tensor([2.0])) == 2.0
    with pytest.raises(of.ArgumentError, match="only a tensor with one element"):
        x.item()
    assert len(x) == 2 and [row.shape for row in x] == [(3,), (3,)]
    assert "tensor(" in repr(x) and "float64" in repr(x)


OPERATORS = [
    (lambda a, b: a + b, "add"), (lambda a, b: a - b, "sub"), (lambda a, b: a * b, "mul"),
    (lambda a, b: a / b, "div"), (lambda a, b: a ** b, "pow"), (lambda a, b: a @ b, "matmul"),
    (lambda a, b: a < b, "less"), (lambda a, b: a <= b, "less_equal"), (lambda a, b: a > b, "greater"),
    (lambda a, b: a >= b, "greater_equal"), (lambda a, b: a == b, "equal"), (lambda a, b: a != b, "not_equal"),
]


@pytest.mark.parametrize("apply, op_name", OPERATORS, ids=[name for _, name in OPERATORS])
def test_every_operator_goes_through_its_registered_op(apply, op_name, monkeypatch):
    calls = []
    real = getattr(F, op_name)
    monkeypatch.setattr(F, op_name, lambda *a, **k: calls.append(op_name) or real(*a, **k))
    a, b = of.tensor(np.full((2, 2), 2.0)), of.tensor(np.full((2, 2), 3.0))
    expected = apply(a.numpy(), b.numpy())
    assert np.array_equal(apply(a, b).numpy(), expected)
    assert calls == [op_name]


def test_reflected_operators_and_unary():
    x = of.tensor([1.0, 2.0])
    assert (1 - x).numpy().tolist() == [0.0, -1.0]
    assert (2 / x).numpy().tolist() == [2.0, 1.0]
    assert (2 ** x).numpy().tolist() == [2.0, 4.0]
    assert (-x).numpy().tolist() == [-1.0, -2.0]
    assert abs(-x).numpy().tolist() == [1.0, 2.0]
    assert (np.float32(3) * x).numpy().tolist() == [3.0, 6.0]


def test_methods():
    x = of.tensor(np.arange(6.0).reshape(2, 3))
    a = x.numpy()
    assert np.allclose(x.sum().numpy(), a.sum()) and np.allclose(x.sum(axis=0).numpy(), a.sum(0))
    assert np.allclose(x.mean(axis=1, keepdim=True).numpy(), a.mean(1, keepdims=True))
    assert x.reshape(3, 2).shape == (3, 2) and x.reshape((6,)).shape == (6,)
    assert x.T.shape == (3, 2) and x.transpose(1, 0).shape == (3, 2)
    assert np.allclose(x.exp().log().numpy(), a)
    assert x.astype("float32").dtype == of.float32 and x.float().dtype == of.float32
    assert np.allclose((x + 1).sqrt().square().numpy(), a + 1)
    assert np.allclose(x.tanh().numpy(), np.tanh(a)) and np.allclose(x.relu().numpy(), a)


@pytest.mark.parametrize("index", [
    0, -1, (1, 2), (slice(None), 1), (slice(None, None, -1),), (slice(1, None), slice(None, None, 2)),
    (None, 0), (Ellipsis, 1), (0, Ellipsis, None), (slice(None, None, -2), slice(3, 0, -1)),
])
def test_basic_indexing_matches_numpy(index):
    a = np.arange(24.0).reshape(4, 6)
    assert np.array_equal(of.tensor(a)[index].numpy(), a[index])


def test_indexing_errors():
    x = of.tensor(np.zeros((2, 3)))
    with pytest.raises(of.ArgumentError, match="out of range"):
        x[5]
    with pytest.raises(of.ArgumentError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(of.ArgumentError, match="only ints, slices, None and"):
        x["a"]
    x[0] = 1.0  # an in-place write, as torch's (tests/test_torch_api.py)
    assert x.numpy()[0].tolist() == [1.0] * 3 and x._version == 1


def test_eye_and_bernoulli():
    assert np.array_equal(F.eye(n=3).numpy(), np.eye(3, dtype=np.float32))
    assert F.eye(n=2, m=4, dtype="int64").numpy().tolist() == np.eye(2, 4, dtype=np.int64).tolist()
    with pytest.raises(of.ArgumentError, match="eye\\(\\): arguments 'n' and 'm' must be >= 0"):
        F.eye(n=-1)
    p = of.full((20000,), 0.3)
    of.manual_seed(1)
    a = F.bernoulli(p).numpy()
    of.manual_seed(1)
    assert np.array_equal(a, F.bernoulli(p).numpy())  # seeded
    assert set(np.unique(a)) <= {0.0, 1.0} and abs(a.mean() - 0.3) < 0.02 and a.dtype == np.float32
