"""Compiled mode means what eager mode means (issue 30): in-place updates of arguments, guards on module state held in
containers and arrays, captured views, the bound on a compiled function's cache, compiling a module, and planning
long programs in near-linear time. Eager is the oracle: each test runs the same code both ways."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

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


def run_both(fn, make_args, calls=2):
    """Call ``fn`` eagerly and compiled ``calls`` times on fresh arguments from ``make_args()`` (the same values
    both ways); compare the results and what each call left in the arguments."""
    compiled = of.compile(fn)
    for _ in range(calls):
        eager_args, compiled_args = make_args(), make_args()
        assert_same(fn(*eager_args), compiled(*compiled_args))
        assert_same(eager_args, compiled_args)
    return compiled


# -- 1. in-place updates of arguments --------------------------------------------------------------------------------


def add_then_mul(a, b):
    with of.no_grad():
        a.add_(b)
    return a * b


def test_an_in_place_update_of_an_argument_lands_in_its_memory():
    run_both(add_then_mul, lambda: (ramp(3), ramp(3, start=10.0)))
    compiled, a, b = of.compile(add_then_mul), ramp(3), ramp(3, start=10.0)
    alias = a.numpy()  # the argument's own memory, as eagerly: not a new array bound to it
    for _ in range(3):  # traced once, each run updates
        compiled(a, b)
    assert_same(ramp(3) + 3 * ramp(3, start=10.0), alias)
    assert len(compiled.cache) == 1 and a.numpy() is alias


def test_an_argument_passed_twice_is_one_tensor_as_eagerly():
    compiled = of.compile(add_then_mul)
    for same in (True, False, True):
        eager_a, a = ramp(3), ramp(3)
        eager_b, b = (eager_a, a) if same else (ramp(3), ramp(3))
        assert_same(add_then_mul(eager_a, eager_b), compiled(a, b))  # f(a, a): 2a * 2a
        assert_same(eager_a, a)
    assert len(compiled.cache) == 2  # a call with an argument passed twice is traced apart


def test_a_parameter_passed_twice_gets_both_gradients():
    def loss(w, v):
        loss = (w * v * 3.0).sum()
        loss.backward()
        return loss

    eager_w, w = ramp(3), ramp(3)
    eager_w.requires_grad_(True), w.requires_grad_(True)
    assert_same(loss(eager_w, eager_w), of.compile(loss)(w, w))
    assert_same(eager_w.grad, w.grad)  # 6w, not 3w


@pytest.mark.parametrize("update", [
    lambda a, b: a.mul_(b),
    lambda a, b: a.sub_(b, alpha=2),
    lambda a, b: a.copy_(b * 2),
    lambda a, b: a.clamp_(min=2.0, max=4.0),
    lambda a, b: a.fill_(7.0),
    lambda a, b: a.zero_(),
], ids=["mul_", "sub_", "copy_", "clamp_", "fill_", "zero_"])
def test_every_in_place_method_updates_the_argument(update):
    def fn(a, b):
        with of.no_grad():
            update(a, b)
            update(b, a)  # b then reads a's new value
        return a + b

    run_both(fn, lambda: (ramp(2, 3), ramp(2, 3, start=-2.0)))


def test_in_place_operators_update_the_argument():
    def fn(a, b):
        a += b
        a *= 2.0
        b -= a
        b /= 4.0
        return a, b

    run_both(fn, lambda: (ramp(4), ramp(4, start=5.0)))


def test_an_array_argument_is_updated_in_place_too():
    def fn(a, b):
        a += b  # NumPy's += writes into the array eagerly
        return b * 2.0

    compiled, a, b = of.compile(fn), np.ones(3, np.float32), np.full(3, 2.0, np.float32)
    compiled(a, b)
    np.testing.assert_array_equal(a, [3.0, 3.0, 3.0])


def test_returning_an_argument_returns_that_tensor():
    def fn(a, b):
        with of.no_grad():
            a.add_(b)
        return a, b, a * 1.0

    a, b = ramp(3), ramp(3)
    out = of.compile(fn)(a, b)
    assert out[0] is a and out[1] is b and out[2] is not a


def test_item_assignment_writes_in_both_modes():
    def fn(a):
        a[0] = 5.0
        return a

    eager, compiled = ramp(3), ramp(3)
    assert fn(eager) is eager and of.compile(fn)(compiled) is compiled
    assert eager.numpy().tolist() == compiled.numpy().tolist() and eager.numpy()[0] == 5.0


def test_an_update_eager_code_would_not_write_into_memory_is_refused():
    w = ramp(3)
    w.requires_grad_(True)

    def update_a_leaf(a):  # eagerly: "a leaf tensor that requires grad cannot be changed in place"
        a.add_(1.0)
        return a

    with pytest.raises(of.GradientError, match="leaf tensor that requires grad"):
        update_a_leaf(w)
    with pytest.raises(of.GradientError, match=r"argument 'a'.*leaf tensor that requires grad"):
        of.compile(update_a_leaf)(w)

    def take_a_history(a):  # eagerly: a becomes a non-leaf with a grad_fn, its memory untouched
        a.add_(w)
        return a

    with pytest.raises(of.GradientError, match=r"argument 'a'.*new value requires grad"):
        of.compile(take_a_history)(ramp(3))

    def read_after_update(a):  # the update is recorded without gradients, the read with them
        with of.no_grad():
            a.add_(1.0)
        return (a * 2.0).sum()

    with pytest.raises(of.ArgumentError, match=r"argument 'a'.*updated earlier"):
        of.compile(read_after_update)(w)


def test_an_update_through_shared_memory_is_refused_not_half_done():
    def fn(a, b):
        with of.no_grad():
            a.add_(1.0)
        return b * 1.0  # eagerly b, a view of a, shows the new value

    x = ramp(2, 3)
    view = x[0]
    assert np.shares_memory(view.numpy(), x.numpy())
    before = x.numpy().copy()
    with pytest.raises(of.ArgumentError, match="argument 'a' is changed in place and shares memory with argument 'b'"):
        of.compile(fn)(x, view)
    assert_same(before, x)
    array = np.ones(3, np.float32)
    with pytest.raises(of.ArgumentError, match="argument 'a' is changed in place and shares memory with argument 'b'"):
        of.compile(fn)(array, array)  # one array twice: two variables, unlike one tensor twice

    compiled = of.compile(fn)
    compiled(ramp(2, 3), ramp(3))
    with pytest.raises(of.ArgumentError, match=r"argument 'a' is changed in place, and its memory .* is read-only"):
        compiled(F.broadcast_to(ramp(3), shape=(2, 3)), ramp(3))  # eagerly: refused, the memory is read-only

    buffer = ramp(3)
    compiled = of.compile(lambda a: add_then_mul(a, buffer))  # reads the tensor it is passed
    compiled(ramp(3))
    with pytest.raises(of.ArgumentError, match="argument 'a' is changed in place and shares memory with a tensor"):
        compiled(buffer)


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


# -- 2. guards on what modules hold -----------------------------------------------------------------------------------


class Holder(of.nn.Module):
    """State a forward reads through containers, an array and a config object: changed without an assignment."""

    def __init__(self):
        super().__init__()
        self.layers = []  # a plain list, not a ModuleList
        self.cfg = {"scale": 2.0, "unused": [1, 2]}
        self.mask = np.ones(3, np.float32)
        self.config = SimpleNamespace(shift=1.0, offsets=(0.0, [0.5]))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return (x * self.cfg["scale"] + self.config.shift + self.config.offsets[1][0]) * self.mask


def test_guards_see_the_contents_of_lists_dicts_arrays_and_config_objects():
    model = Holder()
    compiled, x = of.compile(model, max_cache=16), ramp(2, 3)
    changes = [
        lambda: model.layers.append(of.nn.Linear(3, 3)),
        lambda: model.cfg.__setitem__("scale", 3.0),
        lambda: model.cfg.__setitem__("scale", -0.0),  # == 0.0, yet another result: 1 / -0.0
        lambda: model.cfg.__setitem__("scale", 0.0),
        lambda: model.mask.__setitem__(0, 5.0),
        lambda: setattr(model.config, "shift", -1.0),
        lambda: model.config.offsets[1].__setitem__(0, 9.0),
        lambda: model.cfg["unused"].append(3),  # not read, but the guard cannot know: traced again, still right
        lambda: model.layers.pop(),
    ]
    assert_same(model(x), compiled(x))
    for i, change in enumerate(changes):
        change()
        assert_same(model(x), compiled(x))
        assert_same(model(x), compiled(x))  # and unchanged, the program is reused
        assert sum(map(len, compiled.cache.values())) == i + 2


class _Counter:
    """Bookkeeping a module holds that changes at every call without changing what a trace computes (as a
    communicator's count of collectives): an object that is not a configuration, compared by identity."""

    def __init__(self):
        self.calls = 0


class Counting(of.nn.Module):
    def __init__(self):
        super().__init__()
        self.counter = _Counter()
        self.settings = _Settings(scale=2.0)

    def forward(self, x):
        self.counter.calls += 1
        return x * self.settings.scale


@dataclass
class _Settings:
    scale: float


def test_state_that_is_not_a_configuration_does_not_trace_again_and_a_dataclass_is_one():
    model = Counting()
    compiled, x = of.compile(model), ramp(2, 3)
    for _ in range(4):
        assert_same(model(x), compiled(x))
    assert sum(map(len, compiled.cache.values())) == 1  # the counter moved at every call: still one program
    model.settings.scale = 3.0  # a dataclass is a configuration: its fields are guarded
    assert_same(model(x), compiled(x))
    assert sum(map(len, compiled.cache.values())) == 2


# -- 3. captured views ------------------------------------------------------------------------------------------------


def test_a_captured_read_only_view_is_read_through_at_each_run():
    base = ramp(3)
    view = F.broadcast_to(base, shape=(2, 3))  # read-only memory, yet it changes with its base

    def fn(x):
        return x + view * 2.0  # view * 2.0 reads nothing else: it was folded once, as if the view were a constant

    compiled, x = of.compile(fn), ramp(2, 3)
    assert_same(fn(x), compiled(x))
    base.add_(1.0)
    assert_same(fn(x), compiled(x))
    assert len(compiled.cache) == 1

    def write_into_the_view(x):
        view.add_(x)  # eagerly refused: the view's memory is read-only
        return x

    with pytest.raises(of.ArgumentError, match="read-only"):
        write_into_the_view(ramp(2, 3))
    with pytest.raises(of.ArgumentError, match="read-only"):
        of.compile(write_into_the_view)(ramp(2, 3))


# -- 4. the bound on the cache ----------------------------------------------------------------------------------------


def test_the_cache_is_bounded_and_calls_past_it_run_eagerly(monkeypatch):
    traced = []

    def fn(x):
        traced.append(isinstance(x, of.Variable))
        return x * 2.0

    compiled = of.compile(fn, max_cache=3)
    with pytest.warns(UserWarning, match=r"fn\(\) \(compiled\): 3 programs traced, the limit") as warned:
        for n in [1, 2, 3, 4, 5, 1, 6]:
            assert_same(fn(ramp(n)), compiled(ramp(n)))
    assert len(warned) == 1  # once
    assert sum(map(len, compiled.cache.values())) == 3
    assert traced.count(True) == 3  # shapes 1-3 traced once each; 4, 5 and 6 ran eagerly, 1 compiled again

    monkeypatch.setattr(of.program.CompiledFunction, "max_cache", 1)  # the default for every compiled function
    compiled = of.compile(fn)
    compiled(ramp(1))
    with pytest.warns(UserWarning, match="limit of its cache"):
        compiled(ramp(2))
    assert len(compiled.cache) == 1
    with pytest.raises(of.ArgumentError, match="max_cache must be an int >= 0"):
        of.compile(fn, max_cache=-1)


def test_a_result_computed_from_tensors_that_require_grad_requires_grad_and_refuses_a_backward_through_it():
    # eagerly y = x * x carries its history and (y.sum() + x.sum()).backward() gives x.grad = 2x + 1; a compiled
    # call's result once had none, and the same backward silently gave x.grad = 1. Now it requires grad, as eagerly,
    # and a backward reaching it is refused naming the function (under no_grad it requires nothing, as eagerly)
    x = of.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    w = of.tensor(np.array([0.5, 0.5, 0.5]), requires_grad=True)

    def f(t):
        return t * t * w

    compiled = of.compile(f)
    y = compiled(x)
    assert y.requires_grad and y.numpy().tolist() == f(x).numpy().tolist()
    with pytest.raises(of.GradientError, match=r"backward through a result of the compiled function f\(\)"):
        (y.sum() + x.sum()).backward()
    with pytest.raises(of.GradientError, match="compiled function f"):
        of.grad(y.sum(), [w])
    with of.no_grad():
        assert not compiled(x).requires_grad
    assert compiled(of.tensor(np.ones(3))).requires_grad  # w, which it reads, requires grad: as eagerly
    with of.no_grad():
        w2 = w.detach()
    assert not of.compile(lambda t: t * w2)(of.tensor(np.ones(3))).requires_grad


def test_a_training_step_still_returns_its_loss_and_its_values():
    w = of.tensor(np.array([1.0, -1.0]), requires_grad=True)

    @of.compile
    def step(x):
        loss = (x * w).sum() ** 2
        loss.backward()
        return loss

    loss = step(of.tensor(np.array([2.0, 1.0])))
    assert loss.item() == 1.0 and w.grad.numpy().tolist() == [4.0, 2.0]


def test_grad_and_requires_grad_read_in_traced_code_are_what_eager_code_reads():
    # x.grad of an argument inside a compiled function was an AttributeError, and requires_grad of every traced
    # value was False (so `if y.requires_grad:` took another branch than eagerly)
    w = of.tensor(np.array([1.0, 0.5, 2.0]), requires_grad=True)

    def step(x, c):
        before = x.grad
        loss = (x * w * x).sum() + (c * x).sum()
        loss.backward()
        with of.no_grad():
            quiet = x * 2.0
        return (before is None, x.grad * 1.0, x.requires_grad, c.requires_grad, (x * c).requires_grad,
                (c * 2.0).requires_grad, quiet.requires_grad, (x.grad * 2.0).requires_grad, loss.grad is None)

    results = []
    for fn in (step, of.compile(step)):
        x = of.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        results.append([fn(x, of.tensor(np.ones(3))) for _ in range(2)])
    for eager, compiled in zip(*results):
        assert [r if isinstance(r, bool) else r.numpy().tolist() for r in compiled] == \
            [r if isinstance(r, bool) else r.numpy().tolist() for r in eager]


def test_dot_data_in_traced_code_is_a_detached_view_as_eagerly():
    """``p.data.add_(...)`` (an old-style hand-written SGD step) and ``y.data`` read in a compiled function: it was
    an AttributeError in traced code; it is ``detach()``, whose writes reach the value, as eagerly."""
    def make():
        return of.nn.Parameter(of.tensor(np.ones(3, np.float32)))

    def step_for(w):
        def step(x):
            loss = (w * x).sum()
            loss.backward()
            w.data.add_(w.grad.data * -0.1)
            w.grad = None
            y = x * 1
            y.data.mul_(2)
            return loss + y.data.sum() + y.sum()
        return step

    x = of.tensor(np.array([0.5, 1.0, 2.0], np.float32))
    w_eager, w_compiled = make(), make()
    eager, compiled = step_for(w_eager), of.compile(step_for(w_compiled))
    for _ in range(3):
        np.testing.assert_array_equal(compiled(x).numpy(), eager(x).numpy())
        np.testing.assert_array_equal(w_compiled.numpy(), w_eager.numpy())

    def assign(x):
        y = x * 1
        y.data = x
        return y

    with pytest.raises(of.ArgumentError, match=r"assigning .data of program variable"):
        of.compile(assign)(x)
