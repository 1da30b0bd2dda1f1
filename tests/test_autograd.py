"""Eager autograd: backward/grad, what is kept for backward, the engine's duties, higher orders."""

import gc
import threading
import weakref
from collections.abc import Mapping

import numpy as np
import pytest
import torch

import opforge as of
from opforge import ops as F


def t64(a, requires_grad=True):
    return of.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


def test_backward_accumulates_into_grad_and_grad_leaves_it_alone():
    x = t64([1.0, 2.0, 3.0])
    (x * x).sum().backward()
    assert x.grad.numpy().tolist() == [2.0, 4.0, 6.0]
    (x * 3).sum().backward()
    assert x.grad.numpy().tolist() == [5.0, 7.0, 9.0]  # accumulated, as in PyTorch
    (g,) = of.grad((x * x).sum(), [x])
    assert g.numpy().tolist() == [2.0, 4.0, 6.0] and x.grad.numpy().tolist() == [5.0, 7.0, 9.0]
    assert not x.grad.requires_grad


def test_backward_of_a_non_scalar_needs_a_gradient():
    x = t64([1.0, 2.0])
    y = x * 2
    with pytest.raises(of.GradientError, match="pass the output gradient explicitly"):
        y.backward()
    y.backward(of.tensor(np.array([1.0, 10.0])))
    assert x.grad.numpy().tolist() == [2.0, 20.0]


def test_detach_requires_grad_and_no_grad():
    x = t64([1.0])
    assert not x.detach().requires_grad and np.shares_memory(x.detach().numpy(), x.numpy())
    with of.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = x * 2
    assert z.requires_grad and z.grad_fn.op.name == "mul" and not z.is_leaf
    with pytest.raises(of.GradientError, match=r"use \.detach"):
        z.requires_grad_(False)

    @of.no_grad()
    def f(v):
        return v * 2

    assert not f(x).requires_grad
    assert (x * 2).requires_grad  # the decorator restores the mode after each call
    with pytest.raises(of.GradientError, match="does not require grad"):
        of.grad(of.tensor([1.0]).sum(), [x])
    off, on = of.no_grad(), of.enable_grad()
    with off:  # one object entered inside itself restores each level on the way out
        with on:
            assert (x * 2).requires_grad
            with off:
                assert not (x * 2).requires_grad
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad
    with pytest.raises(ZeroDivisionError), off:
        1 / 0
    assert (x * 2).requires_grad


def test_grad_options():
    x, w = t64([1.0, 2.0]), t64([3.0, 4.0])
    y = (x * x).sum()
    with pytest.raises(of.GradientError, match=r"inputs\[1\] .* was not used.*allow_unused=True"):
        of.grad(y, [x, w], retain_graph=True)
    gx, gw = of.grad(y, [x, w], allow_unused=True, retain_graph=True)
    assert gx.numpy().tolist() == [2.0, 4.0] and gw is None
    (gx,) = of.grad([y, (x * w).sum()], [x], grad_outputs=[of.tensor(np.array(2.0)), None])
    assert gx.numpy().tolist() == [4 + 3, 8 + 4]


def test_the_graph_is_freed_after_backward_unless_retained():
    x = t64([1.0, 2.0])
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.numpy() == pytest.approx(4 * np.exp([1.0, 2.0]))
    with pytest.raises(of.GradientError, match=r"second time.*retain_graph=True"):
        y.backward()


def test_grad_wrt_an_intermediate_tensor():
    x = t64([1.0, 2.0])
    h = x * 3
    y = (h * h).sum()
    gh, gx = of.grad(y, [h, x])
    assert gh.numpy().tolist() == [6.0, 12.0] and gx.numpy().tolist() == [18.0, 36.0]


# -- what a rule names is all that is kept -------------------------------------------------------------------


def test_a_rule_that_names_only_dy_keeps_the_forward_input_collectable():
    x = t64([1.0, -2.0])
    h = x * 2.0  # an intermediate: nothing but `identity` would hold it
    ref = weakref.ref(h)
    y = F.neg(h)  # neg's rule is `def _(dy)`: it names no forward tensor (a view op, identity, keeps its base, as
    del h         # torch's views do, so that a write through the view reaches it)
    gc.collect()
    assert ref() is None
    y.sum().backward()
    assert x.grad.numpy().tolist() == [-2.0, -2.0]


def test_a_rule_that_names_its_input_keeps_it_alive():
    x = t64([1.0, -2.0])
    h = x * 2.0
    ref = weakref.ref(h)
    y = F.leaky_relu(h, alpha=0.1)  # its rule names x: the input is kept for backward
    del h
    gc.collect()
    assert ref() is not None
    del y
    gc.collect()
    assert ref() is None  # ... and no longer than the graph that needs it


def test_saved_outputs_make_no_reference_cycle():
    x = t64([0.5, 1.0])
    gc.disable()
    try:
        y = F.exp(x)  # exp's rule names its output y
        ref = weakref.ref(y)
        node = weakref.ref(y.grad_fn)
        del y
        assert ref() is None and node() is None  # freed by reference counting alone
    finally:
        gc.enable()


# -- the engine's duties -------------------------------------------------------------------------------------


def test_broadcast_gradients_are_summed_to_the_input_shape():
    x, b = t64(np.ones((4, 3))), t64([1.0, 2.0, 3.0])
    s = t64(2.0)
    ((x + b) * s).sum().backward()
    assert b.grad.shape == (3,) and b.grad.numpy().tolist() == [8.0, 8.0, 8.0]
    assert s.grad.shape == () and s.grad.item() == pytest.approx(4 * 3 + 4 * 6)


def test_fan_out_accumulates():
    x = t64([2.0])
    y = x * x + x.exp() + x  # x is read four times
    y.sum().backward()
    assert x.grad.item() == pytest.approx(2 * 2 + np.exp(2) + 1)


def test_no_grad_ops_and_non_differentiable_inputs_are_skipped(scratch_ops):
    scratch_ops.append("masked_scale")

    @of.op("masked_scale(Tensor x, nograd Tensor mask) -> Tensor y", traits=["broadcast"])
    def masked_scale(x, mask):
        return x * mask

    calls = []

    @masked_scale.grad
    def _(mask, dy):
        calls.append("rule")
        return dy * mask, dy * 1000  # the mask's gradient is ignored: the schema says nograd

    x, mask = t64([1.0, 2.0]), t64([0.0, 1.0])
    y = F.masked_scale(x, mask) + (x > 1)  # the comparison is a no_grad op: no gradient flows there
    y.sum().backward()
    assert x.grad.numpy().tolist() == [0.0, 1.0] and mask.grad is None and calls == ["rule"]


def test_multi_output_ops_where_only_some_outputs_get_gradients(scratch_ops):
    scratch_ops.append("split2")

    @of.op("split2(Tensor x) -> (Tensor first, Tensor second)")
    def split2(x):
        half = x.shape[0] // 2
        return x[:half] * 1, x[half:] * 1

    @split2.infer
    def _(x):
        half = x.shape[0] // 2
        return of.Spec((half,), x.dtype), of.Spec((x.shape[0] - half,), x.dtype)

    @split2.grad
    def _(x_spec, dfirst, dsecond):
        n, half = x_spec.shape[0], x_spec.shape[0] // 2
        return (F.slice_grad(dfirst, shape=[n], axes=[0], starts=[0], ends=[half], steps=[1])
                + F.slice_grad(dsecond, shape=[n], axes=[0], starts=[half], ends=[n], steps=[1]))

    x = t64([1.0, 2.0, 3.0, 4.0])
    first, _ = F.split2(x)
    assert F.split2(x).first.shape == (2,)  # results are named tuples
    (first * 10).sum().backward()  # `second` gets no gradient: the engine fills zeros for dsecond
    assert x.grad.numpy().tolist() == [10.0, 10.0, 0.0, 0.0]


def test_a_rule_that_declares_an_output_gradient_none_gets_none_for_an_unused_output(scratch_ops):
    # d<output>=None: the rule handles "no gradient reached that output" itself, and no zeros are made for it —
    # eagerly (as written, and replayed from the third backward pass on), recorded (create_graph) and compiled
    scratch_ops.append("halves")
    seen = []

    @of.op("halves(Tensor x) -> (Tensor first, Tensor second)")
    def halves(x):
        half = x.shape[0] // 2
        return x[:half] * 1, x[half:] * 1

    @halves.infer
    def _(x):
        half = x.shape[0] // 2
        return of.Spec((half,), x.dtype), of.Spec((x.shape[0] - half,), x.dtype)

    @halves.grad
    def _(x_spec, dfirst=None, dsecond=None):
        seen.append((dfirst is None, dsecond is None))
        n, half = x_spec.shape[0], x_spec.shape[0] // 2
        parts = [F.slice_grad(d, shape=[n], axes=[0], starts=[a], ends=[b], steps=[1])
                 for d, a, b in ((dfirst, 0, half), (dsecond, half, n)) if d is not None]
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

    x = t64([1.0, 2.0, 3.0, 4.0])
    for _ in range(3):  # the third pass replays the rule recorded in the second
        x.grad = None
        (F.halves(x).second * 10).sum().backward()
        assert x.grad.numpy().tolist() == [0.0, 0.0, 10.0, 10.0]
    (g,) = of.grad((F.halves(x).first * 3).sum(), [x], create_graph=True)
    assert g.numpy().tolist() == [3.0, 3.0, 0.0, 0.0]
    assert seen == [(True, False)] * 2 + [(False, True)]  # the rule ran twice (as written, recorded); replayed once
    seen.clear()
    step = of.compile(lambda x: of.grad((F.halves(x).second * 2).sum(), [x])[0])
    assert step(x).numpy().tolist() == [0.0, 0.0, 2.0, 2.0]
    assert seen == [(True, False)]  # run once, while the program's backward pass was built


@pytest.mark.parametrize("returned, message", [
    (lambda dy: (dy, dy), "must return 1 gradient"),
    (lambda dy: np.ones(3), "returned ndarray of shape"),
    (lambda dy: F.reshape(dy, shape=[3, 1]) * of.tensor(np.ones((1, 2))),
     r"shape \(3, 2\) for input 'x' of shape \(3,\)"),
    (lambda dy: {"z": dy}, "not inputs of the op"),
])
def test_wrong_gradients_are_reported_naming_the_op(returned, message, scratch_ops):
    scratch_ops.append("bad_rule")

    @of.op("bad_rule(Tensor x) -> Tensor y", traits=["elementwise"])
    def bad_rule(x):
        return x * 1

    bad_rule.grad(returned)
    x = t64([1.0, 2.0, 3.0])
    with pytest.raises(of.GradientError, match="op 'bad_rule'") as info:
        F.bad_rule(x).sum().backward()
    assert info.match(message)


def test_an_op_without_a_gradient_rule_on_the_path_is_named_with_its_path(scratch_ops):
    scratch_ops.append("opaque")

    @of.op("opaque(Tensor x) -> Tensor y", traits=["elementwise"])
    def opaque(x):
        return x * 2

    x = t64([1.0])
    y = (F.exp(F.opaque(x)) * 2).sum()
    with pytest.raises(of.GradientError) as info:
        y.backward()
    assert "op 'opaque' has no gradient rule" in str(info.value)
    assert "opaque -> exp -> mul -> sum -> output" in str(info.value)
    # Off the path to the inputs asked for, a missing rule does not matter:
    w = t64([3.0])
    (gw,) = of.grad((F.opaque(x) * w).sum(), [w])
    assert gw.item() == 2.0


def test_a_rule_can_ask_which_inputs_need_gradients():
    x = t64([2.0])
    y = of.tensor(np.array([3.0]))  # the exponent does not require grad: log(x) is never computed for it
    (g,) = of.grad(F.pow(x, y).sum(), [x])
    assert g.item() == pytest.approx(3 * 4)
    with np.errstate(all="raise"):  # a negative base would warn in log() if the rule computed dy anyway
        (g,) = of.grad(F.pow(t64([-2.0]), y).sum(), [x], allow_unused=True)


# -- the seed designs' examples ------------------------------------------------------------------------------


def test_minus_gradient_is_identity_and_scale_as_in_the_design_doc():
    x, y = t64([1.0, 2.0]), t64([3.0, 4.0])
    out = F.minus(x, y)
    seed = t64([1.0, 1.0])  # a seed that requires grad, so that the backward ops are recorded
    gx, gy = of.grad(out, [x, y], grad_outputs=[seed], create_graph=True)
    assert gx.grad_fn.op.name == "identity" and gy.grad_fn.op.name == "scale"
    assert gy.grad_fn.attrs == {"scale": -1.0}
    assert gx.numpy().tolist() == [1.0, 1.0] and gy.numpy().tolist() == [-1.0, -1.0]


def test_dedicated_gradient_ops_are_used():
    x = t64([0.5, 2.0])
    (g,) = of.grad(F.sqrt(x).sum(), [x], create_graph=True)
    assert g.grad_fn.op.name == "sqrt_grad"
    (g,) = of.grad(F.smooth_l1(x).sum(), [x], create_graph=True)
    assert g.grad_fn.op.name == "smooth_l1_grad"
    (g,) = of.grad(F.leaky_relu(x).sum(), [x], create_graph=True)
    assert g.grad_fn.op.name == "leaky_relu_grad"


def test_third_derivative_of_sqrt_goes_through_sqrt_grad_grad():
    x = t64([0.5, 1.0, 4.0])
    (g1,) = of.grad(F.sqrt(x).sum(), [x], create_graph=True)
    (g2,) = of.grad(g1.sum(), [x], create_graph=True)
    (g3,) = of.grad(g2.sum(), [x])
    xs = x.numpy()
    assert g1.numpy() == pytest.approx(0.5 * xs ** -0.5)
    assert g2.numpy() == pytest.approx(-0.25 * xs ** -1.5)
    assert g3.numpy() == pytest.approx(0.375 * xs ** -2.5)


def test_higher_orders_agree_with_pytorch():
    a = np.array([0.3, -1.2, 2.0])

    def f(lib, x):
        return (lib.tanh(x) * x * x).sum() if lib is torch else (F.tanh(x) * x * x).sum()

    x = t64(a)
    xt = torch.tensor(a, requires_grad=True)
    ours, theirs = [x], [xt]
    g, gt = f(None, x), f(torch, xt)
    for _ in range(3):
        (g,) = of.grad(g.sum() if g.ndim else g, [x], create_graph=True)
        (gt,) = torch.autograd.grad(gt.sum() if gt.ndim else gt, [xt], create_graph=True)
        ours.append(g)
        theirs.append(gt)
        assert g.numpy() == pytest.approx(gt.detach().numpy(), rel=1e-10)


def test_autograd_in_threads_is_independent():
    results = {}

    def work(k):
        x = t64([float(k)])
        with of.no_grad() if k == 0 else of.enable_grad():
            y = x * x
        results[k] = y.requires_grad

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {0: False, 1: True, 2: True, 3: True}


def test_each_grad_owns_its_memory():
    x, y = t64([1.0, 2.0]), t64([3.0, 4.0])
    F.sum(x + y).backward()  # add's rule hands the same tensor to both inputs; sum's is a broadcast view
    assert x.grad is not y.grad and not np.shares_memory(x.grad.numpy(), y.grad.numpy())
    x.grad.numpy()[0] = 100.0  # writable, and private
    assert y.grad.numpy().tolist() == [1.0, 1.0]


def test_generated_attach_sets_what_node_and_wrap_output_set():
    # The straight-line attach writes a Node's and its output Tensor's fields one by one (faster than calling
    # Node() and wrap_output()): a field added to either must be set there too, with the same kind of value.
    from opforge.tensor import Node, Tensor, _epoch, wrap_output

    x = of.tensor(np.linspace(-1, 1, 6, dtype=np.float32), requires_grad=True)
    y = F.relu(x)
    made = Node(y._node.op, {}, ((x, -1),), (-1,), ((x.shape, x.dtype),), (-1,), ((x.shape, x.dtype),), {},
                {"y": [(0, y._data)]}, x._device)
    assert "_of_node = _of_new(_of_Node)" in F.relu.source  # relu's call records with attach's lines, inline
    attached = y._node.op.attach_args(x, {}, y._data)  # and attach itself (for other callers) runs the same lines
    for node in (y._node, attached._node):
        for name in Node.__slots__:
            assert hasattr(made, name) == hasattr(node, name), name
            if name in ("saved", "saved_out"):  # mappings; nothing to save is one shared read-only mapping there
                assert isinstance(getattr(node, name), Mapping), name
            elif hasattr(made, name) and name != "__weakref__":
                assert type(getattr(made, name)) is type(getattr(node, name)), name
    assert hasattr(y._node.op.attach_args, "source")  # compiled by that call
    assert not y._node.saved and y._node.saved_out["y"] == ((0, y._data),)
    with pytest.raises(TypeError):
        y._node.saved["x"] = x  # the shared empty mapping cannot be written
    assert y._node.epoch == _epoch[0] and y._node.edges == ((x, -1),)
    assert y._node.in_meta == ((x.shape, x.dtype),) and y._node.out_meta == ((y.shape, y.dtype),)
    assert y._node.saved_out["y"][0][1] is y._data
    wrapped = wrap_output(y._data, y._node, 0, x._device)
    for name in Tensor.__slots__:
        assert hasattr(wrapped, name) == hasattr(y, name), name
        if hasattr(wrapped, name) and name != "__weakref__":
            assert getattr(wrapped, name) is getattr(y, name) or getattr(wrapped, name) == getattr(y, name), name
    (g,) = of.grad(F.sum(y), [x])
    np.testing.assert_array_equal(g.numpy(), (x.numpy() > 0).astype(np.float32))


def test_generated_attach_takes_any_input_names(scratch_ops):
    # The straight-line attach gets the inputs under their schema names: names it uses itself must not clash.
    scratch_ops.append("names_like_locals")

    @of.op("names_like_locals(Tensor t, Tensor device) -> Tensor node", traits=["elementwise"])
    def names_like_locals(t, device):
        return t * device

    @names_like_locals.grad
    def _(t, device, dnode):
        return dnode * device, dnode * t

    a = of.tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = of.tensor(np.array([3.0, -1.0]), requires_grad=True)
    y = F.names_like_locals(a, b)
    assert y._node.saved["t"] is a and y._node.saved["device"] is b
    ga, gb = of.grad(F.sum(y), [a, b])
    np.testing.assert_array_equal(ga.numpy(), [3.0, -1.0])
    np.testing.assert_array_equal(gb.numpy(), [1.0, 2.0])


def test_generated_code_is_compiled_at_first_use_and_stays_the_same_function(scratch_ops):
    # An op's function and its attach are compiled at their first call (import opforge compiles none of them):
    # the function object is the one already handed out, with its signature, before and after.
    import inspect

    scratch_ops.append("compiled_late")

    @of.op("compiled_late(Tensor x, *, float k=2.0) -> Tensor y", traits=["elementwise"])
    def compiled_late(x, *, k):
        return x * k

    @compiled_late.grad
    def _(x, dy, *, k):
        return dy * k

    from opforge.dispatch import api_source

    fn = F.compiled_late
    assert fn.__code__.co_name != "compiled_late" and not hasattr(fn, "source")
    assert "def compiled_late(x, *, k=" in api_source(compiled_late)
    assert list(inspect.signature(fn).parameters) == ["x", "k"] and fn.__doc__.startswith("compiled_late(")
    with pytest.raises(TypeError, match="unexpected keyword argument 'scale'"):
        fn(of.tensor([1.0]), scale=3.0)  # refused as the compiled function refuses it
    assert fn.__code__.co_name == "compiled_late" and F.compiled_late is fn and fn.source == api_source(compiled_late)
    x = of.tensor(np.array([1.0, -2.0]), requires_grad=True)
    y = fn(x, k=3.0)  # recorded by the function's own lines (attach's, inline)
    assert y._node.op is compiled_late and y._node.saved["x"] is x
    (g,) = of.grad(F.sum(fn(x, k=3.0)), [x])
    assert g.tolist() == [3.0, 3.0] and fn(x).tolist() == [2.0, -4.0]
    stand_in = compiled_late.attach_args  # attach, for other callers: compiled at its first call, once
    assert not hasattr(stand_in, "source")
    assert stand_in(x, {"k": 3.0}, np.array([3.0, -6.0]))._node.op is compiled_late
    compiled = compiled_late.attach_args
    assert hasattr(compiled, "source") and stand_in(x, {"k": 3.0}, np.ones(2))._node.op is compiled_late
    assert compiled_late.attach_args is compiled  # the kept stand-in did not compile it again

    @compiled_late.grad  # a new rule (it keeps nothing): the function, the same object, records for it
    def _(dy, *, k):
        return dy * (2 * k)

    assert F.compiled_late is fn and fn.__code__.co_name != "compiled_late"
    y = fn(x, k=3.0)
    assert not y._node.saved and of.grad(F.sum(y), [x])[0].tolist() == [6.0, 6.0]


def test_generated_op_function_makes_the_tensor_wrap_makes():
    # An op's fast path writes its unrecorded result's fields one by one (a call less than wrap()): the same ones.
    from opforge.tensor import Tensor, wrap

    x = of.tensor(np.linspace(-1, 1, 6, dtype=np.float32))
    y = F.leaky_relu(x, alpha=0.1)
    wrapped = wrap(y._data, x._device)
    for name in Tensor.__slots__:
        assert hasattr(wrapped, name) == hasattr(y, name), name
        if hasattr(wrapped, name) and name != "__weakref__":
            assert getattr(wrapped, name) is getattr(y, name) or getattr(wrapped, name) == getattr(y, name), name


def test_a_kernel_table_hit_still_refuses_a_dtype_the_schema_does_not_allow():
    # The fast path checks the first input's dtype only when its kernel is not cached yet (only allowed dtypes are
    # cached): a float call first, then an integer one, must still be refused in the op's words.
    F.leaky_relu(of.tensor(np.ones(3, np.float32)), alpha=0.1)
    with pytest.raises(of.ArgumentError, match=r"leaky_relu\(\): argument 'x' expected dtype"):
        F.leaky_relu(of.tensor(np.ones(3, np.int64)), alpha=0.1)
    with pytest.raises(of.ArgumentError, match=r"leaky_relu\(\): argument 'x' expected dtype"):
        F.leaky_relu(of.tensor(np.ones(3, np.int64)), alpha=0.1)

