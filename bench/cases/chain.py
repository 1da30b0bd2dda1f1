"""2. A chain of 200 tiny elementwise ops: tanh, then * 1.01, 100 times, on 16 float32 elements. "forward" runs it
without recording; "forward+backward" computes the gradient of sum(chain(x)) with respect to x. Times are per
chain op (a call's time / 200)."""

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

TITLE = "2. Chain of 200 tiny elementwise ops (16 float32), per op"
UNIT = "µs"
FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "torch.compile", "jax", "jax.jit")
REFERENCES = ("numpy", "torch", "torch.compile", "jax.jit")

PAIRS = 100  # tanh + mul = 2 ops each
OPS = 2 * PAIRS


def data() -> np.ndarray:
    return np.linspace(-1, 1, 16, dtype=np.float32)


def numpy_forward(x):
    h = x
    for _ in range(PAIRS):
        h = np.tanh(h) * 1.01
    return h


def numpy_gradient(x):
    """d sum(chain(x)) / dx by hand: keep each tanh output t, then g ← g · 1.01 · (1 − t²) backwards."""
    ts = []
    h = x
    for _ in range(PAIRS):
        t = np.tanh(h)
        ts.append(t)
        h = t * 1.01
    g = np.ones_like(h)
    for t in reversed(ts):
        g = g * 1.01 * (1 - t * t)
    return g


def chain_fn(tanh):
    def chain(x):
        h = x
        for _ in range(PAIRS):
            h = tanh(h) * 1.01
        return h

    return chain


def variants(framework: str, quick: bool) -> list[Variant]:
    x0 = data()
    if framework == "numpy":
        fwd = lambda: numpy_forward(x0)  # noqa: E731
        bwd = lambda: numpy_gradient(x0)  # noqa: E731
    elif framework.startswith("opforge"):
        import opforge as of
        from opforge import ops as F

        chain = chain_fn(F.tanh)
        (x,), (xg,) = opforge_tensors([x0]), opforge_tensors([x0], requires_grad=True)
        if framework == "opforge":
            fwd = lambda: chain(x)  # noqa: E731
            bwd = lambda: of.grad(F.sum(chain(xg)), [xg])[0]  # noqa: E731
        else:
            fwd_c = of.compile(chain)
            bwd_c = of.compile(lambda x: of.grad(F.sum(chain(x)), [x])[0])
            fwd = lambda: fwd_c(x)  # noqa: E731
            bwd = lambda: bwd_c(x)  # noqa: E731
    elif framework == "torch":
        torch = load_torch()
        chain = chain_fn(torch.tanh)
        (x,), (xg,) = torch_tensors([x0]), torch_tensors([x0], requires_grad=True)
        fwd = lambda: chain(x)  # noqa: E731
        bwd = lambda: torch.autograd.grad(chain(xg).sum(), [xg])[0]  # noqa: E731
    elif framework == "torch.compile":
        torch = load_torch_compile()
        chain = chain_fn(torch.tanh)
        (x,) = torch_tensors([x0])
        fwd_c = torch.compile(chain)
        bwd_c = torch.compile(torch.func.grad(lambda x: chain(x).sum()))  # one graph, forward and backward
        fwd = lambda: fwd_c(x)  # noqa: E731
        bwd = lambda: bwd_c(x)  # noqa: E731
    elif framework.startswith("jax"):
        jax = load_jax()
        chain = chain_fn(jax.numpy.tanh)
        grad = jax.grad(lambda x: chain(x).sum())
        if framework == "jax.jit":
            chain, grad = jax.jit(chain), jax.jit(grad)
        (x,) = jax_arrays([x0])
        fwd = lambda: chain(x).block_until_ready()  # noqa: E731
        bwd = lambda: grad(x).block_until_ready()  # noqa: E731
    else:
        raise unknown(framework, "chain")
    return [Variant("forward", fwd, per=OPS, check=lambda: {"y²": sq(fwd())}),
            Variant("forward+backward", bwd, per=OPS, check=lambda: {"dx²": sq(bwd())})]
