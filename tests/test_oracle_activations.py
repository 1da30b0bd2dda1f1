"""PyTorch as the oracle for the activations of torch.nn.functional that opforge/ops/elementwise.py adds (hardtanh,
relu6, hardsigmoid, hardswish, mish, logsigmoid, celu, softmin, glu, prelu and their grad ops), and NaN propagation
through the backward pass of every elementwise op.

``ORACLE`` maps each op to its torch counterpart, as in ``test_torch_oracle.py`` (whose runners this file reuses):
every (op, case), the op's declared samples plus the ``extra`` ones, goes through ``test_forward``, ``test_vjp``
and ``test_hvp`` in float64. Dedicated tests follow for the kinks (PyTorch's conventions at the bounds of the hard
activations) and for NaN: a gradient at a NaN input is NaN (``test_nan_reaches_the_gradient`` walks the registry's
elementwise ops). There opforge departs from PyTorch on purpose: torch's relu, elu, hardtanh, ... backward give a
finite gradient at NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_torch_oracle import (
    _case_id,
    _declared_samples,
    _is_float64_case,
    check_forward,
    check_hvp,
    check_vjp,
    torch_vjp,
)
from test_torch_oracle import _op_pair as torch_oracle_op_pair

import opforge as of
from opforge import Sample
from opforge import ops as F
from opforge.testing import call_op

TF = torch.nn.functional

_rng = np.random.default_rng(20250115)


def uniform(low: float, high: float, *shape) -> np.ndarray:
    return np.asarray(_rng.uniform(low, high, shape))


@dataclass(frozen=True)
class Oracle:
    torch_fn: Callable  # (*torch tensors, **attrs) -> torch tensor
    extra: tuple = ()  # Samples added to the op's declared samples


def torch_hardsigmoid(x):
    """torch's hardsigmoid has no double backward; hardtanh(x + 3, 0, 6)/6 is the same function with one
    (test_hardsigmoid_formula_is_torchs checks the values and first derivatives, at the kinks too)."""
    return TF.hardtanh(x + 3, 0.0, 6.0) / 6


ORACLE: dict[str, Oracle] = {
    "hardtanh": Oracle(lambda x, min_val, max_val: TF.hardtanh(x, min_val, max_val), extra=(
        Sample.of(uniform(-3, 3, 7), min_val=-2.0, max_val=0.5),
    )),
    "hardtanh_grad": Oracle(torch_vjp(lambda x, min_val, max_val: TF.hardtanh(x, min_val, max_val))),
    "relu6": Oracle(TF.relu6, extra=(Sample.of(uniform(-10, 10, 9)),)),
    "hardsigmoid": Oracle(torch_hardsigmoid, extra=(Sample.of(uniform(-10, 10, 9)),)),
    "hardswish": Oracle(TF.hardswish, extra=(Sample.of(uniform(-10, 10, 9)),)),
    "hardswish_grad": Oracle(torch_vjp(TF.hardswish), extra=(Sample.of(uniform(-10, 10, 9), uniform(-1, 1, 9)),)),
    "mish": Oracle(TF.mish, extra=(Sample.of(uniform(-40, 40, 9)),)),
    "logsigmoid": Oracle(TF.logsigmoid, extra=(Sample.of(uniform(-800, 800, 9)),)),  # no overflow either way
    "celu": Oracle(lambda x, alpha: TF.celu(x, alpha=alpha), extra=(
        Sample.of(uniform(-30, 800, 9), alpha=3.0),
        Sample.of(uniform(-3, 3, 5), alpha=-0.5),
    )),
    "softmin": Oracle(lambda x, axis: TF.softmin(x, dim=axis), extra=(
        Sample.of(uniform(-500, 500, 3, 4), axis=0),  # exp would overflow without the shift
    )),
    "glu": Oracle(lambda x, axis: TF.glu(x, dim=axis), extra=(Sample.of(uniform(-3, 3, 2, 4, 2), axis=-2),)),
    "prelu": Oracle(TF.prelu, extra=(
        Sample.of(uniform(-2, 2, 2, 3, 2, 2), uniform(-1, 1, 3)),
        Sample.of(uniform(-2, 2, 3, 2), uniform(-1, 1, 1)),
    )),
}


def _params(order: int) -> list:
    params = []
    for name, oracle in ORACLE.items():
        for i, case in enumerate([*_declared_samples(name), *oracle.extra]):
            if order and not _is_float64_case(case):
                continue
            params.append(pytest.param(name, case, id=_case_id(name, i, case)))
    return params


def _op_pair(name: str, sample: Sample):
    return torch_oracle_op_pair(name, sample, ORACLE)


@pytest.mark.parametrize(("name", "sample"), _params(0))
def test_forward(name, sample):
    check_forward(*_op_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(1))
def test_vjp(name, sample):
    check_vjp(*_op_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(2))
def test_hvp(name, sample):
    check_hvp(*_op_pair(name, sample), sample.args)


def test_table_covers_the_activations():
    required = {"hardtanh", "hardtanh_grad", "relu6", "hardsigmoid", "hardswish", "hardswish_grad", "mish",
                "logsigmoid", "celu", "softmin", "glu", "prelu"}
    assert required <= set(ORACLE), f"no oracle for {sorted(required - set(ORACLE))}"


# -- kinks: PyTorch's conventions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(F.hardtanh, TF.hardtanh, id="hardtanh"),
    pytest.param(lambda x: F.hardtanh(x, min_val=-0.25, max_val=0.5), lambda x: TF.hardtanh(x, -0.25, 0.5),
                 id="hardtanh-bounds"),
    pytest.param(F.relu6, TF.relu6, id="relu6"),
    pytest.param(F.hardsigmoid, torch_hardsigmoid, id="hardsigmoid"),
    pytest.param(F.hardswish, TF.hardswish, id="hardswish"),
    pytest.param(F.celu, TF.celu, id="celu"),
])
def test_kinks_follow_torch(of_fn, torch_fn):
    x = np.array([-4.0, -3.0, -1.0, -0.25, -0.0, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0])  # every op's bounds
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])


def test_hardsigmoid_formula_is_torchs():
    x = torch.tensor([-4.0, -3.0, -1.0, 0.0, 2.5, 3.0, 7.0], dtype=torch.float64, requires_grad=True)
    (g_formula,), (g_torch,) = (torch.autograd.grad(fn(x).sum(), x) for fn in (torch_hardsigmoid, TF.hardsigmoid))
    # torch's own kernel is off by ~3e-8 relative in float64 (a single-precision 1/6): the oracle's RTOL, 1e-7.
    torch.testing.assert_close(torch_hardsigmoid(x), TF.hardsigmoid(x), rtol=1e-7, atol=0)
    torch.testing.assert_close(g_formula, g_torch, rtol=1e-7, atol=0)


# -- NaN in, NaN out, in the gradients too ---------------------------------------------------------------------------


def _reads_data(opdef) -> bool:
    """Whether the op's gradient depends on the data at all (identity's, sign's or cast's does not; to_device's
    rule reads only where x is)."""
    rule = opdef.grad_rule
    return rule is not None and bool(rule.saved_inputs or rule.saved_outputs) and opdef.name != "to_device"


NAN_OPS = sorted(op.name for op in of.registry
                 if ("elementwise" in op.traits or op.name == "clip") and "no_grad" not in op.traits
                 and _reads_data(op) and (op.inputs[0].dtypes is None or of.float64 in op.inputs[0].dtypes))


@pytest.mark.parametrize("name", NAN_OPS)
def test_nan_reaches_the_gradient(name):
    # A NaN in the first input: every gradient the rule gives (VJPs with a finite cotangent) is NaN there, and NaN
    # spreads nowhere else. torch gives finite gradients at NaN for relu, elu, hardtanh, ...: opforge does not.
    sample = next(s for s in _declared_samples(name) if s.args[0].ndim >= 1 and s.args[0].dtype == np.float64)
    args = [a.copy() for a in sample.args]
    args[0].reshape(-1)[0] = np.nan
    with np.errstate(invalid="ignore"):
        xs = [of.tensor(a, requires_grad=a.dtype == np.float64) for a in args]
        y = call_op(name, xs, sample.kwargs)  # inputs by name: an attr may come first (polygamma)
        u = of.tensor(np.random.default_rng(0).uniform(0.5, 1.5, y.shape))
        grads = of.grad([y], [x for x in xs if x.requires_grad], grad_outputs=[u], allow_unused=True)
    got = [g for g in grads if g is not None]
    assert got, f"{name}: no input got a gradient"
    for i, g in enumerate(got):
        g = g.numpy()
        assert np.isnan(g.reshape(-1)[0]), f"{name}: gradient {i} is {g.reshape(-1)[0]} at the NaN input"
        assert not np.isnan(g.reshape(-1)[1:]).any(), f"{name}: gradient {i} is NaN away from the NaN input"


def test_the_walk_covers_the_ops_that_select_by_comparing():
    assert {"relu", "relu_grad", "elu", "selu", "softplus", "abs", "leaky_relu", "leaky_relu_grad", "clip",
            "hardtanh", "relu6", "hardswish", "hardsigmoid", "celu", "smooth_l1"} <= set(NAN_OPS)


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(lambda x: F.clip(x, min=-1.0, max=0.0), lambda x: torch.clamp(x, -1.0, 0.0), id="clip"),
    pytest.param(F.hardtanh, TF.hardtanh, id="hardtanh"),
    pytest.param(F.relu6, TF.relu6, id="relu6"),
    pytest.param(F.hardsigmoid, TF.hardsigmoid, id="hardsigmoid"),
    pytest.param(F.hardswish, TF.hardswish, id="hardswish"),
])
def test_nan_and_infinities_in_forward_follow_torch(of_fn, torch_fn):
    with np.errstate(invalid="ignore"):  # hardswish(−inf) = −inf·0 = NaN, in torch too
        check_forward(of_fn, torch_fn, [np.array([np.nan, np.inf, -np.inf, 1.0, -0.5])])


def test_nan_reaches_prelu_gradients():
    x = of.tensor(np.array([[np.nan, -1.0], [2.0, -0.5]]), requires_grad=True)
    w = of.tensor(np.array([0.25, 0.5]), requires_grad=True)
    with np.errstate(invalid="ignore"):
        gx, gw = of.grad([F.prelu(x, w).sum()], [x, w])
    assert np.isnan(gx.numpy()[0, 0]) and np.isfinite(gx.numpy().reshape(-1)[1:]).all()
    assert np.isnan(gw.numpy()[0]) and np.isfinite(gw.numpy()[1])


# -- wrong calls -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.hardtanh(of.zeros(3), min_val=1.0, max_val=0.0), r"hardtanh\(\): argument 'min_val' must not exceed"),
    (lambda: F.celu(of.zeros(3), alpha=0.0), r"celu\(\): argument 'alpha' must not be 0"),
    (lambda: F.glu(of.zeros((2, 3))), r"glu\(\): dim 1 of shape \(2, 3\) must have an even size"),
    (lambda: F.glu(of.zeros(())), r"glu\(\): needs at least 1 dim"),
    (lambda: F.prelu(of.zeros((2, 3)), of.zeros(2)), r"prelu\(\): weight must have shape \(\), \(1,\) or \(3,\)"),
    (lambda: F.softmin(of.zeros((2, 3)), axis=2), r"softmin\(\): axis 2 is out of range"),
])
def test_wrong_calls_name_the_op(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()


@pytest.mark.parametrize("n", [8192, 8192 * 3 + 5, 100_003])
def test_relu_over_large_arrays_is_numpys_maximum(n):
    # relu takes a faster path (rows of zeros) from 8,192 elements: the same values, NaN, ±0 and ±inf included.
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x[::7], x[1::11], x[2::13], x[3::17] = np.nan, -0.0, np.inf, -np.inf
    got = F.relu(of.tensor(x)).numpy()
    want = np.maximum(x, 0)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))
    y = of.tensor(x.reshape(-1, 1) if n % 2 else x.reshape(2, -1), requires_grad=True)
    step = of.compile(lambda t: F.relu(t * 1.0))
    assert np.array_equal(step(y).numpy().reshape(-1), want, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sigmoid_matches_torch_at_the_tails(dtype):
    """sigmoid is 1/(1 + e⁻ˣ) as torch computes it, subnormal results included (a select between two stable forms
    gave 3.8e-44 at x = -100 in float32, where torch gives 0), and warns of no overflow."""
    import warnings

    import opforge as of
    from opforge import ops as F

    limit = 100 if dtype == "float32" else 750
    x = np.linspace(-limit, limit, 40001).astype(dtype)
    want = torch.sigmoid(torch.from_numpy(x)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = F.sigmoid(of.tensor(x)).numpy()
    tiny = np.finfo(dtype).tiny * np.finfo(dtype).eps  # the smallest subnormal
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=tiny)  # torch's exp is not ours
