"""PyTorch's OpInfo database as the oracle for the ops and functions of issue 27's second share (activations,
losses, indexing, shape): torch's own sample inputs for each, run through opforge's function of torch's name
(``of.<name>``, ``F.<name>`` for ``nn.functional``) with torch's arguments as torch writes them, compared with what
torch computes: values, shapes and dtypes in float64 and float32, and in float64 the vector-Jacobian products for
every floating input and, where torch's OpInfo says it has them, the Hessian-vector products.

The database lives in ``torch.testing._internal``, which imports ``expecttest`` (a test dependency of torch's own)
only to subclass its ``TestCase``: where that package is not installed, a module holding ``unittest.TestCase``
under its name stands in (nothing here runs torch's test classes).
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from test_oracle_opinfo import (  # the OpInfo harness
    _array,
    _describe,
    _opinfo,
    _outputs,
    _tensors,
    assert_same,
)

import opforge as of
from opforge import nn
from opforge import ops as F

TOLERANCES = {torch.float64: (1e-7, 1e-9), torch.float32: (2e-5, 1e-6), torch.int64: (0, 0)}


@dataclass(frozen=True)
class Case:
    fn: Callable | None = None  # opforge's function; by default the one of torch's name
    gradgrad: bool = True  # compare second derivatives (where OpInfo says torch has them)
    skip: Callable | None = None  # (sample) -> a reason to leave the sample out, or None
    no_grad: tuple = ()  # positions of args (0 = input) that torch does not differentiate
    limit: int | None = None  # the first this many samples only (where torch makes hundreds, slowly)
    atol32: float | None = None  # float32's absolute tolerance, where torch's float32 sums cancel (bicubic)
    grads: bool = True  # compare derivatives at torch's sample inputs (see ctc_loss's own test where not)
    grad_skip: Callable | None = None  # (sample) -> a reason not to compare its derivatives, or None


def _training(sample) -> str | None:
    return "draws random slopes" if sample.kwargs.get("training") else None


def _kwarg(name: str, why: str) -> Callable:
    def skip(sample) -> str | None:
        return why if name in sample.kwargs else None
    return skip


def _negative_eps(sample) -> str | None:
    if sample.kwargs.get("eps", 0) < 0:
        return "opforge refuses eps < 0, naming the op (torch computes with it)"
    return None


OPINFO: dict[str, Case] = {
    # -- activations (opforge/ops/activations.py) -------------------------------------------------------------------
    "nn.functional.hardshrink": Case(),
    "nn.functional.softshrink": Case(),
    "nn.functional.tanhshrink": Case(),
    "nn.functional.softsign": Case(),
    "nn.functional.threshold": Case(),
    "nn.functional.rrelu": Case(skip=_training),
    # -- pooling (opforge/ops/pool.py) ------------------------------------------------------------------------------
    **{f"nn.functional.adaptive_max_pool{nd}d": Case() for nd in (1, 2, 3)},  # return_indices, None sizes
    **{f"nn.functional.adaptive_avg_pool{nd}d": Case() for nd in (1, 2, 3)},  # None sizes, empty batches
    **{f"nn.functional.max_pool{nd}d": Case(limit=48) for nd in (1, 2, 3)},  # return_indices; 576-1440 samples
    "nn.functional.local_response_norm": Case(),
    **{f"nn.functional.max_unpool{nd}d{variant}": Case(limit=12) for nd in (1, 2, 3) for variant in ("", ":grad")},
    "nn.functional.grid_sample": Case(),  # 4-D and 5-D, every mode
    "nn.functional.interpolate:bicubic": Case(atol32=2e-5),  # outputs ~0.06 from terms ~8, summed in float32
    "nn.functional.interpolate:area": Case(),
    # -- indexing (opforge/ops/selection.py) ------------------------------------------------------------------------
    "take_along_dim": Case(),
    "index_fill": Case(),
    "index_copy": Case(),
    "index_put": Case(),
    "masked_select": Case(),
    "masked_scatter": Case(),
    # torch's deprecated reduce= is scatter_reduce with include_self: torch has no gradient for it (see
    # test_scatter_reduce_form_gradients)
    "scatter": Case(grad_skip=_kwarg("reduce", "torch has no gradient for scatter(..., reduce=)")),
    "nonzero": Case(),
    **{f"scatter_reduce:{r}": Case() for r in ("sum", "prod", "mean", "amax", "amin")},
    "argwhere": Case(),
    "searchsorted": Case(),
    "bucketize": Case(),
    "isin": Case(),
    "tril_indices": Case(),  # (of.tril_indices: torch's samples give device=)
    "triu_indices": Case(),
    # -- shape (opforge/ops/shape_functions.py) -------------------------------------------------------------------
    **{name: Case() for name in ("tensor_split", "hstack", "vstack", "dstack", "atleast_1d", "atleast_2d",
                                 "atleast_3d", "rot90", "diag", "diag_embed", "diagflat", "broadcast_tensors",
                                 "meshgrid:variadic_tensors", "meshgrid:list_of_tensors", "unbind")},
    "unfold": Case(fn=lambda x, *args: x.unfold(*args)),
    # -- fixes of existing ops: a 0-d prelu weight, empty batches -----------------------------------------------------
    "nn.functional.prelu": Case(),  # a 0-d weight among the samples
    "nn.functional.group_norm": Case(skip=_negative_eps),  # an empty batch among the samples
    "nn.functional.unfold": Case(),  # empty batches
    # -- losses (opforge/ops/margin_losses.py) ------------------------------------------------------------------------
    "nn.functional.soft_margin_loss": Case(),
    "nn.functional.hinge_embedding_loss": Case(),
    "nn.functional.multi_margin_loss": Case(),
    "nn.functional.multilabel_margin_loss": Case(),
    "nn.functional.multilabel_soft_margin_loss": Case(),
    "nn.functional.poisson_nll_loss": Case(),
    "nn.functional.gaussian_nll_loss": Case(),
    "nn.functional.ctc_loss": Case(grads=False),  # torch's gradient at log_probs: see test_ctc_loss_gradients
}


# -- the database -----------------------------------------------------------------------------------------------------


def _opforge_fn(name: str) -> Callable:
    if OPINFO[name].fn is not None:
        return OPINFO[name].fn
    torch_name = name.partition(":")[0]
    if torch_name.startswith("nn.functional."):
        return getattr(F, torch_name.removeprefix("nn.functional."))
    return getattr(of, torch_name)


def _samples(name: str, dtype, requires_grad: bool = False) -> list:
    info = _opinfo(name)
    if dtype not in info.supported_dtypes("cpu"):
        return []
    skip, limit = OPINFO[name].skip, OPINFO[name].limit
    samples = itertools.islice(info.sample_inputs("cpu", dtype, requires_grad=requires_grad), limit)
    return [s for s in samples if skip is None or skip(s) is None]


def _to_opforge(value, leaves: dict | None = None):
    """torch's arguments for opforge: tensors as opforge tensors (those that require grad as leaves when ``leaves``
    collects them), torch dtypes as NumPy's; numbers, strings and the rest as they are."""
    if isinstance(value, torch.Tensor):
        t = of.tensor(value.detach().numpy().copy(), requires_grad=leaves is not None and value.requires_grad)
        if t.requires_grad:
            leaves[id(value)] = t
        return t
    if isinstance(value, torch.dtype):
        return np.dtype(str(value).removeprefix("torch."))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_opforge(v, leaves) for v in value)
    if isinstance(value, dict):
        return {k: _to_opforge(v, leaves) for k, v in value.items()}
    return value


# -- the tests --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32, torch.int64), ids=("float64", "float32", "int64"))
@pytest.mark.parametrize("name", sorted(OPINFO))
def test_forward(name, dtype):
    info, fn = _opinfo(name), _opforge_fn(name)
    if dtype == torch.int64 and info.supported_dtypes("cpu") & {torch.float64, torch.float32}:
        pytest.skip("int64 only for the ops torch's OpInfo gives no floating samples (tril_indices)")
    samples = _samples(name, dtype)
    assert samples or dtype not in info.supported_dtypes("cpu"), f"torch's OpInfo gives {name} no {dtype} samples"
    for sample in samples:
        with np.errstate(all="ignore"):
            want = _outputs(info.op(sample.input, *sample.args, **sample.kwargs))
            got = _outputs(fn(*_to_opforge([sample.input, *sample.args]), **_to_opforge(sample.kwargs)))
        assert len(got) == len(want), f"{name}: {len(got)} outputs, torch gives {len(want)}"
        rtol, atol = TOLERANCES[dtype]
        if dtype == torch.float32 and OPINFO[name].atol32 is not None:
            atol = OPINFO[name].atol32
        for g, w in zip(got, want):
            assert_same(g, w, f"{name} in {dtype}, {_describe(sample)}", rtol, atol)


@pytest.mark.parametrize("name", sorted(OPINFO))
def test_gradients(name):
    info, fn = _opinfo(name), _opforge_fn(name)
    if not info.supports_autograd or not OPINFO[name].grads:
        pytest.skip(f"torch's {name} has no gradient to compare at its sample inputs")
    second = info.supports_gradgrad and OPINFO[name].gradgrad
    checked = 0
    for sample in _samples(name, torch.float64, requires_grad=True):
        if OPINFO[name].grad_skip is not None and OPINFO[name].grad_skip(sample) is not None:
            continue
        args = [sample.input, *sample.args]
        for i in OPINFO[name].no_grad:  # what torch does not differentiate
            if i < len(args) and isinstance(args[i], torch.Tensor):
                args[i] = args[i].detach()
        torch_leaves = [t for t in _tensors((args, sample.kwargs)) if t.requires_grad]
        with np.errstate(all="ignore"):
            want_out = [o for o in _outputs(info.op(*args, **sample.kwargs)) if o.requires_grad]
            if not torch_leaves or not want_out:
                continue
            of_leaves: dict = {}
            got_out = [o for o in _outputs(fn(*_to_opforge(args, of_leaves), **_to_opforge(sample.kwargs, of_leaves)))
                       if np.dtype(o.dtype).kind == "f"]  # (torch's integer outputs, indices, need no grad)
            leaves = [of_leaves[id(t)] for t in torch_leaves]
            want = _derivatives(TORCH, want_out, torch_leaves, second)
            got = _derivatives(OPFORGE, got_out, leaves, second)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{name}: derivative {i}, {_describe(sample)}", *TOLERANCES[torch.float64])
        checked += 1
    assert checked, f"no sample of {name} has a gradient to compare"


TORCH = types.SimpleNamespace(grad=torch.autograd.grad, tensor=lambda a, **k: torch.tensor(a, **k))
OPFORGE = types.SimpleNamespace(grad=of.grad, tensor=lambda a, **k: of.tensor(a, **k))


def _derivatives(fw, outputs, leaves, second: bool) -> list:
    """u·∂f/∂x for each leaf x, for random cotangents u; with ``second``, also the gradients of Σ <u·∂f/∂x, v>
    (random v) with respect to the leaves and to u. The random values are the same for both frameworks."""
    rng = np.random.default_rng(0)
    us = [fw.tensor(rng.standard_normal(tuple(o.shape)), requires_grad=second) for o in outputs]
    grads = fw.grad(outputs, leaves, grad_outputs=us, create_graph=second, allow_unused=True)
    firsts = [np.zeros(tuple(x.shape)) if g is None else _array(g) for g, x in zip(grads, leaves)]
    vs = [fw.tensor(rng.standard_normal(tuple(x.shape))) for x in leaves]
    terms = [(g * v).sum() for g, v in zip(grads, vs) if g is not None and g.requires_grad]
    if not second or not terms:
        return firsts
    seconds = fw.grad([functools.reduce(lambda a, b: a + b, terms)], [*leaves, *us], allow_unused=True)
    return firsts + [np.zeros(tuple(x.shape)) if g is None else _array(g) for g, x in zip(seconds, [*leaves, *us])]


# -- modules, random slopes, compiled calls, wrong calls -----------------------------------------------------------

_RNG = np.random.default_rng(7)
_X, _Y = _RNG.standard_normal((4, 5)), _RNG.standard_normal((4, 5))
_SIGNS = np.sign(_RNG.standard_normal((4, 5)))
_CLASSES = np.array([1, 0, 4, 2])
_LABELS = np.array([[3, 0, -1, 1, 2], [4, -1, 2, 2, 2], [0, 1, 2, 3, 4], [-1, 0, 0, 0, 0]])
_COUNTS = _RNG.poisson(3.0, (4, 5)).astype(np.float64)

MODULES = [  # (torch.nn's class, its arguments, the inputs to call it with)
    ("Hardshrink", (0.3,), (_X,)), ("Softshrink", (0.3,), (_X,)), ("Softsign", (), (_X,)), ("Tanhshrink", (), (_X,)),
    ("Threshold", (0.1, -2.0), (_X,)), ("RReLU", (0.1, 0.3), (_X,)),
    ("SoftMarginLoss", (), (_X, _SIGNS)), ("HingeEmbeddingLoss", (0.5,), (_X, _SIGNS)),
    ("MultiMarginLoss", (2, 0.7, np.arange(1.0, 6.0)), (_X, _CLASSES)), ("MultiLabelMarginLoss", (), (_X, _LABELS)),
    ("MultiLabelSoftMarginLoss", (np.arange(1.0, 6.0),), (_X, (_SIGNS > 0).astype(np.float64))),
    ("PoissonNLLLoss", (True, True), (_X, _COUNTS)),
    ("GaussianNLLLoss", (), (_X, _Y, np.abs(_RNG.standard_normal((4, 1))))),
    ("AdaptiveMaxPool1d", (3,), (_X[None],)),
    ("AdaptiveMaxPool3d", ((2, None, 2),), (_RNG.standard_normal((2, 3, 4, 5)),)),
    ("LocalResponseNorm", (3, 0.1, 0.6, 1.5), (_RNG.standard_normal((2, 5, 3, 2)),)),
    ("Upsample", (None, 1.6, "bicubic"), (_RNG.standard_normal((2, 3, 4, 5)),)),
    ("Upsample", ((3, 7), None, "area"), (_RNG.standard_normal((2, 3, 4, 5)),)),
]


def _module_args(args, to):
    return tuple(to(a) if isinstance(a, np.ndarray) else a for a in args)


@pytest.mark.parametrize(("cls", "args", "inputs"), MODULES, ids=[m[0] for m in MODULES])
def test_module(cls, args, inputs):
    """nn's module of torch's name, built with torch's positional arguments, in evaluation mode (RReLU's slope is
    then fixed): torch's values and input gradient, and its repr's settings."""
    want_m = getattr(torch.nn, cls)(*_module_args(args, torch.tensor)).eval()
    got_m = getattr(nn, cls)(*_module_args(args, of.tensor)).eval()
    tx = torch.tensor(inputs[0], requires_grad=True)
    x = of.tensor(inputs[0], requires_grad=True)
    want = want_m(tx, *(torch.tensor(a) for a in inputs[1:]))
    got = got_m(x, *(of.tensor(a) for a in inputs[1:]))
    assert_same(got, want, cls, 1e-12, 1e-12)
    (want_g,) = torch.autograd.grad(want.sum(), tx)
    (got_g,) = of.grad(got.sum(), [x])
    assert_same(got_g, want_g, f"{cls}: gradient", 1e-12, 1e-12)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_unpool_inverts_max_pool(nd):
    """nn.MaxUnpool{nd}d on what nn.MaxPool{nd}d(return_indices=True) gives (overlapping windows: an index comes
    back twice), into an odd size given by output_size: torch's values and input gradient."""
    x = _RNG.standard_normal((2, 3, *[7] * nd))
    tp = getattr(torch.nn, f"MaxPool{nd}d")(3, 2, return_indices=True)
    y, idx = tp(torch.tensor(x))
    ty = torch.tensor(y.numpy(), requires_grad=True)
    want = getattr(torch.nn, f"MaxUnpool{nd}d")(3, 2)(ty, idx, output_size=x.shape)
    oy = of.tensor(y.numpy(), requires_grad=True)
    got = getattr(nn, f"MaxUnpool{nd}d")(3, 2)(oy, of.tensor(idx.numpy()), output_size=x.shape)
    assert_same(got, want, f"MaxUnpool{nd}d", 0, 0)
    u = _RNG.standard_normal(x.shape)
    assert_same(of.grad(got, [oy], grad_outputs=[of.tensor(u)])[0],
                torch.autograd.grad(want, ty, torch.tensor(u))[0], f"MaxUnpool{nd}d: gradient", 1e-15, 0)


def test_rrelu_training_draws_slopes_that_backward_uses():
    """In training each x ≤ 0 gets its own slope in [lower, upper], x > 0 keeps slope 1; the gradient is the slope
    the forward pass drew; of.manual_seed reproduces the draws; evaluation uses (lower + upper)/2."""
    x = of.tensor(np.concatenate([-np.linspace(0.5, 3.0, 200), np.linspace(0.5, 3.0, 50)]), requires_grad=True)
    of.manual_seed(3)
    y = F.rrelu(x, 0.1, 0.4, training=True)
    slopes = y.numpy() / x.numpy()
    assert np.all(slopes[:200] >= 0.1) and np.all(slopes[:200] <= 0.4) and np.ptp(slopes[:200]) > 0.2
    np.testing.assert_array_equal(slopes[200:], 1.0)
    (g,) = of.grad(y.sum(), [x])
    np.testing.assert_allclose(g.numpy(), slopes, rtol=1e-12)
    of.manual_seed(3)
    np.testing.assert_array_equal(F.rrelu(x, 0.1, 0.4, training=True).numpy(), y.numpy())
    np.testing.assert_allclose(F.rrelu(x, 0.1, 0.4).numpy()[:200], x.numpy()[:200] * 0.25, rtol=1e-15)


LOSS_CALLS = [  # (function, inputs, settings): compiled, each gives what it gives eagerly
    (F.soft_margin_loss, (_X, _SIGNS), {}), (F.hinge_embedding_loss, (_X, _SIGNS), {"margin": 0.5}),
    (F.multi_margin_loss, (_X, _CLASSES), {"p": 2}), (F.multilabel_margin_loss, (_X, _LABELS), {}),
    (F.multilabel_soft_margin_loss, (_X, _SIGNS > 0), {}), (F.poisson_nll_loss, (_X, _COUNTS), {"full": True}),
    (F.gaussian_nll_loss, (_X, _Y, np.abs(_Y) + 0.1), {"reduction": "sum"}), (F.softsign, (_X,), {}),
    (F.rrelu, (_X,), {}), (F.softshrink, (_X,), {}), (F.threshold, (_X, 0.2, 1.0), {}),
]


@pytest.mark.parametrize(("fn", "inputs", "settings"), LOSS_CALLS, ids=[c[0].__name__ for c in LOSS_CALLS])
def test_compiled_as_eager(fn, inputs, settings):
    tensors = [of.tensor(a) for a in inputs if isinstance(a, np.ndarray)]
    numbers = [a for a in inputs if not isinstance(a, np.ndarray)]

    def call(*ts):
        return fn(*ts, *numbers, **settings)

    np.testing.assert_allclose(of.compile(call)(*tensors).numpy(), call(*tensors).numpy(), rtol=1e-15)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: F.soft_margin_loss(of.tensor(_X), of.tensor(_SIGNS), reduction="avg"),
     r"soft_margin_loss\(\): argument 'reduction' must be 'mean', 'sum' or 'none', got 'avg'"),
    (lambda: F.hinge_embedding_loss(of.tensor(_X), of.tensor(_SIGNS), 1.0, True),
     r"hinge_embedding_loss\(\): size_average= and reduce="),
    (lambda: F.multi_margin_loss(of.tensor(_X), of.tensor(_CLASSES), p=3), r"multi_margin_loss\(\).*'p'.*got 3"),
    (lambda: F.multi_margin_loss(of.tensor(_X), of.tensor(_LABELS)), r"multi_margin_loss\(\).*target of shape \(4,\)"),
    (lambda: F.gaussian_nll_loss(of.tensor(_X), of.tensor(_Y), of.tensor(-np.ones((4, 5)))),
     r"gaussian_nll_loss\(\): var has negative"),
    (lambda: F.gaussian_nll_loss(of.tensor(_X), of.tensor(_Y), of.tensor(np.ones((2, 5)))),
     r"gaussian_nll_loss\(\): var of shape \(2, 5\)"),
    (lambda: F.softshrink(of.tensor(_X), -0.5), r"softshrink\(\): argument 'lambd' must be >= 0"),
    (lambda: F.rrelu(of.tensor(_X), 0.5, 0.1), r"rrelu_with_noise\(\): argument 'lower' must not exceed 'upper'"),
    (lambda: nn.SoftMarginLoss(reduce=False), r"SoftMarginLoss\(\): size_average= and reduce="),
])
def test_wrong_calls_name_the_function(call, message):
    with pytest.raises(of.OpforgeError, match=message):
        call()


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int64"])
def test_add_n_takes_a_number_as_add_does(dtype):
    """F.add_n([5.576, y]) is F.add(5.576, y): the number is not rounded to float32 first (issue 27), eagerly and
    compiled, in either position."""
    y = of.tensor(np.array([1.0, 2.0, -3.25]).astype(dtype))
    want = F.add(5.576, y)
    for got in (F.add_n([5.576, y]), F.add_n([y, 5.576]), of.compile(lambda t: F.add_n([5.576, t]))(y)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_indexing_methods_and_in_place_forms():
    """The Tensor methods of the indexing ops, in torch's call forms, and their in-place forms."""
    x = _RNG.standard_normal((3, 4))
    idx, mask = np.array([[0, 2], [1, 3], [3, 0]]), x > 0
    calls = [
        lambda t, m: t.scatter(1, m.tensor(idx), m.tensor(np.ones((3, 2)))),
        lambda t, m: t.scatter(1, m.tensor(idx), value=-2.0),
        lambda t, m: t.index_fill(1, m.tensor(np.array([0, 3])), 5.0),
        lambda t, m: t.index_copy(0, m.tensor(np.array([2, 0])), m.tensor(np.ones((2, 4)))),
        lambda t, m: t.masked_select(m.tensor(mask)),
        lambda t, m: t.masked_scatter(m.tensor(mask), m.tensor(np.arange(12.0))),
        lambda t, m: t.take_along_dim(m.tensor(idx), 1),
        lambda t, m: t.nonzero(),
        lambda t, m: t.nonzero(as_tuple=True)[1],
        lambda t, m: t.argwhere(),
        lambda t, m: t.index_put((m.tensor(np.array([0, 0])), m.tensor(np.array([1, 1]))), m.tensor(np.array(2.0)),
                                 True),
        lambda t, m: t.clone().scatter_(0, m.tensor(idx[:1]), -1.0),
        lambda t, m: t.clone().scatter_(1, m.tensor(idx), m.tensor(np.full((3, 2), 2.0)), reduce="multiply"),
        lambda t, m: t.clone().scatter_(1, m.tensor(idx), 1.5, reduce="add"),
        lambda t, m: m.scatter(t, 1, m.tensor(idx[:2]), value=3.0, reduce="add"),
        lambda t, m: t.clone().index_fill_(0, m.tensor(np.array([1])), 0.5),
        lambda t, m: t.clone().masked_scatter_(m.tensor(mask), m.tensor(np.arange(12.0))),
        lambda t, m: t.clone().index_put_((m.tensor(np.array([2])),), m.tensor(np.array(7.0))),
    ]
    for i, call in enumerate(calls):
        assert_same(call(of.tensor(x), of), call(torch.tensor(x), torch), f"call {i}", 0, 0)


def test_scatter_reduce_form_gradients():
    """x.scatter(dim, index, src or value, reduce='add'|'multiply') at torch's OpInfo samples: torch has no gradient
    for this deprecated form, so its first and second derivatives are compared with those of the torch call it
    means, scatter_reduce(x, dim, index, src, 'sum'|'prod', include_self=True), and checked numerically."""
    checked = 0
    for sample in _samples("scatter", torch.float64):  # (torch gives reduce= samples only without requires_grad)
        reduce = sample.kwargs.get("reduce")
        if reduce is None:
            continue
        x, (dim, index, src) = sample.input, sample.args
        if not isinstance(src, torch.Tensor):  # value=: the same number at every place
            src = torch.full(index.shape, src, dtype=x.dtype)
        leaves = [x.requires_grad_(), src.requires_grad_()]
        want_out = torch.scatter_reduce(x, dim, index, src, {"add": "sum", "multiply": "prod"}[reduce])
        of_leaves: dict = {}
        ox, oindex, osrc = _to_opforge([x, index, src], of_leaves)
        got_out = ox.scatter(dim, oindex, osrc, reduce=reduce)
        want = _derivatives(TORCH, [want_out], leaves, True)
        got = _derivatives(OPFORGE, [got_out], [of_leaves[id(t)] for t in leaves], True)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"scatter reduce={reduce}: derivative {i}, {_describe(sample)}", 1e-7, 1e-9)
        of.testing.gradcheck(lambda a, b, r=reduce, d=dim, i=oindex: a.scatter(d, i, b, reduce=r),
                             [ox, osrc])
        checked += 1
    assert checked


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_gradients(reduction):
    """F.ctc_loss through log_softmax (where its inputs come from), against torch: values and the gradient of the
    logits, for padded and concatenated targets, an impossible alignment (inf, or 0 with zero_infinity) and an
    unbatched call; and through nn.CTCLoss. At log_probs itself torch's gradient adds exp(log_probs) (log_softmax's
    backward folded in), which the logits' gradient does not see: docs/pytorch.md."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((12, 4, 5))
    targets = rng.integers(1, 5, (4, 6))
    input_lengths, target_lengths = np.array([12, 10, 3, 7]), np.array([6, 4, 5, 0])  # sample 2: impossible
    concatenated = np.concatenate([t[:n] for t, n in zip(targets, target_lengths)])
    for zero_infinity in (False, True):
        for tg in (targets, concatenated):
            tx = torch.tensor(x, requires_grad=True)
            want = torch.nn.functional.ctc_loss(tx.log_softmax(2), torch.tensor(tg), torch.tensor(input_lengths),
                                                torch.tensor(target_lengths), reduction=reduction,
                                                zero_infinity=zero_infinity)
            ox = of.tensor(x, requires_grad=True)
            got = nn.CTCLoss(reduction=reduction, zero_infinity=zero_infinity)(
                F.log_softmax(ox, 2), of.tensor(tg), of.tensor(input_lengths), of.tensor(target_lengths))
            assert_same(got, want, f"ctc_loss {reduction}", 1e-12, 1e-12)
            if zero_infinity:  # (an infinite loss has NaN gradients in torch too)
                u = _RNG.standard_normal(tuple(want.shape))
                (tg_,) = torch.autograd.grad(want, tx, torch.tensor(u))
                (og,) = of.grad(got, [ox], grad_outputs=[of.tensor(u)])
                assert_same(og, tg_, f"ctc_loss {reduction}: gradient", 1e-10, 1e-12)
    one = torch.nn.functional.ctc_loss(torch.tensor(x[:, 0]).log_softmax(1), torch.tensor(targets[0]), (12,), (6,),
                                       reduction=reduction)
    assert_same(F.ctc_loss(F.log_softmax(of.tensor(x[:, 0]), 1), of.tensor(targets[0]), [12], [6],
                           reduction=reduction), one, "ctc_loss unbatched", 1e-12, 1e-12)


@pytest.mark.parametrize("device", ["cpu", "strict"])
def test_ctc_loss_with_every_target_empty(device):
    """Targets of length 0 all (the extended target is the blank alone, one position wide): the loss is −Σ of the
    blank's log-probabilities, as torch's; the kernel indexed a second position and failed."""
    from opforge.testing import strict  # noqa: F401  (registers the device)

    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3, 4))
    for tg in (np.zeros(0, np.int64), np.zeros((3, 0), np.int64)):
        tx = torch.tensor(x, requires_grad=True)
        want = torch.nn.functional.ctc_loss(tx.log_softmax(2), torch.tensor(tg), torch.tensor([5, 3, 0]),
                                            torch.tensor([0, 0, 0]), reduction="sum")
        ox = of.tensor(x, requires_grad=True, device=device)
        got = F.ctc_loss(F.log_softmax(ox, 2), of.tensor(tg, device=device), of.tensor(np.array([5, 3, 0]),
                         device=device), of.tensor(np.zeros(3, np.int64), device=device), reduction="sum")
        assert_same(got.cpu(), want, "ctc_loss of empty targets", 1e-12, 1e-12)
        (tg_,) = torch.autograd.grad(want, tx)
        (og,) = of.grad(got, [ox])
        assert_same(og.cpu(), tg_, "ctc_loss of empty targets: gradient", 1e-10, 1e-12)


def test_ctc_loss_has_no_second_derivative():
    lp = of.tensor(np.log(np.full((4, 1, 3), 1 / 3)), requires_grad=True)
    loss = F.ctc_loss(lp, of.tensor(np.array([[1, 2]])), [4], [2])
    with pytest.raises(of.GradientError, match="ctc_nll"):
        of.grad(loss, [lp], create_graph=True)
    (g,) = of.grad(F.ctc_loss(lp, of.tensor(np.array([[1, 2]])), [4], [2]), [lp])  # once is fine
    assert g.shape == (4, 1, 3)


@pytest.mark.parametrize(("rank", "mode"), [(4, "bilinear"), (4, "nearest"), (4, "bicubic"), (5, "bilinear"),
                                            (5, "nearest")])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample(rank, mode, padding_mode, align_corners):
    """F.grid_sample against torch with positions well outside [-1, 1] (every padding mode's reach), on images and
    volumes: values and the gradients of the input and of the grid."""
    rng = np.random.default_rng(5)
    if rank == 4:
        x, grid = rng.standard_normal((2, 3, 4, 5)), rng.uniform(-2.5, 2.5, (2, 3, 6, 2))
    else:
        x, grid = rng.standard_normal((2, 3, 3, 4, 5)), rng.uniform(-2.5, 2.5, (2, 2, 3, 4, 3))
    tx, tgrid = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    want = torch.nn.functional.grid_sample(tx, tgrid, mode, padding_mode, align_corners)
    ox, ogrid = of.tensor(x, requires_grad=True), of.tensor(grid, requires_grad=True)
    got = F.grid_sample(ox, ogrid, mode, padding_mode, align_corners)
    assert_same(got, want, "grid_sample", 1e-12, 1e-12)
    u = rng.standard_normal(want.shape)
    for g, w in zip(of.grad(got, [ox, ogrid], grad_outputs=[of.tensor(u)], allow_unused=mode == "nearest"),
                    torch.autograd.grad(want, [tx, tgrid], torch.tensor(u))):
        if g is None:  # "nearest": the grid gets no gradient (torch's is zeros)
            assert not w.numpy().any()
            continue
        assert_same(g, w, "grid_sample: gradient", 1e-10, 1e-12)


@pytest.mark.parametrize(("x_shape", "grid_shape", "mode"), [((1, 1, 3, 4), (1, 1, 3, 2), "bicubic"),
                                                             ((1, 1, 2, 3, 3), (1, 1, 2, 2, 3), "bilinear")])
def test_grid_sample_gradients_numerically(x_shape, grid_shape, mode):
    """Bicubic and trilinear grid_sample: first and second derivatives (input and grid) by central differences, in
    float64, with reflection padding (the grid's positions stay off the kinks, where the derivative jumps)."""
    rng = np.random.default_rng(3)
    x = of.tensor(rng.standard_normal(x_shape), requires_grad=True)
    grid = of.tensor(rng.uniform(-0.9, 0.9, grid_shape), requires_grad=True)

    def sample(a, g):
        return F.grid_sample(a, g, mode, "reflection", False)

    of.testing.gradcheck(sample, [x, grid])
    of.testing.gradgradcheck(sample, [x, grid])


def test_grid_sample_compiled_and_wrong_calls():
    """A volume sampled in a compiled program gives what it gives eagerly; calls torch refuses are refused, naming
    grid_sample and what was expected."""
    x, grid = of.tensor(_RNG.standard_normal((1, 2, 3, 4, 5))), of.tensor(_RNG.uniform(-1, 1, (1, 2, 2, 3, 3)))
    np.testing.assert_allclose(of.compile(lambda a, g: F.grid_sample(a, g, align_corners=True))(x, grid).numpy(),
                               F.grid_sample(x, grid, align_corners=True).numpy(), rtol=1e-12)
    with pytest.raises(of.ArgumentError, match=r"grid_sample\(\): mode 'bicubic' takes a 4-D input"):
        F.grid_sample(x, grid, "bicubic")
    with pytest.raises(of.ShapeError, match=r"grid_sample\(\): .*grid must be \(N, Do, Ho, Wo, 3\)"):
        F.grid_sample(x, of.tensor(_RNG.uniform(-1, 1, (1, 2, 2, 3, 2))))
    with pytest.raises(of.ArgumentError, match=r"grid_sample\(\): mode must be one of"):
        F.grid_sample(x, grid, "area")


def test_adaptive_max_pool_call_forms():
    """torch's call forms of adaptive max pooling: F.adaptive_max_pool{1,2,3}d's return_indices (positional or by
    name) and None sizes, nn.AdaptiveMaxPool{nd}d(return_indices=True), and torch.adaptive_max_pool1d, which
    returns (values, indices) always; eagerly and compiled, values, indices and the input's gradient."""
    x = _RNG.standard_normal((2, 3, 4, 5, 6))
    for nd in (1, 2, 3):
        xn = x.reshape(2, 3, -1)[..., :7] if nd == 1 else x[:, :, 0] if nd == 2 else x
        size = [3, None, 2][:nd] if nd > 1 else 3
        for want, got in [
            (getattr(torch.nn.functional, f"adaptive_max_pool{nd}d")(torch.tensor(xn), size, True),
             getattr(F, f"adaptive_max_pool{nd}d")(of.tensor(xn), size, True)),
            (getattr(torch.nn, f"AdaptiveMaxPool{nd}d")(size, return_indices=True)(torch.tensor(xn)),
             getattr(nn, f"AdaptiveMaxPool{nd}d")(size, return_indices=True)(of.tensor(xn))),
            (getattr(torch.nn.functional, f"adaptive_max_pool{nd}d")(torch.tensor(xn), size, return_indices=True),
             of.compile(lambda t, n=nd, s=size: getattr(F, f"adaptive_max_pool{n}d")(t, s, return_indices=True))(
                 of.tensor(xn)))]:
            assert len(got) == 2
            for g, w in zip(got, want):
                assert_same(g, w, f"adaptive_max_pool{nd}d", 0, 0)
        tx, ox = torch.tensor(xn, requires_grad=True), of.tensor(xn, requires_grad=True)
        (wg,) = torch.autograd.grad(getattr(torch.nn.functional, f"adaptive_max_pool{nd}d")(tx, size).sum(), tx)
        (gg,) = of.grad(getattr(F, f"adaptive_max_pool{nd}d")(ox, size).sum(), [ox])
        assert_same(gg, wg, f"adaptive_max_pool{nd}d: gradient", 0, 0)
    x1 = x.reshape(2, 3, -1)[..., :7]
    for g, w in zip(of.adaptive_max_pool1d(of.tensor(x1), 3), torch.adaptive_max_pool1d(torch.tensor(x1), 3)):
        assert_same(g, w, "torch.adaptive_max_pool1d", 0, 0)
    with pytest.raises(of.ShapeError, match=r"adaptive_max_pool2d\(\): argument 'output_size' must be an int or 2 "):
        F.adaptive_max_pool2d(of.tensor(x[:, :, 0]), [1, 2, 3])


def test_multinomial_draws_as_torch_defines_them():
    """torch.multinomial's meaning (its draws are its generator's, so the distribution is what is compared): the
    shapes and dtype torch gives, one-hot rows drawing their category (nanoGPT's generate with top_k=1), the
    frequencies of many draws, without replacement distinct indices and never a weight-0 category, and torch's
    refusals, each naming multinomial."""
    for probs, n, replacement in [(np.array([0.2, 0.0, 0.8]), 5, True), (np.eye(4)[[2, 0, 3]], 1, False),
                                  (np.array([[1.0, 2.0, 0.0, 4.0], [3.0, 0.0, 1.0, 1.0]]), 3, False)]:
        want = torch.multinomial(torch.tensor(probs), n, replacement)
        got = of.multinomial(of.tensor(probs), n, replacement)
        assert got.shape == tuple(want.shape) and got.dtype == np.int64
        assert ((probs.reshape(-1, probs.shape[-1])[np.arange(got.numpy().reshape(-1, n).shape[0])[:, None],
                                                    got.numpy().reshape(-1, n)]) > 0).all()
        if probs.ndim == 2 and (probs > 0).sum(1).max() == n:  # as many categories as draws: torch's, as sets
            np.testing.assert_array_equal(np.sort(got.numpy(), -1), np.sort(want.numpy(), -1))
    of.manual_seed(3)
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    counts = np.bincount(of.multinomial(of.tensor(weights), 20000, replacement=True).numpy(), minlength=4)
    np.testing.assert_allclose(counts / 20000, weights / weights.sum(), atol=0.015)
    rows = of.multinomial(of.tensor(np.tile(np.append(weights, 0.0), (4000, 1))), 4).numpy()
    assert all(len(set(r)) == 4 for r in rows) and not (rows == 4).any()
    np.testing.assert_allclose(np.bincount(rows[:, 0], minlength=4) / 4000, weights / weights.sum(), atol=0.03)
    of.manual_seed(5)
    first = of.multinomial(of.tensor(weights), 3).numpy()
    of.manual_seed(5)
    np.testing.assert_array_equal(of.multinomial(of.tensor(weights), 3).numpy(), first)
    for call, message in [
        (lambda: of.multinomial(of.tensor([0.5, -0.1]), 1), r"multinomial\(\): argument 'input' holds inf, nan or a "
                                                             r"negative"),
        (lambda: of.multinomial(of.tensor([0.0, 0.0]), 1, True), r"multinomial\(\): a row .* has no positive weight"),
        (lambda: of.multinomial(of.tensor([0.5, 0.0, 0.5]), 3), r"multinomial\(\): without replacement, 3 samples"),
        (lambda: of.multinomial(of.tensor([0.5, 0.5]), 3), r"multinomial\(\): without replacement, num_samples \(3\)"),
        (lambda: of.multinomial(of.tensor(np.ones((2, 2, 2))), 1), r"multinomial\(\): input must be 1-D or 2-D"),
        (lambda: of.multinomial(of.tensor([0.5, 0.5]), 0), r"multinomial\(\): argument 'num_samples' must be positive"),
    ]:
        with pytest.raises(of.OpforgeError, match=message):
            call()


def test_scaled_dot_product_attention_takes_torchs_positions():
    """F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=): torch's positional form
    (nanoGPT's call passes dropout_p=0 and is_causal=True by name, others positionally); a dropout_p that is no
    probability is refused naming the argument (tests/test_torch_attention_dropout.py checks dropout_p > 0)."""
    q, k, v = (_RNG.standard_normal((2, 3, 4, 8)) for _ in range(3))
    for args, kwargs in [((None, 0.0, True), {}), ((None, 0), {"is_causal": True, "scale": 0.3}),
                         ((_RNG.standard_normal((4, 4)),), {"dropout_p": 0.0})]:
        want = torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(t) for t in (q, k, v)), *(torch.tensor(a) if isinstance(a, np.ndarray) else a
                                                    for a in args), **kwargs)
        got = F.scaled_dot_product_attention(*(of.tensor(t) for t in (q, k, v)),
                                             *(of.tensor(a) if isinstance(a, np.ndarray) else a for a in args),
                                             **kwargs)
        assert_same(got, want, "scaled_dot_product_attention", 1e-12, 1e-12)
    with pytest.raises(of.ArgumentError, match=r"scaled_dot_product_attention\(\): argument 'dropout_p' must be a "
                                               r"probability in \[0, 1\], got 1.5"):
        F.scaled_dot_product_attention(of.tensor(q), of.tensor(k), of.tensor(v), None, 1.5)
