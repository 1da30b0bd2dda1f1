"""Vector norms put to use: normalize, cosine_similarity, pairwise_distance (``torch.nn.functional``'s). Their rules
reuse ``norm``'s gradient rule for the norm inside them."""

import math

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, broadcast_shapes, normalize_axes, np, op
from .reduce import norm_grad_rule, vector_norm


def _check_p(*, p, **_):
    if math.isnan(p):
        raise ValueError("argument 'p' must not be NaN")


@op("normalize(Tensor<floating> x, float p=2.0, int axis/dim=1, float eps=1e-12) -> Tensor y")
def normalize(x, *, p, axis, eps):
    """``torch.nn.functional.normalize``: ``x`` divided by its p-norm along ``axis``, or by ``eps`` where the norm is
    smaller: y = x / max(‖x‖ₚ, eps)."""
    n = vector_norm(x, p, normalize_axes("normalize", (axis,), x.ndim), True)
    return x / np.maximum(n, eps)


normalize.check(_check_p)


@normalize.infer
def _(x, *, p, axis, eps):
    normalize_axes("normalize", (axis,), len(x.shape))
    return x


@normalize.grad
def _(x, dy, *, p, axis, eps):
    # y = x/d with d = max(n, eps): dx = dy/d − x·Σ(dy·x)/d²·∂d/∂x, and ∂d/∂x is the norm's gradient where n ≥ eps
    # (torch.clamp_min passes it there, the bound included), 0 elsewhere.
    n = F.norm(x, p=p, axis=[axis], keepdim=True)
    d = F.clip(n, min=eps)
    dn = F.where(n >= eps, -F.sum(dy * x, axis=[axis], keepdim=True) / (d * d), 0)
    return dy / d + norm_grad_rule(x, n, dn, p=p, axis=[axis], keepdim=True)


@normalize.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), axis=-1, p=3.0)
    yield Sample.of(rng.uniform(0.3, 2.0, (4, 3)) * rng.choice([-1, 1], (4, 3)), axis=0, p=1.0)
    yield Sample.of(np.array([[1e-3, -2e-3], [0.5, 1.5]]), axis=1, eps=0.1)  # row 0: the norm is below eps
    yield Sample.of(rng.standard_normal(5), axis=0)


def _pair_shape(op_name, x1, x2):
    return broadcast_shapes(x1.shape, x2.shape, op=op_name)


def _cosine_axes(shape, axis):
    return normalize_axes("cosine_similarity", (axis,), len(shape))


@op("cosine_similarity(Tensor<floating> x1, Tensor<floating> x2, int axis/dim=1, float eps=1e-8) -> Tensor y")
def cosine_similarity(x1, x2, *, axis, eps):
    """``torch.nn.functional.cosine_similarity``: ⟨x1, x2⟩/(‖x1‖·‖x2‖) along ``axis`` (x1 and x2 broadcast), each
    norm at least ``eps``, computed as PyTorch does: ⟨x1/max(‖x1‖, eps), x2/max(‖x2‖, eps)⟩, which stays in
    [−1, 1]. Where a norm is below eps, the gradient is the derivative (PyTorch's treats the clamped norm as if it
    were the norm)."""
    a, b = np.broadcast_arrays(x1, x2)
    axes = _cosine_axes(a.shape, axis)
    u = a / np.maximum(vector_norm(a, 2, axes, True), eps)
    v = b / np.maximum(vector_norm(b, 2, axes, True), eps)
    return np.sum(u * v, axis=axes)


@cosine_similarity.infer
def _(x1, x2, *, axis, eps):
    shape = _pair_shape("cosine_similarity", x1, x2)
    axes = _cosine_axes(shape, axis)
    return Spec(tuple(d for i, d in enumerate(shape) if i not in axes), D.promote(x1.dtype, x2.dtype))


@cosine_similarity.grad
def _(x1, x2, y, dy, *, axis, eps):
    # y = Σ u·v with u = x1/d1, v = x2/d2, dᵢ = max(‖xᵢ‖, eps): ∂y/∂x1 = v/d1 − (y/d1)·∂d1/∂x1, and ∂d1/∂x1 is the
    # 2-norm's gradient where ‖x1‖ ≥ eps; likewise for x2. Computed on the broadcast operands (the engine sums the
    # gradients back down).
    if tuple(x1.shape) != tuple(x2.shape):  # broadcast with ops, which works for sizes unknown until run time too
        x1, x2 = x1 + F.zeros_like(x2), x2 + F.zeros_like(x1)
    axes = _cosine_axes(x1.shape, axis)
    if axes:
        dy, y = F.unsqueeze(dy, axis=axes[0]), F.unsqueeze(y, axis=axes[0])
    grads = []
    for a, b in ((x1, x2), (x2, x1)):
        na, nb = F.norm(a, axis=list(axes), keepdim=True), F.norm(b, axis=list(axes), keepdim=True)
        da = F.clip(na, min=eps)
        dn = F.where(na >= eps, -dy * y / da, 0)
        v = b / F.clip(nb, min=eps)  # divided one norm at a time, as the kernel: no overflow
        grads.append(dy * v / da + norm_grad_rule(a, na, dn, p=2.0, axis=list(axes), keepdim=True))
    return tuple(grads)


@cosine_similarity.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4)), axis=-1)  # broadcast
    yield Sample.of(rng.standard_normal((4, 1)), rng.standard_normal((4, 3)), axis=0)
    yield Sample.of(np.array([[1e-3, 2e-3], [0.5, 1.5]]), rng.standard_normal((2, 2)), axis=1, eps=0.1)


def _distance_axes(shape):
    return normalize_axes("pairwise_distance", (-1,), len(shape))


@op("pairwise_distance(Tensor<floating> x1, Tensor<floating> x2, float p=2.0, float eps=1e-6, "
    "bool keepdim=False) -> Tensor y")
def pairwise_distance(x1, x2, *, p, eps, keepdim):
    """``torch.nn.functional.pairwise_distance``: the p-norm of x1 − x2 + eps over the last dim (x1 and x2
    broadcast); ``eps`` keeps the norm differentiable where x1 = x2."""
    diff = x1 - x2 + eps
    return vector_norm(diff, p, _distance_axes(diff.shape), keepdim)  # (a NumPy scalar on the host: dispatch's)


pairwise_distance.check(_check_p)


@pairwise_distance.infer
def _(x1, x2, *, p, eps, keepdim):
    shape = _pair_shape("pairwise_distance", x1, x2)
    axes = _distance_axes(shape)
    if math.isinf(p) and axes and shape[axes[0]] == 0:
        raise ShapeError(f"pairwise_distance(): the max (min) of |x1 − x2| over an empty last dim has no value "
                         f"(shape {shape})")
    if keepdim:
        return Spec(tuple(1 if i in axes else d for i, d in enumerate(shape)), D.promote(x1.dtype, x2.dtype))
    return Spec(tuple(d for i, d in enumerate(shape) if i not in axes), D.promote(x1.dtype, x2.dtype))


@pairwise_distance.grad
def _(x1, x2, y, dy, *, p, eps, keepdim):
    g = norm_grad_rule(x1 - x2 + eps, y, dy, p=p, axis=[-1], keepdim=keepdim)
    return g, -g


@pairwise_distance.samples
def _(rng):
    def apart(*shape):  # |x1 − x2| away from 0, where |·| has a kink
        return np.asarray(rng.uniform(0.3, 1.5, shape) * rng.choice([-1, 1], shape))

    x = rng.standard_normal((3, 4))
    yield Sample.of(x, x + apart(3, 4))
    yield Sample.of(x, x + apart(3, 4), p=1.0, keepdim=True)
    yield Sample.of(x, x + apart(4), p=3.0)  # broadcast
    yield Sample.of(x, x + apart(3, 4), p=math.inf)
    yield Sample.of(rng.standard_normal(5), rng.standard_normal(5), p=2.0, eps=0.0)


# -- ONNX export: the kernels' formulas, with norm's mapping for the norms ----------------------------------------


def _onnx_clamped_norm(g, x, axes, eps, p=2.0):
    return g.op("Max", g.call("norm", x, p=p, axis=list(axes), keepdim=True), g.scalar(eps, x))


@normalize.onnx
def _(g, x, *, p, axis, eps):
    return g.op("Div", x, _onnx_clamped_norm(g, x, normalize_axes("normalize", (axis,), x.ndim), eps, p))


@cosine_similarity.onnx
def _(g, x1, x2, *, axis, eps):
    dtype = g.outputs[0].dtype
    x1, x2 = g.cast(x1, dtype), g.cast(x2, dtype)
    if x1.shape != x2.shape:  # the norms are of the broadcast operands, as the kernel's (Expand broadcasts both ways)
        spec = Spec(_pair_shape("cosine_similarity", x1, x2), dtype)
        x1, x2 = (g.op("Expand", x1, g.op("Shape", x2), spec=spec), g.op("Expand", x2, g.op("Shape", x1), spec=spec))
    axes = _cosine_axes(x1.shape, axis)
    u = g.op("Div", x1, _onnx_clamped_norm(g, x1, axes, eps))
    v = g.op("Div", x2, _onnx_clamped_norm(g, x2, axes, eps))
    return g.reduce("ReduceSum", g.op("Mul", u, v), axes, False, spec=g.outputs[0])


@pairwise_distance.onnx
def _(g, x1, x2, *, p, eps, keepdim):
    dtype = g.outputs[0].dtype
    diff = g.op("Add", g.op("Sub", g.cast(x1, dtype), g.cast(x2, dtype)), g.scalar(eps, g.outputs[0]),
                spec=Spec(_pair_shape("pairwise_distance", x1, x2), dtype))
    return g.call("norm", diff, p=p, axis=list(_distance_axes(diff.shape)), keepdim=keepdim)
