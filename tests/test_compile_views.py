"""Views and in-place updates inside a compiled function mean what they mean eagerly (issue 30): a write through a
view of an argument, a captured tensor or a computed value changes what the view shares, a view read after its
memory changed sees the change, a result that is a view of an argument shares its memory, and a reshape that
copies stays a copy. PyTorch is the oracle where our eager code writes as torch's does; eager opforge everywhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opforge as of
from opforge import nn
from opforge.core.errors import ArgumentError, GradientError


def ramp(*shape):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape)


def check(fn, *arrays, calls=2, torch_too=True):
    """``fn`` eagerly, compiled (``calls`` times: traced, then its program) and in torch on the same values: the
    results, and what each call left in the arguments, agree."""
    compiled = of.compile(fn)
    for _ in range(calls):
        eager_args = [of.tensor(a.copy()) for a in arrays]
        compiled_args = [of.tensor(a.copy()) for a in arrays]
        eager, got = fn(*eager_args), compiled(*compiled_args)
        np.testing.assert_array_equal(got.numpy(), eager.numpy())
        for e, c in zip(eager_args, compiled_args):
            np.testing.assert_array_equal(c.numpy(), e.numpy())
        if torch_too:
            torch_args = [torch.tensor(a.copy()) for a in arrays]
            expected = fn(*torch_args)
            np.testing.assert_array_equal(got.numpy(), expected.numpy())
            for t, c in zip(torch_args, compiled_args):
                np.testing.assert_array_equal(c.numpy(), t.numpy())


def _set_row(x):
    v = x[:, 1:]
    v[0] = 7.0
    return x * 1


WRITES_THROUGH_VIEWS = {
    "index": lambda x: (x[0].mul_(2), x * 1)[1],
    "view(-1)": lambda x: (x.view(-1).add_(1), x * 1)[1],
    "unsqueeze": lambda x: (x.unsqueeze(0).add_(1), x * 1)[1],
    "t()": lambda x: (x.t().add_(1), x * 1)[1],
    "squeeze": lambda x: (x.unsqueeze(1).squeeze(1).add_(1), x * 1)[1],
    "slice zero_": lambda x: (x[:, :2].zero_(), x * 1)[1],
    "narrow": lambda x: (x.narrow(1, 0, 2).mul_(0), x * 1)[1],
    "split": lambda x: (x.split(1, 0)[1].add_(5), x * 1)[1],
    "unbind": lambda x: (x.unbind(0)[0].add_(1), x * 1)[1],
    "detach": lambda x: (x.detach().add_(5), x * 1)[1],
    "view of a view": lambda x: (x[1][1:].mul_(0), x * 1)[1],
    "reshape then index": lambda x: (x.reshape(3, 2)[0].mul_(0), x * 1)[1],
    "+= on a reshape": lambda x: (x.reshape(3, 2).__iadd__(1), x * 1)[1],
    "copy_ into a row": lambda x: (x[1].copy_(x[0] * 10), x * 1)[1],
    "item assignment on a view": _set_row,
}


@pytest.mark.parametrize("name", WRITES_THROUGH_VIEWS)
def test_a_write_through_a_view_of_an_argument_changes_the_argument(name):
    check(WRITES_THROUGH_VIEWS[name], ramp(2, 3))


def test_a_write_through_a_view_of_a_computed_value_changes_that_value():
    def fn(x):
        y = x * 1
        y[0].add_(1)
        return y

    check(fn, ramp(2, 3))


def _read_after(write):
    def fn(x):
        y = x * 1
        v = y.T
        write(y)
        return v * 1

    return fn


VIEWS_READ_AFTER_A_WRITE = {
    "slice of an argument": lambda x: (lambda v: (x.mul_(3), v + 0)[1])(x[:, 1]),
    "transpose of an argument": lambda x: (lambda v: (x.add_(1), v * 1)[1])(x.transpose(0, 1)),
    "item assignment to the argument": lambda x: (lambda v: (x.__setitem__((0, 0), -1.0), v * 1)[1])(x.T),
    "computed value, add_": _read_after(lambda y: y.add_(1)),
    "computed value, item assignment": _read_after(lambda y: y.__setitem__(0, 7.0)),
    "through another view": lambda x: (lambda a, b: (a.mul_(10), b * 1)[1])(x[0], x[:, 0]),
}


@pytest.mark.parametrize("name", VIEWS_READ_AFTER_A_WRITE)
def test_a_view_read_after_its_memory_changed_sees_the_change(name):
    check(VIEWS_READ_AFTER_A_WRITE[name], ramp(2, 3))


def test_a_reshape_that_copies_stays_a_copy():
    # eagerly x.T.reshape(-1) is a copy (NumPy cannot make a view of transposed memory): writing it leaves x
    check(lambda x: (x.T.reshape(-1).add_(100), x * 1)[1], ramp(2, 3))
    check(lambda x: (lambda y: (y[0:2].add_(100), y * 1)[1])(x.T.reshape(-1)), ramp(2, 3))
    # a transposed argument: reshaping it copies, slicing it does not
    for fn in (lambda x: (x.reshape(-1).add_(100), x * 1)[1], lambda x: (x[0].add_(100), x * 1)[1]):
        base_e, base_c = of.tensor(ramp(2, 3)), of.tensor(ramp(2, 3))
        compiled = of.compile(fn)
        for _ in range(2):
            np.testing.assert_array_equal(compiled(base_c.T).numpy(), fn(base_e.T).numpy())
            np.testing.assert_array_equal(base_c.numpy(), base_e.numpy())


def test_a_result_that_is_a_view_of_an_argument_shares_its_memory():
    def fn(x):
        v = x[0]
        x.add_(1)
        return v

    compiled = of.compile(fn)
    for _ in range(2):
        xe, xc = of.tensor(ramp(2, 3)), of.tensor(ramp(2, 3))
        ve, vc = fn(xe), compiled(xc)
        np.testing.assert_array_equal(vc.numpy(), ve.numpy())
        assert np.shares_memory(vc.numpy(), xc.numpy())
        xe.mul_(2)
        xc.mul_(2)  # later writes to the argument show in the view, as eagerly
        np.testing.assert_array_equal(vc.numpy(), ve.numpy())
    t = of.tensor(ramp(2, 3))
    assert np.shares_memory(of.compile(lambda x: x.T)(t).numpy(), t.numpy())


def test_a_write_through_a_view_of_a_captured_tensor_changes_it():
    torch_lin = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        torch_lin.weight.copy_(torch.tensor(ramp(2, 3)))
    models = []
    for _ in range(2):
        lin = nn.Linear(3, 2).double()
        lin.load_state_dict({k: v.detach().numpy() for k, v in torch_lin.state_dict().items()})
        models.append(lin)

    def step(model, x):
        with torch.no_grad() if isinstance(model, torch.nn.Module) else of.no_grad():
            model.weight[0].mul_(2)
            model.bias[1:].add_(1)
            return model(x)

    compiled = of.compile(lambda x: step(models[1], x))
    x = ramp(1, 3)
    for _ in range(3):
        eager, got, expected = step(models[0], of.tensor(x)), compiled(of.tensor(x)), step(torch_lin, torch.tensor(x))
        np.testing.assert_array_equal(got.numpy(), eager.numpy())
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        for name in ("weight", "bias"):
            np.testing.assert_array_equal(getattr(models[1], name).numpy(), getattr(models[0], name).numpy())
            np.testing.assert_array_equal(getattr(models[1], name).numpy(), getattr(torch_lin, name).detach().numpy())

    buffers = [of.tensor(ramp(4)), of.tensor(ramp(4))]

    def read_view_after(buffer, x):
        v = buffer[0:2]
        buffer.mul_(2)
        buffer[1:].add_(x.sum())
        return v * 1

    compiled = of.compile(lambda x: read_view_after(buffers[1], x))
    for _ in range(3):
        x = of.tensor(np.ones(2))
        np.testing.assert_array_equal(compiled(x).numpy(), read_view_after(buffers[0], x).numpy())
        np.testing.assert_array_equal(buffers[1].numpy(), buffers[0].numpy())


def test_a_write_into_a_broadcast_view_is_refused_as_eagerly():
    fn = lambda x: x.expand(2, 2, 3).add_(1)  # noqa: E731
    with pytest.raises(ArgumentError, match="read-only"):
        fn(of.tensor(ramp(2, 3)))
    with pytest.raises(ArgumentError, match="read-only"):
        of.compile(fn)(of.tensor(ramp(2, 3)))


def _losses(body):
    """(the losses of two calls, the gradient they leave) of ``body`` on a parameter, eagerly and compiled."""
    out = []
    for compiled in (False, True):
        w = of.tensor(ramp(2, 3) + 1, requires_grad=True)

        def step(x, w=w):
            loss = body(w, x)
            loss.backward()
            return loss

        fn = of.compile(step) if compiled else step
        out.append(([fn(of.tensor(np.ones((2, 3)))).numpy() for _ in range(2)], w.grad.numpy()))
    return out


def test_writes_recorded_for_autograd_mean_what_they_mean_eagerly():
    def into_a_view(w, x):  # the view's new value and history reach y, as in torch (test_inplace_views.py)
        y = w * x
        y[0].mul_(3)
        return y.sum()

    def into_the_base(w, x):
        y = w * x
        v = y.T
        y.add_(w * 2)
        return (v * v).sum() + y.sum()

    for body in (into_a_view, into_the_base):
        (eager, eager_grad), (compiled, compiled_grad) = _losses(body)
        np.testing.assert_allclose(compiled, eager, rtol=1e-12)
        np.testing.assert_allclose(compiled_grad, eager_grad, rtol=1e-12)
        w = torch.tensor(ramp(2, 3) + 1, requires_grad=True)
        for _ in range(2):
            loss = body(w, torch.ones(2, 3, dtype=torch.float64))
            loss.backward()
        np.testing.assert_allclose(eager[-1], loss.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(eager_grad, w.grad.numpy(), rtol=1e-12)


def test_a_backward_through_a_value_changed_under_no_grad_is_refused():
    # eagerly y keeps its history and backward differentiates through it with the new elements; the program's new
    # value has none: refused, naming the op that reads it, rather than a gradient that misses a term
    def body(w, x):
        y = w * x
        with of.no_grad():
            y[0].mul_(3)
        return (y * w).sum()

    w = of.tensor(ramp(2, 3), requires_grad=True)

    def step(x):
        loss = body(w, x)
        loss.backward()
        return loss

    with pytest.raises(GradientError, match="under no_grad"):
        of.compile(step)(of.tensor(np.ones((2, 3))))
    # without a backward through it, the write is followed
    def values(x):
        y = w * x
        with of.no_grad():
            y[0].mul_(3)
        return y * 1

    x = of.tensor(np.ones((2, 3)))
    np.testing.assert_array_equal(of.compile(values)(x).numpy(), values(x).detach().numpy())


def test_flip_copies_as_torch_does():
    # NumPy's flip is a view: a write to the result changed x eagerly (and not compiled)
    check(lambda x: (x.flip(0).add_(1), x * 1)[1], ramp(2, 3))


def test_a_reshape_of_a_value_of_unknown_layout_written_in_place_is_refused():
    # eagerly x.T * 2 is laid out in Fortran order, so its reshape copies; x * 2 is in C order, its reshape is a view
    check(lambda x: (lambda y: (y.view(-1).add_(1), y * 1)[1])(x * 2), ramp(2, 3))
    fn = lambda x: (lambda y: (y.reshape(-1).add_(1), y * 1)[1])(x.T * 2)  # noqa: E731
    fn(of.tensor(ramp(2, 3)))
    with pytest.raises(ArgumentError, match="transposed memory"):
        of.compile(fn)(of.tensor(ramp(2, 3)))


def test_a_captured_tensor_read_after_a_captured_alias_was_written_is_refused():
    # base and base.T, both captured, share memory: eagerly `base * 1` after a write through the transpose sees the
    # write; a program reads each captured tensor as its own value (it gave the old one): refused, naming both
    base = of.tensor(ramp(2, 3))
    transposed = base.T

    def fn(x):
        transposed[0].add_(x[0])
        return base * 1

    with pytest.raises(ArgumentError, match="shares memory with"):
        of.compile(fn)(of.tensor(np.ones(3)))
    # reading it before the write is what eager code does too
    base = of.tensor(ramp(2, 3))
    transposed = base.T
    eager_base = of.tensor(ramp(2, 3))
    eager_t = eager_base.T

    def before(b, t, x):
        y = b * 1
        t[0].add_(x[0])
        return y

    compiled = of.compile(lambda x: before(base, transposed, x))
    for _ in range(2):
        x = of.tensor(np.ones(3))
        np.testing.assert_array_equal(compiled(x).numpy(), before(eager_base, eager_t, x).numpy())
        np.testing.assert_array_equal(base.numpy(), eager_base.numpy())


def test_views_of_values_sized_at_run_time_trace_and_writes_through_them_are_refused():
    # of.trace with a None dim: a reshape of a slice may be a view or a copy; no error until a write needs to know
    program = of.trace(lambda x: x[:, 1:].reshape(-1, 2).T * 2, x=of.Spec((None, 3), "float64"))
    assert program.outputs
    with pytest.raises(ArgumentError, match="known only at run time"):
        of.trace(lambda x: (x[:, 1:].reshape(-1, 2).T.mul_(2), x * 1)[1], x=of.Spec((None, 3), "float64"))
