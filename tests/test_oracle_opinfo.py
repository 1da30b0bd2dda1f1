"""PyTorch's OpInfo database as the oracle for the ops torch users reach for by name (issue 27): torch's own sample
inputs for each op, run through opforge's function of torch's name (``of.<name>``, ``F.<name>`` for
``nn.functional``, ``of.linalg.<name>``) with torch's arguments as torch writes them, then compared with what torch
computes from the same inputs.

``OPINFO`` maps an OpInfo name to a ``Case``. For each op:

* ``test_forward``: every sample (``sample_inputs``, plus the ``reference_inputs`` of at most ``SMALL`` elements:
  NaN, infinities, empty tensors, extreme values) in float64, float32, int64 and bool where torch takes the dtype:
  the same values, shapes and dtypes; or, for a dtype the case lists in ``refuses``, an opforge error naming the op
  (never a silently different result);
* ``test_method``: the Tensor method and the in-place method, where torch has them, on the float64 samples;
* ``test_gradients``: in float64, the same vector-Jacobian products for every floating input, and (where torch's
  OpInfo says the op is twice differentiable) the same Hessian-vector products, derivative of the cotangent
  included.

The database lives in ``torch.testing._internal``, which imports ``expecttest`` (a test dependency of torch's own)
only to subclass its ``TestCase``: where that package is not installed, a module holding ``unittest.TestCase`` under
its name stands in (nothing here runs torch's test classes).
"""

from __future__ import annotations

import functools
import os
import sys
import types
import unittest
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F

SMALL = 512  # reference inputs up to this many elements (the larger ones are the same values, repeated)
# rtol, atol by the dtype of torch's result; integers and bools exact
TOLERANCES = {torch.float64: (1e-7, 1e-9), torch.float32: (2e-5, 1e-6), torch.float16: (2e-3, 1e-3),
              torch.bfloat16: (1.6e-2, 1e-2)}
DTYPES = (torch.float64, torch.float32, torch.int64, torch.bool)


@dataclass(frozen=True)
class Case:
    fn: Callable | None = None  # opforge's function; by default the one of torch's name (see _opforge_fn)
    refuses: tuple = ()  # dtypes torch computes in that opforge refuses, naming the op
    gradgrad: bool = True  # compare second derivatives (where OpInfo says torch has them)
    skip: Callable | None = None  # (sample) -> a reason to leave the sample out, or None
    rtol: float | None = None  # float64 tolerance, where torch's own kernel is less exact than the default's
    extra: tuple = ()  # X(...) calls added to torch's samples: edges its database leaves out
    # (sample) -> (dim, keepdim) of a value-selecting reduction whose index among equal elements torch leaves
    # unspecified (its quickselect names any one): its indices output must name an element equal to torch's value
    ties: Callable | None = None
    # (outputs, sign) -> outputs, applied to both frameworks' results before they are compared and differentiated
    # (``sign`` is the framework's): outputs defined up to a choice, such as each eigenvector's sign
    normalize: Callable | None = None
    tolerances: dict | None = None  # torch dtype -> (rtol, atol), where torch's own kernel is less exact
    # torch's own test wrapper for an op of a symmetric matrix (gradcheck_wrapper_hermitian_input): both frameworks
    # are called on x + xᵀ (torch reads one triangle, opforge the symmetric part: docs/pytorch.md)
    symmetric: bool = False
    # every stride-th of torch's samples only, where it has many (hundreds of flag combinations, each checked to
    # the second derivative): the suite's time; OPFORGE_FUZZ=long runs them all
    stride: int = 1


class X(NamedTuple):
    """A call added to torch's samples, with NumPy arrays for tensors: it runs with the samples of its input's dtype
    (with requires_grad for float64 tensors, in test_gradients)."""

    input: np.ndarray
    args: tuple = ()
    kwargs: dict = {}  # noqa: RUF012 (never changed)

    @classmethod
    def of(cls, input, *args, **kwargs):
        return cls(input, args, kwargs)

    def to_torch(self, requires_grad: bool):
        def one(v):
            if isinstance(v, np.ndarray):
                return torch.tensor(v, requires_grad=requires_grad and v.dtype == np.float64)
            return type(v)(one(a) for a in v) if isinstance(v, (list, tuple)) else v
        return X(one(self.input), tuple(one(a) for a in self.args), {k: one(v) for k, v in self.kwargs.items()})


_INTS = (torch.int64, torch.bool)
_NAN, _INF = np.nan, np.inf


def a(*values, dtype=np.float64) -> np.ndarray:
    return np.array(values, dtype=dtype)


def _float_scale_of_integers(sample):
    if sample.input.dtype == torch.int64 and any(isinstance(sample.kwargs.get(k), float) for k in ("alpha", "beta")):
        return "torch truncates a float alpha or beta for integer tensors; opforge refuses it (docs/pytorch.md)"
    return None


OPINFO: dict[str, Case] = {
    # -- elementwise maths (opforge/ops/elementwise_math.py) ---------------------------------------------------------
    **{name: Case(refuses=_INTS) for name in (
        "tan", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "log2", "log10", "exp2", "frac")},
    "atan2": Case(refuses=_INTS, extra=(X.of(a(0.0, -0.0, 0.0, 1.0, -2.0), a(0.0, -1.0, -0.0, 0.0, _INF)),)),
    "hypot": Case(refuses=_INTS, extra=(X.of(a(0.0, 3.0, _INF), a(0.0, -4.0, _NAN)),)),
    "logaddexp": Case(refuses=_INTS, extra=(X.of(a(-_INF, _INF, 0.0, 800.0), a(-_INF, 1.0, _INF, 799.0)),)),
    "xlogy": Case(refuses=_INTS, extra=(X.of(a(0.0, 0.0, 1.5, 2.0, 0.0, -1.0), a(0.0, _NAN, 0.0, 3.0, 2.0, -1.0)),)),
    "copysign": Case(refuses=_INTS, extra=(
        X.of(a(1.0, -2.0, 0.0, -0.0, 3.0, 2.0), a(-1.0, 3.0, -1.0, 1.0, -0.0, _NAN)),
    )),
    "logit": Case(refuses=_INTS, extra=(
        X.of(a(0.05, 0.1, 0.5, 0.9, 0.95, -0.1, 1.2), 0.1),  # at and beyond both clamps
        X.of(a(0.2, -0.1, 1.2, 0.7)),  # NaN outside [0, 1] without eps, in the gradient too
    )),
    "lerp": Case(refuses=_INTS, extra=(
        X.of(a(1.5, -2.0, 0.1), a(3.0, 7.0, 1e-17), 1.0),  # weight 1: end exactly
        X.of(a(1.0, 2.0, 3.0), a(-1.0, 5.0, 0.5), a(0.0, 0.5, 0.75)),
    )),
    "trunc": Case(refuses=(torch.bool,), extra=(X.of(a(-2.5, -0.5, -0.0, 0.5, 2.5, _INF, _NAN)),)),
    "fmod": Case(refuses=(torch.bool,), extra=(
        X.of(a(5.5, -5.5, 5.5, -5.5), a(2.0, 2.0, -2.0, -2.0)),
        X.of(a(7, -7, 7, -7, dtype=np.int64), a(3, 3, -3, -3, dtype=np.int64)),
    )),
    **{name: Case(refuses=(torch.bool,), extra=(
        X.of(a(1.0, _NAN, 2.0, _NAN, 3.0, -0.0), a(_NAN, 0.5, 2.0, _NAN, -1.0, 0.0)),  # NaN ignored; ties to x
    )) for name in ("fmax", "fmin")},
    "addcmul": Case(),
    "addcdiv": Case(),
    "isinf": Case(),
    "isposinf": Case(),
    "isneginf": Case(),
    "isclose": Case(extra=(
        X.of(a(_NAN, _INF, -_INF, 1.0, 1.0), a(_NAN, _INF, _INF, 1.0 + 1e-6, 1.1), equal_nan=True),
        X.of(a(100, 101, 5, dtype=np.int64), a(100, 100, 6, dtype=np.int64), rtol=0.01, atol=0.0),
    )),
    "nan_to_num": Case(extra=(
        X.of(a(_NAN, _INF, -_INF, 1.5)), X.of(a(_NAN, _INF, -_INF, 1.5), 2.0, 1.0),
        X.of(a(_NAN, _INF, -_INF, 1.5, dtype=np.float32), neginf=-3.0),
    )),
    "bitwise_xor": Case(),
    "logical_xor": Case(),
    # -- special functions (opforge/ops/special.py) ----------------------------------------------------------------
    "erfc": Case(refuses=_INTS),
    "erfinv": Case(refuses=_INTS, extra=(X.of(a(-1.0, 1.0, -0.0, 0.0, 1.5, _NAN, 0.999999)),)),
    "lgamma": Case(refuses=_INTS, extra=(X.of(a(0.0, -0.0, -1.0, -2.5, 1e-300, _INF, -_INF, 171.5, -1e-9)),)),
    "digamma": Case(refuses=_INTS, extra=(X.of(a(0.0, -0.0, -1.0, -2.5, 1e-300, _INF, -_INF, 200.0, -1e-9)),)),
    **{f"polygamma:polygamma_n_{n}": Case(fn=lambda x, n: of.polygamma(n, x), refuses=_INTS, extra=(
        X.of(a(0.0, -1.0, -2.5, 1e-300, _INF, -_INF, 170.0, -1e-9, 3.3, -3.7), n),  # torch's values at the poles
    )) for n in range(5)},
    "i0": Case(refuses=_INTS, extra=(X.of(a(0.0, -0.0, 1e-20, -3.5, 700.0, _INF)),)),  # NaN: see docs/pytorch.md
    "special.i1": Case(fn=lambda x: F.special_i1(x), refuses=_INTS, extra=(X.of(a(0.0, -0.0, 1e-20, -3.5, 700.0)),)),
    **{name: Case(extra=(  # counts beyond the width and negative ones, as torch defines them
        X.of(a(1, -8, 5, 3, -5, 7, dtype=np.int64), a(1, 2, 64, -1, 70, 63, dtype=np.int64)),
        X.of(a(1, -8, 5, 3, -5, 7, dtype=np.int32), a(31, 2, 32, -1, 40, 3, dtype=np.int32)),
    )) for name in ("bitwise_left_shift", "bitwise_right_shift")},
    # -- reductions (opforge/ops/reduce_torch.py) ------------------------------------------------------------------
    **{name: Case() for name in ("all", "any", "count_nonzero", "nansum", "aminmax", "diff", "cummax",
                                 "cummin", "bincount")},
    "unique": Case(stride=4),  # 528 samples
    **{name: Case(refuses=_INTS) for name in ("nanmean", "logcumsumexp", "quantile", "nanquantile")},
    **{f"{name}:{variant}": Case() for name in ("var_mean", "std_mean") for variant in ("", "unbiased")},
    "trace": Case(fn=lambda x: F.trace(x)),  # of.trace traces a program
    "kthvalue": Case(refuses=(torch.bool,), ties=lambda s: (_arg(s, 1, "dim", -1), _arg(s, 2, "keepdim", False))),
    "median": Case(refuses=(torch.bool,), ties=lambda s: _median_ties(s), extra=(
        X.of(a(1.0, 2.0, 1.0, 3.0, 2.0, 1.0)), X.of(a(1.0, _NAN, 0.5, _NAN)),  # ties share; NaN propagates
        X.of(np.array([[3.0, 1.0, _NAN, 2.0], [0.5, 2.5, 1.5, -1.0]]), 1),
    )),
    "nanmedian": Case(refuses=(torch.bool,), ties=lambda s: _median_ties(s), extra=(
        X.of(a(1.0, _NAN, 0.5, _NAN, 2.0)), X.of(np.array([[3.0, 1.0, _NAN, 2.0], [_NAN, 1.5, _NAN, 0.5]]), 1),
    )),
    "mode": Case(ties=lambda s: (_arg(s, 0, "dim", -1), _arg(s, 1, "keepdim", False)), extra=(
        X.of(np.array([[2.0, 1.0, 2.0, 1.0, 3.0, 3.0, 1.0], [0.5, 0.5, 1.5, 2.5, 1.5, 4.0, 0.0]]), 1),
    )),
    # -- linear algebra (opforge/ops/linalg_torch.py) ----------------------------------------------------------------
    **{name: Case() for name in ("addmm", "addmm:decomposed", "bmm", "inner", "tensordot", "kron", "block_diag",
                                 "linalg.multi_dot", "linalg.cross", "cholesky_solve", "logdet", "linalg.slogdet",
                                 "linalg.matrix_power",
                                 "linalg.matrix_rank", "linalg.matrix_rank:hermitian", "linalg.lstsq")},
    **{name: Case() for name in ("linalg.lu_factor", "linalg.lu", "lu_unpack")},
    "linalg.lu_solve": Case(stride=3),  # 108 samples
    "linalg.solve_triangular": Case(stride=4),  # 144
    **{name: Case(symmetric=True) for name in ("linalg.eigvalsh", "linalg.pinv:hermitian")},
    **{name: Case(skip=_float_scale_of_integers) for name in ("addmv", "baddbmm")},
    # torch's float32 result is off by up to 5e-7 of the largest entry (9e4 in its samples), small entries included
    "matrix_exp": Case(tolerances={torch.float32: (2e-5, 5e-2)}),
    "linalg.pinv": Case(skip=lambda s: "a tensor rtol: opforge's pinv takes a number" if isinstance(
        s.kwargs.get("rtol"), torch.Tensor) else None),
    "linalg.lstsq:grad_oriented": Case(fn=lambda a, b, driver: of.linalg.lstsq(a, b, driver=driver)[:2]),
    "cdist": Case(rtol=1e-6),  # torch's matrix-product route (p = 2) is exact to about 1e-7 only
    "linalg.eigh": Case(symmetric=True, normalize=lambda outs, sign: [outs[0], outs[1] * sign(outs[1][..., :1, :])]),
    # -- torch's names written with ops (signbit, heaviside: elementwise_math.py; the integrals, cov (its weights
    # too) and corrcoef: reduce_torch.py; cartesian_prod, combinations: shape_functions.py) ------------------------
    **{name: Case() for name in ("signbit", "heaviside", "trapezoid", "trapz", "cumulative_trapezoid",
                                 "cartesian_prod", "combinations", "corrcoef")},
    # torch's gradient samples give cov float32 aweights that require grad, which this harness does not follow
    # (float64 leaves only); test_torch_missing_names.py checks the weighted gradients
    "cov": Case(skip=lambda s: "float32 aweights that require grad" if getattr(
        s.kwargs.get("aweights"), "requires_grad", False) else None),
}


def _arg(sample, position: int, name: str, default):
    """A sample's argument given by position or by name."""
    return sample.args[position] if len(sample.args) > position else sample.kwargs.get(name, default)


def _median_ties(sample):
    dim = _arg(sample, 0, "dim", None)
    return (0, True) if dim is None else (dim, _arg(sample, 1, "keepdim", False))


# -- the database -----------------------------------------------------------------------------------------------------


@functools.cache
def _op_db() -> dict:
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase)
    from torch.testing._internal.common_methods_invocations import op_db

    return {(o.name, o.variant_test_name): o for o in op_db}


def _opinfo(name: str):
    torch_name, _, variant = name.partition(":")
    return _op_db()[(torch_name, variant)]


def _symmetrized(fn: Callable) -> Callable:
    return lambda x, *args, **kwargs: fn(x + x.transpose(-2, -1), *args, **kwargs)


def _torch_fn(name: str, fn: Callable) -> Callable:
    return _symmetrized(fn) if OPINFO[name].symmetric else fn


def _opforge_fn(name: str) -> Callable:
    return _torch_fn(name, _opforge_fn_of(name))


def _opforge_fn_of(name: str) -> Callable:
    case = OPINFO[name]
    if case.fn is not None:
        return case.fn
    torch_name = name.partition(":")[0]
    for prefix, namespace in (("nn.functional.", F), ("linalg.", of.linalg)):
        if torch_name.startswith(prefix):
            return getattr(namespace, torch_name.removeprefix(prefix))
    return getattr(of, torch_name)


def _samples(name: str, dtype, requires_grad: bool = False, reference: bool = False) -> list:
    info = _opinfo(name)
    if dtype not in info.supported_dtypes("cpu"):
        return []
    samples = list(info.sample_inputs("cpu", dtype, requires_grad=requires_grad))
    if os.environ.get("OPFORGE_FUZZ") != "long":
        samples = samples[::OPINFO[name].stride]
    if reference:
        samples += [s for s in info.reference_inputs("cpu", dtype) if _size(s) <= SMALL]
    samples += [x.to_torch(requires_grad) for x in OPINFO[name].extra
                if str(x.input.dtype) == str(dtype).removeprefix("torch.")]
    skip = OPINFO[name].skip
    return [s for s in samples if all(t.dtype in _OURS for t in _tensors((s.input, s.args, s.kwargs)))
            and (skip is None or skip(s) is None)]


# the dtypes opforge has (a reference input may mix in complex or uint8 tensors: promotion tests of other dtypes)
_OURS = (torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _size(sample) -> int:
    return sum(t.numel() for t in _tensors((sample.input, sample.args, sample.kwargs)))


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


# -- both frameworks on one sample ----------------------------------------------------------------------------------


def _to_opforge(value, leaves: dict | None = None):
    """torch's arguments for opforge: tensors as opforge tensors (floating ones as leaves when ``leaves`` collects
    them), torch dtypes as NumPy's; numbers, strings and the rest as they are."""
    if isinstance(value, torch.Tensor):
        t = of.tensor(_array(value).copy(), requires_grad=leaves is not None and value.dtype == torch.float64)
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


def _outputs(result) -> list:
    """The tensors a call returned, in order (a tuple or named tuple of them, or one)."""
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _outputs(r)]
    return [result]


def _array(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        if t.dtype == torch.bfloat16:  # which torch's .numpy() does not convert
            return t.detach().float().numpy(force=True).astype(of.bfloat16)
        return t.detach().numpy(force=True)
    if isinstance(t, of.Tensor):
        return t.numpy()
    return np.asarray(t)


def assert_same(got, want, what: str, rtol: float, atol: float) -> None:
    got, want = _array(got), _array(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch says {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch says {want.dtype}"
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _normalized(name: str, outputs: list, sign) -> list:
    normalize = OPINFO[name].normalize
    return outputs if normalize is None else normalize(outputs, sign)


def _describe(sample) -> str:
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"{v.dtype}{list(v.shape)}".replace("torch.", "")
        return repr(v)
    return (f"input {one(sample.input)}, args ({', '.join(one(a) for a in sample.args)}), "
            f"kwargs {{{', '.join(f'{k}: {one(v)}' for k, v in sample.kwargs.items())}}}")


def _tolerances(name: str, dtype) -> tuple:
    rtol, atol = (OPINFO[name].tolerances or {}).get(dtype, TOLERANCES.get(dtype, (0, 0)))
    if dtype == torch.float64 and OPINFO[name].rtol is not None:
        rtol = OPINFO[name].rtol
    return rtol, atol


def _empty_dims(sample) -> bool:
    """Whether a sample reduces over an empty list of dims (``dim=()``), which every opforge reduction refuses."""
    dims = sample.kwargs.get("dim", sample.args[0] if sample.args else None)
    return isinstance(dims, (tuple, list)) and not dims


def _check_call(name, sample, of_call, torch_call, dtype, what) -> None:
    with np.errstate(all="ignore"):
        want = _normalized(name, _outputs(torch_call(sample.input, *sample.args, **sample.kwargs)), torch.sign)
        if _empty_dims(sample):  # torch's all/any reduce no dim there, its sum every dim: opforge refuses it
            with pytest.raises(of.ArgumentError, match=r"dim=\(\).*ambiguous"):
                of_call(*_to_opforge([sample.input, *sample.args]), **_to_opforge(sample.kwargs))
            return
        if dtype in OPINFO[name].refuses:
            with pytest.raises(of.OpforgeError, match=name.split(".")[-1].partition(":")[0]):
                of_call(*_to_opforge([sample.input, *sample.args]), **_to_opforge(sample.kwargs))
            return
        got = _normalized(name, _outputs(of_call(*_to_opforge([sample.input, *sample.args]),
                                                 **_to_opforge(sample.kwargs))), F.sign)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, torch gives {len(want)}"
    if OPINFO[name].ties is not None and len(got) == 2:  # the indices: of an element equal to the value
        dim, keepdim = OPINFO[name].ties(sample)
        x, index = _array(sample.input), _array(got[1])
        index = index if keepdim or not x.ndim else np.expand_dims(index, dim)
        named = np.take_along_axis(x, index, dim) if x.ndim else x
        got[1] = named.reshape(_array(want[0]).shape)
        want = [want[0], want[0]]
    for i, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"{what}, output {i}, {_describe(sample)}", *_tolerances(name, getattr(w, "dtype", None)))


# -- the tests --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", sorted(OPINFO))
def test_forward(name, dtype):
    info = _opinfo(name)
    samples = _samples(name, dtype, reference=dtype in (torch.float64, torch.int64))
    if not samples:
        pytest.skip(f"torch's {name} takes no {dtype}")
    for sample in samples:
        _check_call(name, sample, _opforge_fn(name), _torch_fn(name, info.op), dtype, f"{name} in {dtype}")


@pytest.mark.parametrize("name", sorted(OPINFO))
def test_method(name):
    info = _opinfo(name)
    if info.method_variant is None:
        pytest.skip(f"torch has no Tensor.{name}")
    torch_name = name.partition(":")[0]
    for sample in _samples(name, torch.float64):
        _check_call(name, sample, lambda x, *a, **k: getattr(x, torch_name)(*a, **k), info.method_variant,
                    torch.float64, f"Tensor.{torch_name}")
        if info.inplace_variant is None or _is_broadcast_up(sample):
            continue
        # in place: the method writes its result into the tensor (the same values as out of place)
        with np.errstate(all="ignore"):
            want = info.inplace_variant(sample.input.clone(), *sample.args, **sample.kwargs)
            x = _to_opforge(sample.input)
            got = getattr(x, f"{torch_name}_")(*_to_opforge(list(sample.args)), **_to_opforge(sample.kwargs))
        assert got is x, f"Tensor.{torch_name}_ must return the tensor it changed"
        assert_same(x, want, f"Tensor.{torch_name}_, {_describe(sample)}", *_tolerances(name, torch.float64))


def _is_broadcast_up(sample) -> bool:
    """Whether the result is larger than the input: an in-place call refuses that, in torch as in opforge."""
    shapes = [tuple(t.shape) for t in _tensors((sample.input, sample.args))]
    try:
        return tuple(np.broadcast_shapes(*shapes)) != tuple(sample.input.shape)
    except ValueError:
        return True


@pytest.mark.parametrize("name", sorted(OPINFO))
def test_gradients(name):
    info = _opinfo(name)
    if not info.supports_autograd:
        pytest.skip(f"torch's {name} has no gradient")
    second = info.supports_gradgrad and OPINFO[name].gradgrad
    for sample in _samples(name, torch.float64, requires_grad=True):
        torch_leaves = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
        with np.errstate(all="ignore"):
            torch_out = _normalized(name, _outputs(_torch_fn(name, info.op)(sample.input, *sample.args,
                                                                            **sample.kwargs)), torch.sign)
            # the outputs torch differentiates (not an empty one, such as lstsq's residuals for some drivers)
            differentiated = [i for i, o in enumerate(torch_out) if isinstance(o, torch.Tensor)
                              and o.dtype == torch.float64 and o.requires_grad and o.numel()]
            if not torch_leaves or not differentiated or _empty_dims(sample):  # refused: test_forward checks it
                continue
            of_leaves: dict = {}
            got = _opforge_fn(name)(*_to_opforge([sample.input, *sample.args], of_leaves),
                                    **_to_opforge(sample.kwargs, of_leaves))
            of_out = _normalized(name, _outputs(got), F.sign)
            assert len(of_out) == len(torch_out), f"{name}: {len(of_out)} outputs, torch {len(torch_out)}"
            want_out, got_out = [torch_out[i] for i in differentiated], [of_out[i] for i in differentiated]
            assert all(o.requires_grad for o in got_out), f"{name}: an output torch differentiates is not recorded"
            leaves = [of_leaves[id(t)] for t in torch_leaves]
            want = _derivatives(TORCH, want_out, torch_leaves, second)
            got = _derivatives(OPFORGE, got_out, leaves, second)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{name}: derivative {i}, {_describe(sample)}", *_tolerances(name, torch.float64))


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
