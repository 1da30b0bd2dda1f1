"""Fuzzing every registered op: bad Python types, disallowed dtypes, out-of-range axes, mismatched shapes, empty
and 0-d tensors, NaN and inf, ints no float can hold — eagerly (with a backward pass where the call succeeds) and
traced into a program and run.

Each case must end in a result or in an ``OpforgeError`` naming the op (a TypeError Python raises binding the
call — an unknown keyword, a positional too many — is fine too), under a watchdog and a memory ceiling. The cases
come from each op's own samples, changed one argument at a time; ``make test`` runs a seeded sample of them,
``OPFORGE_FUZZ=long`` all of them for every sample.
"""

from __future__ import annotations

import numpy as np
import pytest
from fuzzing import LONG, SEED, count, hard_deadline, memory_ceiling, quiet, run_case

import opforge as of
from opforge import ops as F
from opforge.core import dtypes as D
from opforge.core.opdef import registry
from opforge.core.spec import Spec
from opforge.tensor import Tensor
from opforge.testing.conformance import _flat, default_samples

BAD_TENSORS = [None, "text", 1j, object(), {"a": 1}, b"x", [[1.0], [1.0, 2.0]], ["a"], np.array(["a"]),
               np.array([1 + 2j]), np.array([1.0], dtype=object), np.ones(2, np.float16), np.ones(2, np.uint8),
               True, 10**400, float("nan"), (), [[]]]
BAD_ATTRS = {
    "int": [-1, 0, 2**62, -(2**62), 10**400, 1.5, "x", None, True, [1], np.int64(3), np.float64(2.0), float("nan")],
    "float": [float("nan"), float("inf"), -float("inf"), 10**400, -(10**400), 1e308, "x", None, True, [1.0], 0, -1,
              np.float32(0.5)],
    "bool": [1, "True", None, np.bool_(True), 0.0],
    "str": [1.5, "", "nonsense", None, b"mean"],
    "dtype": ["complex128", "float16", "x", 5, None, np.float32, "bool", object, "(-1,)f8", ">f8"],
}
BAD_INT_LISTS = [[], [-1], [2**62], [10**400], [1.5], "x", [[1]], [None], 5, [1] * 70, [0, 0], (-1, -1), [True]]
AXIS_NAMES = {"axis", "axes", "dims", "perm", "dim"}


def samples_of(opdef, rng):
    make = opdef.samples_fn or (lambda r: default_samples(opdef, r))
    return list(make(rng))


def _reshaped(array: np.ndarray, rng) -> list:
    """Shape variants of one input: a dim more or less, transposed, one dim off by one, empty, 0-d."""
    out = [("a leading dim more", np.stack([array, array])), ("0-d", np.asarray(array.reshape(-1)[:1].sum()
                                                                               if array.size else 0.0, array.dtype))]
    if array.ndim:
        out.append(("its leading dim dropped", array[0].copy() if len(array) else np.zeros(array.shape[1:])))
        grown = list(array.shape)
        k = int(rng.integers(array.ndim))
        grown[k] += 1
        out.append((f"dim {k} one longer", np.resize(array, grown)))
        empty = list(array.shape)
        empty[k] = 0
        out.append((f"dim {k} empty", np.zeros(empty, array.dtype)))
    if array.ndim >= 2:
        out.append(("transposed", array.T.copy()))
    return out


def cases(opdef, sample, rng):
    """(label, args, kwargs) for one sample of the op, each changed in one place."""
    args, kwargs = list(sample.args), dict(sample.kwargs)
    yield "as sampled", args, kwargs
    for i, value in enumerate(args):
        p = opdef.inputs[i] if i < len(opdef.inputs) else None
        name = p.name if p is not None else f"#{i}"
        if isinstance(value, list):
            for label, bad in [("[]", []), ("[None]", [None]), ("'text'", "text"), ("one dropped", value[:-1]),
                               ("one repeated", [*value, value[-1]]), ("a tuple", tuple(value)),
                               ("mixed dtypes", [np.asarray(v).astype(np.int32) if k == 0 else v
                                                 for k, v in enumerate(value)])]:
                yield f"{name}={label}", [*args[:i], bad, *args[i + 1:]], kwargs
            continue
        for bad in BAD_TENSORS:
            yield f"{name}={bad!r:.30}", [*args[:i], bad, *args[i + 1:]], kwargs
        if not isinstance(value, np.ndarray):
            continue
        for dt in D.SUPPORTED:
            if dt != value.dtype:
                yield f"{name} as {dt}", [*args[:i], value.astype(dt), *args[i + 1:]], kwargs
        for label, changed in _reshaped(value, rng):
            yield f"{name} {label}", [*args[:i], changed, *args[i + 1:]], kwargs
        if value.dtype.kind == "f" and value.size:
            for special in (np.nan, np.inf, -np.inf):
                changed = value.copy()
                changed.reshape(-1)[rng.integers(value.size)] = special
                yield f"{name} holding {special}", [*args[:i], changed, *args[i + 1:]], kwargs
    ndim = max((np.ndim(a) for a in args if isinstance(a, np.ndarray)), default=1)
    for p in opdef.attrs:
        if p.is_list:
            bad_values = list(BAD_INT_LISTS)
            if p.name in AXIS_NAMES:
                bad_values += [[ndim], [-ndim - 1], list(range(ndim + 1))]
        else:
            bad_values = list(BAD_ATTRS[p.type])
            if p.name in AXIS_NAMES:
                bad_values += [ndim, -ndim - 1, 64]
        for bad in bad_values:
            yield f"{p.name}={bad!r:.30}", args, {**kwargs, p.name: bad}
    yield "a positional too many", [*args, np.ones(2)] + [None] * len(opdef.attrs), kwargs
    yield "an unknown keyword", args, {**kwargs, "no_such_argument": 1}


def _tensors(values, requires_grad: bool):
    def one(v):
        if isinstance(v, np.ndarray) and v.dtype in D.SUPPORTED:
            return of.tensor(v, requires_grad=requires_grad and v.dtype.kind == "f")
        return v

    return [[one(x) for x in v] if isinstance(v, list) else one(v) for v in values]


class InBackward(of.OpforgeError):
    """An error of the backward pass that does not name the op differentiated (see ``core_issue``)."""


def _call(opdef, args, kwargs):
    """The op called with a sample's inputs by name (an op's attrs may come between its inputs, as torch's
    gather(input, dim, index)); more positional arguments than inputs stay positional (a wrong call)."""
    if len(args) > len(opdef.input_names):
        return opdef.fn(*args, **kwargs)
    return opdef.fn(**dict(zip(opdef.input_names, args)), **kwargs)


def run_eager(opdef, args, kwargs):
    """The call on Tensors that require grad, then a backward pass from each float output."""
    out = _call(opdef, _tensors(args, True), {k: _tensors([v], True)[0] for k, v in kwargs.items()})
    for t in _flat(out):
        if isinstance(t, Tensor) and t.requires_grad:
            try:
                F.sum(t).backward(retain_graph=True)
            except of.OpforgeError as e:
                if opdef.name in str(e):
                    raise
                raise InBackward(f"in the backward pass, {type(e).__name__}: {e}") from e


def run_traced(opdef, args, kwargs):
    """The call traced into a program (its tensor inputs fed), and the program run."""
    feeds, slots = {}, []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype in D.SUPPORTED:
            feeds[f"a{i}"] = a
            slots.append(f"a{i}")
        else:
            slots.append(None)
    if not feeds:
        return

    def fn(**variables):
        return {f"out{k}": o for k, o in enumerate(_flat(_call(
            opdef, [variables[s] if s else a for a, s in zip(args, slots)], kwargs)))}

    program = of.trace(fn, **{n: Spec(a.shape, a.dtype) for n, a in feeds.items()})
    of.Executor(program).run(**feeds)


def fuzz(opdefs, per_op: int | None, seed: int, traced: bool):
    """Run the cases (``per_op`` of them per op, chosen at random; all of every sample with None). Return the
    number run and the problems found."""
    rng = np.random.default_rng(seed)
    problems, ran = [], 0
    with memory_ceiling(), quiet(), hard_deadline(count(300, 3000)):
        for opdef in opdefs:
            samples = samples_of(opdef, rng)
            chosen = [samples[rng.integers(len(samples))]] if per_op is not None else samples
            all_cases = [c for s in chosen for c in cases(opdef, s, rng)]
            if per_op is not None:
                picks = rng.choice(len(all_cases), min(per_op, len(all_cases)), replace=False)
                all_cases = [all_cases[0], *(all_cases[k] for k in sorted(picks) if k)]
            for label, args, kwargs in all_cases:
                modes = [("eager", run_eager)] + ([("traced", run_traced)] if traced else [])
                for mode, runner in modes:
                    ran += 1
                    what = f"{opdef.name} [{mode}] {label}"
                    problem = run_case(10, lambda what=what: what,
                                       lambda o=opdef, r=runner, a=args, k=kwargs: r(o, a, k), opdef.name)
                    if problem:
                        problems.append(f"{what}: {problem}")
    return ran, problems


def test_fuzz_every_op_with_bad_arguments():
    ran, problems = fuzz(list(registry), per_op=count(8, None), seed=SEED, traced=True)
    assert not problems, f"{len(problems)} of {ran} cases failed:\n" + "\n".join(problems[:40])


@pytest.mark.skipif(not LONG, reason="a longer fuzz run: OPFORGE_FUZZ=long")
@pytest.mark.parametrize("seed", range(3))
def test_fuzz_every_op_long(seed):
    ran, problems = fuzz(list(registry), per_op=None, seed=SEED + 1000 + seed, traced=True)
    print(f"{ran} cases, {len(problems)} problems")
    assert not problems, f"{len(problems)} of {ran} cases failed:\n" + "\n".join(problems[:80])


# -- what the fuzzing found in the core (dispatch, trace, the executor, the engine), fixed there ---------------

@pytest.mark.parametrize("how", ["call", "operator", "traced"])
@pytest.mark.parametrize("big", [2**63, 10**400], ids=["2**63", "10**400"])
def test_a_python_int_no_dtype_holds_as_a_tensor_input_is_an_argument_error(how, big):
    x = np.ones(3, np.int64)
    with pytest.raises(of.ArgumentError, match="add\\(\\): argument 'y'"):
        if how == "traced":
            of.trace(lambda x: F.add(x, big), x=Spec(x.shape, x.dtype))
        elif how == "operator":
            of.tensor(x) + big
        else:
            F.add(of.tensor(x), big)


@pytest.mark.parametrize("call", [
    lambda x: F.max_pool2d(x, kernel_size=[2, 2], stride=[0, 0]),
    lambda x: F.pad(x, pad=[1, 1], mode="nonsense"),
])
def test_tracing_runs_the_ops_attr_checks(call):
    """Found by the fuzzing (shape rules crashing on attrs the check refuses), fixed by the interpreter stack."""
    x = np.ones((1, 1, 4, 4))
    with pytest.raises(of.ArgumentError):
        call(of.tensor(x))  # eagerly: refused by the check
    with pytest.raises(of.ArgumentError):
        of.trace(call, x=Spec(x.shape, x.dtype))


@pytest.mark.parametrize("scalar", [0.5, np.float64(0.5), np.array(0.5)], ids=["float", "numpy scalar", "0-d array"])
def test_an_elementwise_op_refuses_a_scalar_of_another_shape_as_it_refuses_a_0d_tensor(scalar):
    dy = of.tensor(np.ones((3, 4)))
    with pytest.raises(of.ShapeError, match="tanh_grad\\(\\): argument 'dy' has shape \\(3, 4\\)"):
        F.tanh_grad(of.tensor(0.5), dy)
    with pytest.raises(of.ShapeError, match="tanh_grad\\(\\): argument 'dy' has shape \\(3, 4\\)"):
        F.tanh_grad(scalar, dy)


def test_an_error_inside_a_gradient_rule_names_the_op_differentiated():
    a = of.tensor(np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), requires_grad=True)  # rank 1: r is singular
    q, _ = F.linalg_qr(a)
    with pytest.raises(of.OpforgeError, match="linalg_qr"):
        F.sum(q).backward()


def test_a_program_with_an_impossible_static_size_fails_with_an_opforge_error():
    x = np.ones(3)
    prog = of.trace(lambda x: F.broadcast_to(x, shape=[10**28, 3]), x=Spec(x.shape, x.dtype))
    with pytest.raises(of.OpforgeError):
        of.Executor(prog).run(x=x)


def test_interpolate_with_a_size_no_float_holds_is_a_shape_error():
    # Found by the long fuzz run: the output size floor(n·scale) raised a raw OverflowError, traced and eager.
    dy = of.tensor(np.ones((1, 1, 4)))
    with pytest.raises(of.ShapeError, match=r"interpolate_grad.*int of 1329 bits.*too large"):
        F.interpolate_grad(dy, input_size=[10**400], scale_factor=[2.0])
