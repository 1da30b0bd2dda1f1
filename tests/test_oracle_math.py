"""PyTorch as the oracle for the maths ops: elementwise functions and activations, minimum and the logical ops,
remainder, floor division and the bitwise ops, to_device, and the reductions (prod, max/min/amax/amin,
argmax/argmin, var/std, logsumexp, norm, cumsum).

``ORACLE`` maps each op to its torch counterpart, exactly as in ``test_torch_oracle.py`` (whose runners this
file reuses): every (op, case), for the op's declared samples plus the ``extra`` ones, goes through
``test_forward``, ``test_vjp`` and ``test_hvp`` in float64. ``orders`` says how far the comparison goes: 0 for
ops without gradients (bool and index results), 1 for piecewise-constant ops, whose first-order gradient is a
constant 0 in both frameworks, so there is nothing to differentiate again (``test_zero_gradients_are_constant``
checks exactly that).

Dedicated tests follow for the places where a derivative jumps, where both frameworks must pick the same
convention: halves for round, the bounds of clip, 0 for elu/selu, ties for minimum and for the max/min
reductions (shared equally), zeros in prod (right to the second order), the zero vector for norm, constant
groups for std, infinities for logsumexp; and the third derivative of gelu.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_torch_oracle import (
    OPFORGE,
    TORCH,
    _case_id,
    _declared_samples,
    _is_float64_case,
    assert_same,
    check_forward,
    check_hvp,
    check_vjp,
    directional_derivative,
    forward,
    hvp,
    program_matches_eager,
    torch_vjp,
    vjp,
)
from test_torch_oracle import _op_pair as torch_oracle_op_pair

import opforge as of
from opforge import Sample
from opforge import ops as F

TF = torch.nn.functional

_rng = np.random.default_rng(20240917)


def randn(*shape) -> np.ndarray:
    return np.asarray(_rng.standard_normal(shape))


def uniform(low: float, high: float, *shape) -> np.ndarray:
    return np.asarray(_rng.uniform(low, high, shape))


def away_from_zero(*shape) -> np.ndarray:
    return np.asarray(uniform(0.3, 2.0, *shape) * _rng.choice([-1, 1], shape))


# -- torch counterparts ----------------------------------------------------------------------------------------------


def dims(x, axis):
    """torch's ``dim`` for opforge's ``axis``: None means every dim."""
    return tuple(range(x.dim())) if axis is None else axis


def torch_prod(x, axis, keepdim):
    """torch.prod reduces one dim at a time: reduce each (keeping it), then squeeze them."""
    reduced = sorted({d % x.dim() for d in ([axis] if isinstance(axis, int) else dims(x, axis))}) if x.dim() else []
    for d in reduced:
        x = torch.prod(x, dim=d, keepdim=True)
    return x if keepdim or not reduced else x.squeeze(tuple(reduced))


def torch_clip(x, min=None, max=None):
    """torch.clamp, with bounds given as arrays (0-d or not) made tensors: Python numbers stay numbers."""
    min, max = (torch.from_numpy(b) if isinstance(b, np.ndarray) else b for b in (min, max))
    return torch.clamp(x, min=min, max=max)


def torch_round(x, decimals):
    """torch.round; torch refuses ``decimals`` for integers, which opforge rounds to tens, hundreds, ... (decimals < 0):
    the same as rounding their float64 values."""
    if decimals == 0:
        return torch.round(x)
    if not x.is_floating_point():
        return x.clone() if decimals > 0 else torch.round(x.double(), decimals=decimals).to(x.dtype)
    return torch.round(x, decimals=decimals)


def reduction(fn):
    """``fn(x, dim=..., keepdim=...)`` called with opforge's attrs."""
    return lambda x, axis, keepdim: fn(x, dim=dims(x, axis), keepdim=keepdim)


# -- the table -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Oracle:
    torch_fn: Callable  # (*torch tensors, **attrs) -> torch tensor
    extra: tuple = ()  # Samples added to the op's declared samples
    orders: int = 2  # derivative orders compared: 0 forward only, 1 adds VJPs, 2 adds HVPs
    torch_hvp_nan: bool = False  # torch's HVP may be NaN where opforge's is 0 (see check_hvp_where_torch_is_nan)


_HALVES = np.array([-2.5, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 3.0, 0.49999999999999994])
_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5])

ORACLE: dict[str, Oracle] = {
    # -- piecewise constant: zero gradients ---------------------------------------------------------------------
    "sign": Oracle(torch.sign, orders=1, extra=(Sample.of(_SPECIAL), Sample.of(np.arange(-2, 3)))),
    "floor": Oracle(torch.floor, orders=1, extra=(Sample.of(_HALVES),)),
    "ceil": Oracle(torch.ceil, orders=1, extra=(Sample.of(_HALVES),)),
    "round": Oracle(torch_round, orders=1, extra=(
        Sample.of(_HALVES), Sample.of(np.arange(-3, 3, dtype=np.int32)),
        Sample.of(_HALVES * 10, decimals=-1), Sample.of(_HALVES / 100, decimals=2),  # halves of 10 and 0.01
        Sample.of(uniform(-1e4, 1e4, 6).astype(np.float32), decimals=3),  # computed in float32, as torch
        Sample.of(np.array([-250, -150, 149, 150, 250, 251]), decimals=-2),  # halves to even
    )),
    # -- smooth elementwise ------------------------------------------------------------------------------------------
    "expm1": Oracle(torch.expm1, extra=(Sample.of(np.array([1e-12, -1e-9, 0.0, 3.0])),)),
    "log1p": Oracle(torch.log1p, extra=(Sample.of(np.array([1e-12, -1e-9, 0.0, 3.0])),)),
    "rsqrt": Oracle(torch.rsqrt, extra=(Sample.of(uniform(1e-3, 100.0, 4, 2)),)),
    "reciprocal": Oracle(torch.reciprocal, extra=(Sample.of(away_from_zero(3, 2)),)),
    "sin": Oracle(torch.sin, extra=(Sample.of(uniform(-10, 10, 7)),)),
    "cos": Oracle(torch.cos, extra=(Sample.of(uniform(-10, 10, 7)),)),
    "asin": Oracle(torch.asin, extra=(Sample.of(uniform(-0.99, 0.99, 7)),)),
    "acos": Oracle(torch.acos, extra=(Sample.of(uniform(-0.99, 0.99, 7)),)),
    "atan": Oracle(torch.atan, extra=(Sample.of(uniform(-50, 50, 7)),)),
    "erf": Oracle(torch.erf, extra=(Sample.of(uniform(-4, 4, 3, 3)),)),
    "softplus": Oracle(lambda x, beta, threshold: TF.softplus(x, beta=beta, threshold=threshold), extra=(
        Sample.of(uniform(-40, 40, 20)),  # both sides of the threshold, and far below it
        Sample.of(uniform(-5, 5, 4, 3), beta=3.0, threshold=4.0),
        Sample.of(uniform(-5, 5, 4), beta=-1.0),
    )),
    "elu": Oracle(lambda x, alpha: TF.elu(x, alpha=alpha), extra=(
        Sample.of(uniform(-30, 800, 10)),  # e^800 would overflow, were it computed where x > 0
        Sample.of(randn(3, 2), alpha=0.3),
    )),
    "selu": Oracle(torch.selu, extra=(Sample.of(uniform(-30, 800, 10)),)),
    "gelu": Oracle(lambda x, approximate: TF.gelu(x, approximate=approximate), extra=(
        Sample.of(uniform(-8, 8, 12)),
        Sample.of(uniform(-8, 8, 12), approximate="tanh"),
    )),
    "gelu_grad": Oracle(torch_vjp(lambda x, approximate: TF.gelu(x, approximate=approximate)), extra=(
        Sample.of(uniform(-6, 6, 8), randn(8)),
        Sample.of(uniform(-6, 6, 8), randn(8), approximate="tanh"),
        Sample.of(randn(), randn(), approximate="tanh"),
    )),
    "silu": Oracle(TF.silu, extra=(Sample.of(uniform(-800, 800, 9)),)),
    "clip": Oracle(torch_clip, extra=(
        Sample.of(randn(4, 3), min=0.5, max=-0.5),  # min > max: max everywhere, no gradient
        Sample.of(np.arange(-4, 4), min=-1, max=2),  # integer bounds keep int64
        Sample.of(np.arange(-4, 4, dtype=np.int32), max=0.5),  # a fractional bound gives float32
        Sample.of(np.arange(-4, 4, dtype=np.int32), max=np.array(0.5)),  # a 0-d float64 one float64
        Sample.of(randn(4).astype(np.float32), min=np.array(-0.5)),  # a 0-d float64 bound keeps float32
        Sample.of(np.array([np.inf, -np.inf, 1.0, -0.5]), min=-1.0, max=0.0),  # NaN: test_oracle_activations.py
        Sample.of(randn(2, 3), randn(2, 3), randn(3)),  # tensor bounds get gradients
        Sample.of(randn(3, 4), randn(4) + 1.0, randn(3, 1) - 1.0),  # min > max in places: max gets them
        Sample.of(randn(3), randn(2, 3)),  # a bound that broadcasts x
    )),
    # -- bool results ------------------------------------------------------------------------------------------------
    "isnan": Oracle(torch.isnan, orders=0, extra=(Sample.of(_SPECIAL.astype(np.float32)),)),
    "isfinite": Oracle(torch.isfinite, orders=0, extra=(Sample.of(_SPECIAL.astype(np.float32)),)),
    "logical_not": Oracle(torch.logical_not, orders=0, extra=(Sample.of(_SPECIAL),)),
    "logical_and": Oracle(torch.logical_and, orders=0, extra=(
        Sample.of(_SPECIAL, _SPECIAL[::-1].copy()), Sample.of(np.array([0, 1, 2]), np.array(True)),
    )),
    "logical_or": Oracle(torch.logical_or, orders=0, extra=(
        Sample.of(_SPECIAL, _SPECIAL[::-1].copy()), Sample.of(np.array([0, 1, 2]), np.array(False)),
    )),
    # -- binary ------------------------------------------------------------------------------------------------------
    "minimum": Oracle(torch.minimum, extra=(
        Sample.of(randn(), randn(2, 1)),
        Sample.of(randn(4, 1), randn(1, 3)),
        Sample.of(np.arange(4), np.array([2, 1, 0, 5], dtype=np.int32)),
    )),
    # -- the operators % // & | ~ (ops/integer.py) and device moves ---------------------------------------------------
    "remainder": Oracle(torch.remainder, extra=(
        Sample.of(np.array([5.5, -5.5, 5.5, -5.5]), np.array([2.0, 2.0, -2.0, -2.0])),  # the divisor's sign
        Sample.of(np.arange(-6, 6).reshape(3, 4), np.array([4, -3, 5, 2])),
    )),
    # torch has no gradient for floor_divide (ours is floor's: 0), so the values alone are compared
    "floor_divide": Oracle(torch.floor_divide, orders=0, extra=(
        Sample.of(np.array([5.5, -5.5, 5.5, -5.5]), np.array([2.0, 2.0, -2.0, -2.0])),  # rounding down
        Sample.of(np.arange(-6, 6).reshape(3, 4), np.array([4, -3, 5, 2])),
    )),
    "bitwise_and": Oracle(torch.bitwise_and, orders=0),
    "bitwise_or": Oracle(torch.bitwise_or, orders=0),
    "bitwise_not": Oracle(torch.bitwise_not, orders=0),
    "to_device": Oracle(lambda x, device: x.to(device), extra=(Sample.of(randn(3, 2), device="cpu"),)),
    # -- reductions --------------------------------------------------------------------------------------------------
    "prod": Oracle(torch_prod, extra=(
        Sample.of(away_from_zero(2, 3, 4), axis=None, keepdim=True),
        Sample.of(away_from_zero(2, 3), axis=[1, 0]),
        Sample.of(away_from_zero(), axis=0, keepdim=True),
        Sample.of(np.array([[True, False], [True, True]]), axis=1),
        Sample.of(np.zeros((0, 3)), axis=0),  # an empty product is 1
    )),
    "amax": Oracle(reduction(torch.amax), extra=(
        Sample.of(randn(2, 3), axis=[-1, 0], keepdim=True),
        Sample.of(randn(2, 3, 4), axis=None, keepdim=True),
        Sample.of(randn(2, 3), axis=[1, 0]),
        Sample.of(randn(), axis=-1, keepdim=True),
        Sample.of(np.array([[1.0, np.nan], [2.0, 3.0]]), axis=1),
    )),
    "amin": Oracle(reduction(torch.amin), extra=(
        Sample.of(randn(2, 3), axis=[-1, 0], keepdim=True),
        Sample.of(randn(2, 3, 4), axis=-2, keepdim=True),
        Sample.of(randn(), axis=0),
    )),
    "argmax": Oracle(lambda x, axis, keepdim: torch.argmax(x, dim=axis, keepdim=keepdim), orders=0, extra=(
        Sample.of(np.array([1.0, np.nan, 3.0, np.nan])),  # NaN counts as the largest
        Sample.of(randn(), keepdim=True),
    )),
    "argmin": Oracle(lambda x, axis, keepdim: torch.argmin(x, dim=axis, keepdim=keepdim), orders=0, extra=(
        Sample.of(np.array([[1, 0, 0], [2, 2, 1]]), axis=1, keepdim=True),
    )),
    "var": Oracle(lambda x, axis, correction, keepdim: torch.var(x, dim=axis, correction=correction, keepdim=keepdim),
                  extra=(Sample.of(randn(2, 3, 4), axis=None, keepdim=True, correction=0),
                         Sample.of(randn(4, 3), axis=[1, 0], correction=3),
                         Sample.of(randn(4, 3), axis=0, correction=2.5))),
    "std": Oracle(lambda x, axis, correction, keepdim: torch.std(x, dim=axis, correction=correction, keepdim=keepdim),
                  torch_hvp_nan=True, extra=(Sample.of(randn(2, 3, 4), axis=None, keepdim=True, correction=0),
                         Sample.of(randn(4, 3), axis=[1, 0], correction=3),
                         Sample.of(randn(4, 3), axis=1, correction=-0.5))),
    "logsumexp": Oracle(reduction(torch.logsumexp), extra=(
        Sample.of(randn(2, 3, 4), axis=None, keepdim=True),
        Sample.of(randn(3, 4) * 300, axis=[1, 0]),
        Sample.of(randn(), axis=0),
    )),
    "norm": Oracle(lambda x, p, axis, keepdim: torch.linalg.vector_norm(x, ord=p, dim=axis, keepdim=keepdim), extra=(
        Sample.of(randn(2, 3, 4), axis=None, keepdim=True),
        Sample.of(away_from_zero(3, 4), p=1.5, axis=[1, 0], keepdim=True),
        Sample.of(away_from_zero(5), p=4.0),
        Sample.of(away_from_zero(5), p=-2.0),
        Sample.of(randn(), p=3.0),
        Sample.of(np.zeros((2, 0)), axis=1),
    )),
    "cumsum": Oracle(lambda x, axis: torch.cumsum(x, dim=axis), extra=(
        Sample.of(randn(2, 3, 4), axis=-3),
        Sample.of(randn(3, 0), axis=1),
        Sample.of(np.array([True, False, True]), axis=0),
        Sample.of(np.arange(5, dtype=np.int32), axis=0),
    )),
    "cumprod": Oracle(lambda x, axis: torch.cumprod(x, dim=axis), extra=(
        Sample.of(randn(2, 3, 4), axis=-3),
        Sample.of(randn(3, 0), axis=1),
        Sample.of(np.array([True, False, True]), axis=0),
        Sample.of(np.arange(1, 6, dtype=np.int32), axis=0),
        Sample.of(np.array([0.0, 0.0, 1.5, 0.0, -0.5, 2.0]), axis=0),  # zeros next to each other, and apart
        Sample.of(np.array([[1.5, -0.5, 2.0, 0.0], [0.0, 1.0, 1.0, 1.0]]), axis=1),  # a zero last, and first
    )),
}


# -- the table's tests ----------------------------------------------------------------------------------------------


def _params(order: int) -> list:
    params = []
    for name, oracle in ORACLE.items():
        if oracle.orders < order:
            continue
        for i, case in enumerate([*_declared_samples(name), *oracle.extra]):
            assert all(isinstance(a, np.ndarray) for a in case.args), f"{name}: tensor args must be arrays"
            if order and not _is_float64_case(case):
                continue
            params.append(pytest.param(name, case, id=_case_id(name, i, case)))
    return params


def _op_pair(name: str, sample: Sample) -> tuple[Callable, Callable]:
    return torch_oracle_op_pair(name, sample, ORACLE)


def _quiet_if_nan(sample: Sample):
    """NaN in, NaN out (and in the gradients, 0·NaN): NumPy's warnings about it say nothing here."""
    has_nan = any(a.dtype.kind == "f" and np.isnan(a).any() for a in sample.args)
    return np.errstate(divide="ignore", invalid="ignore") if has_nan else contextlib.nullcontext()


@pytest.mark.parametrize(("name", "sample"), _params(0))
def test_forward(name, sample):
    with _quiet_if_nan(sample):
        check_forward(*_op_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(1))
def test_vjp(name, sample):
    with _quiet_if_nan(sample):
        check_vjp(*_op_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(2))
def test_hvp(name, sample):
    if name == "norm" and sample.kwargs.get("p") == 0.0:
        pytest.skip("p = 0 counts nonzeros: its gradient is a constant 0 (checked by test_zero_gradients_are_constant)")
    with _quiet_if_nan(sample):
        (check_hvp_where_torch_is_nan if ORACLE[name].torch_hvp_nan else check_hvp)(*_op_pair(name, sample),
                                                                                     sample.args)


def check_hvp_where_torch_is_nan(of_fn, torch_fn, arrays, seed: int = 2) -> None:
    """check_hvp, except where torch's double backward meets 0·∞: std at a constant group and the 2-norm at the zero
    vector define their first derivative there as 0 by masking a division by 0. torch masks the quotient, so its
    backward still divides (0/0 = NaN); opforge masks the divisor too, and gives the 0 the convention implies."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(forward(TORCH, torch_fn, arrays).shape)
    vs = [rng.standard_normal(a.shape) for a in arrays if a.dtype.kind == "f"]
    got, want = hvp(OPFORGE, of_fn, arrays, u, vs), hvp(TORCH, torch_fn, arrays, u, vs)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, np.where(np.isnan(w), 0.0, w), f"hvp, derivative {i} (torch's NaN read as 0)")


def test_table_covers_the_ops():
    required = {
        "sign", "expm1", "log1p", "rsqrt", "reciprocal", "sin", "cos", "softplus", "elu", "selu", "gelu", "gelu_grad",
        "asin", "acos", "atan",
        "silu", "erf", "clip", "floor", "ceil", "round", "isnan", "isfinite", "logical_not", "minimum", "logical_and",
        "logical_or", "prod", "amax", "amin", "argmax", "argmin", "var", "std", "logsumexp", "norm",
        "cumsum", "cumprod",
    }
    assert required <= set(ORACLE), f"no oracle for {sorted(required - set(ORACLE))}"


# -- zero gradients ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(F.sign, torch.sign, id="sign"),
    pytest.param(F.floor, torch.floor, id="floor"),
    pytest.param(F.ceil, torch.ceil, id="ceil"),
    pytest.param(F.round, torch.round, id="round"),
    pytest.param(lambda x: F.norm(x, p=0.0), lambda x: torch.linalg.vector_norm(x, ord=0.0), id="norm-p=0"),
])
def test_zero_gradients_are_constant(of_fn, torch_fn):
    # At the jumps too (0 for sign, integers and halves for the others) the gradient is 0, and it does not depend
    # on x: neither framework records anything to differentiate a second time.
    x = _HALVES
    check_vjp(of_fn, torch_fn, [x])
    for fw, fn in ((OPFORGE, of_fn), (TORCH, torch_fn)):
        t = fw.tensor(x, requires_grad=True)
        y = fn(t)
        (g,) = fw.grad([y], [t], grad_outputs=[fw.tensor(np.ones(tuple(y.shape)))], create_graph=True,
                       allow_unused=True)
        assert g is None or (not g.requires_grad and not np.any(fw.numpy(g)))  # torch: None for the norm


# -- kinks: torch's conventions --------------------------------------------------------------------------------------


def test_clip_passes_the_gradient_at_its_bounds():
    x = np.array([-2.0, -0.5, -0.25, 0.0, 0.5, 0.75, 3.0])
    for bounds in ({"min": -0.5, "max": 0.5}, {"min": -0.5}, {"max": 0.5}, {"min": 0.0, "max": 0.0}):
        check_forward(lambda t, b=bounds: F.clip(t, **b), lambda t, b=bounds: torch.clamp(t, **b), [x])
        check_vjp(lambda t, b=bounds: F.clip(t, **b), lambda t, b=bounds: torch.clamp(t, **b), [x])
        check_hvp(lambda t, b=bounds: F.clip(t, **b), lambda t, b=bounds: torch.clamp(t, **b), [x])


def test_clip_with_tensor_bounds_at_ties():
    # x equal to a bound, and min equal to max: which of x, min and max gets the gradient is torch's choice.
    x = np.array([-0.5, 0.5, 0.0, 1.0, -1.0, 2.0])
    lo = np.array([-0.5, -0.5, 0.0, 1.0, 0.0, 3.0])
    hi = np.array([0.5, 0.5, 0.0, 1.0, 0.0, 1.0])
    for args in ([x, lo, hi], [x, lo], [x, hi]):
        of_fn = (lambda t, a, b: F.clip(t, a, b)) if len(args) == 3 else (
            (lambda t, a: F.clip(t, min=a)) if args[1] is lo else (lambda t, b: F.clip(t, max=b)))
        torch_fn = (lambda t, a, b: torch.clamp(t, a, b)) if len(args) == 3 else (
            (lambda t, a: torch.clamp(t, min=a)) if args[1] is lo else (lambda t, b: torch.clamp(t, max=b)))
        check_forward(of_fn, torch_fn, args)
        check_vjp(of_fn, torch_fn, args)


_NAN = float("nan")


@pytest.mark.parametrize("tensors", [False, True], ids=["number-bounds", "tensor-bounds"])
@pytest.mark.parametrize(("lo", "hi"), [(_NAN, None), (None, _NAN), (_NAN, 1.0), (0.0, _NAN), (_NAN, _NAN),
                                        (0.0, None), (None, 1.0), (0.0, 1.0)])
def test_clip_with_nan_follows_torch_but_for_a_nan_in_x(lo, hi, tensors):
    # Decided in issue 30, said in clip's docstring: where a bound is NaN, y is NaN and neither x nor that bound
    # gets a gradient (torch's rule, its comparisons all false). A NaN in x gives x a NaN gradient there (torch: 0),
    # as for every elementwise op; the bounds get torch's gradients there too.
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, np.nan])
    u = np.random.default_rng(0).uniform(0.5, 1.5, x.shape)
    got, want = [], []
    for fw, out in ((OPFORGE, got), (TORCH, want)):
        tx = fw.tensor(x, requires_grad=True)
        bounds = [None if b is None else fw.tensor(np.array(b), requires_grad=True) if tensors else b
                  for b in (lo, hi)]
        with np.errstate(invalid="ignore"):
            y = F.clip(tx, *bounds) if fw is OPFORGE else torch.clamp(tx, *bounds)
            leaves = [tx, *(b for b in bounds if tensors and b is not None)]
            grads = fw.grad([y], leaves, grad_outputs=[fw.tensor(u)])
        out += [fw.numpy(y), *(fw.numpy(g) for g in grads)]
    np.testing.assert_array_equal(got[0], want[0])  # values (NaN where torch has NaN)
    np.testing.assert_array_equal(got[1][:-1], want[1][:-1])  # dx away from x's NaN
    assert np.isnan(got[1][-1]) and want[1][-1] == 0  # the one place opforge departs
    for g, w in zip(got[2:], want[2:]):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(F.elu, TF.elu, id="elu"),
    pytest.param(lambda x: F.elu(x, alpha=0.3), lambda x: TF.elu(x, alpha=0.3), id="elu-alpha=0.3"),
    pytest.param(F.selu, torch.selu, id="selu"),
    pytest.param(lambda x: F.softplus(x, beta=2.0, threshold=1.0), lambda x: TF.softplus(x, beta=2.0, threshold=1.0),
                 id="softplus-threshold"),
])
def test_kinks_follow_torch(of_fn, torch_fn):
    x = np.array([-3.0, -1e-3, -0.0, 0.0, 0.5, 2.0])  # 0 for elu and selu, βx = threshold for softplus
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])


def _with_ties(shape_x, shape_y, seed=3):
    rng = np.random.default_rng(seed)
    return rng.integers(-3, 4, shape_x).astype(np.float64), rng.integers(-3, 4, shape_y).astype(np.float64)


@pytest.mark.parametrize(("shape_x", "shape_y"), [((3, 4), (3, 4)), ((2, 5), (5,)), ((), (2, 3)), ((4, 1), (1, 3))])
def test_minimum_ties_share_the_gradient(shape_x, shape_y):
    x, y = _with_ties(shape_x, shape_y)
    assert np.any(np.broadcast_arrays(x, y)[0] == np.broadcast_arrays(x, y)[1]), "the case must hold ties"
    for of_fn, torch_fn in ((F.minimum, torch.minimum), (F.maximum, torch.maximum)):
        check_forward(of_fn, torch_fn, [x, y])
        check_vjp(of_fn, torch_fn, [x, y])
        check_hvp(of_fn, torch_fn, [x, y])


def test_minimum_and_maximum_with_nan_give_the_gradient_to_both_sides():
    x, y = np.array([np.nan, 1.0, np.nan]), np.array([2.0, np.nan, np.nan])
    for of_fn, torch_fn in ((F.minimum, torch.minimum), (F.maximum, torch.maximum)):
        check_forward(of_fn, torch_fn, [x, y])
        check_vjp(of_fn, torch_fn, [x, y])


_TIES = np.array([[3.0, -1.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -4.0, 0.0, -4.0]])


@pytest.mark.parametrize("name", ["amax", "amin"])  # F.max(x, dim): tests/test_torch_semantics.py
@pytest.mark.parametrize(("axis", "keepdim"), [(None, False), (1, False), (0, True), ([0, 1], True)])
def test_reductions_share_the_gradient_among_ties(name, axis, keepdim):
    torch_fn = getattr(torch, name)
    of_fn = lambda x: getattr(F, name)(x, axis=axis, keepdim=keepdim)  # noqa: E731
    torch_fn = lambda x, f=torch_fn: f(x, dim=dims(x, axis), keepdim=keepdim)  # noqa: E731
    check_forward(of_fn, torch_fn, [_TIES])
    check_vjp(of_fn, torch_fn, [_TIES])
    check_hvp(of_fn, torch_fn, [_TIES])


@pytest.mark.parametrize("p", [math.inf, -math.inf])
@pytest.mark.parametrize("axis", [None, 1])
def test_infinity_norms_share_the_gradient_among_ties(p, axis):
    x = _TIES * np.array([1.0, -1.0, 1.0, -1.0])  # ties in |x| with either sign
    of_fn = lambda t: F.norm(t, p=p, axis=axis)  # noqa: E731
    torch_fn = lambda t: torch.linalg.vector_norm(t, ord=p, dim=axis)  # noqa: E731
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])


def test_argmax_and_argmin_pick_the_first_tie():
    for axis in (None, 0, 1):
        check_forward(lambda t, a=axis: F.argmax(t, axis=a), lambda t, a=axis: torch.argmax(t, dim=a), [_TIES])
        check_forward(lambda t, a=axis: F.argmin(t, axis=a), lambda t, a=axis: torch.argmin(t, dim=a), [_TIES])


@pytest.mark.parametrize("x", [
    pytest.param(np.array([0.0, 1.5, -2.0, 0.5]), id="one-zero"),
    pytest.param(np.array([0.0, 1.5, 0.0, 0.5]), id="two-zeros"),
    pytest.param(np.array([0.0, 0.0, 0.0]), id="all-zeros"),
    pytest.param(np.array([[0.0, 1.5, -2.0], [1.0, 0.0, 0.0], [0.7, 1.1, -0.9]]), id="matrix"),
    pytest.param(np.array(0.0), id="0-d"),
])
def test_prod_with_zeros(x):
    # The gradient at a zero is the product of the others (one zero), or 0 (two or more); and the second
    # derivatives, which are products over all but two elements, must survive the zeros too.
    for axis in [None, 0, -1, [0, -1]][:x.ndim + 1 if x.ndim < 2 else 4]:
        of_fn = lambda t, a=axis: F.prod(t, axis=a)  # noqa: E731
        torch_fn = lambda t, a=axis: torch_prod(t, a, False)  # noqa: E731
        check_forward(of_fn, torch_fn, [x])
        check_vjp(of_fn, torch_fn, [x])
        check_hvp(of_fn, torch_fn, [x])


def test_prod_hessian_with_zeros_is_the_product_of_the_others():
    # Independent of torch: ∂²(x₀x₁x₂x₃)/∂xᵢ∂xⱼ = the product over the two other elements (0 on the diagonal).
    x = np.array([0.0, 1.5, 0.0, 0.5])
    hessian = np.array([[0.0 if i == j else np.prod(np.delete(x, [i, j])) for j in range(4)] for i in range(4)])
    t = of.tensor(x, requires_grad=True)
    (g,) = of.grad(F.prod(t), [t], create_graph=True)
    rows = [of.grad(g, [t], grad_outputs=[of.tensor(np.eye(4)[i])], retain_graph=True)[0].numpy() for i in range(4)]
    np.testing.assert_allclose(np.stack(rows), hessian, rtol=0, atol=1e-15)


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 1.5, 0.5])
def test_norm_of_a_zero_vector(p):
    # The gradient at the zero vector is 0 (PyTorch's subgradient), also when only some groups are zero.
    x = np.array([[0.0, 0.0, 0.0], [0.0, 1.5, -2.0]])
    for axis in (None, 1):
        x_used = x[:1] if axis is None else x
        of_fn = lambda t, a=axis: F.norm(t, p=p, axis=a)  # noqa: E731
        torch_fn = lambda t, a=axis: torch.linalg.vector_norm(t, ord=p, dim=a)  # noqa: E731
        check_forward(of_fn, torch_fn, [x_used])
        check_vjp(of_fn, torch_fn, [x_used])
        if p == 2.0:
            check_hvp_where_torch_is_nan(of_fn, torch_fn, [x_used])


def test_std_of_a_constant_group():
    # The derivative of √var is infinite where var = 0; PyTorch gives 0 there, and so must its double backward.
    x = np.array([[1.5, 1.5, 1.5], [0.5, -1.0, 2.0]])
    for correction in (0, 1):
        of_fn = lambda t, c=correction: F.std(t, axis=1, correction=c)  # noqa: E731
        torch_fn = lambda t, c=correction: torch.std(t, dim=1, correction=c)  # noqa: E731
        check_forward(of_fn, torch_fn, [x])
        check_vjp(of_fn, torch_fn, [x])
        check_hvp_where_torch_is_nan(of_fn, torch_fn, [x])


def test_var_without_degrees_of_freedom():
    # N − correction ≤ 0: inf (NaN for a constant group), as PyTorch (which warns).
    x = np.array([[1.0, 2.0], [3.0, 3.0]])
    with pytest.warns(UserWarning):
        check_forward(lambda t: F.var(t, axis=1, correction=2), lambda t: torch.var(t, dim=1, correction=2), [x])
    with pytest.warns(UserWarning):
        check_forward(lambda t: F.std(t, axis=1, correction=2.5), lambda t: torch.std(t, dim=1, correction=2.5), [x])


def test_logsumexp_with_infinities():
    x = np.array([[-np.inf, 0.5, 1.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0]])
    of_fn, torch_fn = (lambda t: F.logsumexp(t, axis=1)), (lambda t: torch.logsumexp(t, dim=1))
    with np.errstate(invalid="ignore"):
        check_forward(of_fn, torch_fn, [x])
        check_vjp(of_fn, torch_fn, [x[:1]])  # the other rows' gradients are NaN in both (e^(−inf − (−inf)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_third_derivative(approximate):
    # gelu -> gelu_grad (one kernel) -> its rule written with ops -> those ops' rules.
    rng = np.random.default_rng(6)
    x = rng.uniform(-3, 3, (2, 3))
    cotangents = [rng.standard_normal((2, 3)) for _ in range(3)]
    for order in (1, 2, 3):
        got = directional_derivative(OPFORGE, lambda t: F.gelu(t, approximate=approximate), x, cotangents[:order])
        want = directional_derivative(TORCH, lambda t: TF.gelu(t, approximate=approximate), x, cotangents[:order])
        assert_same(got, want, f"derivative of order {order}")


def test_cumsum_gradient_is_a_reversed_cumsum():
    x, u = randn(3, 4), randn(3, 4)
    for axis in (0, 1, -1):
        (got,) = vjp(OPFORGE, lambda t, a=axis: F.cumsum(t, axis=a), [x], u)
        np.testing.assert_allclose(got, np.flip(np.cumsum(np.flip(u, axis), axis), axis), rtol=1e-12)


# -- float32, and programs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "sample"), _params(1))
def test_float32_gradients_stay_float32(name, sample):
    # The conformance suite checks float32 forward passes; gradient rules must not promote either (a NumPy scalar
    # constant in a rule would, for instance). Values are not compared: float64 is what the other tests are for.
    args = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in sample.args]
    of_fn, _ = _op_pair(name, sample)
    xs = [of.tensor(a, requires_grad=a.dtype.kind == "f") for a in args]
    diff = [x for x in xs if x.requires_grad]
    with _quiet_if_nan(sample):
        y = of_fn(*xs)
        grads = of.grad([y], diff, grad_outputs=[of.ones(y.shape, dtype="float32")], create_graph=True,
                        allow_unused=True)
        assert all(g is None or g.dtype == np.float32 for g in grads), [g.dtype for g in grads if g is not None]
        linked = [g for g in grads if g is not None and g.requires_grad]
        if linked and ORACLE[name].orders == 2:
            second = of.grad([F.sum(g * g) for g in linked], diff, allow_unused=True)
            assert all(g is None or g.dtype == np.float32 for g in second), [g.dtype for g in second if g is not None]


PROGRAM_CASES = {
    "prod": lambda x: F.prod(x, axis=[0, 2]),
    "max": lambda x: F.max(x, axis=0).values,  # torch's max along a dim: amax's values, argmax's indices
    "amin": lambda x: F.amin(x, axis=[0, 1], keepdim=True),
    "var": lambda x: F.var(x, axis=0),
    "std": lambda x: F.std(x, axis=[0, 2], correction=0),
    "logsumexp": lambda x: F.logsumexp(x, axis=0),
    "norm": lambda x: F.norm(x, axis=0),
    "norm-p=3": lambda x: F.norm(x, p=3.0, axis=[0, 1]),
    "norm-p=inf": lambda x: F.norm(x, p=math.inf, axis=0),
    "cumsum": lambda x: F.cumsum(x, axis=0),
    "cumprod": lambda x: F.cumprod(F.where(F.abs(x) < 0.3, 0.0, x), axis=0),  # zeros along the unknown dim
    "cumprod-axis=2": lambda x: F.cumprod(x, axis=2),
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "elu": F.elu,
    "softplus": F.softplus,
    "clip": lambda x: F.clip(x, min=-0.5),
    "clip-tensor-bounds": lambda x: F.clip(x, F.sum(x, axis=0) * 0.1, max=F.abs(x[:, :1]) + 0.2),
    "minimum": lambda x: F.minimum(x, x * x),
}


@pytest.mark.parametrize("name", PROGRAM_CASES)
def test_rules_build_programs_with_unknown_dims(name):
    # The same rules emit the backward ops of a program whose batch dim is known only at run time; first and second
    # order gradients must equal eager ones.
    fn = PROGRAM_CASES[name]
    rng = np.random.default_rng(7)
    x, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    program_matches_eager(fn, x, v, (None, 3, 4), g_tol=(1e-12, 1e-14), hv_tol=(1e-10, 1e-12))


# -- wrong calls -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.amax(of.zeros((0, 3)), axis=0), r"amax\(\): cannot reduce over axis 0 of size 0"),
    (lambda: F.amin(of.zeros((2, 0))), r"amin\(\): cannot reduce over axis 1 of size 0"),
    (lambda: F.argmax(of.zeros((0,))), r"argmax\(\): cannot reduce"),
    (lambda: F.argmin(of.zeros((2, 3)), axis=2), r"argmin\(\): axis 2 is out of range"),
    (lambda: F.norm(of.zeros((0,)), p=math.inf), r"norm\(\): cannot reduce"),
    (lambda: F.norm(of.zeros(3), p=math.nan), r"norm\(\): argument 'p'"),
    (lambda: F.cumsum(of.zeros((2, 3)), axis=-3), r"cumsum\(\): axis -3 is out of range"),
    (lambda: F.clip(of.zeros(3)), r"clip\(\): arguments 'min' and 'max' are both None"),
    (lambda: F.gelu(of.zeros(3), approximate="erf"), r"gelu\(\): argument 'approximate'"),
    (lambda: F.softplus(of.zeros(3), beta=0.0), r"softplus\(\): argument 'beta'"),
    (lambda: F.sin(of.tensor([1, 2])), r"sin\(\): argument 'x' expected dtype"),
])
def test_wrong_calls_name_the_op(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()


# -- integer division by zero (issue 30) ------------------------------------------------------------------------------


_INT_DIVISIONS = [
    pytest.param(F.floor_divide, torch.floor_divide, "floor_divide", id="floor_divide"),
    pytest.param(F.remainder, torch.remainder, "remainder", id="remainder"),
    pytest.param(lambda x, y: x // y, lambda x, y: x // y, "floor_divide", id="//"),
    pytest.param(lambda x, y: x % y, lambda x, y: x % y, "remainder", id="%"),
]


@pytest.mark.parametrize(("of_fn", "torch_fn", "op_name"), _INT_DIVISIONS)
@pytest.mark.parametrize("y", [np.array([2, 0, -3]), np.array(0, np.int32), np.array([[1], [0]], np.int32)],
                         ids=["vector", "0-d", "broadcast"])
def test_integer_division_by_zero_raises_eagerly_and_compiled(of_fn, torch_fn, op_name, y):
    # NumPy gives 0 (and a warning); torch raises RuntimeError("ZeroDivisionError"), Python ZeroDivisionError.
    x = np.array([7, -7, 5])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch_fn(torch.tensor(x), torch.tensor(y))
    for run in (of_fn, of.compile(of_fn)):
        with pytest.raises(of.DivisionByZeroError, match=rf"^{op_name}\(\): integer division by zero") as caught:
            run(of.tensor(x), of.tensor(y))
        assert isinstance(caught.value, ZeroDivisionError) and isinstance(caught.value, ValueError)
    with pytest.raises(of.DivisionByZeroError):
        of_fn(of.tensor(x), 0)  # a Python 0


def test_integer_division_by_zero_of_nothing_and_float_division_by_zero_do_not_raise():
    empty = np.zeros((0, 3), np.int64)
    assert F.floor_divide(of.tensor(empty), of.tensor([0, 1, 2])).shape == (0, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        for x, y in [(np.array([1.0, -1.0]), np.array(0.0)), (np.array([1, -1]), np.array(0.0)),
                     (np.array([1.0, -1.0]), np.array(0))]:
            for of_fn, torch_fn in [(F.floor_divide, torch.floor_divide), (F.remainder, torch.remainder)]:
                got = of_fn(of.tensor(x), of.tensor(y)).numpy()
                want = torch_fn(torch.tensor(x), torch.tensor(y)).numpy()
                np.testing.assert_array_equal(got, want)
