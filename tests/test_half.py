"""float16 and bfloat16: PyTorch's promotion, kernels that compute in float32 and round once (so they agree with
torch's CPU kernels, which do the same), reductions and matmul accumulating in float32, gradients and programs in
half precision. check_op runs every op's float samples in both dtypes too (tests/test_conformance.py)."""

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.core import dtypes as D

DTYPES = ["bool", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
TORCH_DTYPE = {"bool": torch.bool, "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
               "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


@pytest.mark.parametrize("a", DTYPES)
@pytest.mark.parametrize("b", ["float16", "bfloat16"])
def test_promotion_with_a_half_dtype_is_torchs(a, b):
    want = str(torch.promote_types(TORCH_DTYPE[a], TORCH_DTYPE[b])).removeprefix("torch.")
    assert str(D.promote(D.as_dtype(a), D.as_dtype(b))) == want
    for x, y in ((of.ones(3, dtype=a), of.ones(3, dtype=b)), (of.ones(3, dtype=b), of.ones(3, dtype=a))):
        assert str((x * y).dtype) == want and str(F.maximum(x, y).dtype) == want


def test_half_and_bfloat16_methods_and_weak_scalars():
    x = of.tensor([1.5, -2.0, 3.25])
    assert x.half().dtype == of.float16 and x.bfloat16().dtype == of.bfloat16
    assert (x.half() * 2.5).dtype == of.float16 and (1 + x.bfloat16()).dtype == of.bfloat16
    assert x.bfloat16().float().dtype == of.float32
    np.testing.assert_array_equal(x.bfloat16().double().numpy(), [1.5, -2.0, 3.25])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reductions_and_matmul_accumulate_in_float32(dtype):
    # 4096 ones: a float16 (or bfloat16) accumulator stops at 2048 (256), where adding 1 no longer changes it.
    ones = of.ones(4096, dtype=dtype)
    assert F.sum(ones).dtype == dtype and float(F.sum(ones).numpy()) == 4096
    assert float(F.mean(ones * 3.0).numpy()) == 3
    assert float((F.reshape(ones, shape=[1, 4096]) @ F.reshape(ones, shape=[4096, 1])).numpy()[0, 0]) == 4096


_UNARY = {
    "exp": (F.exp, torch.exp), "tanh": (F.tanh, torch.tanh), "sigmoid": (F.sigmoid, torch.sigmoid),
    "gelu": (F.gelu, torch.nn.functional.gelu), "silu": (F.silu, torch.nn.functional.silu),
    "softmax": (F.softmax, lambda t: torch.softmax(t, -1)),
    "layer_norm": (lambda x: F.layer_norm(x, normalized_shape=[8]), lambda t: torch.nn.functional.layer_norm(t, [8])),
    "rms_norm": (lambda x: F.rms_norm(x, normalized_shape=[8]), lambda t: torch.nn.functional.rms_norm(t, [8])),
    "sum": (lambda x: F.sum(x, axis=[1]), lambda t: t.sum(1)),
    "matmul": (lambda x: x @ F.transpose(x), lambda t: t @ t.T),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(_UNARY))
def test_half_forward_agrees_with_torch(name, dtype):
    # Both compute in float32 and round once: the same up to a rounding step (libm and summation orders differ).
    of_fn, torch_fn = _UNARY[name]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got = of_fn(of.tensor(x).astype(dtype))
    want = torch_fn(torch.from_numpy(x).to(TORCH_DTYPE[dtype]))
    assert str(got.dtype) == dtype
    np.testing.assert_allclose(got.numpy().astype(np.float64), want.double().numpy(), rtol=D.EPS[got.dtype],
                               atol=D.EPS[got.dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gradients_in_half_precision(dtype):
    # A small model trained in half: every gradient is of the half dtype and near the float32 one.
    of.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 3))
    x, y = of.randn(5, 6), of.tensor(np.array([0, 2, 1, 1, 0]))
    F.cross_entropy(model(x), y).backward()
    want = {n: p.grad.numpy() for n, p in model.named_parameters()}
    model.zero_grad()
    model.to(dtype)
    loss = F.cross_entropy(model(x.astype(dtype)), y)
    assert loss.dtype == dtype
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad.dtype == dtype, n
        np.testing.assert_allclose(p.grad.numpy().astype(np.float32), want[n], rtol=0.1, atol=10 * D.EPS[p.dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_programs_run_in_half_precision(dtype):
    w = of.tensor(np.random.default_rng(1).standard_normal((4, 3)), dtype=dtype, requires_grad=True)

    def fn(x):
        loss = F.mean(F.square(F.hardswish(x @ w)))
        return loss, *of.grad(loss, [w])

    x = of.randn(5, 4).astype(dtype)
    loss, gw = of.compile(fn)(x)
    eager = F.mean(F.square(F.hardswish(x @ w)))
    (eager_gw,) = of.grad(eager, [w])
    assert loss.dtype == gw.dtype == dtype
    np.testing.assert_array_equal(loss.numpy(), eager.numpy())
    np.testing.assert_array_equal(gw.numpy(), eager_gw.numpy())


def test_integer_first_operand_meets_a_half_one():
    i = of.tensor([1, 2, 3])
    for dtype in ("float16", "bfloat16"):
        h = of.tensor([0.5, 0.25, 2.0]).astype(dtype)
        assert (i * h).dtype == dtype and (i > h).dtype == of.bool_
        np.testing.assert_array_equal((i * h).numpy().astype(np.float32), [0.5, 0.5, 6.0])
