"""The interpreter boundary: what an op call means is decided per thread by the innermost interpreter."""

import sys
import threading

import numpy as np
import pytest

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.dispatch import EAGER, Interpreter, current_interpreter, interpreting
from opforge.program import Tracer, Variable


class Counting(Interpreter):
    """Counts op calls by name and runs them eagerly: the smallest interpreter there is."""

    def __init__(self):
        self.calls = []

    def apply(self, op, inputs, attrs):
        self.calls.append(op.name)
        with interpreting(EAGER):
            return op.fn(*inputs, **attrs)


def test_every_call_goes_to_the_innermost_interpreter_and_eager_is_the_bottom():
    assert current_interpreter() is EAGER
    x = of.tensor([1.0, -2.0], requires_grad=True)
    with interpreting(Counting()) as counting:
        y = F.relu(x) * 2.0 + 1
        y.sum().backward()  # the engine's ops (ones_like, the rules' ops) are calls too
    assert counting.calls[:3] == ["relu", "mul", "add"] and "relu_grad" in counting.calls
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0])
    assert current_interpreter() is EAGER


def test_eager_inside_a_trace_runs_kernels_now():
    seen = {}

    def fn(x):
        with interpreting(EAGER):
            seen["eager"] = F.relu(of.tensor([-1.0, 3.0]))
        return F.relu(x)

    program = of.trace(fn, x=of.Spec((2,), "float32"))
    assert isinstance(seen["eager"], of.Tensor) and seen["eager"].tolist() == [0.0, 3.0]
    assert [op.type for op in program.block.ops] == ["relu"]


def test_a_trace_in_one_thread_leaves_every_other_thread_eager():
    inside, release, results = threading.Event(), threading.Event(), {}

    def traced(x):
        inside.set()
        release.wait(10)
        return F.relu(x)

    def trace():
        results["program"] = of.trace(traced, x=of.Spec((2,), "float32"))

    tracer = threading.Thread(target=trace)
    tracer.start()
    assert inside.wait(10)
    try:
        assert current_interpreter() is EAGER
        y = F.relu(of.tensor([-1.0, 2.0]))  # the fast path, in this thread, while the other traces
        assert type(y) is of.Tensor and y.tolist() == [0.0, 2.0]
    finally:
        release.set()
        tracer.join(10)
    assert [op.type for op in results["program"].block.ops] == ["relu"]


def test_a_variable_used_after_its_trace_still_goes_to_its_program():
    program = of.trace(lambda x: F.exp(x), x=of.Spec((3,), "float64"))
    out = Variable(program, program.outputs["out"])
    y = F.log(out)
    assert isinstance(y, Variable) and program.block.ops[-1].type == "log"
    assert isinstance(out.interpreter, Tracer)


def test_attr_checks_run_while_tracing_too():
    with pytest.raises(of.ArgumentError, match=r"leaky_relu\(\).*alpha"):
        of.trace(lambda x: F.leaky_relu(x, alpha="big"), x=of.Spec((2,), "float32"))
    with pytest.raises(of.ArgumentError, match="dropout"):
        of.trace(lambda x: F.dropout(x, p=1.5), x=of.Spec((2,), "float32"))


def test_generated_functions_have_no_dead_guards_and_optional_inputs_get_the_fast_path():
    from opforge.dispatch import api_source

    for op in of.registry:
        assert "if True" not in api_source(op)
    linear = of.registry.get("linear")
    assert linear.fast_path and "type(x) is _of_T" in api_source(linear)
    x, w = of.tensor(np.ones((2, 3))), of.tensor(np.ones((4, 3)), requires_grad=True)
    y = F.linear(x, w, None)
    assert y.shape == (2, 4) and y.requires_grad


def test_a_tuple_of_tensors_in_a_tensor_slot_is_refused():
    y = F.dropout_with_mask(of.ones(2, 8), p=0.5)  # (y, mask): a multi-output op's result
    with pytest.raises(of.ArgumentError, match=r"relu\(\): argument 'x' expected Tensor, got a .*holding tensors"):
        F.relu(y)


def test_threads_training_eagerly_while_another_compiles_give_what_they_give_alone():
    """Four threads train eagerly while a fifth compiles and runs a training step: each result is bit-identical
    to the same work done alone (tracing state is per thread; nothing leaks between them). With a process-wide
    "tracing" counter, as before the interpreter stack, the eager threads ended in RecursionError."""

    def eager_training(seed):
        of.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        opt = of.optim.Adam(model.parameters(), lr=1e-2)
        rng = np.random.default_rng(seed)
        for _ in range(30):
            x, y = of.tensor(rng.standard_normal((8, 4)), "float32"), of.tensor(rng.standard_normal((8, 1)), "float32")
            loss = F.mean(F.square(model(x) - y))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [p.numpy().copy() for p in model.parameters()]

    def compiled_training(seed):
        of.manual_seed(seed)
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = of.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        @of.compile(max_cache=30)  # each of its 30 batch sizes traced (past the default limit: run eagerly)
        def step(x, y):
            loss = F.mean(F.square(model(x) - y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        rng = np.random.default_rng(seed)
        for n in range(4, 34):  # a new batch size each step: 30 traces, while the other threads run
            step(of.tensor(rng.standard_normal((n, 4)).astype("float32")),
                 of.tensor(rng.standard_normal((n, 1)).astype("float32")))
        return [p.numpy().copy() for p in model.parameters()]

    jobs = [(eager_training, s) for s in range(4)] + [(compiled_training, 9)]
    alone = [fn(seed) for fn, seed in jobs]
    together, errors = [None] * len(jobs), []

    def run(i, fn, seed):
        try:
            together[i] = fn(seed)
        except BaseException as e:  # reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so that interleavings happen
    try:
        threads = [threading.Thread(target=run, args=(i, fn, seed)) for i, (fn, seed) in enumerate(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    for got, want in zip(together, alone):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


# -- of.detect_anomaly(): an interpreter too ------------------------------------------------------------------------


def test_detect_anomaly_names_the_forward_op_and_the_users_line():
    x = of.tensor([1.0, -1.0])
    with of.detect_anomaly(), pytest.raises(of.AnomalyError) as info, np.errstate(invalid="ignore"):
        F.log(x)  # the line the error must name
    text = str(info.value)
    assert "log() forward produced NaN in output 'y'" in text
    assert f"test_interpreters.py:{info.tb.tb_lineno}" in text


def test_detect_anomaly_names_the_op_whose_backward_goes_non_finite_and_where_it_was_called():
    x = of.tensor([0.0, 4.0], dtype="float64", requires_grad=True)
    with of.detect_anomaly(), np.errstate(divide="ignore"):
        y = F.sqrt(x)  # finite forward; the gradient 1/(2·sqrt(x)) is infinite at 0
        line = sys._getframe().f_lineno - 1
        with pytest.raises(of.AnomalyError) as info:
            y.sum().backward()
    text = str(info.value)
    assert "backward of sqrt()" in text and f"test_interpreters.py:{line}" in text
    assert "infinity" in text


def test_without_detect_anomaly_nothing_is_checked_or_kept():
    x = of.tensor([0.0], requires_grad=True)
    y = F.sqrt(x)
    assert not hasattr(y.grad_fn, "origin")
    with np.errstate(divide="ignore"):
        y.sum().backward()  # an infinite gradient, silently: as PyTorch does outside anomaly mode
    assert np.isinf(x.grad.numpy()).all()
