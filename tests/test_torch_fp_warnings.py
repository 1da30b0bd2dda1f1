"""opforge's kernels are as silent as torch's about floating-point exceptions (log(0) = −inf, 1/0 = inf, 0/0 = NaN,
sqrt(−1) = NaN, exp(1000) = inf, with no NumPy RuntimeWarning), eagerly, compiled and in backward — under the
default warnings filters, under a user's ``simplefilter("error")`` and under ``np.errstate(all="raise")`` — while
the user's own NumPy calls warn as before. The values are torch's."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F

# (name, opforge's function, torch's, inputs)
CASES = [
    ("log(0)", F.log, torch.log, [0.0]),
    ("1/0", lambda a, b: a / b, lambda a, b: a / b, [1.0, 0.0]),
    ("0/0", lambda a, b: a / b, lambda a, b: a / b, [0.0, 0.0]),
    ("sqrt(-1)", F.sqrt, torch.sqrt, [-1.0]),
    ("exp(1000)", F.exp, torch.exp, [1000.0]),
    ("x**-1 at 0", lambda a: a ** -1.0, lambda a: a ** -1.0, [0.0]),
    ("tanh(log(0) * 2) + 1", lambda a: F.tanh(F.log(a) * 2) + 1, lambda a: torch.tanh(torch.log(a) * 2) + 1, [0.0]),
    ("mul overflow", lambda a, b: a * b, lambda a, b: a * b, [1e30, 1e30]),  # float32's largest is 3.4e38
]


def _arrays(values, dtype=np.float32):
    return [np.full(8, v, dtype) for v in values]


def _assert_as_torch(got, want):
    np.testing.assert_array_equal(np.asarray(got), want.detach().numpy())


def _check_silent_and_as_torch(fn, torch_fn, values):
    """Every form of the call, under the filters and NumPy settings in force: nothing warned (an error here
    would raise), and torch's values."""
    want = torch_fn(*[torch.tensor(a) for a in _arrays(values)])
    _assert_as_torch(fn(*[of.tensor(a) for a in _arrays(values)]).numpy(), want)
    _assert_as_torch(of.compile(fn)(*[of.tensor(a) for a in _arrays(values)]).numpy(), want)
    ours = [of.tensor(a, requires_grad=True) for a in _arrays(values, np.float64)]
    theirs = [torch.tensor(a, requires_grad=True) for a in _arrays(values, np.float64)]
    for _ in range(3):  # run as written, then recorded and replayed (the backward pass's fast path)
        got = of.grad(F.sum(fn(*ours)), ours)
    want = torch.autograd.grad(torch_fn(*theirs).sum(), theirs)
    for g, w in zip(got, want):
        _assert_as_torch(g.numpy(), w)


@pytest.mark.parametrize(("name", "fn", "torch_fn", "values"), CASES, ids=[c[0] for c in CASES])
def test_silent_under_a_users_error_filter(name, fn, torch_fn, values):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in front of opforge's filter: a warning would be an exception
        _check_silent_and_as_torch(fn, torch_fn, values)


@pytest.mark.parametrize(("name", "fn", "torch_fn", "values"), CASES, ids=[c[0] for c in CASES])
def test_silent_under_a_users_errstate_raise(name, fn, torch_fn, values):
    with np.errstate(all="raise"):  # NumPy's FloatingPointError in place of a warning: torch ignores it
        _check_silent_and_as_torch(fn, torch_fn, values)
        with pytest.raises(FloatingPointError):  # the user's own NumPy call keeps the user's settings
            np.log(np.zeros(1))


@pytest.mark.parametrize(("name", "fn", "torch_fn", "values"), CASES, ids=[c[0] for c in CASES])
def test_silent_under_the_default_filters(name, fn, torch_fn, values):
    with warnings.catch_warnings(record=True) as caught:
        # the filters as a script that imported opforge has them: pytest gives each test the filters it found before
        # collecting, without the one opforge's import (during collection) installed
        of.core.floating_point.install_filter()
        _check_silent_and_as_torch(fn, torch_fn, values)
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_random_op_under_an_error_filter_draws_once():
    x = of.tensor(np.full(1000, 3e38, np.float32))
    of.manual_seed(0)
    want = F.dropout(x, 0.5).numpy()  # 3e38 / 0.5 overflows float32: inf where kept, as torch
    assert np.isinf(want).any() and (want == 0).any()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        of.manual_seed(0)
        got = F.dropout(x, 0.5).numpy()
        after = F.dropout(x, 0.5).numpy()
    np.testing.assert_array_equal(got, want)  # drawn once: the same mask as without the filter, and so next
    of.manual_seed(0)
    F.dropout(x, 0.5)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), after)


def test_a_users_numpy_still_warns_in_a_fresh_process():
    """Under Python's default filters: opforge's log(0) says nothing, the user's np.log(0) warns as always, from the
    user's line."""
    script = ("import numpy as np, opforge as of\n"
              "of.log(of.tensor(0.0)); of.tensor([1.0]) / of.tensor([0.0]); of.compile(of.ops.log)(of.tensor(0.0))\n"
              "np.log(np.zeros(1))\n")
    env = {**os.environ, "PYTHONWARNINGS": ""}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                            check=True)
    lines = [line for line in result.stderr.splitlines() if "encountered" in line]
    assert len(lines) == 1 and lines[0].startswith("<string>:3: RuntimeWarning: divide by zero encountered in log"), \
        result.stderr
