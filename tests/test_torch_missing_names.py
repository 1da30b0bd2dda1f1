"""torch's names that opforge lacked and now has as functions of ops (signbit, heaviside, trapezoid and trapz,
cumulative_trapezoid, cartesian_prod, combinations, cov, corrcoef, vander, and the Tensor methods torch has among
them), against torch 2.13: values, dtypes and shapes on ordinary and edge inputs (-0.0 and NaN, empty tensors,
integers and bools, no degrees of freedom), the same refusals, and float64 gradients against torch.autograd's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opforge as of

RNG = np.random.default_rng(0)
M = RNG.standard_normal((3, 5))
V = RNG.standard_normal(4)
NAN, INF = np.nan, np.inf


def f(*values, dtype=np.float64):
    return np.array(values, dtype=dtype)


def _pair(v, lib):
    if isinstance(v, np.ndarray):
        return torch.tensor(v) if lib is torch else of.tensor(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_pair(x, lib) for x in v)
    return v


def _call(lib, name, args, kwargs):
    try:
        return getattr(lib, name)(*_pair(args, lib), **{k: _pair(v, lib) for k, v in kwargs.items()})
    except Exception as e:  # (both must fail: compared by kind of outcome)
        return e


def _same(ours, theirs, what):
    if isinstance(theirs, Exception):
        assert isinstance(ours, Exception), f"{what}: torch refuses ({theirs}), opforge gave {ours!r}"
        return
    assert not isinstance(ours, Exception), f"{what}: opforge refused ({ours}), torch gave {theirs!r}"
    want = theirs.detach().numpy()
    got = ours.detach().numpy()
    assert (got.dtype, got.shape) == (want.dtype, want.shape), what
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(want.dtype).eps, atol=4 * np.finfo(want.dtype).eps,
                                   err_msg=what)
        np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]), err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


# (name, args, kwargs): NumPy arrays stand for tensors
CALLS = [
    ("signbit", (f(-0.0, 0.0, NAN, -NAN, -1.0, INF, -INF, 2.5),), {}),
    ("signbit", (f(-0.0, 1.0, dtype=np.float32),), {}),
    ("signbit", (f(-3, 0, 4, dtype=np.int64),), {}),
    ("signbit", (f(-3, 0, 4, dtype=np.int32),), {}),
    ("signbit", (f(True, False, dtype=bool),), {}),
    ("signbit", (f(dtype=np.float32),), {}),
    ("heaviside", (f(-1.0, -0.0, 0.0, 2.0, NAN, -INF, INF), f(0.5)), {}),
    ("heaviside", (M, M[0]), {}),
    ("heaviside", (f(-2, 0, 3, dtype=np.int64), np.array(7)), {}),
    ("heaviside", (f(True, False, dtype=bool), np.array(True)), {}),
    ("heaviside", (f(-1.0, 0.0), np.array(0.5, np.float32)), {}),  # dtypes differ: refused
    ("heaviside", (f(-1.0, 0.0), 0.5), {}),  # values must be a tensor
    ("heaviside", (f(dtype=np.float32), f(1.0, dtype=np.float32)), {}),
    ("trapezoid", (M,), {}),
    ("trapezoid", (M,), {"dim": 0}),
    ("trapezoid", (M,), {"dx": 0.25}),
    ("trapezoid", (M,), {"dx": 3}),
    ("trapezoid", (M, np.sort([*V.tolist(), 2.0])), {}),
    ("trapezoid", (M, np.sort(RNG.standard_normal(3))), {"dim": 0}),
    ("trapezoid", (M, RNG.standard_normal((3, 5))), {}),
    ("trapezoid", (M, RNG.standard_normal((1, 5))), {"dim": 0}),
    ("trapezoid", (M, RNG.standard_normal(4)), {}),  # one x per sample: refused
    ("trapezoid", (f(1, 2, 4, dtype=np.int64),), {}),
    ("trapezoid", (f(1, 2, 4, dtype=np.int64), f(0, 1, 3, dtype=np.int64)), {}),
    ("trapezoid", (f(1, 2, 4, dtype=np.int64),), {"dx": 2}),
    ("trapezoid", (f(dtype=np.int64),), {}),
    ("trapezoid", (np.zeros((2, 0, 3)),), {"dim": 1}),
    ("trapezoid", (f(2.5),), {}),
    ("trapezoid", (np.array(1.0),), {}),
    ("trapezoid", (f(True, False, dtype=bool),), {}),
    ("trapezoid", (M, 2), {}),  # a number is dx=, not x
    ("trapezoid", (M,), {"dim": 2}),
    ("trapz", (M,), {"dx": 0.5}),
    ("trapz", (M, np.sort([*V.tolist(), 2.0])), {}),
    ("cumulative_trapezoid", (M,), {}),
    ("cumulative_trapezoid", (M,), {"dim": 0, "dx": 0.5}),
    ("cumulative_trapezoid", (M, np.sort([*V.tolist(), 2.0])), {}),
    ("cumulative_trapezoid", (M, RNG.standard_normal((3, 5))), {"dim": 0}),
    ("cumulative_trapezoid", (f(1, 2, 4, dtype=np.int64),), {}),
    ("cumulative_trapezoid", (f(1, 2, 4, dtype=np.int64), f(0, 1, 3, dtype=np.int64)), {}),
    ("cumulative_trapezoid", (f(dtype=np.int64),), {}),
    ("cumulative_trapezoid", (f(1.5),), {"dx": 2}),
    ("cumulative_trapezoid", (f(True, dtype=bool),), {}),
    ("cartesian_prod", (V,), {}),
    ("cartesian_prod", (V, M[0], f(1.0, 2.0)), {}),
    ("cartesian_prod", (f(1, 2, dtype=np.int64), f(3, 4, 5, dtype=np.int64)), {}),
    ("cartesian_prod", (f(1, 2, dtype=np.int64), f(dtype=np.int64)), {}),
    ("cartesian_prod", (f(1, 2, dtype=np.int64), f(1.0)), {}),  # dtypes differ: refused
    ("cartesian_prod", (M,), {}),
    ("cartesian_prod", (np.array(1.0), V), {}),
    ("combinations", (V,), {}),
    ("combinations", (V, 3), {}),
    ("combinations", (V, 3, True), {}),
    ("combinations", (V,), {"r": 2, "with_replacement": True}),
    ("combinations", (V, 1), {}),
    ("combinations", (V, 0), {}),
    ("combinations", (V, 5), {}),
    ("combinations", (V, 5, True), {}),
    ("combinations", (f(1, 1, 2, dtype=np.int64),), {}),  # equal values: positions, not values, are combined
    ("combinations", (f(dtype=np.float32),), {}),
    ("combinations", (f(dtype=np.float32), 0), {}),
    ("combinations", (f(True, False, dtype=bool), 2, True), {}),
    ("combinations", (V, -1), {}),
    ("combinations", (M,), {}),
    ("combinations", (np.array(1.0),), {}),
    ("cov", (M,), {}),
    ("cov", (M,), {"correction": 0}),
    ("cov", (M,), {"correction": 3}),
    ("cov", (M.T,), {}),
    ("cov", (V,), {}),
    ("cov", (M[:1],), {}),
    ("cov", (np.array(2.0),), {}),
    ("cov", (M[:, :1],), {}),  # one observation: no degrees of freedom (torch warns): NaN
    ("cov", (np.zeros((2, 0)),), {}),
    ("cov", (np.zeros((0, 3)),), {}),
    ("cov", (f(1, 2, 4, 7, dtype=np.int64),), {}),
    ("cov", (np.arange(12, dtype=np.int32).reshape(3, 4),), {}),
    ("cov", (M.astype(np.float32),), {}),
    ("cov", (f(True, False, dtype=bool),), {}),
    ("cov", (np.zeros((2, 2, 2)),), {}),
    ("cov", (M,), {"fweights": f(1, 2, 0, 1, 3, dtype=np.int64)}),
    ("cov", (M,), {"aweights": f(0.5, 2.0, 1.0, 0.0, 1.5)}),
    ("cov", (M.astype(np.float32),), {"aweights": f(0.5, 2.0, 1.0, 0.0, 1.5)}),  # float64 weights: a float64 cov
    ("cov", (M,), {"fweights": f(1, 2, 0, 1, 3, dtype=np.int64), "aweights": f(0.5, 2.0, 1.0, 0.0, 1.5)}),
    ("cov", (M,), {"fweights": f(1, 2, 0, 1, 3, dtype=np.int64), "aweights": f(0.5, 2.0, 1.0, 0.0, 1.5),
                   "correction": 0}),
    ("cov", (np.arange(10, dtype=np.int64).reshape(2, 5),), {"fweights": f(1, 2, 0, 1, 3, dtype=np.int64)}),
    ("cov", (f(1.0, 2.0, 4.0),), {"aweights": f(1.0, 1e-3, 1e-3), "correction": 2}),  # no freedom left (warns)
    ("cov", (f(2.5),), {"fweights": np.array(3)}),
    ("cov", (M,), {"fweights": f(0, 0, 0, 0, 0, dtype=np.int64)}),  # sum to zero: refused
    ("cov", (M,), {"fweights": f(1, -2, 0, 1, 3, dtype=np.int64)}),  # negative: refused
    ("cov", (M,), {"aweights": f(1.0, -2, 0, 1, 3)}),
    ("cov", (M,), {"fweights": f(1.0, 2, 0, 1, 3)}),  # not integers: refused
    ("cov", (M,), {"aweights": f(1, 2, 0, 1, 3, dtype=np.int64)}),  # not floats: refused
    ("cov", (M,), {"fweights": f(1, 2, 0, dtype=np.int64)}),  # not one per observation: refused
    ("cov", (M,), {"aweights": np.ones((1, 5))}),
    ("corrcoef", (M,), {}),
    ("corrcoef", (M.T,), {}),
    ("corrcoef", (V,), {}),
    ("corrcoef", (np.array([[1.0, 2.0, 4.0], [1.0, 1.0, 1.0]]),), {}),  # a constant row: NaN
    ("corrcoef", (f(3.0, 3.0, 3.0),), {}),
    ("corrcoef", (np.zeros((0, 3)),), {}),
    ("corrcoef", (f(1, 2, 4, 7, dtype=np.int64),), {}),
    ("corrcoef", (np.array([[1, 2, 4], [3, 2, 0]], dtype=np.int64),), {}),
    ("corrcoef", (np.zeros((2, 2, 2)),), {}),
    ("vander", (V,), {}),
    ("vander", (V, 6), {}),
    ("vander", (V,), {"N": 3, "increasing": True}),
    ("vander", (V, 1), {}),
    ("vander", (V, 0), {}),
    ("vander", (f(1, 2, -3, 0, dtype=np.int64),), {}),
    ("vander", (f(1, 2, -3, dtype=np.int32), 4), {}),
    ("vander", (f(True, False, dtype=bool),), {}),
    ("vander", (f(1.5, 2.0, dtype=np.float32), 3, True), {}),
    ("vander", (f(0.0, -0.0, NAN, INF), 4), {}),
    ("vander", (f(dtype=np.float32), 3), {}),
    ("vander", (V, -1), {}),
    ("vander", (M,), {}),
]


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@pytest.mark.parametrize(("name", "args", "kwargs"), CALLS, ids=lambda v: v if isinstance(v, str) else "")
def test_as_torch(name, args, kwargs):
    _same(_call(of, name, args, kwargs), _call(torch, name, args, kwargs), f"{name}{args!r} {kwargs}")


def test_refusals_name_the_function_and_the_difference():
    x = of.tensor(f(-1.0, 0.0))
    with pytest.raises(of.ArgumentError, match=r"heaviside\(\): input and values must have one dtype"):
        of.heaviside(x, of.tensor(np.array(0.5, np.float32)))
    with pytest.raises(of.ArgumentError, match=r"cov\(\): fweights cannot be negative"):
        of.cov(of.tensor(M), fweights=of.tensor([1, 2, -1, 1, 1]))
    with pytest.raises(of.ArgumentError, match=r"cov\(\): expected aweights to have a floating dtype, got int64"):
        of.cov(of.tensor(M), aweights=of.tensor([1, 2, 1, 1, 1]))
    with pytest.raises(of.ArgumentError, match=r"cov\(\): aweights in a traced program"):
        of.compile(lambda m, w: of.cov(m, aweights=w))(of.tensor(M), of.tensor(f(1.0, 2, 1, 1, 1)))
    with pytest.raises(of.ArgumentError, match=r"trapezoid\(\): argument 'x' must be a tensor .* dx="):
        of.trapezoid(x, 2)
    with pytest.raises(of.ArgumentError, match=r"trapezoid\(\): give x or dx, not both"):
        of.trapezoid(x, x, dx=2)
    with pytest.raises(of.ArgumentError, match=r"cartesian_prod\(\): the tensors must have one dtype"):
        of.cartesian_prod(of.tensor([1, 2]), x)
    with pytest.raises(of.ArgumentError, match=r"combinations\(\): argument 'r' must be an int >= 0, got -1"):
        of.combinations(x, -1)
    with pytest.raises(of.ShapeError, match=r"vander\(\): x must be a one-dimensional tensor"):
        of.vander(of.tensor(M))


def test_cov_warns_as_torch_when_no_degrees_of_freedom_are_left():
    with pytest.warns(UserWarning, match=r"cov\(\): degrees of freedom is <= 0"), np.errstate(invalid="ignore"):
        got = of.cov(of.tensor(M[:, :1]))  # (pytest.warns shows NumPy's 0/0 warning too: docs/pytorch.md)
    assert np.isnan(got.numpy()).all()


# the Tensor methods torch has among these names: (method, args) on M's rows or V
METHODS = [("signbit", ()), ("heaviside", (np.array(0.5),)), ("cov", ()), ("corrcoef", ())]


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@pytest.mark.parametrize(("method", "args"), METHODS, ids=lambda v: v if isinstance(v, str) else "")
def test_methods_as_torch(method, args):
    x = M.copy()
    x[0, 0] = -0.0
    x[1, 2] = 0.0
    assert hasattr(torch.Tensor, method)
    _same(getattr(of.tensor(x), method)(*_pair(args, of)), getattr(torch.tensor(x), method)(*_pair(args, torch)),
          method)


def test_heaviside_in_place_as_torch():
    ours, theirs = of.tensor(f(-1.0, 0.0, 3.0, NAN)), torch.tensor(f(-1.0, 0.0, 3.0, NAN))
    alias = ours
    assert ours.heaviside_(of.tensor(f(0.25))) is alias
    theirs.heaviside_(torch.tensor(f(0.25)))
    _same(alias, theirs, "heaviside_")


def test_differential_names_are_missing_no_more():
    for name in ("signbit", "heaviside", "trapezoid", "trapz", "cumulative_trapezoid", "cartesian_prod",
                 "combinations", "cov", "corrcoef", "vander"):
        assert callable(getattr(of, name)) and callable(getattr(of.ops, name)), name


# -- gradients, float64, against torch.autograd: (name, tensors differentiated, other args, kwargs) ----------------
GRADIENTS = [
    ("trapezoid", (M,), (), {}),
    ("trapezoid", (M,), (), {"dx": 0.3, "dim": 0}),
    ("trapezoid", (M, np.sort(RNG.standard_normal(5))), (), {}),
    ("trapezoid", (M, RNG.standard_normal((3, 5))), (), {"dim": 0}),
    ("trapz", (M, np.sort(RNG.standard_normal(5))), (), {}),
    ("cumulative_trapezoid", (M,), (), {"dx": 2.0}),
    ("cumulative_trapezoid", (M, RNG.standard_normal((3, 5))), (), {}),
    ("cartesian_prod", (V, M[0]), (), {}),
    ("combinations", (V,), (3,), {}),
    ("combinations", (V,), (2, True), {}),
    ("cov", (M,), (), {}),
    ("cov", (V,), (), {"correction": 0}),
    ("corrcoef", (M,), (), {}),
    ("corrcoef", (M.T[:3],), (), {}),
    ("vander", (f(0.5, -1.5, 0.0, 2.0),), (), {}),
    ("vander", (f(0.5, -1.5, 0.0),), (5, True), {}),
]


@pytest.mark.parametrize(("name", "tensors", "args", "kwargs"), GRADIENTS,
                         ids=lambda v: v if isinstance(v, str) else "")
def test_gradients_as_torch(name, tensors, args, kwargs):
    theirs_in = [torch.tensor(t, requires_grad=True) for t in tensors]
    ours_in = [of.tensor(t, requires_grad=True) for t in tensors]
    theirs = getattr(torch, name)(*theirs_in, *args, **kwargs)
    ours = getattr(of, name)(*ours_in, *args, **kwargs)
    cotangent = RNG.standard_normal(theirs.shape)
    if name == "vander":  # torch's vander writes in place and cannot differentiate: the same powers through pow
        x, columns = theirs_in[0], (args[0] if args else len(tensors[0]))
        powers = torch.pow(x[:, None], torch.arange(columns, dtype=torch.float64))
        theirs = powers if args[1:] == (True,) else powers.flip(1)
    want = [g.numpy() for g in torch.autograd.grad(theirs, theirs_in, torch.tensor(cotangent))]
    got = of.grad(of.ops.sum(ours * of.tensor(cotangent)), ours_in)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-10, atol=1e-12, err_msg=name)
    assert of.testing.gradcheck(lambda *xs: getattr(of, name)(*xs, *args, **kwargs), ours_in)


def test_weighted_cov_gradients_as_torch():
    # the gradient reaches the input and the aweights (fweights are integers), as torch's
    fweights, aweights, cotangent = f(1, 2, 0, 1, 3, dtype=np.int64), f(0.5, 2.0, 1.0, 0.25, 1.5), M[:, :3].T @ M[:, :3]
    theirs = [torch.tensor(M, requires_grad=True), torch.tensor(aweights, requires_grad=True)]
    ours = [of.tensor(M, requires_grad=True), of.tensor(aweights, requires_grad=True)]
    want = torch.autograd.grad(torch.cov(theirs[0], fweights=torch.tensor(fweights), aweights=theirs[1],
                                         correction=2), theirs, torch.tensor(cotangent))
    got = of.grad(of.ops.sum(of.cov(ours[0], fweights=of.tensor(fweights), aweights=ours[1], correction=2)
                             * of.tensor(cotangent)), ours)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)
    assert of.testing.gradcheck(lambda m, a: of.cov(m, fweights=of.tensor(fweights), aweights=a, correction=2), ours)


def test_heaviside_differentiates_in_values():
    # torch's heaviside has no derivative ("not implemented"); opforge's is where's: the incoming gradient goes to
    # values where input is 0 (broadcast values summed), none to input (0 almost everywhere)
    x, values = of.tensor(f(-1.0, 0.0, 2.0, 0.0)), of.tensor(f(0.5, 0.25, 3.0, -1.0), requires_grad=True)
    cotangent = f(1.0, 2.0, 3.0, 4.0)
    (g,) = of.grad(of.ops.sum(of.heaviside(x, values) * of.tensor(cotangent)), [values])
    np.testing.assert_array_equal(g.numpy(), f(0.0, 2.0, 0.0, 4.0))
    one = of.tensor(f(0.5), requires_grad=True)
    (g,) = of.grad(of.ops.sum(of.heaviside(x, one) * of.tensor(cotangent)), [one])
    np.testing.assert_array_equal(g.numpy(), f(6.0))
    assert of.testing.gradcheck(lambda v: of.heaviside(x, v), [values])
    with pytest.raises(RuntimeError, match="derivative for aten::heaviside is not implemented"):
        t = torch.tensor(f(0.5), requires_grad=True)
        torch.heaviside(torch.tensor(f(0.0)), t).sum().backward()


def test_compiled_as_eager():
    def program(m, v):
        return (of.cov(m), of.corrcoef(m), of.trapezoid(m, dx=0.5), of.cumulative_trapezoid(m, v, dim=0),
                of.combinations(m[0], 2), of.cartesian_prod(v, v), of.vander(v, 4), of.signbit(-m),
                of.heaviside(m, v[:1]))

    m, v = of.tensor(M), of.tensor(f(0.5, -1.0, 2.0))
    for got, want in zip(of.compile(program)(m, v), program(m, v)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
