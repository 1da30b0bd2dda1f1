"""Compiled mode means what eager mode means (issue 30): in-place updates of arguments, guards on module state held in
containers and arrays, captured views, the bound on a compiled function's cache, compiling a module, and planning
long programs in near-linear time. Eager is the oracle: each test runs the same code both ways."""

from __future__ import annotations

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.program.desc import OpDesc


def ramp(*shape, start=1.0):
    return of.tensor(np.arange(start, start + np.prod(shape), dtype=np.float32).reshape(shape))


def assert_same(eager, compiled):
    if isinstance(eager, (tuple, list)):
        assert len(eager) == len(compiled)
        for e, c in zip(eager, compiled):
            assert_same(e, c)
        return
    np.testing.assert_array_equal(np.asarray(compiled.numpy() if isinstance(compiled, of.Tensor) else compiled),
                                  np.asarray(eager.numpy() if isinstance(eager, of.Tensor) else eager))


# -- 6. planning a long chain of pointwise ops ----------------------------------------------------------------------


def _chain(n: int):
    def fn(x):
        y = x
        for i in range(n):  # every op reads the input too: a group whose members have two readers' worth of inputs
            y = F.tanh(y) if i % 2 else y + x * 0.5
        return y

    return fn


def test_planning_a_chain_of_ten_thousand_pointwise_ops_is_near_linear(monkeypatch):
    # Planning scanned every member of a fused group per member, and labelled each member's line of generated code
    # with the group's whole text: 10**4 ops took minutes. Counted here: the reads of an op's inputs while planning,
    # and the text of the labels; a quadratic plan does 10x more of both per op at 10**4 ops than at 10**3.
    reads = [0]
    input_names = OpDesc.input_names

    def counted(self):
        reads[0] += 1
        return input_names(self)

    monkeypatch.setattr(OpDesc, "input_names", counted)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    per_op = {}
    for n in (1000, 10000):
        program = of.trace(_chain(n), x=of.Spec((8,), "float32"))
        reads[0] = 0
        plan = of.Executor(program).plan(x=x)
        assert plan.steps == 1  # one fused group
        per_op[n] = (reads[0] / n, sum(map(len, plan.line_ops.values())) / n)
    assert per_op[10000][0] < 2 * per_op[1000][0] and per_op[10000][1] < 2 * per_op[1000][1], per_op
    with of.no_grad():
        eager = _chain(10000)(of.tensor(x))
    np.testing.assert_allclose(of.compile(_chain(10000))(of.tensor(x)).numpy(), eager.numpy(), rtol=1e-6)


# -- 5. compiling a module -------------------------------------------------------------------------------------------


def test_a_compiled_module_runs_the_module_compiled_with_its_own_parameters():
    layer = of.nn.Linear(3, 2)
    compiled = of.compile(layer)
    x = ramp(4, 3)
    assert_same(layer(x), compiled(x))
    assert compiled.__name__ == "Linear" and compiled.__wrapped__ is layer
    assert compiled.weight is layer.weight and all(a is b for a, b in zip(compiled.parameters(), layer.parameters()))
    with of.no_grad():
        layer.weight.mul_(2.0)  # the module's own parameters: the compiled module reads them as they are now
    assert_same(layer(x), compiled(x))
    assert_same(layer(x), compiled(x=x))  # calls bind as the module's forward does
    assert len(compiled.cache) == 1
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'no_such_thing'"):
        compiled.no_such_thing
    with pytest.raises(of.ArgumentError, match="compile\\(\\): expected a function or a module, got"):
        of.compile(3)
