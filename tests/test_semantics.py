"""Same code, same meaning (issue 14): compiled functions mean what the eager code means, or trace again.

Each numbered item of the issue runs the same code eagerly and compiled, side by side, and compares values,
``.grad`` and state (parameters, buffers, optimizer state). The raw exceptions the issue lists follow, each now a
clear error.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import opforge as of
from opforge import nn
from opforge import ops as F


def randn(*shape, seed=0, dtype="float32"):
    return of.tensor(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)


def assert_same(a, b, rtol=1e-6):
    """Two values, or two lists of tensors (None where a gradient is absent), agree."""
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y, rtol)
    elif a is None or b is None:
        assert a is None and b is None
    else:
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=rtol, atol=1e-7)


def twins(make):
    """The same model (or model and optimizer) twice, from the same seed: one to run eagerly, one compiled."""
    of.manual_seed(0)
    first = make()
    of.manual_seed(0)
    return first, make()


def state(model, opt=None):
    values = [t.detach() for t in model.state_dict().values()]
    grads = [p.grad for p in model.parameters()]
    moments = [] if opt is None else [t for p in model.parameters() for t in opt.state[p].values()]
    return values, grads, moments


def counting(fn):
    """``fn`` that counts its calls: how many times a compiled function traced it."""
    def counted(*args, **kwargs):
        counted.calls += 1
        return fn(*args, **kwargs)
    counted.calls = 0
    return counted


# -- 1. module modes and attributes are guarded -------------------------------------------------------------------


def test_1_dropout_and_batch_norm_follow_train_and_eval_in_compiled_code():
    def make():
        return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.ReLU())

    eager, traced = twins(make)
    forward = counting(lambda x: traced(x))
    compiled = of.compile(forward)
    for k, mode in enumerate(["train", "eval", "train", "eval", "eval"]):
        x = randn(8, 4, seed=k)
        outs = []
        for model, fn in ((eager, eager), (traced, compiled)):
            model.train(mode == "train")
            of.manual_seed(k)  # the same dropout masks
            outs.append(fn(x))
        assert_same(outs[0], outs[1])
        assert_same(state(eager)[0], state(traced)[0])  # the running statistics move only in training
    assert forward.calls == 2  # one trace per mode, reused when the mode comes back


def test_1_the_issue_case_and_a_changed_attribute():
    d = nn.Dropout(0.5)
    f = of.compile(lambda x: d(x))
    assert (f(of.ones(64)).numpy() == 0).any()
    d.eval()
    assert f(of.ones(64)).numpy().tolist() == [1.0] * 64
    d.train()
    d.p = 0.0  # an attribute the trace baked in
    assert f(of.ones(64)).numpy().tolist() == [1.0] * 64


# -- 2. what a trace captured is guarded: replaced, re-typed, re-shaped parameters --------------------------------


class Net(nn.Module):
    def __init__(self, width=5):
        super().__init__()
        self.fc1 = nn.Linear(3, width)
        self.fc2 = nn.Linear(width, 2)

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def test_2_double_replace_and_reshape_are_seen_by_compiled_code():
    eager, traced = twins(Net)
    forward = counting(lambda x: traced(x))
    compiled = of.compile(forward)
    x = randn(4, 3)
    assert_same(eager(x), compiled(x))
    eager.double(), traced.double()  # re-typed in place: the same Tensor objects, float64 arrays
    assert_same(eager(x.double()), compiled(x.double()))
    assert compiled(x.double()).dtype == of.float64
    for model in (eager, traced):  # a layer replaced, of another width (its parameters are re-shaped)
        of.manual_seed(1)
        model.fc1, model.fc2 = nn.Linear(3, 7, dtype="float64"), nn.Linear(7, 2, dtype="float64")
    assert_same(eager(x.double()), compiled(x.double()))
    calls = forward.calls
    with of.no_grad():  # new values in the same arrays: nothing to trace again
        for model in (eager, traced):
            model.fc1.weight.mul_(0.5)
    traced.load_state_dict(eager.state_dict())
    assert_same(eager(x.double()), compiled(x.double()))
    assert forward.calls == calls == 3


def test_2_a_parameter_given_a_new_array_of_the_same_shape_is_read_from_it():
    w = of.tensor(np.ones((2, 2)), requires_grad=True)
    f = counting(lambda x: x @ w)
    compiled = of.compile(f)
    x = of.tensor(np.eye(2))
    compiled(x)
    w._data = np.full((2, 2), 3.0)  # what Module.to() or a device move does to a tensor: a new array
    assert compiled(x).numpy().tolist() == [[3.0, 3.0], [3.0, 3.0]] and f.calls == 1
    w.requires_grad_(False)  # frozen: the program no longer treats it as a parameter
    assert compiled(x).numpy().tolist() == [[3.0, 3.0], [3.0, 3.0]] and f.calls == 2


# -- 3. .grad means the same in both modes ----------------------------------------------------------------------


def test_3_backward_without_a_step_leaves_the_gradients():
    eager, traced = twins(Net)

    def loss_of(model):
        def fn(x, y):
            loss = F.mean(F.square(model(x) - y))
            loss.backward()
            return loss
        return fn

    compiled = of.compile(loss_of(traced))
    for k in range(3):  # no zero_grad: the gradients accumulate, run after run
        x, y = randn(4, 3, seed=k), randn(4, 2, seed=10 + k)
        assert_same(loss_of(eager)(x, y), compiled(x, y))
        assert_same(state(eager)[1], state(traced)[1])
        assert all(p.grad is not None for p in traced.parameters())


def test_3_gradient_accumulation_over_compiled_micro_batches():
    def make():
        model = Net()
        return model, of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    (eager, eager_opt), (traced, traced_opt) = twins(make)

    def micro(model):
        def fn(x, y):
            loss = F.mean(F.square(model(x) - y)) / 4
            loss.backward()
            return loss
        return fn

    compiled = of.compile(micro(traced))
    for step in range(2):
        for k in range(4):
            x, y = randn(4, 3, seed=step * 4 + k), randn(4, 2, seed=100 + k)
            assert_same(micro(eager)(x, y), compiled(x, y))
        for opt in (eager_opt, traced_opt):
            opt.step()
            opt.zero_grad()
        assert_same(state(eager, eager_opt), state(traced, traced_opt))
    start = Net()
    assert not np.allclose(traced.fc1.weight.numpy(), start.fc1.weight.numpy())  # the weights moved


@pytest.mark.parametrize("order", ["backward, step", "zero_grad, backward, step", "backward, step, zero_grad"])
def test_3_training_steps_with_and_without_zero_grad(order):
    def make():
        model = Net()
        return model, of.optim.Adam(model.parameters(), lr=0.01)

    (eager, eager_opt), (traced, traced_opt) = twins(make)

    def step(model, opt):
        def fn(x, y):
            loss = F.mean(F.square(model(x) - y))
            for call in order.split(", "):
                loss.backward() if call == "backward" else getattr(opt, call)()
            return loss
        return fn

    compiled = of.compile(step(traced, traced_opt))
    for k in range(4):
        x, y = randn(4, 3, seed=k), randn(4, 2, seed=10 + k)
        assert_same(step(eager, eager_opt)(x, y), compiled(x, y), rtol=1e-5)
        assert_same(state(eager, eager_opt), state(traced, traced_opt), rtol=1e-5)


def test_3_an_argument_that_requires_grad_gets_its_gradient():
    w = of.tensor(np.array([1.0, -2.0]), requires_grad=True)

    def fn(x):
        loss = F.sum(F.tanh(x * w))
        loss.backward()
        return loss

    compiled = of.compile(fn)
    xs = [of.tensor(np.array([0.5, 0.25]), requires_grad=True) for _ in range(2)]
    fn(xs[0]), fn(xs[0])
    compiled(xs[1]), compiled(xs[1])
    assert_same(xs[0].grad, xs[1].grad)
    with pytest.raises(of.GradientError, match="compiled program cannot extend an eager graph"):
        compiled(xs[1] * 2)


# -- 4. calls bind as in Python ---------------------------------------------------------------------------------


def test_4_arguments_bind_as_python_binds_them():
    def fn(x, *rest, scale=2.0, shift=None):
        total = x * scale
        for r in rest:
            total = total + r
        return total if shift is None else total + shift

    compiled = of.compile(fn)
    x, y = randn(3), randn(3, seed=1)
    for args, kwargs in [((x,), {}), ((x, y), {}), ((x, y, y), {"scale": 3}), ((x,), {"shift": y}),
                         ((x,), {"scale": 0.5})]:
        assert_same(fn(*args, **kwargs), compiled(*args, **kwargs))
    assert len(compiled.cache) == 5  # a Python scalar is a constant: another value, another trace

    strict = of.compile(lambda x, y: x + y)
    with pytest.raises(of.ArgumentError, match="too many positional arguments"):
        strict(x, y, y)
    with pytest.raises(of.ArgumentError, match="missing a required argument: 'y'"):
        strict(x)
    with pytest.raises(of.ArgumentError, match="multiple values for argument 'y'"):
        strict(x, y, y=y)
    with pytest.raises(of.ArgumentError, match="unexpected keyword argument 'z'"):
        strict(x, y, z=y)


def test_4_containers_of_tensors_and_namedtuple_results():
    def fn(batch, pair):
        return {"sum": batch["a"] + batch["b"], "both": (pair[0] * 2, pair[1])}

    compiled = of.compile(fn)
    batch, pair = {"a": randn(2), "b": randn(2, seed=1)}, [randn(3), randn(3, seed=2)]
    eager, ours = fn(batch, pair), compiled(batch, pair)
    assert_same(eager["sum"], ours["sum"])
    assert_same(list(eager["both"]), list(ours["both"])) and isinstance(ours["both"], tuple)
    with pytest.raises(of.ArgumentError, match="argument 'batch' is object"):
        compiled(object(), pair)


# -- 5. looking at the program runs nothing ---------------------------------------------------------------------


def test_5_program_traces_but_does_not_run():
    model = Net()
    opt = of.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        loss = F.mean(F.square(model(x) - y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = of.compile(step)
    before = [p.numpy().copy() for p in model.parameters()]
    program = compiled.program(randn(4, 3), randn(4, 2))
    assert "fc1.weight" in str(program)
    assert all(np.array_equal(a, p.numpy()) for a, p in zip(before, model.parameters()))
    compiled(randn(4, 3), randn(4, 2))  # the traced program runs now, with no second trace
    assert not np.array_equal(before[0], model.fc1.weight.numpy()) and len(compiled.cache) == 1


# -- 6. a multi-output result in a Tensor slot is an error --------------------------------------------------------


def test_6_a_tuple_of_tensors_for_a_tensor_is_refused_in_both_modes():
    def fn(x):
        return F.relu(F.dropout_with_mask(x, p=0.5))  # (y, mask)

    with pytest.raises(of.ArgumentError, match=r"relu\(\): argument 'x' expected Tensor.*multi-output"):
        fn(randn(2, 8, 4))
    with pytest.raises(of.ArgumentError, match=r"relu\(\): argument 'x' expected Tensor.*multi-output"):
        of.compile(fn)(randn(2, 8, 4))


# -- 7. in-place writes and the version check ---------------------------------------------------------------------


def test_7_backward_refuses_a_saved_value_changed_in_place():
    w = of.tensor(np.array([1.0, 2.0]), requires_grad=True)
    x = of.tensor(np.array([3.0, 4.0]))
    loss = F.sum(x * w)  # mul saves x (for w's gradient)
    x.add_(1.0)
    with pytest.raises(of.GradientError, match=r"op 'mul': its saved input 'x' \(a tensor of shape \(2,\).*add_"):
        loss.backward()
    y = F.exp(w)  # exp saves its output
    with of.no_grad():
        y.mul_(2.0)
    with pytest.raises(of.GradientError, match="op 'exp': its saved output 'y'"):
        F.sum(y).backward()
    view = w.detach()  # an alias: the write is seen through it (as through views)
    loss = F.sum(F.square(w))
    view.zero_()
    with pytest.raises(of.GradientError, match=r"op 'square'.*zero_"):
        loss.backward()


def test_7_in_place_methods_bump_the_version_and_keep_the_memory():
    t = of.tensor(np.array([1.0, 2.0, 3.0]))
    data, version = t.numpy(), t._version
    t.add_(1).sub_(0.5).mul_(2)
    t += 1
    t -= of.tensor(np.array([1.0, 1.0, 1.0]))
    t *= 2
    t /= 2
    assert t.numpy() is data and t.numpy().tolist() == [3.0, 5.0, 7.0]
    t.clamp_(max=6.0).fill_(4.0)
    t.copy_(of.tensor([1.0, 2.0, 3.0], dtype="float64"))  # cast into the tensor's dtype
    assert t.numpy().tolist() == [1.0, 2.0, 3.0] and t.zero_().numpy().tolist() == [0.0] * 3
    assert t._version == version + 11 and t.numpy() is data
    with pytest.raises(of.ArgumentError, match="dtype float32, which cannot be written into a int64"):
        of.tensor([1, 2]).add_(0.5)
    with pytest.raises(of.ArgumentError, match=r"shape \(2, 3\), which does not fit"):
        of.zeros(3).add_(of.zeros(2, 3))


def test_7_updates_and_the_leaf_rule_mean_the_same_eagerly_and_compiled():
    def make():
        return of.tensor(np.array([1.0, -1.0]), requires_grad=True)

    def step(w):
        def fn(x):
            loss = F.sum(F.square(x * w))
            loss.backward()
            with of.no_grad():
                for p in [w]:
                    p -= 0.1 * p.grad  # in place, as PyTorch
                    p.grad.zero_()
            return loss
        return fn

    w_eager, w_comp = make(), make()
    compiled, memory = of.compile(step(w_comp)), w_comp.numpy()
    for k in range(3):
        x = randn(2, seed=k, dtype="float64")
        assert_same(step(w_eager)(x), compiled(x))
        assert_same([w_eager, w_eager.grad], [w_comp, w_comp.grad])
    assert w_comp.numpy() is memory

    def bad(x):
        w_comp.add_(x)  # a leaf that requires grad, with grad recorded
        return w_comp

    for fn in (bad, of.compile(bad)):
        with pytest.raises(of.GradientError, match=r"leaf tensor that requires grad .* cannot be changed in place"):
            fn(randn(2, dtype="float64"))


def test_7_in_place_on_a_recorded_tensor_takes_its_new_history():
    def fn(x):
        y = x * 2
        y.add_(x)  # y = 3x, recorded: gradients go through both
        y.mul_(x)  # y = 3x², and mul sees the y before this line
        return F.sum(y)

    x_eager, x_comp = (of.tensor(np.array([1.0, 2.0]), requires_grad=True) for _ in range(2))
    fn(x_eager).backward()
    loss = of.compile(lambda x: fn(x) * 1)(x_comp.detach())
    assert_same(fn(x_eager.detach()), loss)
    assert x_eager.grad.numpy().tolist() == [6.0, 12.0]


def test_7_a_compiled_step_counts_as_an_in_place_write():
    model = Net()
    opt = of.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        loss = F.sum(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    x = randn(2, 3)
    pending = F.sum(model(x))  # an eager graph saving the weights ...
    of.compile(step)(x)  # ... which a compiled step then updates in place
    with pytest.raises(of.GradientError, match="modified in place by a compiled function's update"):
        pending.backward()


# -- 8. map-style datasets --------------------------------------------------------------------------------------


class Squares:
    """A map-style dataset, PyTorch's protocol: __len__ and __getitem__ (here without __iter__)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = np.array([i, i * i], dtype=np.float32) / 10
        return x, i % 2


def test_8_a_map_style_dataset_is_read_by_its_length():
    loader = of.data.DataLoader(Squares(10), batch_size=4)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    assert batches[2][1].numpy().tolist() == [0, 1] and batches[0][0].shape == (4, 2)
    assert batches[0][0].dtype == of.float32 and batches[0][1].dtype == of.int64
    assert len(list(of.data.DataLoader(Squares(10), batch_size=4, drop_last=True))) == 2
    pairs = of.data.DataLoader(Squares(5), batch_size=2, collate_fn=lambda samples: samples)
    assert [len(b) for b in pairs] == [2, 2, 1]
    records = of.data.DataLoader([{"x": np.ones(2), "tag": "a"}] * 3, batch_size=3)
    (batch,) = records
    assert batch["x"].shape == (3, 2) and batch["tag"] == ["a"] * 3


def test_8_training_from_a_dataset_eagerly_and_compiled():
    def make():
        model = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2))
        return model, of.optim.SGD(model.parameters(), lr=0.5)

    (eager, eager_opt), (traced, traced_opt) = twins(make)

    def step(model, opt):
        def fn(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        return fn

    compiled = of.compile(step(traced, traced_opt))
    for x, y in of.data.DataLoader(Squares(12), batch_size=4, shuffle=True, seed=0):
        assert_same(step(eager, eager_opt)(x, y), compiled(x, y))
    assert_same(state(eager, eager_opt), state(traced, traced_opt))


# -- 9. mixed float dtypes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda: nn.Linear(3, 2)(of.tensor(np.ones((1, 3)))),
    lambda: of.ones(2, 3) @ of.ones(3, 2, dtype="float64"),
    lambda: F.conv2d(of.ones(1, 1, 4, 4), of.ones(1, 1, 3, 3, dtype="float64")),
])
def test_9_mixed_float_dtypes_are_refused_naming_both(call):
    for fn in (call, of.compile(lambda: call())):
        with pytest.raises(of.ArgumentError, match=r"is float(32|64) but argument '\w+' is float(32|64)"):
            fn()
    assert (of.ones(2, 2) @ of.tensor([[1, 2], [3, 4]])).shape == (2, 2)  # an integer tensor still promotes


# -- raw exceptions that became clear errors ------------------------------------------------------------------


def test_numpy_reductions_on_tensors():
    x = of.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    total = np.sum(x)
    assert isinstance(total, of.Tensor) and total.item() == 15.0
    assert np.mean(x, axis=0).numpy().tolist() == [1.5, 2.5, 3.5]
    assert np.max(x, axis=1, keepdims=True).shape == (2, 1) and np.argmax(x).item() == 5
    total.backward()
    assert x.grad.numpy().tolist() == [[1.0] * 3] * 2
    assert isinstance(np.concatenate([x.detach(), x.detach()]), np.ndarray)  # others get the arrays
    with pytest.raises(of.ArgumentError, match="out=, where= and initial= are not supported"):
        np.sum(x, out=np.zeros(()))


def test_values_are_not_known_while_tracing():
    def reading(read):
        return of.compile(lambda x: read(F.sum(x)))

    for read in (lambda v: v.item(), float, int, lambda v: np.asarray(v), lambda v: v.tolist()):
        with pytest.raises(of.ArgumentError, match=r"no value while tracing.*return them from it"):
            reading(read)(of.ones(2))


def test_definition_mistakes_are_caught_at_definition(scratch_ops):
    scratch_ops += ["no_attr_infer", "pair_elementwise"]

    @of.op("no_attr_infer(Tensor x, *, float alpha=1.0) -> Tensor y")
    def no_attr_infer(x, *, alpha):
        return x * alpha

    with pytest.raises(of.SchemaError, match=r"infer rule of op 'no_attr_infer' must take .* attrs \(alpha\)"):
        no_attr_infer.infer(lambda x: x)
    with pytest.raises(of.SchemaError, match="op 'pair_elementwise': traits elementwise/broadcast describe one output"):
        of.op("pair_elementwise(Tensor x) -> (Tensor a, Tensor b)", traits=["elementwise"])(lambda x: (x, x))


def test_kernel_bugs_are_not_shape_errors(scratch_ops):
    scratch_ops.append("buggy")

    @of.op("buggy(Tensor x) -> Tensor y", traits=["elementwise"])
    def buggy(x):
        return x * undefined_name  # noqa: F821

    with pytest.raises(NameError) as info:
        F.buggy(of.ones(2))
    assert "kernel of op 'buggy'" in "".join(info.value.__notes__)
    with pytest.raises(of.OutOfMemoryError, match=r"^zeros\(\): out of memory: output 'y' \(1000000, 1000000\)"):
        of.zeros(10**6, 10**6)  # a MemoryError too (tests/test_hostile_ops.py)


def test_files_errors_name_what_the_user_gave(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"the folder .*missing' does not exist"):
        of.save({"w": of.ones(2)}, tmp_path / "missing" / "ckpt.npz")
    program = of.trace(lambda x: x * 2, x=of.Spec((2,), "float32"))
    program.save(tmp_path / "prog.json")
    with pytest.raises(of.OpforgeError, match=r"not an opforge checkpoint.*JSON .*of.Program.load"):
        of.load(tmp_path / "prog.json")


def test_pickling_tensors():
    leaf = of.tensor([1.0, 2.0], requires_grad=True)
    back = pickle.loads(pickle.dumps(leaf))
    assert back.numpy().tolist() == [1.0, 2.0] and back.requires_grad and back.is_leaf
    with pytest.raises(of.GradientError, match=r"cannot pickle a tensor computed by recorded ops.*detach"):
        pickle.dumps(leaf * 2)
    assert pickle.loads(pickle.dumps((leaf * 2).detach())).numpy().tolist() == [2.0, 4.0]


def test_debug_mode_checks_kernels_against_their_shape_rule(scratch_ops):
    scratch_ops.append("wrong_dtype")

    @of.op("wrong_dtype(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
    def wrong_dtype(x):
        return x.astype(np.float64)  # the trait says: like x

    x = of.ones(3)
    assert wrong_dtype(x).dtype == of.float64  # unchecked, as the fast path runs the kernel alone
    previous = of.set_debug(True)
    try:
        with pytest.raises(of.SchemaError, match=r"wrong_dtype\(\): the kernel .* dtype float64 .* trait "
                                                 r"'elementwise' says .* dtype float32"):
            wrong_dtype(x)
        assert F.relu(x).numpy().tolist() == [1.0] * 3  # correct ops pass
    finally:
        of.set_debug(previous)
    report = of.testing.check_op(wrong_dtype, raise_on_failure=False)
    assert any("float64" in f for f in report.failures)


def test_a_gradient_rule_in_numpy_is_named_at_second_order(scratch_ops):
    scratch_ops.append("numpy_rule")

    @of.op("numpy_rule(Tensor<floating> x) -> Tensor y", traits=["elementwise"])
    def numpy_rule(x):
        return np.sin(x)

    @numpy_rule.grad
    def _(x, dy):
        return dy * of.tensor(np.cos(x.numpy()))  # works at first order, cut from the graph at the second

    x = of.tensor(np.array([0.5, 1.0]), requires_grad=True)
    (g,) = of.grad(F.sum(numpy_rule(x)), [x])
    np.testing.assert_allclose(g.numpy(), np.cos([0.5, 1.0]))
    with pytest.raises(of.GradientError, match="gradient rule of op 'numpy_rule' read tensor values out to NumPy"):
        of.grad(F.sum(numpy_rule(x)), [x], create_graph=True)
