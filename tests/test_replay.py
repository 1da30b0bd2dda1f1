"""The backward pass's replay of gradient rules (opforge/autodiff/replay.py) gives what the rules give, bit for bit,
and runs a rule as written whenever a replay could not repeat it."""

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.autodiff import replay
from opforge.testing import call_op
from opforge.testing.conformance import default_samples

DIFFERENTIABLE = sorted(op.name for op in of.registry if op.grad_rule is not None and "no_grad" not in op.traits)


def _samples(opdef):
    rng = np.random.default_rng(0)
    return list(opdef.samples_fn(rng)) if opdef.samples_fn else list(default_samples(opdef, rng))


def _tapes_of(opdef) -> list:
    return [tape for key, tape in replay._tapes.items() if key[0] is opdef and callable(tape)]


def _inputs(opdef, sample):
    tensors = []
    for p, a in zip(opdef.inputs, sample.args):
        def one(array, p=p):
            wants = p.differentiable and np.issubdtype(np.asarray(array).dtype, np.floating)
            return of.tensor(array, requires_grad=bool(wants))
        tensors.append(None if a is None else [one(x) for x in a] if p.is_list else one(a))
    return tensors


def _gradients(opdef, sample, seed: int):
    """The gradients of a random weighting of the op's floating outputs, from fresh tensors (the same values)."""
    of.manual_seed(seed)  # random ops draw the same values each time
    tensors = _inputs(opdef, sample)
    leaves = [t for v in tensors for t in (v if isinstance(v, list) else (v,)) if t is not None and t.requires_grad]
    if not leaves:
        return None
    with np.errstate(all="ignore"):
        out = call_op(opdef, tensors, sample.kwargs)
        flat = [out] if isinstance(out, of.Tensor) else [t for v in out for t in (v if isinstance(v, list) else (v,))]
        outs = [t for t in flat if t.requires_grad]
        if not outs:
            return None
        rng = np.random.default_rng(seed)
        cots = [of.tensor(rng.uniform(0.5, 1.5, t.shape).astype(t.dtype)) for t in outs]
        grads = of.grad(outs, leaves, grad_outputs=cots, allow_unused=True)
    return [None if g is None else g.numpy().copy() for g in grads]


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True) and \
        np.array_equal(np.signbit(a), np.signbit(b))


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_replayed_rules_give_the_rules_results_bit_for_bit(name):
    opdef = of.registry.get(name)
    for k, sample in enumerate(_samples(opdef)):
        previous = replay.set_replay(False)
        try:
            want = _gradients(opdef, sample, k)
        finally:
            replay.set_replay(previous)
        if want is None:
            continue
        for attempt in range(3):  # seen, recorded and replayed, replayed
            got = _gradients(opdef, sample, k)
            for i, (g, w) in enumerate(zip(got, want)):
                assert _same(g, w), f"{name} sample {k}, attempt {attempt}: gradient {i} differs from the rule's"


def test_the_common_ops_are_replayed_not_refused():
    for name in ["add", "mul", "sub", "div", "tanh", "relu", "exp", "matmul", "linear", "sum", "mean", "reshape",
                 "transpose", "softmax", "log_softmax", "cross_entropy", "conv2d", "max_pool2d_values", "layer_norm",
                 "embedding", "concat", "gelu", "dropout_with_mask"]:
        opdef = of.registry.get(name)
        for k, sample in enumerate(_samples(opdef)):
            for _ in range(2):
                _gradients(opdef, sample, k)
        assert _tapes_of(opdef), f"{name}: no sample's rule was replayed"


def test_a_chain_replays_each_rule_from_its_second_node():
    x = of.tensor(np.linspace(-1, 1, 16, dtype=np.float32), requires_grad=True)
    h = x
    for _ in range(20):
        h = F.tanh(h) * 1.01
    (g,) = of.grad(F.sum(h), [x])
    tape = _tapes_of(of.registry.get("tanh"))
    assert tape and "k0(" in tape[0].source
    mul_tape = next(t for t in _tapes_of(of.registry.get("mul")) if "None]" in t.source)
    assert mul_tape.source.count(" = k") == 1  # one kernel call: the gradient for 1.01 is not wanted
    previous = replay.set_replay(False)
    try:
        h2 = x
        for _ in range(20):
            h2 = F.tanh(h2) * 1.01
        (want,) = of.grad(F.sum(h2), [x])
    finally:
        replay.set_replay(previous)
    assert _same(g.numpy(), want.numpy())


@pytest.fixture
def scratch(scratch_ops):
    def define(name, kernel, rule, traits=("elementwise",)):
        scratch_ops.append(name)
        opdef = of.op(f"{name}(Tensor x) -> Tensor y", traits=list(traits))(kernel)
        opdef.grad(rule)
        return opdef
    return define


def _three_backwards(fn, values):
    out = []
    for v in values:
        x = of.tensor(np.asarray(v, dtype=np.float64), requires_grad=True)
        (g,) = of.grad(F.sum(fn(x)), [x])
        out.append(g.numpy().copy())
    return out


def test_a_rule_that_reads_values_is_run_as_written(scratch):
    # The rule branches on a value (through .item()): a recording would freeze the branch it saw first.
    def rule(x, dy):
        return dy * 2.0 if F.sum(x).item() > 0 else dy * -3.0
    op = scratch("branchy", lambda x: x * 1.0, rule)
    got = _three_backwards(op.fn, [[1.0, 2.0], [1.0, 2.0], [-1.0, -2.0], [-1.0, -2.0]])
    assert [g.tolist() for g in got] == [[2.0, 2.0], [2.0, 2.0], [-3.0, -3.0], [-3.0, -3.0]]
    assert not _tapes_of(op)


def test_a_rule_that_uses_a_tensor_from_outside_is_run_as_written(scratch):
    scale = of.tensor(np.array([2.0, 2.0]))
    op = scratch("captures", lambda x: x * 1.0, lambda dy: dy * scale)
    assert [g.tolist() for g in _three_backwards(op.fn, [[1.0, 2.0]] * 2)] == [[2.0, 2.0]] * 2
    scale.numpy()[:] = 5.0  # a replay would have kept the old value as a constant
    assert _three_backwards(op.fn, [[1.0, 2.0]])[0].tolist() == [5.0, 5.0]
    assert not _tapes_of(op)


def test_a_rule_that_fails_says_so_as_the_rule_does(scratch):
    op = scratch("bad_rule", lambda x: x * 1.0, lambda dy: F.sum(dy))  # a () gradient for a (2, 2) input
    for _ in range(3):
        x = of.tensor(np.ones((2, 2)), requires_grad=True)
        with pytest.raises(of.GradientError, match="bad_rule"):
            of.grad(F.sum(op.fn(x)), [x])


def test_a_new_kernel_is_used_by_the_replays_that_call_its_op():
    x = of.tensor(np.linspace(-1, 1, 6), requires_grad=True)
    for _ in range(3):
        (before,) = of.grad(F.sum(F.tanh(x)), [x])
    opdef = of.registry.get("tanh_grad")
    original = opdef.kernels[("cpu", None)].fn
    try:
        opdef.kernel(device="cpu")(lambda y, dy, out=None: np.full_like(dy, 7.0))
        (after,) = of.grad(F.sum(F.tanh(x)), [x])
        assert after.tolist() == [7.0] * 6
    finally:
        opdef.kernel(device="cpu")(original)
    (again,) = of.grad(F.sum(F.tanh(x)), [x])
    assert _same(again.numpy(), before.numpy())


def test_leaves_given_one_passed_through_gradient_do_not_share_memory():
    # add's rule returns dy for both inputs: the replay returns that very Tensor twice, and .grad copies once.
    for _ in range(3):
        a = of.tensor(np.ones(3), requires_grad=True)
        b = of.tensor(np.ones(3), requires_grad=True)
        F.sum(F.add(a, b) * 2.0).backward()
        a.grad.numpy()[0] = 100.0
        assert b.grad.tolist() == [2.0, 2.0, 2.0]


def test_create_graph_and_custom_interpreters_see_the_rules_themselves():
    from opforge.dispatch import EAGER, Interpreter, interpreting

    class Counting(Interpreter):
        def __init__(self):
            self.names = []

        def apply(self, op, inputs, attrs):
            self.names.append(op.name)
            return EAGER.apply(op, inputs, attrs)

    x = of.tensor(np.linspace(0.1, 1, 4), requires_grad=True)
    for _ in range(3):
        of.grad(F.sum(F.tanh(x)), [x])  # recorded by now
    counting = Counting()
    with interpreting(counting):
        y = F.sum(F.tanh(x))
        of.grad(y, [x])
    assert "tanh_grad" in counting.names  # the rule ran as written, under the interpreter
    (g,) = of.grad(F.sum(F.tanh(x)), [x], create_graph=True)
    (gg,) = of.grad(F.sum(g), [x])  # a replay gives no history: the second derivative needs the rule's ops
    np.testing.assert_allclose(gg.numpy(), -2 * np.tanh(x.numpy()) * (1 - np.tanh(x.numpy()) ** 2))


def test_set_replay_returns_the_previous_setting():
    assert replay.set_replay(False) is True
    assert replay.set_replay(True) is False


def test_recording_leaves_no_reference_cycles():
    # A cycle through the recorder kept every value of the recorded rule (a layer's weight gradient) alive until the
    # cyclic collector ran: +12 MB peak on the benchmark MLP.
    import gc

    x = of.tensor(np.linspace(-1, 1, 8), requires_grad=True)
    w = of.tensor(np.ones((3, 8)), requires_grad=True)
    gc.collect()
    gc.disable()
    try:
        replay._tapes.clear()
        for _ in range(3):
            of.grad(F.sum(F.tanh(F.linear(x, w)) * 2.0), [x, w])
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_replayed_gradient_is_a_tensor_as_wrap_makes_it():
    # The replay writes the Tensors it makes field by field (wrap(), written out): every field wrap sets, alike.
    from opforge.tensor import Tensor, wrap

    x = of.tensor(np.linspace(-1, 1, 6, dtype=np.float32), requires_grad=True)
    grads = [of.grad(F.sum(F.tanh(x)), [x])[0] for _ in range(3)]  # the third is replayed
    made = wrap(grads[-1]._data, x._device)
    for name in Tensor.__slots__:
        assert hasattr(made, name) == hasattr(grads[-1], name), name
        if hasattr(made, name) and name not in ("__weakref__", "_data"):
            assert getattr(made, name) == getattr(grads[-1], name), name
    np.testing.assert_array_equal(grads[-1].numpy(), grads[0].numpy())


def test_a_tape_that_made_a_tensor_on_the_default_device_is_not_replayed_after_the_default_changed(scratch_ops):
    # The rule makes a tensor with no tensor input (on the default device then). Recorded while "cpu" is the
    # default, its tape must not run while another device is: the rule runs as written and says what it says.
    scratch_ops.append("twice_by_a_made_two")
    of.register_device("replay_twin", kernels_of="cpu")  # registering the same device again is allowed

    @of.op("twice_by_a_made_two(Tensor x) -> Tensor y", traits=["elementwise"], replace=True)
    def twice(x):
        return x * 2

    @twice.grad
    def _(dy):
        return dy * of.full((), 2.0, dtype=dy.dtype)  # made on the default device

    x = of.tensor(np.ones(3), requires_grad=True)
    for _ in range(3):  # seen, recorded, replayed
        (g,) = of.grad(F.sum(twice(x)), [x])
        np.testing.assert_array_equal(g.numpy(), [2.0, 2.0, 2.0])
    assert _tapes_of(of.registry.get("twice_by_a_made_two"))
    with of.using_device("replay_twin"), pytest.raises(of.OpforgeError, match="replay_twin"):
        of.grad(F.sum(twice(x)), [x])  # as written: a cpu tensor times a replay_twin one is refused


# -- a tape is keyed on everything its result depends on (issue 30) ----------------------------------------------------


def _leaf_grad(x, y, seed) -> np.ndarray:
    x.grad = None
    y.backward(seed)
    return x.grad.numpy().copy()


def test_a_gradient_of_another_dtype_does_not_replay_the_tape_recorded_for_the_first():
    # float32 gradients record the tape (no cast in it: none was needed); a float64 one must still leave a float32
    # .grad on the float32 leaf, as the rule run as written does, and a float32 one after it be replayed again.
    x = of.tensor(np.array([0.5, -1.0, 2.0], np.float32), requires_grad=True)
    seeds = [of.tensor(np.ones(3, dt)) for dt in (np.float32, np.float32, np.float32, np.float64, np.float64,
                                                   np.float64, np.float32)]
    got = [_leaf_grad(x, F.tanh(x * 2.0), s) for s in seeds]
    previous = replay.set_replay(False)
    try:
        want = [_leaf_grad(x, F.tanh(x * 2.0), s) for s in seeds]
    finally:
        replay.set_replay(previous)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == np.float32 and _same(g, w)


def test_attrs_that_compare_equal_but_differ_get_tapes_of_their_own():
    # alpha = -0.0 and alpha = 0.0 compare equal; the gradient of leaky_relu at x < 0 is alpha·dy, a zero of
    # alpha's sign. A NaN attr (which never equals itself) finds its own tape.
    x = of.tensor([-1.0, 2.0], requires_grad=True)
    for alpha, sign in [(0.0, False), (0.0, False), (0.0, False), (-0.0, True), (-0.0, True)]:
        (g,) = of.grad(F.sum(F.leaky_relu(x, alpha=alpha)), [x])
        assert g.numpy()[0] == 0 and np.signbit(g.numpy()[0]) == sign, alpha
    before = len(replay._tapes)
    for _ in range(4):
        (g,) = of.grad(F.sum(F.leaky_relu(x, alpha=float("nan"))), [x])
        assert np.isnan(g.numpy()[0])
    assert len(replay._tapes) <= before + 1  # one key for every NaN, not one per call
