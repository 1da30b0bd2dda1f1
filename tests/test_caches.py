"""A cache never changes a result (issue 30): what a cache is keyed on tells apart every value the cached result
depends on, where ``==`` does not (``-0.0 == 0.0``, ``1 == 1.0 == True``, ``nan != nan``)."""

import numpy as np

import opforge as of
from opforge import nn
from opforge import ops as F

NEG_ZERO = np.array([-0.0])


def _signs(t) -> list:
    return np.signbit(t.numpy()).tolist()


def test_a_python_minus_zero_is_not_the_lifted_zero_of_an_earlier_call():
    x = of.tensor(NEG_ZERO)
    assert _signs(x + 0.0) == [False]  # -0.0 + 0.0 = 0.0: lifts 0.0 (and caches its tensor)
    assert _signs(x + -0.0) == [True]  # -0.0 + -0.0 = -0.0, whatever was lifted before
    with np.errstate(divide="ignore"):
        assert (1 / (x + -0.0)).numpy().tolist() == [-np.inf]
    assert np.isnan((x + float("nan")).numpy()).all() and np.isnan((x + float("nan")).numpy()).all()


def test_a_kernels_typed_constant_of_zero_keeps_its_sign():
    x = of.tensor([-1.0])
    assert _signs(F.leaky_relu(x, alpha=0.0)) == [True]  # max(-1, -1·0.0) = -0.0
    assert _signs(F.leaky_relu(x, alpha=-0.0)) == [False]  # max(-1, -1·-0.0) = 0.0


def test_a_compiled_function_traces_again_for_minus_zero_and_finds_its_nan_trace():
    @of.compile
    def f(x, c):
        return x + c

    x = of.tensor(NEG_ZERO)
    assert _signs(f(x, 0.0)) == [False]
    assert _signs(f(x, -0.0)) == [True]
    for _ in range(3):
        assert np.isnan(f(x, float("nan")).numpy()).all()
    assert sum(len(entries) for entries in f.cache.values()) == 3  # 0.0, -0.0 and one for every NaN


def test_the_executor_does_not_merge_ops_whose_attrs_only_compare_equal():
    @of.compile
    def f(x):
        return F.leaky_relu(x, alpha=0.0), F.leaky_relu(x, alpha=-0.0)

    a, b = f(of.tensor([-1.0]))
    assert _signs(a) == [True] and _signs(b) == [False]


class _Scale(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x):
        return x * self.c


def test_a_module_attribute_that_changes_type_or_sign_of_zero_traces_again():
    m = _Scale(2)
    f = of.compile(lambda x: m(x))
    x = of.tensor([3])
    assert f(x).dtype == of.int64
    m.c = 2.0  # == 2, but an int tensor times 2.0 is floating
    assert f(x).dtype == m(x).dtype != of.int64
    m.c = 0.0
    y = of.tensor(NEG_ZERO)
    assert _signs(f(y)) == [True]
    m.c = -0.0
    assert _signs(f(y)) == _signs(m(y)) == [False]
