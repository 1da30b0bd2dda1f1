"""3. MLP 784-512-512-10, ReLU, softmax cross-entropy, one SGD step (lr 0.01) on a fixed batch of 64 and of 512.
Every framework starts from the same float32 weights (weight (out, in), as ``linear``) and updates them in place
where it can (JAX returns new arrays). The floor is the step's own eight matmuls in NumPy — three forward, five
backward (no gradient for the input) — on operands of the same shapes and layouts. The floor multiplies as plain
NumPy does (``x @ W.T`` forward). opforge's ``linear`` computes a product of 8-64 float32 rows as W·xᵀ instead,
which OpenBLAS's AVX-512 kernel runs faster (ops/linalg.py, ``_few_rows_linear``): at batch 64 its two large forward
matmuls take about 150 µs less than the floor's, so "× floor" there is below the step's overhead over its own
matmuls."""

from __future__ import annotations

import itertools

import numpy as np

from .common import (
    Variant,
    jax_arrays,
    load_jax,
    load_torch,
    load_torch_compile,
    opforge_tensors,
    step_check,
    torch_compiled_sgd_step,
    torch_tensors,
    unknown,
)

TITLE = "3. MLP 784-512-512-10 SGD step (float32)"
UNIT = "ms"
FRAMEWORKS = ("floor", "numpy", "opforge", "opforge.compiled", "torch", "torch.compile", "jax", "jax.jit")
REFERENCES = ("floor", "numpy", "torch", "torch.compile", "jax.jit")

SIZES = (784, 512, 512, 10)
LR = 0.01
BATCHES = (64, 512)


def init(batch: int, seed: int = 0):
    """(params [W1, b1, W2, b2, W3, b3], x, y) as NumPy arrays: He-scaled weights, small biases, random labels."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in itertools.pairwise(SIZES):
        params.append((rng.standard_normal((fan_out, fan_in)) * np.sqrt(2 / fan_in)).astype(np.float32))
        params.append((0.01 * rng.standard_normal(fan_out)).astype(np.float32))
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], batch)
    return params, x, y


# -- NumPy by hand ---------------------------------------------------------------------------------------------------


def numpy_forward_backward(params, x, y):
    """Loss, gradients (in params order) and the intermediates the backward pass used."""
    W1, b1, W2, b2, W3, b3 = params
    n = len(x)
    rows = np.arange(n)
    h1 = np.maximum(x @ W1.T + b1, 0)
    h2 = np.maximum(h1 @ W2.T + b2, 0)
    z = h2 @ W3.T + b3
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    loss = np.log(s[:, 0]).mean() - z[rows, y].mean()
    d3 = e / s  # softmax − onehot, over n: the gradient of the mean cross-entropy at the logits
    d3[rows, y] -= 1
    d3 /= n
    d2 = np.where(h2 > 0, d3 @ W3, 0)
    d1 = np.where(h1 > 0, d2 @ W2, 0)
    grads = [d1.T @ x, d1.sum(axis=0), d2.T @ h1, d2.sum(axis=0), d3.T @ h2, d3.sum(axis=0)]
    return loss, grads, (h1, h2, d3, d2, d1)


def numpy_step(params, x, y):
    def step():
        loss, grads, _ = numpy_forward_backward(params, x, y)
        for p, g in zip(params, grads):
            p -= LR * g
        return loss

    return step


def floor(params, x, y, to=lambda a: a):
    """The step's eight matmuls alone, on operands computed once; ``to`` moves each operand to the framework that
    multiplies (bench/gpu.py: torch on the GPU)."""
    _, _, intermediates = numpy_forward_backward(params, x, y)
    W1, _, W2, _, W3, _ = map(to, params)
    x, (h1, h2, d3, d2, d1) = to(x), map(to, intermediates)

    def matmuls():
        return (x @ W1.T, h1 @ W2.T, h2 @ W3.T,  # forward
                d3.T @ h2, d3 @ W3, d2.T @ h1, d2 @ W2, d1.T @ x)  # backward: dW3, dh2, dW2, dh1, dW1

    return matmuls


# -- the frameworks --------------------------------------------------------------------------------------------------


def opforge_loss(params, x, y):
    from opforge import ops as F

    W1, b1, W2, b2, W3, b3 = params
    h = F.relu(F.linear(x, W1, b1))
    h = F.relu(F.linear(h, W2, b2))
    return F.cross_entropy(F.linear(h, W3, b3), y)


def opforge_step(params, x, y, compiled: bool):
    import opforge as of
    from opforge.program import assign

    def step(x, y):
        loss = opforge_loss(params, x, y)
        grads = of.grad(loss, params)
        with of.no_grad():
            for p, g in zip(params, grads):
                assign(p, p - LR * g)
        return loss

    fn = of.compile(step) if compiled else step
    return lambda: fn(x, y)


def torch_loss(params, x, y):
    torch = load_torch()
    TF = torch.nn.functional
    W1, b1, W2, b2, W3, b3 = params
    h = torch.relu(TF.linear(x, W1, b1))
    h = torch.relu(TF.linear(h, W2, b2))
    return TF.cross_entropy(TF.linear(h, W3, b3), y)


def torch_step(params, x, y):
    torch = load_torch()

    def step():
        loss = torch_loss(params, x, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= LR * g
        return loss

    return step


def torch_compiled_step(params, x, y):
    """One graph for the whole step (common.torch_compiled_sgd_step)."""
    return torch_compiled_sgd_step(torch_loss, params, x, y, LR)


def jax_loss(params, x, y):
    jax = load_jax()
    W1, b1, W2, b2, W3, b3 = params
    h = jax.nn.relu(x @ W1.T + b1)
    h = jax.nn.relu(h @ W2.T + b2)
    logp = jax.nn.log_softmax(h @ W3.T + b3)
    return -jax.numpy.take_along_axis(logp, y[:, None], axis=1).mean()


def jax_step(state, x, y, jit: bool):
    """``state["params"]`` is replaced by the updated list at each step (jit: the old buffers are donated)."""
    jax = load_jax()

    def sgd(params, x, y):
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        return [p - LR * g for p, g in zip(params, grads)], loss

    fn = jax.jit(sgd, donate_argnums=0) if jit else sgd

    def step():
        state["params"], loss = fn(state["params"], x, y)
        jax.block_until_ready(state["params"])
        return loss

    return step


def build(framework: str, batch: int):
    """(step, params) for one framework: ``step()`` does one SGD step and returns the loss before it;
    ``params()`` gives the current parameters (JAX's are new arrays after each step)."""
    arrays, x, y = init(batch)
    if framework == "numpy":
        return numpy_step(arrays, x, y), lambda: arrays
    if framework in ("opforge", "opforge.compiled"):
        import opforge as of

        params = opforge_tensors(arrays, requires_grad=True)
        return opforge_step(params, of.tensor(x), of.tensor(y), framework == "opforge.compiled"), lambda: params
    if framework == "torch":
        torch = load_torch()
        params = torch_tensors(arrays, requires_grad=True)
        return torch_step(params, torch.from_numpy(x), torch.from_numpy(y)), lambda: params
    if framework == "torch.compile":
        torch = load_torch_compile()
        params = torch_tensors(arrays)  # torch.func differentiates without requires_grad
        return torch_compiled_step(params, torch.from_numpy(x), torch.from_numpy(y)), lambda: params
    if framework in ("jax", "jax.jit"):
        state = {"params": jax_arrays(arrays)}
        jx, jy = jax_arrays([x, y.astype(np.int32)])
        return jax_step(state, jx, jy, framework == "jax.jit"), lambda: state["params"]
    raise unknown(framework, "mlp")


def variants(framework: str, quick: bool) -> list[Variant]:
    out = []
    for batch in BATCHES:
        name = f"step, batch {batch}"
        if framework == "floor":
            out.append(Variant(name, floor(*init(batch))))
            continue
        step, params = build(framework, batch)
        out.append(Variant(name, step, check=step_check(step, params)))
    return out
