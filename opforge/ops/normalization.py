"""Normalisation: layer_norm, rms_norm, group_norm, instance_norm and batch_norm, as torch.nn.functional's.

Each normalises x̂ = (x − μ)·r over some axes, with r = 1/√(σ² + ε) (σ² the biased variance; rms_norm does not
centre: x̂ = x·r, r = 1/√(mean(x²) + ε)), then scales and shifts it per element (layer_norm, rms_norm) or per
channel. Their backward passes share one dedicated op, ``normalize_grad``, which gives dx for an incoming
g = dy·weight together with x̂ in one kernel:
    dx = r·(g − mean(g) − x̂·mean(g·x̂))        (means over the normalised axes; no mean(g) without centring),
where the same formula written with ops took a dozen ops, each a pass over the data and a call. Its own rule (the
second derivative) is written with ops, normalize_grad among them, so every order is reached.
"""

import math

from opforge import ops as F

from ..core.errors import ArgumentError
from ..core.grad_mode import no_grad
from ..core.sbp import Decomposition
from ._common import (
    B,
    D,
    P,
    S,
    Sample,
    ShapeError,
    Spec,
    called_as,
    function,
    normalize_axes,
    np,
    op,
    overflow_ignored,
    row_buffers,
    row_width,
)
from .nn import _numel, _same_dims, _validate

# -- the shared backward ---------------------------------------------------------------------------------------------


def _recentred(xc, var, mean):
    """x − μ and σ², centred again where the rounding of μ matters. μ is a rounded mean: x − μ keeps a remainder
    c = mean(x − μ) of a few ulps of μ, nothing beside σ unless the group is (nearly) constant, where it is all there
    is: a constant row of 4e7 in float32 normalised to ±1 instead of 0 (torch: 0). Where c is not below σ's last
    digit, x − μ − c and its variance again; elsewhere the bits stay those of the two passes."""
    c = mean(xc)
    digit = np.finfo(np.float64 if xc.dtype == np.float64 else np.float32).eps
    again = c * c > var * (digit * digit)
    if not again.any():
        return xc, var
    xc = np.where(again, xc - c, xc)
    return xc, np.where(again, mean(xc * xc), var)


def _normalize_np(x, axes, eps, center=True):
    def mean(a):
        return np.mean(a, axis=axes, keepdims=True)

    with row_buffers(row_width(x, axes)):  # reductions along rows read the same either way: the same bits
        with overflow_ignored():  # a group whose statistics overflow is redone by _big_groups
            xc = x - mean(x) if center else x
            var = mean(xc * xc)
            if center:
                xc, var = _recentred(xc, var, mean)
            overflowed = not np.isfinite(np.add.reduce(var, axis=None))
        if overflowed:
            big = _big_groups(x, axes, eps, center, var)
            if big is not None:
                with np.errstate(all="ignore"):
                    return np.where(big[0], big[1], xc / np.sqrt(var + eps))
        return xc / np.sqrt(var + eps)


def _big_groups(x, axes, eps, center, var):
    """For the groups whose variance overflowed although their values are finite (the square of |x| ≳ 1e19 in
    float32, 1e154 in float64, was inf; x̂ came out 0): (where they are, x̂ there, r there), computed on x / s
    with s = max |x| of the group, where nothing overflows: x̂ = (x/s − μ/s)·r_s, r_s = 1/√(σ²/s² + ε/s²), and
    r = r_s / s. None where no group did (a NaN or an infinity in x leaves its group NaN, as elsewhere)."""
    with np.errstate(all="ignore"):
        s = np.max(np.abs(x), axis=axes, keepdims=True)
        big = ~np.isfinite(var) & np.isfinite(s)
        if not big.any():
            return None
        s = np.where(big, s, 1).astype(x.dtype, copy=False)  # s > 0 in those groups: something overflowed

        def mean(a):
            return np.mean(a, axis=axes, keepdims=True)

        xs = x / s
        xc = xs - mean(xs) if center else xs
        var = mean(xc * xc)
        if center:
            xc, var = _recentred(xc, var, mean)
        d = var + eps / s / s
        r = 1 / np.sqrt(d)
        # a constant group: x − μ is 0 and ε/s² underflows to 0, r_s infinite; x̂ is 0 all the same, and r = 1/√ε
        r_x = np.where(d > 0, r / s, 1 / np.sqrt(x.dtype.type(eps))).astype(x.dtype, copy=False)
        return big, np.where(xc == 0, 0, xc * r).astype(x.dtype, copy=False), r_x


def _check_eps(*, eps, **_):
    if eps is not None and not eps >= 0:
        raise ValueError(f"argument 'eps' must be >= 0, got {eps}")


def _trailing(ndim, normalized_shape):
    return list(range(ndim - len(normalized_shape), ndim))


@op("normalize_grad(Tensor<floating> x, Tensor<floating> g, *, int[] axes, float eps, bool center=True) -> "
    "(Tensor dx, Tensor xhat)")
def normalize_grad(x, g, *, axes, eps, center):
    """Backward of a normalisation over ``axes``: dx = r·(g − mean(g) − x̂·mean(g·x̂)) for the incoming ``g``
    (dy times the weight), and x̂ itself (the weight's gradient is Σ dy·x̂). ``center=False``: rms_norm's x̂ = x·r,
    and no mean(g) term."""
    _validate(normalize_grad, x, g, axes=axes, eps=eps, center=center)
    axes = normalize_axes("normalize_grad", axes, x.ndim)
    inv_n = 1.0 / max(int(np.prod([x.shape[a] for a in axes])), 1)

    def mean(a):  # np.add.reduce: np.mean's own overhead is most of the cost on small inputs
        return np.add.reduce(a, axis=axes, keepdims=True) * inv_n

    with row_buffers(row_width(x, axes)):
        with overflow_ignored():  # as in _normalize_np
            xc = x - mean(x) if center else x
            var = mean(np.square(xc))
            if center:
                xc, var = _recentred(xc, var, mean)
            big = None if np.isfinite(np.add.reduce(var, axis=None)) else _big_groups(x, axes, eps, center, var)
        if big is None:
            r = 1 / np.sqrt(var + eps)
            xhat = np.multiply(xc, r, out=xc if center else None)
        else:
            with np.errstate(all="ignore"):
                r = np.where(big[0], big[2], 1 / np.sqrt(var + eps))
                xhat = np.where(big[0], big[1], xc * r)
        dx = g * xhat
        np.multiply(xhat, mean(dx), out=dx)  # x̂·mean(g·x̂)
        np.subtract(g - mean(g) if center else g, dx, out=dx)
        dx *= r
    return dx.astype(x.dtype, copy=False), xhat.astype(x.dtype, copy=False)


@normalize_grad.infer
def _(x, g, *, axes, eps, center):
    normalize_axes("normalize_grad", axes, len(x.shape))
    if not _same_dims(x.shape, g.shape):
        raise ShapeError(f"normalize_grad(): g must have the shape of x {x.shape}, got {g.shape}")
    return Spec(x.shape, x.dtype), Spec(x.shape, x.dtype)


normalize_grad.check(_check_eps)


@normalize_grad.grad
def _(x, g, dx, xhat, ddx, dxhat, *, axes, eps, center):
    # P(v) = r·(v − mean(v) − x̂·mean(v·x̂)) is the (symmetric) Jacobian of x̂ in x applied to v, so dx = P(g) and the
    # gradient through x̂ is P(dxhat). dx is linear in g: its gradient in g is P(ddx). In x, with ∂r/∂x = −r²·x̂/n,
    #   ∂⟨ddx, dx⟩/∂x = −r·mean(g·x̂)·P(ddx) − r·mean(ddx·x̂)·dx − r²·x̂·(cov(ddx, g) − mean(ddx·x̂)·mean(g·x̂)),
    # cov(a, g) = mean(a·g) − mean(a)·mean(g) (no mean(a)·mean(g) without centring). P is linear and r, the means
    # are constant over each group, so the P terms combine into one normalize_grad.
    def mean(t):
        return F.mean(t, axis=axes, keepdim=True)

    xc = x - mean(x) if center else x
    r = 1.0 / F.sqrt(mean(xc * xc) + eps)
    ax, gx = mean(ddx * xhat), mean(g * xhat)
    cov = mean(ddx * g) - mean(ddx) * mean(g) if center else mean(ddx * g)
    through_p, _ = F.normalize_grad(x, dxhat - r * gx * ddx, axes=axes, eps=eps, center=center)
    d_x = through_p - r * (ax * dx + r * xhat * (cov - ax * gx))
    d_g, _ = F.normalize_grad(x, ddx, axes=axes, eps=eps, center=center)
    return d_x, d_g


@normalize_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), axes=[1], eps=1e-5)
    yield Sample.of(rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4)), axes=[0, 2], eps=0.1)
    yield Sample.of(rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), axes=[-1], eps=1e-3, center=False)


# -- layer_norm and rms_norm: over the last dims ---------------------------------------------------------------------


@op("layer_norm(Tensor<floating> x, int[] normalized_shape, Tensor<floating>? weight=None, "
    "Tensor<floating>? bias=None, float eps=1e-5) -> Tensor y")
def layer_norm(x, weight, bias, *, normalized_shape, eps):
    """Normalises over the last len(normalized_shape) dims to mean 0 and variance 1 (biased, plus eps), then
    y = x̂·weight + bias (each of shape normalized_shape, optional)."""
    _validate(layer_norm, x, weight, bias, normalized_shape=normalized_shape, eps=eps)
    y = _normalize_np(x, tuple(_trailing(x.ndim, normalized_shape)), eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False)


@layer_norm.onnx
def _(g, x, weight, bias, *, normalized_shape, eps):
    if x.dtype == D.float32 or (x.dtype == D.float64 and g.exact(eps)):
        scale = weight if weight is not None else g.const(np.ones(tuple(normalized_shape), x.dtype))
        return g.op("LayerNormalization", x, scale, bias, axis=-len(normalized_shape), epsilon=eps)
    # float64 with an eps that a float32 attribute would round: the kernel's steps, eps in float64
    return _onnx_affine(g, _onnx_normalize(g, x, _trailing(x.ndim, normalized_shape), eps), weight, bias)


def _onnx_normalize(g, x, axes, eps, center=True):
    xc = g.op("Sub", x, g.reduce("ReduceMean", x, axes, True)) if center else x
    var = g.reduce("ReduceMean", g.op("Mul", xc, xc), axes, True)
    return g.op("Div", xc, g.op("Sqrt", g.op("Add", var, g.scalar(eps, x))))


def _onnx_affine(g, y, weight, bias, per_channel=False):
    def shaped(t):
        return g.op("Reshape", t, g.ints([1, -1, *[1] * (y.ndim - 2)])) if per_channel else t

    y = y if weight is None else g.op("Mul", y, shaped(weight))
    return y if bias is None else g.op("Add", y, shaped(bias))


layer_norm.check(_check_eps)


def _last_dims_spec(op_name, x, normalized_shape, **affine):
    """The shape rule of layer_norm and rms_norm: ``normalized_shape`` ends ``x``'s, the weight (and bias) have it."""
    k = len(normalized_shape)
    if k == 0 or k > len(x.shape) or not _same_dims(tuple(x.shape[len(x.shape) - k:]), tuple(normalized_shape)):
        raise ShapeError(f"{op_name}(): normalized_shape {list(normalized_shape)} must be the last dims of the "
                         f"input, whose shape is {x.shape}")
    for name, t in affine.items():
        if t is not None and not _same_dims(t.shape, tuple(normalized_shape)):
            raise ShapeError(f"{op_name}(): {name} must have shape normalized_shape {tuple(normalized_shape)}, "
                             f"got {t.shape}")
    return Spec(x.shape, x.dtype)


@layer_norm.infer
def _(x, weight, bias, *, normalized_shape, eps):
    return _last_dims_spec("layer_norm", x, normalized_shape, weight=weight, bias=bias)


@layer_norm.grad
def _(x, weight, dy, *, normalized_shape, eps, needs_input_grad):
    axes = _trailing(x.ndim, normalized_shape)
    dx, xhat = F.normalize_grad(x, dy * weight if weight is not None else dy, axes=axes, eps=eps)
    # weight and bias broadcast over the leading dims: the engine sums their gradients down.
    return (dx if needs_input_grad[0] else None, dy * xhat if needs_input_grad[1] else None,
            dy if needs_input_grad[2] else None)


def _leading_sbp(x, *affine, normalized_shape, **_):
    # normalised over the last dims: split along any dim before them, each rank normalises whole groups
    for k in range(len(x.shape) - len(normalized_shape)):
        yield (S(k), *[B] * len(affine)), S(k)


layer_norm.sbp(lambda x, weight, bias, **attrs: _leading_sbp(x, weight, bias, **attrs))


@layer_norm.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), normalized_shape=[4])
    yield Sample.of(rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4)),
                    normalized_shape=[3, 4])
    yield Sample.of(rng.standard_normal((2, 5)), rng.standard_normal(5), None, normalized_shape=[5], eps=0.1)
    yield Sample.of(rng.standard_normal(6), None, rng.standard_normal(6), normalized_shape=[6])



def _rms_eps(eps, dtype):
    """torch's default: the machine epsilon of the dtype computed in (float32 for the half dtypes)."""
    return eps if eps is not None else D.EPS[D.float32 if dtype in D.HALF else dtype]


@op("rms_norm(Tensor<floating> x, int[] normalized_shape, Tensor<floating>? weight=None, float? eps=None) "
    "-> Tensor y")
def rms_norm(x, weight, *, normalized_shape, eps):
    """Root-mean-square normalisation over the last len(normalized_shape) dims: y = x/√(mean(x²) + eps)·weight
    (weight of shape normalized_shape, optional); eps defaults to the machine epsilon of x's dtype, as torch's."""
    _validate(rms_norm, x, weight, normalized_shape=normalized_shape, eps=eps)
    y = _normalize_np(x, tuple(_trailing(x.ndim, normalized_shape)), _rms_eps(eps, x.dtype), center=False)
    return (y if weight is None else y * weight).astype(x.dtype, copy=False)


@rms_norm.onnx
def _(g, x, weight, *, normalized_shape, eps):
    y = _onnx_normalize(g, x, _trailing(x.ndim, normalized_shape), _rms_eps(eps, x.dtype), center=False)
    return _onnx_affine(g, y, weight, None)


rms_norm.check(_check_eps)


@rms_norm.infer
def _(x, weight, *, normalized_shape, eps):
    return _last_dims_spec("rms_norm", x, normalized_shape, weight=weight)


@rms_norm.grad
def _(x, weight, dy, *, normalized_shape, eps, needs_input_grad):
    dx, xhat = F.normalize_grad(x, dy * weight if weight is not None else dy, axes=_trailing(x.ndim, normalized_shape),
                                eps=_rms_eps(eps, x.dtype), center=False)
    return dx if needs_input_grad[0] else None, dy * xhat if needs_input_grad[1] else None


rms_norm.sbp(lambda x, weight, **attrs: _leading_sbp(x, weight, **attrs))


@rms_norm.samples
def _(rng):
    yield Sample.of(rng.standard_normal((3, 4)), normalized_shape=[4])
    yield Sample.of(rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4)), normalized_shape=[3, 4], eps=1e-3)
    yield Sample.of(rng.standard_normal(6), rng.standard_normal(6), normalized_shape=[6], eps=0.1)


# -- per channel of an (N, C, ...) input: group_norm, instance_norm, batch_norm ---------------------------------------


def _channel(t, ndim):
    """A per-channel (C,) tensor shaped (1, C, 1, ...) to broadcast against an (N, C, ...) input."""
    return F.reshape(t, shape=[1, t.shape[0], *[1] * (ndim - 2)])


def _affine_np(y, weight, bias):
    shape = (1, y.shape[1], *[1] * (y.ndim - 2))
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _channel_spec(op_name, x, weight, bias, min_ndim=2):
    if len(x.shape) < min_ndim:
        raise ShapeError(f"{op_name}(): the input must be (N, C{', L' if min_ndim > 2 else ''}, ...), got shape "
                         f"{x.shape}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and not _same_dims(t.shape, (x.shape[1],)):
            raise ShapeError(f"{op_name}(): {name} must have shape ({x.shape[1]},) for an input of shape {x.shape}, "
                             f"got {t.shape}")
    return Spec(x.shape, x.dtype)


def _channel_grads(dy, xhat, dx, needs_input_grad):
    """(dx, dweight, dbias) of a per-channel affine normalisation, from normalize_grad's dx and x̂."""
    axes = [0, *range(2, dy.ndim)]
    return (dx if needs_input_grad[0] else None, F.sum(dy * xhat, axis=axes) if needs_input_grad[1] else None,
            F.sum(dy, axis=axes) if needs_input_grad[2] else None)


def _grouped(shape, num_groups) -> list:
    """(N, G, C/G·...): an (N, C, ...) shape in groups; the group's size is given rather than −1 when known, which
    an empty batch needs (reshaping no elements cannot infer it)."""
    rest = shape[1:]
    size = math.prod(rest) // num_groups if all(isinstance(d, int) for d in rest) else -1
    return [shape[0], num_groups, size]


@op("group_norm(Tensor<floating> x, int num_groups, Tensor<floating>? weight=None, "
    "Tensor<floating>? bias=None, float eps=1e-5) -> Tensor y")
def group_norm(x, weight, bias, *, num_groups, eps):
    """Splits the C channels of an (N, C, ...) input into ``num_groups`` groups and normalises each group of each
    sample over its channels and the other dims; then y = x̂·weight + bias per channel (each (C,), optional)."""
    _validate(group_norm, x, weight, bias, num_groups=num_groups, eps=eps)
    y = _normalize_np(x.reshape(_grouped(x.shape, num_groups)), (2,), eps).reshape(x.shape)
    return _affine_np(y, weight, bias).astype(x.dtype, copy=False)


@group_norm.onnx
def _(g, x, weight, bias, *, num_groups, eps):
    grouped = g.op("Reshape", x, g.ints([0, num_groups, -1]), spec=Spec((None, num_groups, None), x.dtype))
    y = g.op("Reshape", _onnx_normalize(g, grouped, [2], eps), g.op("Shape", x), spec=x.spec)
    return _onnx_affine(g, y, weight, bias, per_channel=True)


@group_norm.check
def _(*, num_groups, eps):
    _check_eps(eps=eps)
    if num_groups < 1:
        raise ValueError(f"argument 'num_groups' must be >= 1, got {num_groups}")


@group_norm.infer
def _(x, weight, bias, *, num_groups, eps):
    spec = _channel_spec("group_norm", x, weight, bias)
    if x.shape[1] is not None and x.shape[1] % num_groups:
        raise ShapeError(f"group_norm(): {x.shape[1]} channels (input shape {x.shape}) do not split into "
                         f"num_groups={num_groups} groups")
    return spec


@group_norm.grad
def _(x, weight, dy, *, num_groups, eps, needs_input_grad):
    # In groups: (N, G, C/G·...) normalised over its last dim.
    grouped = _grouped(x.shape, num_groups)
    g = dy * _channel(weight, x.ndim) if weight is not None else dy
    dx, xhat = F.normalize_grad(F.reshape(x, shape=grouped), F.reshape(g, shape=grouped), axes=[2], eps=eps)
    return _channel_grads(dy, F.reshape(xhat, shape=x.shape), F.reshape(dx, shape=x.shape), needs_input_grad)


@group_norm.sbp
def _(x, weight, bias, *, num_groups, eps, ranks):
    yield (S(0), B, B), S(0)  # each sample's groups are its own
    if num_groups % ranks == 0:  # whole groups of channels on each rank, with their weights and biases
        yield (S(1), S(0), S(0)), S(1), {"num_groups": num_groups // ranks}


@group_norm.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 4, 3)), num_groups=2)
    yield Sample.of(rng.standard_normal((2, 6, 2, 2)), rng.standard_normal(6), rng.standard_normal(6), num_groups=3)
    yield Sample.of(rng.standard_normal((3, 4)), rng.standard_normal(4), None, num_groups=4, eps=0.1)
    yield Sample.of(rng.standard_normal((1, 2, 5)), None, rng.standard_normal(2), num_groups=1)


@op("instance_norm_affine(Tensor<floating> x, Tensor<floating>? weight=None, Tensor<floating>? bias=None, *, "
    "float eps=1e-5) -> Tensor y")
def instance_norm_affine(x, weight, bias, *, eps):
    """Normalises each channel of each sample of an (N, C, L, ...) input over its other dims (L, ...); then
    y = x̂·weight + bias per channel (each (C,), optional). ``F.instance_norm`` is torch's functional form, with
    running statistics."""
    _validate(instance_norm_affine, x, weight, bias, eps=eps)
    y = _normalize_np(x, tuple(range(2, x.ndim)), eps)
    return _affine_np(y, weight, bias).astype(x.dtype, copy=False)


@instance_norm_affine.onnx
def _(g, x, weight, bias, *, eps):
    if weight is not None and bias is not None and (x.dtype == D.float32 or g.exact(eps)):
        return g.op("InstanceNormalization", x, weight, bias, epsilon=eps)
    return _onnx_affine(g, _onnx_normalize(g, x, list(range(2, x.ndim)), eps), weight, bias, per_channel=True)


instance_norm_affine.check(_check_eps)


@instance_norm_affine.infer
def _(x, weight, bias, *, eps):
    return _channel_spec("instance_norm_affine", x, weight, bias, min_ndim=3)


@instance_norm_affine.grad
def _(x, weight, dy, *, eps, needs_input_grad):
    g = dy * _channel(weight, x.ndim) if weight is not None else dy
    dx, xhat = F.normalize_grad(x, g, axes=list(range(2, x.ndim)), eps=eps)
    return _channel_grads(dy, xhat, dx, needs_input_grad)


instance_norm_affine.sbp(lambda x, weight, bias, **_: [((S(0), B, B), S(0)), ((S(1), S(0), S(0)), S(1))])


@instance_norm_affine.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 3, 4)))
    yield Sample.of(rng.standard_normal((2, 3, 2, 3)), rng.standard_normal(3), rng.standard_normal(3))
    yield Sample.of(rng.standard_normal((1, 2, 5)), rng.standard_normal(2), None, eps=0.1)


@op("batch_norm_with_stats(Tensor<floating> x, Tensor<floating>? running_mean, Tensor<floating>? running_var, "
    "Tensor<floating>? weight=None, Tensor<floating>? bias=None, *, bool training=False, float momentum=0.1, "
    "float eps=1e-5) -> (Tensor y, Tensor new_running_mean, Tensor new_running_var)")
def batch_norm_with_stats(x, running_mean, running_var, weight, bias, *, training, momentum, eps):
    """Batch normalisation of an (N, C, ...) input per channel C, then y = x̂·weight + bias (each (C,), optional).

    Functional: nothing is updated in place (``F.batch_norm``, torch's form, returns ``y`` and updates the running
    statistics given in place). With ``training`` the batch statistics normalise and the outputs
    ``new_running_mean``/``new_running_var`` are (1 − momentum)·running + momentum·batch statistic, the variance
    unbiased (as torch); without running statistics they are the batch mean and unbiased variance themselves (as
    if momentum were 1). Otherwise the running statistics normalise and come back unchanged.

    The statistics outputs are plain functions of x and the running statistics, and their gradients are the exact
    ones rather than None: a gradient that ignored them would be wrong wherever they are used, and numeric checks
    (which see every float output) would fail. A training loop that only stores them never backpropagates there.
    """
    _validate(batch_norm_with_stats, x, running_mean, running_var, weight, bias, training=training, momentum=momentum,
              eps=eps)
    axes = (0, *range(2, x.ndim))
    shape = (1, x.shape[1], *[1] * (x.ndim - 2))
    if training:
        mean = np.mean(x, axis=axes)
        var = np.mean(np.square(x - mean.reshape(shape)), axis=axes)
        n = x.size // x.shape[1]
        new_mean, new_var = mean, var * (n / (n - 1))
        if running_mean is not None:
            new_mean = running_mean * (1 - momentum) + new_mean * momentum
            new_var = running_var * (1 - momentum) + new_var * momentum
    else:
        mean, var, new_mean, new_var = running_mean, running_var, running_mean.copy(), running_var.copy()
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y.astype(x.dtype, copy=False), new_mean.astype(x.dtype, copy=False), new_var.astype(x.dtype, copy=False)


@batch_norm_with_stats.onnx
def _(g, x, running_mean, running_var, weight, bias, *, training, momentum, eps):
    if not training and (x.dtype == D.float32 or g.exact(eps)):
        channels = (x.shape[1],)
        scale = weight if weight is not None else g.const(np.ones(channels, x.dtype))
        shift = bias if bias is not None else g.const(np.zeros(channels, x.dtype))
        y = g.op("BatchNormalization", x, scale, shift, running_mean, running_var, epsilon=eps)
        return y, g.op("Identity", running_mean), g.op("Identity", running_var)
    # the kernel's steps: batch statistics when training (ONNX's training mode updates the running variance with
    # the biased one, and weighs momentum the other way), float64 eps otherwise
    axes = [0, *range(2, x.ndim)]
    per_channel = g.ints([1, -1, *[1] * (x.ndim - 2)])
    if training:
        mean = g.reduce("ReduceMean", x, axes, False)
        xc = g.op("Sub", x, g.op("Reshape", mean, per_channel))
        var = g.reduce("ReduceMean", g.op("Mul", xc, xc), axes, False)
        n = g.cast(g.reduce("ReduceProd", g.op("Gather", g.op("Shape", x), g.ints(axes), axis=0), None, False),
                   x.dtype)
        new_mean, new_var = mean, g.op("Mul", var, g.op("Div", n, g.op("Sub", n, g.scalar(1, x))))
        if running_mean is not None:
            keep, take = g.scalar(1 - momentum, x), g.scalar(momentum, x)
            new_mean = g.op("Add", g.op("Mul", running_mean, keep), g.op("Mul", new_mean, take))
            new_var = g.op("Add", g.op("Mul", running_var, keep), g.op("Mul", new_var, take))
    else:
        mean, var = running_mean, running_var
        new_mean, new_var = g.op("Identity", running_mean), g.op("Identity", running_var)
    y = g.op("Div", g.op("Sub", x, g.op("Reshape", mean, per_channel)),
             g.op("Sqrt", g.op("Add", g.op("Reshape", var, per_channel), g.scalar(eps, x))))
    if weight is not None:
        y = g.op("Mul", y, g.op("Reshape", weight, per_channel))
    if bias is not None:
        y = g.op("Add", y, g.op("Reshape", bias, per_channel))
    return y, new_mean, new_var


@batch_norm_with_stats.check
def _(*, eps, momentum, **_):
    _check_eps(eps=eps)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"argument 'momentum' must be in [0, 1], got {momentum}")


@batch_norm_with_stats.infer
def _(x, running_mean, running_var, weight, bias, *, training, momentum, eps):
    if len(x.shape) < 2:
        raise ShapeError(f"batch_norm_with_stats(): the input must be (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    if (running_mean is None) != (running_var is None):
        raise ShapeError("batch_norm_with_stats(): give both running_mean and running_var, or neither")
    if running_mean is None and not training:
        raise ShapeError("batch_norm_with_stats(): running_mean and running_var are needed when training=False")
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and not _same_dims(t.shape, (c,)):
            raise ShapeError(f"batch_norm_with_stats(): {name} must have shape ({c},) for an input of shape {x.shape}, "
                             f"got {t.shape}")
    if training and None not in x.shape and x.shape[1] and _numel(x.shape) // x.shape[1] <= 1:
        raise ShapeError(f"batch_norm_with_stats(): training needs more than one value per channel, got an input of "
                         f"shape {x.shape}")
    return Spec(x.shape, x.dtype), Spec((c,), x.dtype), Spec((c,), x.dtype)


@batch_norm_with_stats.grad
def _(x, running_mean_spec, weight, new_running_mean, new_running_var, dy, dnew_running_mean, dnew_running_var, *,
      training, momentum, eps, needs_input_grad):
    # The running statistics are read from the outputs (equal to them without training): the layer updates its
    # buffers in place after the call, and a training step needs none of their values.
    nd = x.ndim
    axes = [0, *range(2, nd)]
    g = dy * _channel(weight, nd) if weight is not None else dy
    if training:
        dx, xhat = F.normalize_grad(x, g, axes=axes, eps=eps)
        if needs_input_grad[0]:
            # y through the batch statistics, then the statistics outputs: new_mean = (1 − m)·rm + m·mean(x) and
            # new_var = (1 − m)·rv + m·Σ(x − μ)²/(n − 1), whose derivative in x is 2m·(x − μ)/(n − 1).
            m = momentum if running_mean_spec is not None else 1.0
            n = _numel(x.shape) // x.shape[1]
            xc = x - F.mean(x, axis=axes, keepdim=True)
            dx = (dx + _channel(dnew_running_mean, nd) * (m / n)
                  + _channel(dnew_running_var, nd) * xc * (2.0 * m / (n - 1)))
        else:
            dx = None
        drm = dnew_running_mean * (1.0 - momentum) if needs_input_grad[1] else None
        drv = dnew_running_var * (1.0 - momentum) if needs_input_grad[2] else None
    else:
        # y = (x − rm)·r·weight + bias with r = 1/√(rv + ε); the running statistics also pass through unchanged.
        r_c = 1.0 / F.sqrt(new_running_var + eps)
        r = _channel(r_c, nd)
        xhat = (x - _channel(new_running_mean, nd)) * r
        dx = g * r if needs_input_grad[0] else None
        drm = dnew_running_mean - F.sum(g, axis=axes) * r_c if needs_input_grad[1] else None
        # ∂x̂/∂rv = −½·x̂·r²
        drv = dnew_running_var - F.sum(g * xhat, axis=axes) * r_c * r_c * 0.5 if needs_input_grad[2] else None
    dw = F.sum(dy * xhat, axis=axes) if needs_input_grad[3] else None
    db = F.sum(dy, axis=axes) if needs_input_grad[4] else None
    return dx, drm, drv, dw, db


@batch_norm_with_stats.sbp
def _(x, running_mean, running_var, weight, bias, *, training, momentum, eps, batch_norm):
    per_channel = S(0) if running_mean is not None else None
    yield (S(1), per_channel, per_channel, S(0), S(0)), (S(1), S(0), S(0))  # channels: each its own statistics
    for k in (0, *range(2, len(x.shape))):  # the batch (or positions) split
        ins = (S(k), B, B, B, B)
        if not training:  # the running statistics normalise: channel by channel, element by element
            yield ins, (S(k), B, B)
        elif batch_norm == "local":  # asked for: each rank's statistics (the running ones: the ranks' mean)
            yield ins, (S(k), P("mean"), P("mean"))
        else:  # synchronised: the statistics of the whole batch, from all-reduced per-channel sums
            yield Decomposition(ins, _batch_norm_synchronised)


def _batch_norm_synchronised(x, running_mean, running_var, weight, bias, *, training, momentum, eps):
    """batch_norm_with_stats (training) written with ops, so that over a split batch each statistic is a sum over
    the rank's rows all-reduced (a channel-sized vector), not the rows gathered."""
    axes = [0, *range(2, len(x.shape))]
    n = _numel(x.shape) // x.shape[1]
    mean = F.sum(x, axis=axes) * (1.0 / n)  # (a partial sum times a number stays partial: one all-reduce)
    xc = x - _channel(mean, len(x.shape))
    var = F.sum(xc * xc, axis=axes) * (1.0 / n)
    y = xc / F.sqrt(_channel(var, len(x.shape)) + eps)
    y = _channel_affine(y, weight, bias)
    new_mean, new_var = mean, var * (n / (n - 1))
    if running_mean is not None:
        new_mean = running_mean * (1 - momentum) + new_mean * momentum
        new_var = running_var * (1 - momentum) + new_var * momentum
    return y, new_mean, new_var


def _channel_affine(y, weight, bias):
    if weight is not None:
        y = y * _channel(weight, len(y.shape))
    return y if bias is None else y + _channel(bias, len(y.shape))


@batch_norm_with_stats.samples
def _(rng):
    def stats(c):
        return rng.standard_normal(c) * 0.5, rng.uniform(0.5, 2.0, c)

    yield Sample.of(rng.standard_normal((4, 3)), *stats(3), training=True)
    yield Sample.of(rng.standard_normal((4, 3)), *stats(3), rng.standard_normal(3), rng.standard_normal(3),
                    training=True, momentum=0.3)
    yield Sample.of(rng.standard_normal((2, 3, 2, 2)), *stats(3), rng.standard_normal(3), rng.standard_normal(3),
                    training=True)
    yield Sample.of(rng.standard_normal((3, 2, 2)), None, None, rng.standard_normal(2), None, training=True)
    yield Sample.of(rng.standard_normal((2, 3, 2, 2)), *stats(3), rng.standard_normal(3), rng.standard_normal(3))
    yield Sample.of(rng.standard_normal((4, 3)), *stats(3), eps=0.1)


# -- torch's functional forms: y alone, the running statistics updated in place ---------------------------------------


def _update(statistic, value) -> None:
    """Write ``value`` into a running statistic (a buffer: no gradient), as torch's functional forms do."""
    with no_grad():
        statistic.copy_(value)


@function
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """``torch.nn.functional.batch_norm``: ``y`` (``batch_norm_with_stats``'s); with ``training``, the running
    statistics given are updated in place to (1 − momentum)·running + momentum·the batch's statistic."""
    y, mean, var = called_as("batch_norm", "batch_norm_with_stats", x, running_mean, running_var, weight, bias,
                             training=training, momentum=momentum, eps=eps)
    if training and running_mean is not None:
        _update(running_mean, mean)
        _update(running_var, var)
    return y


def instance_stats(x):
    """The batch's mean of the per-sample statistics of each channel of an (N, C, ...) input: the mean, and the
    unbiased variance (what instance norm's running statistics average, as in torch)."""
    spatial = list(range(2, len(x.shape)))
    return F.mean(x, axis=[0, *spatial]), F.mean(F.var(x, axis=spatial, correction=1), axis=[0])


@function
def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """``torch.nn.functional.instance_norm``: each channel of each sample normalised by its own statistics
    (``instance_norm_affine``), the running statistics given updated in place with ``instance_stats``; or, with
    ``use_input_stats=False``, normalised by the running statistics."""
    if not use_input_stats:
        return batch_norm(x, running_mean, running_var, weight, bias, eps=eps)
    if running_mean is not None or running_var is not None:
        with no_grad():
            mean, var = instance_stats(x)
        for statistic, value in ((running_mean, mean), (running_var, var)):
            if statistic is not None:
                _update(statistic, statistic * (1 - momentum) + value * momentum)
    return called_as("instance_norm", "instance_norm_affine", x, weight, bias, eps=eps)


@function
def local_response_norm(input, size, alpha=1e-4, beta=0.75, k=1.0):
    """``torch.nn.functional.local_response_norm``: x / (k + alpha·mean of x² over ``size`` neighbouring
    channels)^beta, for an (N, C, ...) input; the window is zero-padded, size//2 channels before and (size − 1)//2
    after, and the mean divides by ``size`` (torch's composition, step for step)."""
    if len(input.shape) < 3:
        raise ShapeError(f"local_response_norm(): the input must be (N, C, L, ...), 3-D or more, got shape "
                         f"{tuple(input.shape)}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ArgumentError(f"local_response_norm(): argument 'size' must be an int >= 1, got {size!r}")
    if 0 in input.shape:
        return input
    shape = list(input.shape)
    squares = F.reshape(input * input, shape=[shape[0], 1, shape[1], shape[2], -1])  # channels as a spatial dim
    squares = F.pad(squares, [0, 0, 0, 0, size // 2, (size - 1) // 2])
    div = F.reshape(F.avg_pool3d(squares, kernel_size=[size, 1, 1], stride=1), shape=shape)
    return input / F.pow(div * alpha + k, beta)
