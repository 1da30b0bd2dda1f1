"""5. Hessian-vector product H·v of the MLP loss (784-512-512-10, ReLU, softmax cross-entropy, batch 64) with respect to
all six parameters, for a fixed random direction v: double backward in opforge and PyTorch, forward-over-reverse
``jvp(grad)`` in JAX and under torch.compile (torch.func's; torch.compile does not compile double backward), and
Pearlmutter's R-operator written out by hand in NumPy."""

from __future__ import annotations

import numpy as np

from . import mlp
from .common import (
    Variant,
    jax_arrays,
    load_jax,
    load_torch,
    load_torch_compile,
    opforge_tensors,
    sq,
    to_numpy,
    torch_tensors,
    unknown,
)

TITLE = "5. Hessian-vector product of the MLP loss, batch 64 (float32)"
UNIT = "ms"
FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "torch.compile", "jax", "jax.jit")
REFERENCES = ("numpy", "torch", "torch.compile", "jax.jit")

BATCH = 64


def init():
    params, x, y = mlp.init(BATCH)
    rng = np.random.default_rng(1)
    v = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    return params, v, x, y


def numpy_hvp(params, v, x, y):
    """R{·} = d/dε ·(params + ε v) at ε = 0, pushed through the forward pass and then through the backward pass.
    ReLU's second derivative is 0, so R{relu(z)} = relu'(z) · R{z}; softmax gives R{p} = p ⊙ (R{z} − ⟨p, R{z}⟩)."""
    W1, b1, W2, b2, W3, b3 = params
    V1, c1, V2, c2, V3, c3 = v
    n = len(x)
    rows = np.arange(n)
    z1 = x @ W1.T + b1
    m1 = z1 > 0
    h1 = np.where(m1, z1, 0)
    z2 = h1 @ W2.T + b2
    m2 = z2 > 0
    h2 = np.where(m2, z2, 0)
    z3 = h2 @ W3.T + b3
    e = np.exp(z3 - z3.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    d3 = p.copy()
    d3[rows, y] -= 1
    d3 /= n
    d2 = np.where(m2, d3 @ W3, 0)
    # forward R-pass
    Rh1 = np.where(m1, x @ V1.T + c1, 0)
    Rh2 = np.where(m2, Rh1 @ W2.T + h1 @ V2.T + c2, 0)
    Rz3 = Rh2 @ W3.T + h2 @ V3.T + c3
    Rd3 = p * (Rz3 - (p * Rz3).sum(axis=1, keepdims=True)) / n
    # backward R-pass
    Rd2 = np.where(m2, Rd3 @ W3 + d3 @ V3, 0)
    Rd1 = np.where(m1, Rd2 @ W2 + d2 @ V2, 0)
    return [Rd1.T @ x, Rd1.sum(axis=0), Rd2.T @ h1 + d2.T @ Rh1, Rd2.sum(axis=0),
            Rd3.T @ h2 + d3.T @ Rh2, Rd3.sum(axis=0)]


def build(framework: str):
    arrays, v, x, y = init()
    if framework == "numpy":
        return lambda: numpy_hvp(arrays, v, x, y)
    if framework in ("opforge", "opforge.compiled"):
        import opforge as of

        params, vs = opforge_tensors(arrays, requires_grad=True), opforge_tensors(v)

        def hvp(x, y):
            grads = of.grad(mlp.opforge_loss(params, x, y), params, create_graph=True)
            return of.grad(sum((g * d).sum() for g, d in zip(grads, vs)), params)

        fn = of.compile(hvp) if framework == "opforge.compiled" else hvp
        ox, oy = of.tensor(x), of.tensor(y)
        return lambda: fn(ox, oy)
    if framework == "torch":
        torch = load_torch()
        params, vs = torch_tensors(arrays, requires_grad=True), torch_tensors(v)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def torch_hvp():
            grads = torch.autograd.grad(mlp.torch_loss(params, tx, ty), params, create_graph=True)
            return torch.autograd.grad(sum((g * d).sum() for g, d in zip(grads, vs)), params)

        return torch_hvp
    if framework == "torch.compile":
        torch = load_torch_compile()
        params, vs = torch_tensors(arrays), torch_tensors(v)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def jvp_grad(params, vs):
            return torch.func.jvp(torch.func.grad(lambda p: mlp.torch_loss(p, tx, ty)), (params,), (vs,))[1]

        fn = torch.compile(jvp_grad)
        return lambda: fn(params, vs)
    if framework in ("jax", "jax.jit"):
        jax = load_jax()
        params, vs = jax_arrays(arrays), jax_arrays(v)
        jx, jy = jax_arrays([x, y.astype(np.int32)])

        def jax_hvp(params, vs, x, y):
            return jax.jvp(lambda p: jax.grad(mlp.jax_loss)(p, x, y), (params,), (vs,))[1]

        fn = jax.jit(jax_hvp) if framework == "jax.jit" else jax_hvp
        return lambda: jax.block_until_ready(fn(params, vs, jx, jy))
    raise unknown(framework, "hvp")


def variants(framework: str, quick: bool) -> list[Variant]:
    fn = build(framework)
    _, v, _, _ = init()

    def check():
        hv = [to_numpy(h).astype(np.float64) for h in fn()]
        return {"(Hv)²": sq(hv), "vᵀHv": float(sum(np.vdot(d, h) for d, h in zip(v, hv)))}

    return [Variant(f"H·v, batch {BATCH}", fn, check=check)]
