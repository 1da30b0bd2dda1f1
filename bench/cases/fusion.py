"""7. Elementwise fusion: a 10-op elementwise expression over 1,000,000 float32, written as a user would. Eager
frameworks make one pass over memory per op and allocate each intermediate; a compiled opforge program runs the
chain as one fused step (``opforge.program.fusion``). Three expressions: ten arithmetic ops, GELU's tanh
approximation times a gate (nine arithmetic ops and a tanh, where the tanh alone is most of the work), and eleven
ops around a sigmoid (issue 32)."""

from __future__ import annotations

import numpy as np

from .common import (
    Variant,
    jax_arrays,
    load_jax,
    load_torch,
    load_torch_compile,
    opforge_tensors,
    sq,
    torch_tensors,
    unknown,
)

TITLE = "7. Elementwise fusion: 10- and 11-op expressions over 1,000,000 float32"
UNIT = "µs"
FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "torch.compile", "jax", "jax.jit")
REFERENCES = ("numpy", "torch", "torch.compile", "jax.jit")

SIZE = 1_000_000


def arithmetic(x, y):
    """Ten ops: mul, add, mul, sub, mul, mul, add, mul, sub, neg."""
    a = x * y + 1.0
    b = a * x - y
    c = b * b * 0.5 + x
    return -(c * y - 1.0)


def gelu_gate(tanh):
    """Ten ops: GELU's tanh approximation of x (three muls, an add, a mul, the tanh, an add, two muls), times g."""

    def fn(x, g):
        t = tanh(0.7978846 * (x + 0.044715 * (x * x * x)))
        return 0.5 * x * (1.0 + t) * g

    return fn


def sigmoid_mix(sigmoid):
    """Eleven ops: mul, add, the sigmoid, mul, sub, mul, mul, mul, add, sub, mul."""

    def fn(x, y):
        a = x * y + 0.5
        s = sigmoid(a) * y
        b = (s - x) * 0.25
        return (b * b + a * s - y) * 1.5

    return fn


def numpy_sigmoid(x):
    return 1 / (1 + np.exp(-x))


CASES = ("10 arithmetic ops", "gelu-tanh × gate (10 ops, 1 tanh)", "11 ops with a sigmoid")


def functions(framework: str) -> dict:
    if framework == "numpy":
        tanh, sigmoid = np.tanh, numpy_sigmoid
    elif framework.startswith("opforge"):
        from opforge import ops as F

        tanh, sigmoid = F.tanh, F.sigmoid
    elif framework.startswith("torch"):
        torch = load_torch()
        tanh, sigmoid = torch.tanh, torch.sigmoid
    else:
        jax = load_jax()
        tanh, sigmoid = jax.numpy.tanh, jax.nn.sigmoid
    return dict(zip(CASES, (arithmetic, gelu_gate(tanh), sigmoid_mix(sigmoid))))


def inputs():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(SIZE).astype(np.float32) for _ in range(2)]


def bind(f, *args):
    """A zero-argument call of f(*args) (a fresh scope per variant: no late binding of loop variables)."""
    return lambda: f(*args)


def blocking(f, *args):
    return lambda: f(*args).block_until_ready()  # JAX dispatches asynchronously


def output_check(call):
    return lambda: {"out²": sq(call())}


def variants(framework: str, quick: bool) -> list[Variant]:
    arrays = inputs()
    out = []
    for name, fn in functions(framework).items():
        if framework == "numpy":
            call = bind(fn, *arrays)
        elif framework == "opforge":
            call = bind(fn, *opforge_tensors(arrays))
        elif framework == "opforge.compiled":
            import opforge as of

            call = bind(of.compile(fn), *opforge_tensors(arrays))
        elif framework == "torch":
            call = bind(fn, *torch_tensors(arrays))
        elif framework == "torch.compile":
            call = bind(load_torch_compile().compile(fn), *torch_tensors(arrays))
        elif framework in ("jax", "jax.jit"):
            jax = load_jax()
            call = blocking(jax.jit(fn) if framework == "jax.jit" else fn, *jax_arrays(arrays))
        else:
            raise unknown(framework, "fusion")
        out.append(Variant(name, call, check=output_check(call)))
    return out
