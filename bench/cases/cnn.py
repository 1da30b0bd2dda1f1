"""4. A small CNN on 8×8 digits (1 channel, 10 classes), batch 128, one SGD step (lr 0.01):
conv 3×3 pad 1 (1→16) → ReLU → max-pool 2 → conv 3×3 pad 1 (16→32) → ReLU → max-pool 2 → linear (128→10) →
softmax cross-entropy. The first 128 of scikit-learn's digits (random images of that shape without it)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

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

TITLE = "4. Small CNN on 8×8 digits, batch 128, SGD step (float32)"
UNIT = "ms"
FRAMEWORKS = ("numpy", "opforge", "opforge.compiled", "torch", "torch.compile", "jax", "jax.jit")
REFERENCES = ("numpy", "torch", "torch.compile", "jax.jit")

BATCH = 128
LR = 0.01


def init(seed: int = 0):
    """(params [K1, c1, K2, c2, W, b], x, y) as NumPy float32 arrays (labels int64)."""
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32)

    params = [he((16, 1, 3, 3), 9), np.zeros(16, np.float32), he((32, 16, 3, 3), 144), np.zeros(32, np.float32),
              he((10, 128), 128), np.zeros(10, np.float32)]
    try:  # the digits ship inside scikit-learn (the demo extra): no download
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.images[:BATCH, None] / 16, digits.target[:BATCH].astype(np.int64)
    except ImportError:  # random images of the same shape and range: the time does not depend on the data
        x, y = rng.integers(0, 17, (BATCH, 1, 8, 8)) / 16, rng.integers(0, 10, BATCH)
    return params, x.astype(np.float32), y


# -- NumPy by hand: im2col convolution, window-argmax pooling --------------------------------------------------------


def conv_forward(x, k, c):
    """3×3, stride 1, pad 1 as one matmul over the im2col matrix; returns y and what the backward needs."""
    n, ch, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = sliding_window_view(xp, (3, 3), axis=(2, 3)).transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, ch * 9)
    y = (cols @ k.reshape(len(k), -1).T + c).reshape(n, h, w, -1).transpose(0, 3, 1, 2)
    return y, cols


def conv_backward(dy, k, cols, x_shape, need_dx: bool):
    n, o, h, w = dy.shape
    d2 = dy.transpose(0, 2, 3, 1).reshape(-1, o)
    dk = (d2.T @ cols).reshape(k.shape)
    if not need_dx:
        return None, dk, d2.sum(axis=0)
    dcols = (d2 @ k.reshape(o, -1)).reshape(n, h, w, x_shape[1], 3, 3)
    dxp = np.zeros((n, x_shape[1], h + 2, w + 2), dy.dtype)
    for i in range(3):  # col2im: each of the nine taps adds its share back
        for j in range(3):
            dxp[:, :, i:i + h, j:j + w] += dcols[..., i, j].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1], dk, d2.sum(axis=0)


def pool_forward(x):
    """2×2 max-pool, stride 2: the argmax of each window, kept for the backward."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    idx = win.argmax(axis=-1)[..., None]
    return np.take_along_axis(win, idx, axis=-1)[..., 0], idx


def pool_backward(dy, idx):
    n, c, h, w = dy.shape
    dwin = np.zeros((n, c, h, w, 4), dy.dtype)
    np.put_along_axis(dwin, idx, dy[..., None], axis=-1)
    return dwin.reshape(n, c, h, w, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, 2 * h, 2 * w)


def numpy_step(params, x, y):
    K1, c1, K2, c2, W, b = params
    rows = np.arange(len(x))

    def step():
        z1, cols1 = conv_forward(x, K1, c1)
        p1, i1 = pool_forward(np.maximum(z1, 0))
        z2, cols2 = conv_forward(p1, K2, c2)
        p2, i2 = pool_forward(np.maximum(z2, 0))
        f = p2.reshape(len(x), -1)
        z = f @ W.T + b
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        loss = np.log(s[:, 0]).mean() - z[rows, y].mean()
        dz = e / s
        dz[rows, y] -= 1
        dz /= len(x)
        dW, db = dz.T @ f, dz.sum(axis=0)
        dp2 = (dz @ W).reshape(p2.shape)
        dz2 = np.where(z2 > 0, pool_backward(dp2, i2), 0)
        dp1, dK2, dc2 = conv_backward(dz2, K2, cols2, p1.shape, need_dx=True)
        dz1 = np.where(z1 > 0, pool_backward(dp1, i1), 0)
        _, dK1, dc1 = conv_backward(dz1, K1, cols1, x.shape, need_dx=False)
        for p, g in zip(params, (dK1, dc1, dK2, dc2, dW, db)):
            p -= LR * g
        return loss

    return step


# -- the frameworks --------------------------------------------------------------------------------------------------


def opforge_step(params, x, y, compiled: bool):
    import opforge as of
    from opforge import ops as F
    from opforge.program import assign

    K1, c1, K2, c2, W, b = params

    def step(x, y):
        h = F.max_pool2d(F.relu(F.conv2d(x, K1, c1, padding=[1, 1])), kernel_size=[2, 2])
        h = F.max_pool2d(F.relu(F.conv2d(h, K2, c2, padding=[1, 1])), kernel_size=[2, 2])
        loss = F.cross_entropy(F.linear(h.reshape((BATCH, -1)), W, b), y)
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
    K1, c1, K2, c2, W, b = params
    h = TF.max_pool2d(torch.relu(TF.conv2d(x, K1, c1, padding=1)), 2)
    h = TF.max_pool2d(torch.relu(TF.conv2d(h, K2, c2, padding=1)), 2)
    return TF.cross_entropy(TF.linear(h.reshape(BATCH, -1), W, b), y)


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


def jax_step(state, x, y, jit: bool):
    jax = load_jax()
    lax, jnp = jax.lax, jax.numpy

    def conv(h, k, c):
        y = lax.conv_general_dilated(h, k, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + c[None, :, None, None]

    def pool(h):
        return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss_fn(params, x, y):
        K1, c1, K2, c2, W, b = params
        h = pool(jax.nn.relu(conv(x, K1, c1)))
        h = pool(jax.nn.relu(conv(h, K2, c2)))
        logp = jax.nn.log_softmax(h.reshape(BATCH, -1) @ W.T + b)
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    def sgd(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return [p - LR * g for p, g in zip(params, grads)], loss

    fn = jax.jit(sgd, donate_argnums=0) if jit else sgd

    def step():
        state["params"], loss = fn(state["params"], x, y)
        jax.block_until_ready(state["params"])
        return loss

    return step


def build(framework: str):
    arrays, x, y = init()
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
        params = torch_tensors(arrays)
        return torch_compiled_step(params, torch.from_numpy(x), torch.from_numpy(y)), lambda: params
    if framework in ("jax", "jax.jit"):
        state = {"params": jax_arrays(arrays)}
        jx, jy = jax_arrays([x, y.astype(np.int32)])
        return jax_step(state, jx, jy, framework == "jax.jit"), lambda: state["params"]
    raise unknown(framework, "cnn")


def variants(framework: str, quick: bool) -> list[Variant]:
    step, params = build(framework)
    return [Variant(f"step, batch {BATCH}", step, check=step_check(step, params))]
