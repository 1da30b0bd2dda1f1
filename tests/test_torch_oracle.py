"""PyTorch as the oracle: opforge's ops agree with torch on values, first and second derivatives, in float64.

``ORACLE`` (below) is the specification. It maps an opforge op name to an ``Oracle``:

* ``torch_fn(*tensors, **attrs)`` computes the same thing with torch. It gets the op's tensor arguments as torch
  tensors and the op's attrs as keywords (defaults filled in from the op's signature).
* ``extra`` cases are added to the op's own samples (``@op.samples``, or the defaults its traits give when it
  declares none, exactly as the conformance suite picks them): 0-d tensors, broadcasting, edge cases.

Every (op, case) runs through three tests, one per derivative order:

* ``test_forward``: the same values, shape and dtype;
* ``test_vjp``: the same vector-Jacobian products ``u·∂f/∂x`` for a random cotangent ``u``;
* ``test_hvp``: the same gradients of ``<vjp(u), v>`` with respect to the inputs *and* to ``u`` (double backward with
  ``create_graph=True`` in both frameworks): Hessian-vector products, and the derivative of the backward pass itself.

Gradient tests run for float64 cases only. Dedicated tests follow the table: ties of ``maximum``, kinks (0 for relu,
abs and leaky_relu, the switch point of smooth_l1), third derivatives of ``sqrt``, and ``Tensor`` indexing (torch has
no negative steps: those compare against slicing with a positive step and ``torch.flip``).

Both frameworks run through the same helpers (``OPFORGE`` and ``TORCH`` below adapt their few API differences),
so each comparison is between the same computation done twice.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import opforge as of
from opforge import Sample
from opforge import ops as F
from opforge.testing import call_op

TF = torch.nn.functional

# float64 throughout: both sides compute the same formulas, so they agree to a few ulps.
RTOL = 1e-7
ATOL = 1e-9

# -- inputs for the extra cases ----------------------------------------------------------------------------------

_rng = np.random.default_rng(20240601)


def randn(*shape) -> np.ndarray:
    return np.asarray(_rng.standard_normal(shape))


def uniform(low: float, high: float, *shape) -> np.ndarray:
    return np.asarray(_rng.uniform(low, high, shape))


# -- torch counterparts that are more than one call ------------------------------------------------------------


def torch_smooth_l1(x, sigma):
    """MXNet's smooth L1, 0.5·(σx)² where |x| < 1/σ², else |x| − 0.5/σ², is torch's smooth_l1_loss against 0 with
    beta = 1/σ²: that is 0.5·x²/β = 0.5·σ²x² inside and |x| − 0.5·β = |x| − 0.5/σ² outside (no extra factor)."""
    return TF.smooth_l1_loss(x, torch.zeros_like(x), reduction="none", beta=1.0 / (sigma * sigma))


def torch_vjp(fn):
    """The counterpart of a dedicated gradient op ``op_grad(x, dy, **attrs)``: torch's own VJP of ``fn``, computed
    with create_graph=True so that it can be differentiated again."""

    def vjp(x, dy, **attrs):
        if not x.requires_grad:
            x = x.detach().requires_grad_()
        (dx,) = torch.autograd.grad(fn(x, **attrs), x, dy, create_graph=True)
        return dx

    return vjp


def torch_sum_to(x, shape):
    """Sums ``x`` down to ``shape``: over the leading dims broadcasting added, then over the dims it stretched."""
    lead = x.dim() - len(shape)
    if lead:
        x = x.sum(dim=tuple(range(lead)))
    stretched = [i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1]
    return x.sum(dim=stretched, keepdim=True) if stretched else x


def torch_transpose(x, perm):
    return x.permute(tuple(reversed(range(x.dim()))) if perm is None else tuple(perm))


def torch_index(t, index):
    """``t[index]`` for ints, slices, None and Ellipsis. Torch only slices with a step > 0, so a slice with a
    negative step takes the same elements with the positive step, and the result is flipped along that dim."""
    items = index if isinstance(index, tuple) else (index,)
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    at = next((i for i, item in enumerate(items) if item is Ellipsis), None)
    fill = (slice(None),) * (t.dim() - used)
    items = items + fill if at is None else items[:at] + fill + items[at + 1:]
    out, flips, dim = [], [], 0  # dim: the input dim the next item indexes
    for item in items:
        if isinstance(item, slice):
            r = range(*item.indices(t.shape[dim]))
            if r.step < 0:
                flips.append(len(out) - sum(isinstance(o, int) for o in out))  # the item's dim in the result
                item = slice(r[-1], r[0] + 1, -r.step) if r else slice(0, 0)
            dim += 1
        elif item is not None:
            dim += 1
        out.append(item)
    y = t[tuple(out)]
    return y.flip(flips) if flips else y


def torch_slice(x, axes, starts, ends, steps):
    """opforge's ``slice`` attrs are normalised indices where a negative end means "past index 0" (a negative step
    running to the start); everything else reads as Python's ``start:end:step``."""
    index = [slice(None)] * x.dim()
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, e if e >= 0 else None, st)
    return torch_index(x, tuple(index))


def torch_slice_grad(dy, shape, **slicing):
    """The adjoint of ``slice``: torch's VJP of ``torch_slice`` (linear, so taken at zeros of ``shape``)."""
    x = torch.zeros(tuple(shape), dtype=dy.dtype, requires_grad=True)
    (dx,) = torch.autograd.grad(torch_slice(x, **slicing), x, dy, create_graph=True)
    return dx


# -- the table ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Oracle:
    torch_fn: Callable  # (*torch tensors, **attrs) -> torch tensor
    extra: tuple = ()  # Samples added to the op's declared samples


ORACLE: dict[str, Oracle] = {
    # -- elementwise, one tensor ---------------------------------------------------------------------------------
    "identity": Oracle(lambda x: x.clone()),
    "scale": Oracle(lambda x, scale: x * scale),
    "neg": Oracle(torch.neg),
    "exp": Oracle(torch.exp),
    "log": Oracle(torch.log),
    "tanh": Oracle(torch.tanh),
    "sigmoid": Oracle(torch.sigmoid),
    "relu": Oracle(torch.relu),
    "abs": Oracle(torch.abs),
    "square": Oracle(torch.square),
    "sqrt": Oracle(torch.sqrt),
    "leaky_relu": Oracle(lambda x, alpha: TF.leaky_relu(x, negative_slope=alpha)),
    "smooth_l1": Oracle(torch_smooth_l1, extra=(
        Sample.of(uniform(-6, 6, 2, 5), sigma=0.5),  # both sides of |x| = 1/σ² = 4
    )),
    "cast": Oracle(lambda x, dtype: x.to(getattr(torch, str(np.dtype(dtype))))),
    # -- dedicated gradient ops ------------------------------------------------------------------------------------
    "sqrt_grad": Oracle(lambda y, dy: dy / (2 * y), extra=(
        Sample.of(uniform(0.5, 2.0), randn()),
    )),
    "leaky_relu_grad": Oracle(torch_vjp(lambda x, alpha: TF.leaky_relu(x, negative_slope=alpha)), extra=(
        Sample.of(randn(), randn(), alpha=1.5),
        Sample.of(randn(5), randn(5), alpha=0.0),
    )),
    "smooth_l1_grad": Oracle(torch_vjp(torch_smooth_l1), extra=(
        Sample.of(np.array(0.2), randn(), sigma=2.0),
        Sample.of(uniform(-6, 6, 2, 5), randn(2, 5), sigma=0.5),
    )),
    # -- binary, broadcasting --------------------------------------------------------------------------------------
    "add": Oracle(torch.add),
    "sub": Oracle(torch.sub),
    "minus": Oracle(torch.sub),
    "mul": Oracle(torch.mul),
    "div": Oracle(torch.div),
    "pow": Oracle(torch.pow, extra=(  # bases > 0, so xʸ and its derivative in y (xʸ·ln x) are real
        Sample.of(uniform(0.5, 2.0, 4, 1), uniform(-2.0, 2.0, 1, 3)),
        Sample.of(uniform(0.5, 2.0), uniform(-2.0, 2.0, 2, 3)),
    )),
    "maximum": Oracle(torch.maximum, extra=(
        Sample.of(randn(), randn(2, 1)),
        Sample.of(randn(4, 1), randn(1, 3)),
    )),
    "where": Oracle(torch.where, extra=(
        Sample.of(np.array(True), randn(2, 3), randn(3)),
        Sample.of(randn(2, 1) > 0, randn(), randn(1, 3)),
    )),
    # -- reductions --------------------------------------------------------------------------------------------------
    "sum": Oracle(lambda x, axis, keepdim: torch.sum(x, dim=axis, keepdim=keepdim), extra=(
        Sample.of(randn(2, 3, 4), axis=None, keepdim=True),
        Sample.of(randn(2, 3, 4), axis=-2, keepdim=True),
        Sample.of(randn(2, 3), axis=[1, 0]),
        Sample.of(randn(), axis=0),
        Sample.of(randn(), axis=-1, keepdim=True),
    )),
    "mean": Oracle(lambda x, axis, keepdim: torch.mean(x, dim=axis, keepdim=keepdim), extra=(
        Sample.of(randn(2, 3, 4), axis=None, keepdim=True),
        Sample.of(randn(2, 3, 4), axis=-2, keepdim=True),
        Sample.of(randn(2, 3), axis=[1, 0]),
        Sample.of(randn(), axis=0),
        Sample.of(randn(), axis=-1, keepdim=True),
    )),
    "sum_to": Oracle(torch_sum_to, extra=(
        Sample.of(randn(2, 3, 4), shape=[2, 1, 4]),
        Sample.of(randn(4, 3), shape=[3]),
        Sample.of(randn(), shape=[]),
    )),
    # -- shape ---------------------------------------------------------------------------------------------------------
    "reshape": Oracle(lambda x, shape: x.reshape(shape), extra=(
        Sample.of(randn(1, 1), shape=[]),
        Sample.of(randn(4), shape=[2, -1]),
    )),
    "transpose": Oracle(torch_transpose, extra=(
        Sample.of(randn()),
        Sample.of(randn(3)),
        Sample.of(randn(2, 3, 4, 5), perm=[3, 1, 0, 2]),
    )),
    "broadcast_to": Oracle(lambda x, shape: torch.broadcast_to(x, shape), extra=(
        Sample.of(randn(3), shape=[2, 3]),
        Sample.of(randn(2, 1), shape=[2, 1]),
    )),
    "slice": Oracle(torch_slice, extra=(
        Sample.of(randn(4, 5), axes=[1], starts=[4], ends=[-1], steps=[-1]),  # the whole dim, reversed
        Sample.of(randn(3, 4, 5), axes=[0, 2], starts=[0, 1], ends=[3, 5], steps=[2, 3]),
        Sample.of(randn(3, 4), axes=[1], starts=[3], ends=[3], steps=[1]),  # empty
    )),
    "slice_grad": Oracle(torch_slice_grad, extra=(
        Sample.of(randn(2, 3), shape=[4, 5], axes=[0, 1], starts=[3, 0], ends=[-1, 5], steps=[-2, 2]),
        Sample.of(randn(3, 2, 5), shape=[3, 4, 5], axes=[1], starts=[3], ends=[0], steps=[-2]),
    )),
    # -- linear algebra ------------------------------------------------------------------------------------------------
    "matmul": Oracle(torch.matmul, extra=(  # declared: 2-D, batched, broadcast batch, vector·matrix, dot, ...
        Sample.of(randn(3), randn(2, 3, 4)),  # vector @ batch of matrices
        Sample.of(randn(2, 1, 2, 3), randn(3, 3, 2)),  # 4-D batch broadcast against 3-D
    )),
}


# -- cases -------------------------------------------------------------------------------------------------------


def _declared_samples(name: str) -> list:
    """The op's own samples, picked as the conformance suite picks them."""
    opdef = of.registry.get(name)
    rng = np.random.default_rng(0)
    return list(opdef.samples_fn(rng) if opdef.samples_fn else of.testing.default_samples(opdef, rng))


def _is_float64_case(sample: Sample) -> bool:
    """Gradients are compared only where every tensor is float64 (or a bool condition) and no cast leaves it."""
    kinds_ok = all(a.dtype == np.float64 or a.dtype == np.bool_ for a in sample.args)
    has_float = any(a.dtype == np.float64 for a in sample.args)
    return kinds_ok and has_float and np.dtype(sample.kwargs.get("dtype") or "float64") == np.float64


def _case_id(name: str, i: int, sample: Sample) -> str:
    shapes = "x".join(str(a.shape).replace(" ", "") for a in sample.args)
    attrs = "".join(f",{k}={v}" for k, v in sample.kwargs.items()).replace(" ", "")
    return f"{name}-{i}[{shapes}{attrs}]"


def _params(gradients: bool) -> list:
    params = []
    for name in ORACLE:
        for i, case in enumerate([*_declared_samples(name), *ORACLE[name].extra]):
            assert all(isinstance(a, np.ndarray) for a in case.args), f"{name}: tensor args must be arrays"
            if gradients and not _is_float64_case(case):
                continue
            params.append(pytest.param(name, case, id=_case_id(name, i, case)))
    return params


def _op_pair(name: str, sample: Sample, table: dict | None = None) -> tuple[Callable, Callable]:
    """The op applied to tensors in opforge and in torch, attrs bound (torch gets the signature's defaults too).
    ``table`` is the oracle table to read (this file's by default; the family files pass theirs)."""
    opdef = of.registry.get(name)
    attrs = {**{p.name: p.default for p in opdef.attrs if p.has_default}, **sample.kwargs}
    torch_fn = (table or ORACLE)[name].torch_fn
    return (lambda *xs: call_op(opdef, xs, sample.kwargs)), (lambda *xs: torch_fn(*xs, **attrs))


# -- running the same computation in both frameworks --------------------------------------------------------------


class OPFORGE:
    grad = staticmethod(of.grad)

    @staticmethod
    def tensor(array: np.ndarray, requires_grad: bool = False):
        return of.tensor(array, requires_grad=requires_grad)

    @staticmethod
    def numpy(t) -> np.ndarray:
        return t.numpy()


class TORCH:
    grad = staticmethod(torch.autograd.grad)

    @staticmethod
    def tensor(array: np.ndarray, requires_grad: bool = False):
        return torch.tensor(array, requires_grad=requires_grad)

    @staticmethod
    def numpy(t) -> np.ndarray:
        return t.detach().numpy(force=True)  # force: torch may return a lazy ZeroTensor


def _inputs(fw, arrays) -> tuple[list, list]:
    """All arguments as tensors, and those that get gradients (the floating-point ones)."""
    xs = [fw.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    return xs, [x for x in xs if x.requires_grad]


def _dense(fw, grads, like) -> list:
    """Gradients as arrays; None (the input was not used) is a zero gradient."""
    return [np.zeros(a.shape) if g is None else fw.numpy(g) for g, a in zip(grads, like)]


def forward(fw, fn, arrays) -> np.ndarray:
    return fw.numpy(fn(*[fw.tensor(a) for a in arrays]))


def vjp(fw, fn, arrays, u) -> list:
    """u·∂f/∂x for every floating-point argument x."""
    xs, diff = _inputs(fw, arrays)
    grads = fw.grad([fn(*xs)], diff, grad_outputs=[fw.tensor(u)], allow_unused=True)
    return _dense(fw, grads, [a for a in arrays if a.dtype.kind == "f"])


def hvp(fw, fn, arrays, u, vs) -> list:
    """The gradient of s = Σ <u·∂f/∂xᵢ, vᵢ> with respect to every floating-point xᵢ and to u (double backward)."""
    xs, diff = _inputs(fw, arrays)
    ut = fw.tensor(u, requires_grad=True)
    grads = fw.grad([fn(*xs)], diff, grad_outputs=[ut], create_graph=True, allow_unused=True)
    terms = [(g * fw.tensor(v)).sum() for g, v in zip(grads, vs) if g is not None]
    assert terms, "no input got a first-order gradient"
    s = functools.reduce(operator.add, terms)
    second = fw.grad([s], [*diff, ut], allow_unused=True)
    return _dense(fw, second, [*[a for a in arrays if a.dtype.kind == "f"], u])


def directional_derivative(fw, fn, array, cotangents) -> np.ndarray:
    """Differentiate ``fn`` at ``array`` once per cotangent: g₁ = w₁·∂f/∂x, g₂ = w₂·∂g₁/∂x, ..."""
    x = fw.tensor(array, requires_grad=True)
    g = fn(x)
    for w in cotangents:
        (g,) = fw.grad([g], [x], grad_outputs=[fw.tensor(w)], create_graph=True)
    return fw.numpy(g)


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch says {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch says {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def check_forward(of_fn, torch_fn, arrays) -> None:
    assert_same(forward(OPFORGE, of_fn, arrays), forward(TORCH, torch_fn, arrays), "forward")


def check_vjp(of_fn, torch_fn, arrays, seed: int = 1) -> None:
    u = np.random.default_rng(seed).standard_normal(forward(TORCH, torch_fn, arrays).shape)
    got, want = vjp(OPFORGE, of_fn, arrays, u), vjp(TORCH, torch_fn, arrays, u)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"vjp, gradient of floating-point input {i}")


def check_hvp(of_fn, torch_fn, arrays, seed: int = 2) -> None:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(forward(TORCH, torch_fn, arrays).shape)
    vs = [rng.standard_normal(a.shape) for a in arrays if a.dtype.kind == "f"]
    got, want = hvp(OPFORGE, of_fn, arrays, u, vs), hvp(TORCH, torch_fn, arrays, u, vs)
    labels = [f"floating-point input {i}" for i in range(len(vs))] + ["the cotangent u"]
    for g, w, label in zip(got, want, labels):
        assert_same(g, w, f"hvp, derivative with respect to {label}")


def program_matches_eager(fn, x, v, spec_shape, g_tol=(1e-10, 1e-12), hv_tol=(1e-8, 1e-10)):
    """First and second order gradients of sum(fn(x)²) from a program whose leading dim is known only at run time,
    against eager ones (``*_tol``: rtol, atol)."""
    prog = of.trace(lambda x: {"loss": F.sum(fn(x) * fn(x))}, x=of.Spec(spec_shape, "float64"))
    (g_var,) = of.append_backward(prog, prog.outputs["loss"], wrt=["x"]).values()
    (hv_var,) = of.append_backward(prog, F.sum(g_var * of.tensor(v)), wrt=["x"]).values()
    out = of.Executor(prog, fetch={"g": g_var, "hv": hv_var}).run(x=x)
    t = of.tensor(x, requires_grad=True)
    (g,) = of.grad(F.sum(fn(t) * fn(t)), [t], create_graph=True)
    (hv,) = of.grad(F.sum(g * of.tensor(v)), [t])
    np.testing.assert_allclose(out["g"], g.numpy(), rtol=g_tol[0], atol=g_tol[1])
    np.testing.assert_allclose(out["hv"], hv.numpy(), rtol=hv_tol[0], atol=hv_tol[1])


# -- the table's tests: one per order -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "sample"), _params(gradients=False))
def test_forward(name, sample):
    check_forward(*_op_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(gradients=True))
def test_vjp(name, sample):
    check_vjp(*_op_pair(name, sample), sample.args)


@pytest.mark.parametrize(("name", "sample"), _params(gradients=True))
def test_hvp(name, sample):
    check_hvp(*_op_pair(name, sample), sample.args)


def test_table_covers_the_required_ops():
    required = {
        "identity", "scale", "minus", "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "tanh", "sigmoid",
        "relu", "abs", "square", "sqrt", "leaky_relu", "smooth_l1", "maximum", "where", "sum", "mean", "reshape",
        "transpose", "broadcast_to", "sum_to", "matmul", "cast", "sqrt_grad", "leaky_relu_grad", "smooth_l1_grad",
        "slice", "slice_grad",
    }
    assert required <= set(ORACLE), f"no oracle for {sorted(required - set(ORACLE))}"


# -- where derivatives jump: torch's conventions ---------------------------------------------------------------------


def _with_ties(shape_x, shape_y, seed=3):
    """x, y of small integers: many positions tie exactly (after broadcasting), the others differ by at least 1."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape_x).astype(np.float64)
    y = rng.integers(-3, 4, shape_y).astype(np.float64)
    return x, y


@pytest.mark.parametrize(("shape_x", "shape_y"), [((3, 4), (3, 4)), ((2, 5), (5,)), ((), (2, 3)), ((4, 1), (1, 3))])
def test_maximum_ties_share_the_gradient(shape_x, shape_y):
    x, y = _with_ties(shape_x, shape_y)
    assert np.any(x == y), "the case must hold ties"
    # torch gives each side half of the gradient where x == y; so must opforge (first order), and its backward
    # must be differentiable in the same way (second order).
    check_forward(F.maximum, torch.maximum, [x, y])
    check_vjp(F.maximum, torch.maximum, [x, y])
    check_hvp(F.maximum, torch.maximum, [x, y])


@pytest.mark.parametrize("exponent", [
    0.0, 0.5, 1.0, 2.0, 3.0,
])
def test_pow_at_zero_base(exponent):
    # The table keeps bases > 0. At x = 0 torch's derivatives are 0 in y for every y >= 0 (opforge's rule says
    # "as PyTorch"), and 0 in x for y = 0; first order only, the second derivatives there are infinite.
    x, y = np.array([0.0, 0.0, 1.5]), np.full(3, exponent)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0^(y-1) is inf for y < 1, in both frameworks
        check_forward(F.pow, torch.pow, [x, y])
        check_vjp(F.pow, torch.pow, [x, y])


_KINKS = np.array([-2.0, -1.0, -0.25, -0.0, 0.0, 0.25, 0.5, 1.0, 3.0])  # 0, and smooth_l1's switch points ±1/σ²


@pytest.mark.parametrize(("of_fn", "torch_fn"), [
    pytest.param(F.relu, torch.relu, id="relu"),
    pytest.param(F.abs, torch.abs, id="abs"),
    pytest.param(lambda x: F.leaky_relu(x, alpha=0.2), lambda x: TF.leaky_relu(x, negative_slope=0.2),
                 id="leaky_relu"),
    pytest.param(lambda x: F.smooth_l1(x, sigma=1.0), lambda x: torch_smooth_l1(x, 1.0), id="smooth_l1-sigma=1"),
    pytest.param(lambda x: F.smooth_l1(x, sigma=2.0), lambda x: torch_smooth_l1(x, 2.0), id="smooth_l1-sigma=2"),
])
def test_kinks_follow_torch(of_fn, torch_fn):
    # At x = 0 (and at |x| = 1/σ² for smooth_l1) the derivative jumps; opforge must pick torch's side.
    check_forward(of_fn, torch_fn, [_KINKS])
    check_vjp(of_fn, torch_fn, [_KINKS])
    check_hvp(of_fn, torch_fn, [_KINKS])


def test_leaky_relu_double_backward():
    # d/dx and d/du of <u·∂leaky_relu/∂x, v>, through leaky_relu -> leaky_relu_grad -> leaky_relu_grad, at points
    # on both sides of 0 and at 0 itself, against double backward through torch.nn.functional.leaky_relu.
    x = np.concatenate([randn(2, 3).ravel(), [0.0]])
    for alpha in (0.01, 0.2, 1.5):
        check_hvp(lambda t, a=alpha: F.leaky_relu(t, alpha=a), lambda t, a=alpha: TF.leaky_relu(t, negative_slope=a),
                  [x])


@pytest.mark.parametrize("shape", [(), (2, 3)])
def test_sqrt_third_derivative(shape):
    # sqrt -> sqrt_grad -> sqrt_grad's own gradient (TensorFlow's SqrtGradGrad) -> its gradient in turn.
    rng = np.random.default_rng(4)
    x = rng.uniform(0.5, 2.0, shape)
    cotangents = [rng.standard_normal(shape) for _ in range(3)]
    for order in (1, 2, 3):
        got = directional_derivative(OPFORGE, F.sqrt, x, cotangents[:order])
        want = directional_derivative(TORCH, torch.sqrt, x, cotangents[:order])
        assert_same(got, want, f"derivative of order {order}")


# -- Tensor indexing -------------------------------------------------------------------------------------------------


class _Index:
    """``ix[1, ::-2, None]`` is just the index tuple, so the table below reads like the indexing it tests."""

    def __getitem__(self, index):
        return index


ix = _Index()


def _show(index) -> str:
    def one(item):
        if item is Ellipsis:
            return "..."
        if isinstance(item, slice):
            text = ":".join("" if v is None else str(v) for v in (item.start, item.stop, item.step))
            return text.removesuffix(":")
        return str(item)

    return ",".join(one(item) for item in (index if isinstance(index, tuple) else (index,)))


INDEXES = [
    ((4, 5, 6), ix[1]),
    ((4, 5, 6), ix[-1, ::-2]),
    ((4, 5, 6), ix[..., None, 1:-1]),
    ((4, 5, 6), ix[::-1, 3:0:-2, -2]),
    ((4, 5, 6), ix[None, 2, ..., 4:0:-3]),
    ((4, 5, 6), ix[...]),
    ((4, 5, 6), ix[0, 0, 0]),
    ((4, 5, 6), ix[-3:, None, :2, -3]),
    ((4, 5, 6), ix[5:]),  # empty
    ((4, 5, 6), ix[:, ::-1, None, ::-1]),
    ((4, 5, 6), ix[1:3, ..., ::2]),
    ((5,), ix[-1]),
    ((5,), ix[10:-10:-1]),  # out-of-range bounds clip, as in Python
    ((), ix[...]),
    ((), ix[None]),
    ((), ix[None, ..., None]),
]


@pytest.mark.parametrize(("shape", "index"),
                         [pytest.param(s, i, id=f"{s}[{_show(i)}]".replace(" ", "")) for s, i in INDEXES])
def test_indexing(shape, index):
    x = np.random.default_rng(5).standard_normal(shape)
    of_fn, torch_fn = (lambda t: t[index]), (lambda t: torch_index(t, index))
    assert_same(forward(TORCH, torch_fn, [x]), x[index], "torch_index itself (against NumPy)")
    check_forward(of_fn, torch_fn, [x])
    check_vjp(of_fn, torch_fn, [x])
    check_hvp(of_fn, torch_fn, [x])
