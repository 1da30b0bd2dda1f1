"""Fuzzing "same meaning" (issue 30): random cases on the surfaces where compiled mode, replayed tapes, caches,
concurrent saves and extreme numbers could change a result without a word. Each case has an oracle: eager mode for
compiled code, ``set_replay(False)`` for replayed tapes, one of the saved objects for concurrent saves, and a
long-double NumPy computation for the numerics (torch float32 gives NaN for a layer_norm opforge gets right).

``make test`` runs a seeded sample of each in seconds; ``OPFORGE_FUZZ=long`` many more (``OPFORGE_FUZZ_SEED`` picks
another seed). Results are compared bit for bit (NaN where NaN, the sign of a zero) where the oracle computes the
same thing, and within a tolerance against the long-double reference. Compiled code runs here with the native backend
off (``OPFORGE_NATIVE=0``: NumPy's kernels, the eager bits): its loops take tanh and exp from libmvec, within an ulp
or two of NumPy's, as documented in opforge/program/native.py and tested in test_native.py; what is fuzzed here is
meaning (guards, caches, aliasing), which a last bit of rounding would hide behind a tolerance.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from fuzzing import SEED, count, hard_deadline, quiet

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.autodiff import replay


@pytest.fixture(autouse=True)
def _bit_for_bit(monkeypatch):
    monkeypatch.setenv("OPFORGE_NATIVE", "0")


# numbers caches keyed by == would mix up: -0.0 and 0.0, 2 and 2.0, True and 1, NaN (never == itself)
TRICKY = [0.0, -0.0, 1, 1.0, True, 2, 2.0, 0.5, -2.5, float("nan"), float("inf"), -float("inf"), 1e-45, 3e38]


def same(a, b, what=""):
    """Bit for bit: dtype, shape, values, NaN where NaN, the sign of each zero."""
    a = np.asarray(a.numpy() if isinstance(a, of.Tensor) else a)
    b = np.asarray(b.numpy() if isinstance(b, of.Tensor) else b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b)), \
        f"{what}: {a.ravel()[:6]} vs {b.ravel()[:6]}"


def pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


# -- 1. compile guards under mutation ----------------------------------------------------------------------------


class Stateful(nn.Module):
    """A forward that reads state through a list, a dict, an array and a config object, each changed in place."""

    def __init__(self):
        super().__init__()
        self.layers = []
        self.cfg = {"scale": 2.0, "shift": 0.0}
        self.mask = np.ones(3, np.float32)
        self.config = SimpleNamespace(offset=1.0, on=True)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        y = x * self.cfg["scale"] + self.cfg["shift"]
        if self.config.on:
            y = 1.0 / (y + self.config.offset)  # (1 / -0.0 is -inf: the sign of a zero shows)
        return y * self.mask


def _mutate_module(model: Stateful, rng) -> str:
    kind = int(rng.integers(7))
    if kind == 0:
        model.layers.append(pick(rng, [nn.Tanh(), nn.ReLU(), nn.Linear(3, 3)]))
    elif kind == 1 and model.layers:
        model.layers.pop(int(rng.integers(len(model.layers))))
    elif kind == 2:
        model.cfg[pick(rng, ["scale", "shift"])] = pick(rng, TRICKY)
    elif kind == 3:
        model.mask[int(rng.integers(3))] = pick(rng, TRICKY)
    elif kind == 4:
        model.config.offset = pick(rng, TRICKY)
    elif kind == 5:
        model.config.on = not model.config.on
    else:
        model.cfg["scale"], model.cfg["shift"] = model.cfg["shift"], model.cfg["scale"]
    return ["append", "pop", "cfg", "mask", "offset", "flag", "swap"][kind]


def fuzz_module_guards(cases: int, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    for case in range(cases):
        of.manual_seed(case)
        model = Stateful()
        compiled = of.compile(model, max_cache=10_000)
        x = of.tensor(rng.standard_normal((2, 3)).astype(np.float32))
        history = []
        for _ in range(steps):
            history.append(_mutate_module(model, rng))
            same(model(x), compiled(x), f"case {case} after {history}")


def test_fuzz_compile_guards_under_mutation():
    with quiet():
        fuzz_module_guards(count(6, 200), count(12, 40), SEED)


_IN_PLACE = [lambda a, b: a.add_(b), lambda a, b: a.sub_(b), lambda a, b: a.mul_(b), lambda a, b: a.div_(b),
             lambda a, b: a.copy_(b), lambda a, b: a.clamp_(-0.5, 0.5), lambda a, b: a.zero_(),
             lambda a, b: a.fill_(-0.0), lambda a, b: a.__iadd__(b), lambda a, b: a.__imul__(b)]
_PURE = [lambda a, b: a * b, lambda a, b: a + b, lambda a, b: F.tanh(a) - b, lambda a, b: a / (b + 2.0),
         lambda a, b: F.where(a > b, a, b)]


def _program(rng):
    """A random function of (a, b): in-place updates of its arguments (under no_grad) between pure ops."""
    steps = [(bool(rng.integers(2)), int(rng.integers(10)), int(rng.integers(2))) for _ in range(int(rng.integers(1,
                                                                                                          6)))]

    def fn(a, b):
        args, outs = [a, b], []
        for in_place, k, which in steps:
            x, y = args[which], args[1 - which]
            if in_place:
                with of.no_grad():
                    _IN_PLACE[k](x, y)
            else:
                outs.append(_PURE[k % len(_PURE)](x, y))
        return [*outs, a * 1.0, b * 1.0]

    return fn, steps


def fuzz_in_place_arguments(cases: int, seed: int):
    rng = np.random.default_rng(seed)
    for case in range(cases):
        fn, steps = _program(rng)
        compiled = of.compile(fn)
        aliased = bool(rng.integers(2))  # f(a, a): one tensor under two names, as eagerly
        for call in range(3):  # traced, then run from the cache
            values = rng.standard_normal((2, 2, 3)).astype(np.float32)
            eager = [of.tensor(v) for v in values]
            mine = [of.tensor(v) for v in values]
            if aliased:
                eager[1], mine[1] = eager[0], mine[0]
            want = fn(*eager)
            got = compiled(*mine)
            for k, (w, g) in enumerate(zip(want, got)):
                same(w, g, f"case {case} {steps} aliased={aliased} call {call}: result {k}")
            for k, (w, g) in enumerate(zip(eager, mine)):
                same(w, g, f"case {case} {steps} aliased={aliased} call {call}: argument {k} after the call")


def test_fuzz_in_place_updates_of_arguments_and_aliasing():
    with quiet():
        fuzz_in_place_arguments(count(25, 600), SEED)


def fuzz_python_numbers(cases: int, seed: int):
    """Python numbers as arguments of compiled functions and as operands: -0.0 after 0.0, 2 after 2.0, NaN."""
    rng = np.random.default_rng(seed)
    x = of.tensor(np.array([1.0, -2.0, 0.0], np.float32))
    fns = [lambda x, s: 1.0 / (x * 0.0 + s), lambda x, s: x * s, lambda x, s: F.leaky_relu(x - 3.0, alpha=s) * 1.0,
           lambda x, s: F.clip(x, min=s) if s == s else x + s, lambda x, s: x + s]
    numpy = {0: lambda x, s: np.float32(1) / (x * np.float32(0) + np.float32(s)), 1: lambda x, s: x * np.float32(s),
             4: lambda x, s: x + np.float32(s)}  # (a Python number does not widen a float32 tensor)
    compiled = [of.compile(f, max_cache=10_000) for f in fns]
    for case in range(cases):
        k, s = int(rng.integers(len(fns))), pick(rng, TRICKY)
        if k == 2 and isinstance(s, (bool, int)):
            s = float(s)  # (alpha is a float attribute)
        eager = fns[k](x, s)
        same(eager, compiled[k](x, s), f"case {case}: fn {k} with {s!r}")
        if k in numpy:  # eager mode's own caches (lifted numbers) against NumPy, which has none
            same(numpy[k](x.numpy(), s), eager, f"case {case}: fn {k} with {s!r}, eagerly")


def test_fuzz_python_numbers_through_caches():
    with quiet():
        fuzz_python_numbers(count(60, 3000), SEED)


# -- 2. replayed tapes against the rules run as written -----------------------------------------------------------

_RULES = [lambda x, a: F.leaky_relu(x, alpha=a), lambda x, a: F.elu(x, alpha=a), lambda x, a: F.celu(x, alpha=a),
          lambda x, a: x * a, lambda x, a: F.tanh(x), lambda x, a: F.softplus(x, beta=a),
          lambda x, a: F.hardtanh(x, min_val=-abs(a), max_val=abs(a)), lambda x, a: F.sigmoid(x) + a,
          lambda x, a: F.exp(x * 0.1)]
_ATTRS = [0.0, -0.0, 0.5, -0.5, 2.0, float("nan"), 1e-38, -1e-38, 3.0]


def _chain(rng):
    return [(int(rng.integers(len(_RULES))), pick(rng, _ATTRS)) for _ in range(int(rng.integers(1, 5)))]


def _gradient(chain, x_values, dtype, seed_dtype):
    """x's gradient through the chain, or the OpforgeError's type when an op refuses an attr (celu's alpha=0)."""
    x = of.tensor(x_values.astype(dtype), requires_grad=True)
    try:
        y = x
        for k, a in chain:
            y = _RULES[k](y, a)
        y.backward(of.tensor(np.linspace(-1.0, 1.0, y.size).reshape(y.shape).astype(seed_dtype)))
    except of.OpforgeError as e:
        return type(e).__name__
    return x.grad


def fuzz_replay(cases: int, seed: int):
    rng = np.random.default_rng(seed)
    x_values = np.array([-2.0, -0.5, 0.0, -0.0, 0.5, 3.0])
    for case in range(cases):
        chain = _chain(rng)
        calls = [(pick(rng, [np.float32, np.float64]), pick(rng, [np.float32, np.float64])) for _ in range(4)]
        got = [_gradient(chain, x_values, d, s) for d, s in calls]  # recorded, then replayed (mixed dtypes)
        previous = replay.set_replay(False)
        try:
            want = [_gradient(chain, x_values, d, s) for d, s in calls]
        finally:
            replay.set_replay(previous)
        for k, (g, w) in enumerate(zip(got, want)):
            if isinstance(w, str) or isinstance(g, str):
                assert g == w, f"case {case}: chain {chain}, call {k}: {g} vs {w}"
            else:
                same(w, g, f"case {case}: chain {chain}, call {k} {calls[k]}")


def test_fuzz_replay_against_the_rules_run_as_written():
    with quiet():
        fuzz_replay(count(40, 2000), SEED)


# -- 3. saving one path at once -----------------------------------------------------------------------------------

def _checkpoint(k: int) -> dict:
    return {"k": k, "w": np.full((4, 3), float(k)), "nested": {"b": np.arange(k + 1)}}


def _same_checkpoint(a, b) -> bool:
    return a["k"] == b["k"] and np.array_equal(a["w"], b["w"]) and np.array_equal(a["nested"]["b"],
                                                                                  b["nested"]["b"])


def _same_program(a, b) -> bool:
    return str(a) == str(b) and a.values.keys() == b.values.keys() and all(
        np.array_equal(a.values[k], b.values[k]) for k in a.values)


def fuzz_concurrent_saves(tmp_path, writers: int, rounds: int, seed: int):
    """Threads saving checkpoints and programs to one path each while others load them: every load gives one of
    the saved objects whole (or, for a program whose values a concurrent save just replaced, a clear error), and
    what is left at the end loads as one of them."""
    from fuzzing import small_program

    rng = np.random.default_rng(seed)
    programs = [small_program(seed=k) for k in range(writers)]
    checkpoints = [_checkpoint(k) for k in range(writers)]
    ckpt, prog = tmp_path / "c.npz", tmp_path / "p.json"
    of.save(checkpoints[0], ckpt)
    programs[0].save(prog)
    problems = []
    stop = threading.Event()
    orders = [rng.permutation(rounds * 2) for _ in range(writers)]  # (drawn here: a Generator is not thread-safe)

    def write(k):
        for i in orders[k]:
            try:
                if i % 2:
                    of.save(checkpoints[k], ckpt)
                else:
                    programs[k].save(prog)
            except Exception as e:
                problems.append(f"writer {k}: {type(e).__name__}: {e}")

    def read():
        while not stop.is_set():
            try:
                got = of.load(ckpt)
                if not any(_same_checkpoint(got, c) for c in checkpoints):
                    problems.append(f"a checkpoint load gave none of the saved ones: {got}")
                loaded = of.Program.load(prog)
                if not any(_same_program(loaded, p) for p in programs):
                    problems.append("a program load gave none of the saved ones")
            except of.OpforgeError:
                pass  # the values a concurrent save removed under this load: said so
            except Exception as e:
                problems.append(f"reader: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    reader = threading.Thread(target=read)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    reader.join(timeout=60)
    assert not problems, problems[:10]
    assert any(_same_checkpoint(of.load(ckpt), c) for c in checkpoints)
    loaded = of.Program.load(prog)
    assert any(_same_program(loaded, p) for p in programs)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert all(n.startswith(("c.", "p.")) and not n.endswith(".tmp") for n in left), left


def test_fuzz_threads_saving_one_path_while_others_load_it(tmp_path):
    with hard_deadline(count(300, 3000)):
        fuzz_concurrent_saves(tmp_path, writers=3, rounds=count(8, 200), seed=SEED)


def _save_checkpoints(path, ks, rounds):
    for i in range(rounds):
        of.save(_checkpoint(ks[i % len(ks)]), path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the savers")
def test_processes_saving_one_checkpoint_path_at_once_leave_one_that_loads(tmp_path):
    import multiprocessing

    path = tmp_path / "c.npz"
    context = multiprocessing.get_context("fork")
    savers = [context.Process(target=_save_checkpoints, args=(path, ks, count(20, 400))) for ks in ([0, 1], [2, 3])]
    for p in savers:
        p.start()
    for p in savers:
        p.join(timeout=300)
        assert p.exitcode == 0
    assert any(_same_checkpoint(of.load(path), _checkpoint(k)) for k in range(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]


# -- 4. numerics at the extremes ----------------------------------------------------------------------------------

def _extreme_rows(rng, dtype, rows=4, width=6):
    """Rows at scales from the smallest normal to near the largest finite number of ``dtype``, some constant."""
    info = np.finfo(dtype)
    exponents = rng.uniform(np.log10(info.tiny) + 2, np.log10(info.max) - 1, rows)
    x = rng.standard_normal((rows, width)) * 10.0 ** exponents[:, None]
    if rng.integers(3) == 0:
        x[int(rng.integers(rows))] = 10.0 ** exponents[0]  # a constant row: zero variance
    return x.astype(dtype)


def _reference(name, x: np.ndarray, target, g: np.ndarray):
    """What the op computes, the gradient of Σ g·op(x) in x, and that gradient's scale (what its rounding is relative
    to: |g| times the largest factor, not the gradient, which cancels to far less), in long double (its range holds
    the squares of float64's largest numbers)."""
    x, g = x.astype(np.longdouble), g.astype(np.longdouble)

    def mean(a):
        return a.mean(-1, keepdims=True)

    if name == "layer_norm":
        xc = x - mean(x)
        r = 1 / np.sqrt(mean(xc * xc) + np.longdouble(1e-5))
        y = xc * r
        return y, r * (g - mean(g) - y * mean(g * y)), r.max() * np.abs(g).max()
    shifted = x - x.max(-1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(-1, keepdims=True))
    p = np.exp(shifted - log_sum)
    if name == "softmax":
        return p, p * (g - (g * p).sum(-1, keepdims=True)), np.abs(g).max()
    if name == "log_softmax":
        return shifted - log_sum, g - p * g.sum(-1, keepdims=True), np.abs(g).max() * x.shape[1]
    hot = np.eye(x.shape[1], dtype=np.longdouble)[target]
    return np.mean(log_sum[:, 0] - shifted[np.arange(len(x)), target]), (p - hot) / len(x), 1 / len(x)


def _close(got: np.ndarray, want: np.ndarray, dtype, scale=0.0) -> bool:
    finite = np.isfinite(want)
    scale = max(np.abs(want[finite]).max(initial=0.0), scale, 1e-30)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    return got.dtype == dtype and np.array_equal(np.isfinite(got), finite) and np.allclose(
        got[finite].astype(np.longdouble), want[finite], rtol=rtol, atol=rtol * scale)


def fuzz_extremes(cases: int, seed: int):
    rng = np.random.default_rng(seed)
    problems = []
    for case in range(cases):
        dtype = pick(rng, [np.float32, np.float64])
        name = pick(rng, ["layer_norm", "softmax", "log_softmax", "cross_entropy"])
        x = _extreme_rows(rng, dtype)
        target = rng.integers(0, x.shape[1], x.shape[0])
        g = rng.standard_normal(x.shape).astype(dtype) if name != "cross_entropy" else np.ones((), dtype)
        t = of.tensor(x, requires_grad=True)
        if name == "layer_norm":
            y = F.layer_norm(t, normalized_shape=[x.shape[1]])
        elif name == "cross_entropy":
            y = F.cross_entropy(t, of.tensor(target))
        else:
            y = getattr(F, name)(t, axis=-1)
        y.backward(of.tensor(g))
        want, want_grad, grad_scale = _reference(name, x, target, g)
        for what, got, w, scale in (("value", y.numpy(), want, 0.0), ("gradient", t.grad.numpy(), want_grad,
                                                                       grad_scale)):
            if not _close(got, np.asarray(w), dtype, scale):
                problems.append(f"case {case}: {name} {np.dtype(dtype)} {what} of rows at {np.abs(x).max(-1)}: "
                                f"got {got.ravel()[:4]}, want {np.asarray(w).ravel()[:4].astype(np.float64)}")
    return problems


def test_fuzz_numerics_at_the_extremes_against_long_double():
    with quiet():
        problems = fuzz_extremes(count(80, 4000), SEED)
    assert not problems, "\n".join(problems[:20])
