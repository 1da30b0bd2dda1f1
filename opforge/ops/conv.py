"""Convolution and pooling, computed with strided views and BLAS-backed contractions (no loops over pixels).

Layouts are PyTorch's: inputs (N, C, L) or (N, C, H, W), weights (out_channels, in_channels / groups, *kernel).
Along each spatial dim, with stride s, padding p, dilation d and kernel size k, output pixel o reads the padded
input at o·s + i·d for the taps i = 0 … k−1, so there are ⌊(n + 2p − d·(k − 1) − 1) / s⌋ + 1 outputs (floor, as
PyTorch). ``groups`` splits the channels into groups convolved separately.

How the kernels compute:

* ``conv2d`` (forward) and ``conv2d_grad_weight``: an im2col view of the padded input (``as_strided``, no copy)
  is reshaped to (n, groups, C/groups·kH·kW, OH·OW) — the one copy, made for a chunk of the batch at a time — and
  contracted with the weight by ``matmul`` (one GEMM per sample and group).
* ``conv2d_grad_input`` (the transposed convolution): a loop over the kH·kW kernel taps, each one GEMM that sends
  wᵀ·dy back to the strided slice of pixels that tap read. Measured faster than building the (N, C·kH·kW, OH·OW)
  column gradient first, and far faster for more than a few channels.
* pooling: a loop over the window's taps, each a vectorized operation on a strided slice.

Gradient rules are written with ops and close over a small set, so every order of derivative exists:
conv2d → conv2d_grad_input, conv2d_grad_weight (and a sum for the bias); each of these is linear in each input,
and its derivatives are convolutions again (conv2d, conv2d_grad_input, conv2d_grad_weight). conv1d is a conv2d
over images of height 1 (reshapes around the same grad ops). max_pool2d → max_pool2d_grad (scatter dy to each
window's argmax) → max_pool2d_grad_grad (gather at the argmax), the two being each other's transposes;
avg_pool2d and avg_pool2d_grad are each other's transposes too.
"""

from numpy.lib.stride_tricks import as_strided

from opforge import ops as F

from ._common import D, Sample, ShapeError, Spec, np, op

# -- attributes and shapes (shared by infer rules and kernels, so kernels fail early with the same message) ----------


def _expand(values, n: int = 2) -> tuple:
    """An ``int[]`` attr as n ints: a lone value (the framework makes a 1-list of a bare int) repeats n times."""
    return tuple(values) * n if len(values) == 1 else tuple(values)


def _check_attrs(n: int, attrs: dict) -> None:
    """Sizes, strides, paddings and dilations hold 1 or n ints, within range; groups ≥ 1."""
    lows = {"input_size": 1, "kernel_size": 1, "stride": 1, "padding": 0, "dilation": 1}
    for name, low in lows.items():
        values = attrs.get(name)
        if values is None:
            continue
        if len(values) not in (1, n):
            raise ValueError(f"argument '{name}' must hold {'1 int' if n == 1 else f'1 or {n} ints'}, "
                             f"got {list(values)}")
        if any(isinstance(v, int) and v < low for v in values):  # not a run-time Dim (a program's unknown size)
            raise ValueError(f"argument '{name}' must be >= {low}, got {list(values)}")
    if attrs.get("groups", 1) < 1:
        raise ValueError(f"argument 'groups' must be >= 1, got {attrs['groups']}")


def _check_1d(**attrs):
    _check_attrs(1, attrs)


def _check_2d(**attrs):
    _check_attrs(2, attrs)


def _out_size(op_name, size, kernel, stride, padding, dilation) -> tuple:
    """Output sizes along the spatial dims: ⌊(n + 2p − d·(k − 1) − 1) / s⌋ + 1 (None stays None)."""
    out = []
    for n, k, s, p, d in zip(size, kernel, stride, padding, dilation):
        m = None if n is None or k is None else (n + 2 * p - d * (k - 1) - 1) // s + 1
        if m is not None and m < 1:
            raise ShapeError(f"{op_name}(): the input's spatial size {tuple(size)} padded by {tuple(padding)} is "
                             f"smaller than the kernel {tuple(kernel)} dilated by {tuple(dilation)}: "
                             "the output would be empty")
        out.append(m)
    return tuple(out)


def _conv_shape(op_name, nd, x, w, bias, stride, padding, dilation, groups) -> tuple:
    """Check input shape ``x`` against weight shape ``w`` (and bias shape); return the output shape."""
    dims = "(N, C, L)" if nd == 1 else "(N, C, H, W)"
    if len(x) != nd + 2:
        raise ShapeError(f"{op_name}(): input must have rank {nd + 2} {dims}, got shape {tuple(x)}")
    if len(w) != nd + 2:
        raise ShapeError(f"{op_name}(): weight must have rank {nd + 2} (out_channels, in_channels / groups, "
                         f"{'kL' if nd == 1 else 'kH, kW'}), got shape {tuple(w)}")
    in_c, out_c = x[1], w[0]
    if 0 in w[2:]:
        raise ShapeError(f"{op_name}(): the weight of shape {tuple(w)} has an empty kernel")
    if in_c is not None and in_c % groups:
        raise ShapeError(f"{op_name}(): the input's {in_c} channels do not split into groups={groups}")
    if out_c is not None and out_c % groups:
        raise ShapeError(f"{op_name}(): the weight's {out_c} output channels do not split into groups={groups}")
    if in_c is not None and w[1] is not None and in_c != w[1] * groups:
        raise ShapeError(f"{op_name}(): the input has {in_c} channels, the weight of shape {tuple(w)} with "
                         f"groups={groups} expects {w[1] * groups}")
    if bias is not None and (len(bias) != 1 or (None not in (bias[0], out_c) and bias[0] != out_c)):
        raise ShapeError(f"{op_name}(): bias must have shape ({out_c},), one value per output channel, "
                         f"got {tuple(bias)}")
    return (x[0], out_c, *_out_size(op_name, x[2:], w[2:], stride, padding, dilation))


def _check_dy(op_name, dy, expected) -> None:
    """The incoming gradient must have the shape of the forward op's output."""
    if len(dy) != len(expected) or any(a is not None and b is not None and a != b for a, b in zip(dy, expected)):
        raise ShapeError(f"{op_name}(): dy has shape {tuple(dy)}, the forward op's output has {tuple(expected)}")


def _geometry(nd, stride, padding, dilation):
    return _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)


# -- NumPy building blocks on (N, C, H, W) arrays --------------------------------------------------------------------


def _pad(x, padding, value=0.0):
    """``x`` with ``padding`` rows and columns of ``value`` on both sides (``x`` itself when there are none)."""
    ph, pw = padding
    if not (ph or pw):
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), value, x.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = x
    return out


def _crop(xp, padding, size):
    """The inverse of ``_pad``: the (contiguous) interior of a padded array."""
    (ph, pw), (h, w) = padding, size
    return np.ascontiguousarray(xp[:, :, ph:ph + h, pw:pw + w])


def _taps(kernel, stride, dilation, out):
    """For each kernel tap (i, j): the index of the strided slice of the padded input it reads at every output
    pixel, i.e. rows i·d + o·s for o < OH (and the same for columns)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out
    for i in range(kh):
        for j in range(kw):
            yield (..., slice(i * dh, i * dh + (oh - 1) * sh + 1, sh), slice(j * dw, j * dw + (ow - 1) * sw + 1, sw))


def _im2col(xp, kernel, stride, dilation, out):
    """A read-only view (N, C, kH, kW, OH, OW) of the padded input:
    [n, c, i, j, p, q] = xp[n, c, p·sH + i·dH, q·sW + j·dW]."""
    sn, sc, sh, sw = xp.strides
    shape = (*xp.shape[:2], *kernel, *out)
    strides = (sn, sc, sh * dilation[0], sw * dilation[1], sh * stride[0], sw * stride[1])
    return as_strided(xp, shape, strides, writeable=False)


# im2col is built for a chunk of the batch at a time, its columns about this many bytes: the copy stays in cache
# while the GEMM reads it, and the temporary is small enough to be reused by malloc instead of being mapped afresh
# (and page-faulted in) on every call. Measured on 32×3×32×32 → 16 (3×3): forward + backward kernels 8.1 ms in one
# piece, 3.0 ms in chunks; no change where the whole batch already fits.
_CHUNK_BYTES = 1 << 19


def _columns(xp, kernel, stride, dilation, groups, out):
    """im2col of (a batch chunk of) the padded input, copied to (n, groups, C/groups·kH·kW, OH·OW), one column per
    output pixel holding the patch it sees."""
    return _im2col(xp, kernel, stride, dilation, out).reshape(xp.shape[0], groups, -1, out[0] * out[1])


def _batch_chunks(x, kernel, out) -> list:
    """Slices of the batch whose im2col columns take about _CHUNK_BYTES each."""
    per_sample = x.shape[1] * kernel[0] * kernel[1] * out[0] * out[1] * x.itemsize
    step = max(1, _CHUNK_BYTES // max(per_sample, 1))
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]


def _conv2d_forward(x, w, bias, stride, padding, dilation, groups):
    out = _out_size("conv2d", x.shape[2:], w.shape[2:], stride, padding, dilation)
    dtype = np.result_type(x.dtype, w.dtype, *([] if bias is None else [bias.dtype]))
    x, w = x.astype(dtype, copy=False), w.astype(dtype, copy=False)
    n, out_c = x.shape[0], w.shape[0]
    # y[n, g, o, p] = Σ_k w[g, o, k] · cols[n, g, k, p], k running over (channel, i, j) of group g:
    # a GEMM per sample and group, written straight into y
    w2 = w.reshape(groups, out_c // groups, -1)
    xp = _pad(x, padding)
    y = np.empty((n, groups, out_c // groups, out[0] * out[1]), dtype)
    for b in _batch_chunks(x, w.shape[2:], out):
        np.matmul(w2, _columns(xp[b], w.shape[2:], stride, dilation, groups, out), out=y[b])
    y = y.reshape(n, out_c, *out)
    if bias is not None:
        y += bias.astype(dtype, copy=False).reshape(-1, 1, 1)
    return y


def _conv2d_grad_input(dy, w, size, stride, padding, dilation, groups):
    dtype = np.result_type(dy.dtype, w.dtype)
    n, out_c, oh, ow = dy.shape
    cg = w.shape[1]
    # The transpose of the forward map: tap (i, j) read xp[.., p·s + i·d, q·s + j·d] with weight w[:, :, i, j],
    # so it sends w[:, :, i, j]ᵀ · dy back there. wt[i, j] is that (groups, C/groups, O/groups) matrix.
    wt = w.astype(dtype, copy=False).reshape(groups, out_c // groups, cg, *w.shape[2:]).transpose(3, 4, 0, 2, 1)
    d = dy.astype(dtype, copy=False).reshape(n, groups, out_c // groups, oh * ow)
    dxp = np.zeros((n, groups * cg, size[0] + 2 * padding[0], size[1] + 2 * padding[1]), dtype)
    for (i, j), index in zip(np.ndindex(*w.shape[2:]), _taps(w.shape[2:], stride, dilation, (oh, ow))):
        dxp[index] += np.matmul(wt[i, j], d).reshape(n, groups * cg, oh, ow)
    return _crop(dxp, padding, size)


def _conv2d_grad_weight(x, dy, kernel, stride, padding, dilation, groups):
    dtype = np.result_type(x.dtype, dy.dtype)
    n, out_c, oh, ow = dy.shape
    xp = _pad(x.astype(dtype, copy=False), padding)
    d = dy.astype(dtype, copy=False).reshape(n, groups, out_c // groups, oh * ow)
    # dw[g, o, k] = Σ_n Σ_p dy[n, g, o, p] · cols[n, g, k, p]: a GEMM per sample and group, summed over samples
    dw = np.zeros((groups, out_c // groups, x.shape[1] // groups * kernel[0] * kernel[1]), dtype)
    for b in _batch_chunks(x, kernel, (oh, ow)):
        cols = _columns(xp[b], kernel, stride, dilation, groups, (oh, ow))
        dw += np.matmul(d[b], cols.transpose(0, 1, 3, 2)).sum(axis=0)
    return dw.reshape(out_c, -1, *kernel)


# -- conv2d and its gradient ops -------------------------------------------------------------------------------------


@op("conv2d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, *, int[] stride=[1, 1], "
    "int[] padding=[0, 0], int[] dilation=[1, 1], int groups=1) -> Tensor y")
def conv2d(x, weight, bias, *, stride, padding, dilation, groups):
    """2-D convolution (cross-correlation, as PyTorch): x (N, C, H, W), weight (O, C/groups, kH, kW), bias (O,)
    give y (N, O, OH, OW) with y[n, o, p, q] = bias[o] + Σ_{c, i, j} weight[o, c, i, j] · x_pad[n, g·C/groups + c,
    p·sH + i·dH, q·sW + j·dW], g being the group of output channel o."""
    stride, padding, dilation = _geometry(2, stride, padding, dilation)
    _conv_shape("conv2d", 2, x.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation,
                groups)
    return _conv2d_forward(x, weight, bias, stride, padding, dilation, groups)


@conv2d.onnx
def _(g, x, weight, bias, *, stride, padding, dilation, groups):
    stride, padding, dilation = _geometry(2, stride, padding, dilation)
    return g.op("Conv", x, weight, bias, strides=stride, pads=[*padding, *padding], dilations=dilation, group=groups)


conv2d.check(_check_2d)


@conv2d.infer
def _(x, weight, bias, *, stride, padding, dilation, groups):
    shape = _conv_shape("conv2d", 2, x.shape, weight.shape, None if bias is None else bias.shape,
                        *_geometry(2, stride, padding, dilation), groups)
    return Spec(shape, D.promote(x.dtype, weight.dtype, *([] if bias is None else [bias.dtype])))


@conv2d.grad
def _(x, weight, dy, needs_input_grad, *, stride, padding, dilation, groups):
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    dx = F.conv2d_grad_input(dy, weight, input_size=x.shape[2:], **geometry) if needs_input_grad[0] else None
    dw = F.conv2d_grad_weight(x, dy, kernel_size=weight.shape[2:], **geometry) if needs_input_grad[1] else None
    db = F.sum(dy, axis=[0, 2, 3]) if needs_input_grad[2] else None
    return dx, dw, db


def _randn(rng, *shape):
    return rng.standard_normal(shape)


@conv2d.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 5, 6), _randn(rng, 4, 3, 3, 3))  # no bias (first: "missing argument" check)
    yield Sample.of(_randn(rng, 2, 2, 7, 7), _randn(rng, 3, 2, 3, 2), _randn(rng, 3), stride=[2, 2], padding=[1, 1])
    yield Sample.of(_randn(rng, 2, 4, 6, 6), _randn(rng, 4, 2, 3, 3), _randn(rng, 4), padding=[1, 2], dilation=2,
                    groups=2)
    yield Sample.of(_randn(rng, 2, 4, 7, 5), _randn(rng, 6, 2, 2, 2), None, stride=[2, 1], dilation=[1, 2], groups=2)
    yield Sample.of(_randn(rng, 2, 2, 6, 5), _randn(rng, 2, 2, 3, 3), _randn(rng, 2), stride=2, padding=1)


def _grad_input_spec(op_name, nd, dy, weight, input_size, stride, padding, dilation, groups):
    """The input Spec a conv's grad_input op returns, after checking dy against the forward geometry."""
    if len(dy.shape) != nd + 2 or len(weight.shape) != nd + 2:
        raise ShapeError(f"{op_name}(): dy and weight must have rank {nd + 2}, got shapes {dy.shape} and "
                         f"{weight.shape}")
    x = (dy.shape[0], None if weight.shape[1] is None else weight.shape[1] * groups, *_expand(input_size, nd))
    geometry = _geometry(nd, stride, padding, dilation)
    _check_dy(op_name, dy.shape, _conv_shape(op_name, nd, x, weight.shape, None, *geometry, groups))
    return Spec(x, D.promote(dy.dtype, weight.dtype))


@op("conv2d_grad_input(Tensor<floating> dy, Tensor<floating> weight, *, int[] input_size, int[] stride=[1, 1], "
    "int[] padding=[0, 0], int[] dilation=[1, 1], int groups=1) -> Tensor dx")
def conv2d_grad_input(dy, weight, *, input_size, stride, padding, dilation, groups):
    """Gradient of conv2d with respect to its input of spatial size ``input_size`` (H, W): the transposed
    convolution of dy with the weight. Input rows and columns no output read (the floor) get 0."""
    _grad_input_spec("conv2d_grad_input", 2, Spec(dy.shape, dy.dtype), Spec(weight.shape, weight.dtype),
                     input_size, stride, padding, dilation, groups)
    return _conv2d_grad_input(dy, weight, _expand(input_size), *_geometry(2, stride, padding, dilation), groups)


conv2d_grad_input.check(_check_2d)


@conv2d_grad_input.infer
def _(dy, weight, *, input_size, stride, padding, dilation, groups):
    return _grad_input_spec("conv2d_grad_input", 2, dy, weight, input_size, stride, padding, dilation, groups)


@conv2d_grad_input.grad
def _(dy, weight, ddx, needs_input_grad, *, input_size, stride, padding, dilation, groups):
    # dx = Aᵀ(w)·dy is linear in dy and in w: <ddx, Aᵀ(w)·dy> = <A(w)·ddx, dy> = <conv2d(ddx, w), dy>, so its
    # derivative in dy is conv2d(ddx, w) and in w that of a conv2d of input ddx against the output gradient dy.
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    ddy = F.conv2d(ddx, weight, **geometry) if needs_input_grad[0] else None
    dw = F.conv2d_grad_weight(ddx, dy, kernel_size=weight.shape[2:], **geometry) if needs_input_grad[1] else None
    return ddy, dw


@conv2d_grad_input.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 4, 3, 4), _randn(rng, 4, 3, 3, 3), input_size=[5, 6])
    yield Sample.of(_randn(rng, 2, 3, 4, 4), _randn(rng, 3, 2, 3, 2), input_size=[7, 7], stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 6, 3, 3), _randn(rng, 6, 2, 2, 2), input_size=[7, 5], stride=[2, 1],
                    dilation=[1, 2], groups=2)


def _grad_weight_spec(op_name, nd, x, dy, kernel_size, stride, padding, dilation, groups):
    """The weight Spec a conv's grad_weight op returns, after checking dy against the forward geometry."""
    if len(x.shape) != nd + 2 or len(dy.shape) != nd + 2:
        raise ShapeError(f"{op_name}(): x and dy must have rank {nd + 2}, got shapes {x.shape} and {dy.shape}")
    in_c = x.shape[1]
    w = (dy.shape[1], None if in_c is None else in_c // groups, *_expand(kernel_size, nd))
    _check_dy(op_name, dy.shape, _conv_shape(op_name, nd, x.shape, w, None, *_geometry(nd, stride, padding, dilation),
                                             groups))
    return Spec(w, D.promote(x.dtype, dy.dtype))


@op("conv2d_grad_weight(Tensor<floating> x, Tensor<floating> dy, *, int[] kernel_size, int[] stride=[1, 1], "
    "int[] padding=[0, 0], int[] dilation=[1, 1], int groups=1) -> Tensor dweight")
def conv2d_grad_weight(x, dy, *, kernel_size, stride, padding, dilation, groups):
    """Gradient of conv2d with respect to its weight of spatial size ``kernel_size`` (kH, kW):
    dweight[o, c, i, j] = Σ_{n, p, q} dy[n, o, p, q] · x_pad[n, g·C/groups + c, p·sH + i·dH, q·sW + j·dW]."""
    _grad_weight_spec("conv2d_grad_weight", 2, Spec(x.shape, x.dtype), Spec(dy.shape, dy.dtype), kernel_size,
                      stride, padding, dilation, groups)
    return _conv2d_grad_weight(x, dy, _expand(kernel_size), *_geometry(2, stride, padding, dilation), groups)


conv2d_grad_weight.check(_check_2d)


@conv2d_grad_weight.infer
def _(x, dy, *, kernel_size, stride, padding, dilation, groups):
    return _grad_weight_spec("conv2d_grad_weight", 2, x, dy, kernel_size, stride, padding, dilation, groups)


@conv2d_grad_weight.grad
def _(x, dy, ddweight, needs_input_grad, *, kernel_size, stride, padding, dilation, groups):
    # dweight is bilinear in (x, dy): <ddweight, dweight(x, dy)> = <conv2d(x, ddweight), dy>, so its derivative
    # in dy is conv2d(x, ddweight) and in x the transposed convolution of dy with ddweight.
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    dx = F.conv2d_grad_input(dy, ddweight, input_size=x.shape[2:], **geometry) if needs_input_grad[0] else None
    ddy = F.conv2d(x, ddweight, **geometry) if needs_input_grad[1] else None
    return dx, ddy


@conv2d_grad_weight.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 5, 6), _randn(rng, 2, 4, 3, 4), kernel_size=[3, 3])
    yield Sample.of(_randn(rng, 2, 2, 7, 7), _randn(rng, 2, 3, 4, 4), kernel_size=[3, 2], stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 4, 6, 6), _randn(rng, 2, 4, 4, 6), kernel_size=[3, 3], padding=[1, 2],
                    dilation=2, groups=2)


# -- conv1d: a conv2d over images of height 1 ------------------------------------------------------------------------


def _as_2d(shape) -> list:
    """(N, C, L) -> (N, C, 1, L), with -1 for an unknown batch."""
    return [-1 if shape[0] is None else shape[0], shape[1], 1, shape[2]]


def _geometry_2d(stride, padding, dilation, groups) -> dict:
    return {"stride": [1, *stride], "padding": [0, *padding], "dilation": [1, *dilation], "groups": groups}


@op("conv1d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, *, int[] stride=[1], "
    "int[] padding=[0], int[] dilation=[1], int groups=1) -> Tensor y")
def conv1d(x, weight, bias, *, stride, padding, dilation, groups):
    """1-D convolution (cross-correlation, as PyTorch): x (N, C, L), weight (O, C/groups, kL), bias (O,) give
    y (N, O, OL) with y[n, o, p] = bias[o] + Σ_{c, i} weight[o, c, i] · x_pad[n, g·C/groups + c, p·s + i·d]."""
    _conv_shape("conv1d", 1, x.shape, weight.shape, None if bias is None else bias.shape, stride, padding, dilation,
                groups)
    y = _conv2d_forward(x[:, :, None], weight[:, :, None], bias, (1, *stride), (0, *padding), (1, *dilation), groups)
    return y[:, :, 0]


conv1d.onnx(lambda g, x, weight, bias, *, stride, padding, dilation, groups: g.op(
    "Conv", x, weight, bias, strides=stride, pads=[*padding, *padding], dilations=dilation, group=groups))


conv1d.check(_check_1d)


@conv1d.infer
def _(x, weight, bias, *, stride, padding, dilation, groups):
    shape = _conv_shape("conv1d", 1, x.shape, weight.shape, None if bias is None else bias.shape, stride, padding,
                        dilation, groups)
    return Spec(shape, D.promote(x.dtype, weight.dtype, *([] if bias is None else [bias.dtype])))


@conv1d.grad
def _(x, weight, dy, needs_input_grad, *, stride, padding, dilation, groups):
    # The same gradients as conv2d's, on (N, C, 1, L) views: reshapes are ops, so double backward goes through.
    geometry = _geometry_2d(stride, padding, dilation, groups)
    dy2 = F.reshape(dy, shape=_as_2d(dy.shape))
    dx = dw = db = None
    if needs_input_grad[0]:
        w2 = F.reshape(weight, shape=_as_2d(weight.shape))
        dx = F.reshape(F.conv2d_grad_input(dy2, w2, input_size=[1, x.shape[2]], **geometry), shape=x.shape)
    if needs_input_grad[1]:
        x2 = F.reshape(x, shape=_as_2d(x.shape))
        dw = F.reshape(F.conv2d_grad_weight(x2, dy2, kernel_size=[1, weight.shape[2]], **geometry),
                       shape=weight.shape)
    if needs_input_grad[2]:
        db = F.sum(dy, axis=[0, 2])
    return dx, dw, db


@conv1d.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 7), _randn(rng, 4, 3, 3))
    yield Sample.of(_randn(rng, 2, 2, 7), _randn(rng, 3, 2, 3), _randn(rng, 3), stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 4, 6), _randn(rng, 4, 2, 2), _randn(rng, 4), padding=[1], dilation=[2], groups=2)


# -- pooling ---------------------------------------------------------------------------------------------------------


def _pool_shape(op_name, x, kernel_size, stride, padding) -> tuple:
    """Check a pooling op's input shape and attrs; return (output shape, kernel, stride, padding) as 2-tuples."""
    kernel = _expand(kernel_size)
    stride = kernel if stride is None else _expand(stride)
    padding = _expand(padding)
    if len(x) != 4:
        raise ShapeError(f"{op_name}(): input must have rank 4 (N, C, H, W), got shape {tuple(x)}")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ShapeError(f"{op_name}(): padding {list(padding)} must be at most half the kernel size "
                         f"{list(kernel)} (so that every window holds an input pixel)")
    return (*x[:2], *_out_size(op_name, x[2:], kernel, stride, padding, (1, 1))), kernel, stride, padding


def _window_argmax(x, kernel, stride, padding, out):
    """For each window, the index (row-major over the kH·kW taps) of its maximum; the first one on ties, as PyTorch."""
    xp = _pad(x, padding, -np.inf)
    taps = list(_taps(kernel, stride, (1, 1), out))
    best = xp[taps[0]].copy()
    arg = np.zeros(best.shape, np.int32)
    for t, index in enumerate(taps[1:], 1):
        bigger = xp[index] > best  # strict: an equal value later in the window does not win
        np.copyto(best, xp[index], where=bigger)
        arg[bigger] = t
    return arg, taps


@op("max_pool2d(Tensor<floating> x, *, int[] kernel_size, int[] stride=None, int[] padding=[0, 0]) -> Tensor y")
def max_pool2d(x, *, kernel_size, stride, padding):
    """The maximum of each kH×kW window of x (N, C, H, W), windows ``stride`` apart (default: the kernel size),
    over x padded with -inf."""
    out, kernel, stride, padding = _pool_shape("max_pool2d", x.shape, kernel_size, stride, padding)
    xp = _pad(x, padding, -np.inf)
    taps = _taps(kernel, stride, (1, 1), out[2:])
    y = xp[next(taps)].copy()
    for index in taps:
        np.maximum(y, xp[index], out=y)
    return y


def _onnx_pool(onnx_type, **extra):
    def mapping(g, x, *, kernel_size, stride, padding):
        kernel, stride, padding = _expand(kernel_size), _expand(stride or kernel_size), _expand(padding)
        return g.op(onnx_type, x, kernel_shape=kernel, strides=stride, pads=[*padding, *padding], **extra)

    return mapping


max_pool2d.onnx(_onnx_pool("MaxPool"))


max_pool2d.check(_check_2d)


@max_pool2d.infer
def _(x, *, kernel_size, stride, padding):
    return Spec(_pool_shape("max_pool2d", x.shape, kernel_size, stride, padding)[0], x.dtype)


@max_pool2d.grad
def _(x, dy, *, kernel_size, stride, padding):
    return F.max_pool2d_grad(x, dy, kernel_size=kernel_size, stride=stride, padding=padding)


def _distinct(rng, *shape):
    """Values in [-2, 2) that are all different (no ties in any window: numeric gradients are well defined)."""
    size = int(np.prod(shape))
    return (rng.permutation(size).reshape(shape) + rng.uniform(0.1, 0.9, shape)) * (4.0 / size) - 2.0


@max_pool2d.samples
def _(rng):
    yield Sample.of(_distinct(rng, 2, 3, 6, 7), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 7, 5), kernel_size=3, stride=2, padding=1)
    yield Sample.of(_distinct(rng, 2, 4, 5, 6), kernel_size=[3, 2], stride=[1, 2], padding=[1, 0])


@op("max_pool2d_grad(Tensor<floating> x, Tensor<floating> dy, *, int[] kernel_size, int[] stride=None, "
    "int[] padding=[0, 0]) -> Tensor dx")
def max_pool2d_grad(x, dy, *, kernel_size, stride, padding):
    """Gradient of max_pool2d: each window's dy goes to the window's maximum of x (the first one on ties, as
    PyTorch); overlapping windows add up."""
    out, kernel, stride, padding = _pool_shape("max_pool2d_grad", x.shape, kernel_size, stride, padding)
    _check_dy("max_pool2d_grad", dy.shape, out)
    arg, taps = _window_argmax(x, kernel, stride, padding, out[2:])
    dxp = np.zeros((*x.shape[:2], x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]),
                   np.result_type(x.dtype, dy.dtype))
    for t, index in enumerate(taps):
        dxp[index] += np.where(arg == t, dy, 0)
    return _crop(dxp, padding, x.shape[2:])


max_pool2d_grad.check(_check_2d)


@max_pool2d_grad.infer
def _(x, dy, *, kernel_size, stride, padding):
    _check_dy("max_pool2d_grad", dy.shape, _pool_shape("max_pool2d_grad", x.shape, kernel_size, stride, padding)[0])
    return Spec(x.shape, D.promote(x.dtype, dy.dtype))


@max_pool2d_grad.grad
def _(x, ddx, *, kernel_size, stride, padding):
    # dx is piecewise constant in x (the argmax only moves at ties) and linear in dy; its transpose in dy gathers
    # ddx at each window's argmax.
    return None, F.max_pool2d_grad_grad(x, ddx, kernel_size=kernel_size, stride=stride, padding=padding)


@max_pool2d_grad.samples
def _(rng):
    yield Sample.of(_distinct(rng, 2, 3, 6, 7), _randn(rng, 2, 3, 3, 3), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 7, 5), _randn(rng, 2, 2, 4, 3), kernel_size=3, stride=2, padding=1)


@op("max_pool2d_grad_grad(Tensor<floating> x, Tensor<floating> ddx, *, int[] kernel_size, int[] stride=None, "
    "int[] padding=[0, 0]) -> Tensor ddy")
def max_pool2d_grad_grad(x, ddx, *, kernel_size, stride, padding):
    """Gradient of max_pool2d_grad with respect to dy (TensorFlow's MaxPoolGradGrad): ddx, an input-shaped tensor,
    read at each window's maximum of x (the first one on ties)."""
    out, kernel, stride, padding = _pool_shape("max_pool2d_grad_grad", x.shape, kernel_size, stride, padding)
    _check_dy("max_pool2d_grad_grad", ddx.shape, x.shape)
    arg, taps = _window_argmax(x, kernel, stride, padding, out[2:])
    ddxp = _pad(ddx.astype(np.result_type(x.dtype, ddx.dtype), copy=False), padding)
    ddy = np.zeros(arg.shape, ddxp.dtype)
    for t, index in enumerate(taps):
        np.copyto(ddy, ddxp[index], where=arg == t)
    return ddy


max_pool2d_grad_grad.check(_check_2d)


@max_pool2d_grad_grad.infer
def _(x, ddx, *, kernel_size, stride, padding):
    _check_dy("max_pool2d_grad_grad", ddx.shape, x.shape)
    return Spec(_pool_shape("max_pool2d_grad_grad", x.shape, kernel_size, stride, padding)[0],
                D.promote(x.dtype, ddx.dtype))


@max_pool2d_grad_grad.grad
def _(x, dddy, *, kernel_size, stride, padding):
    # gathering at the argmax is the transpose of scattering there; constant in x away from ties
    return None, F.max_pool2d_grad(x, dddy, kernel_size=kernel_size, stride=stride, padding=padding)


@max_pool2d_grad_grad.samples
def _(rng):
    yield Sample.of(_distinct(rng, 2, 3, 6, 7), _randn(rng, 2, 3, 6, 7), kernel_size=2)
    yield Sample.of(_distinct(rng, 2, 2, 7, 5), _randn(rng, 2, 2, 7, 5), kernel_size=3, stride=2, padding=1)


@op("avg_pool2d(Tensor<floating> x, *, int[] kernel_size, int[] stride=None, int[] padding=[0, 0]) -> Tensor y")
def avg_pool2d(x, *, kernel_size, stride, padding):
    """The mean of each kH×kW window of x (N, C, H, W), windows ``stride`` apart (default: the kernel size), over
    x padded with zeros that count in the mean (PyTorch's count_include_pad=True)."""
    out, kernel, stride, padding = _pool_shape("avg_pool2d", x.shape, kernel_size, stride, padding)
    xp = _pad(x, padding)
    taps = _taps(kernel, stride, (1, 1), out[2:])
    y = xp[next(taps)].copy()
    for index in taps:
        y += xp[index]
    y *= 1.0 / (kernel[0] * kernel[1])  # a Python float keeps float32
    return y


avg_pool2d.onnx(_onnx_pool("AveragePool", count_include_pad=1))


avg_pool2d.check(_check_2d)


@avg_pool2d.infer
def _(x, *, kernel_size, stride, padding):
    return Spec(_pool_shape("avg_pool2d", x.shape, kernel_size, stride, padding)[0], x.dtype)


@avg_pool2d.grad
def _(dy, x_spec, *, kernel_size, stride, padding):
    return F.avg_pool2d_grad(dy, input_size=x_spec.shape[2:], kernel_size=kernel_size, stride=stride,
                             padding=padding)


@avg_pool2d.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 6, 7), kernel_size=2)
    yield Sample.of(_randn(rng, 2, 2, 7, 5), kernel_size=3, stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 4, 5, 6), kernel_size=[3, 2], stride=[1, 2], padding=[1, 0])


def _avg_pool_grad_spec(dy, input_size, kernel_size, stride, padding) -> Spec:
    """The input Spec avg_pool2d_grad returns, after checking dy against the forward geometry."""
    if len(dy.shape) != 4:
        raise ShapeError(f"avg_pool2d_grad(): dy must have rank 4 (N, C, OH, OW), got shape {dy.shape}")
    x = (*dy.shape[:2], *_expand(input_size))
    _check_dy("avg_pool2d_grad", dy.shape, _pool_shape("avg_pool2d_grad", x, kernel_size, stride, padding)[0])
    return Spec(x, dy.dtype)


@op("avg_pool2d_grad(Tensor<floating> dy, *, int[] input_size, int[] kernel_size, int[] stride=None, "
    "int[] padding=[0, 0]) -> Tensor dx")
def avg_pool2d_grad(dy, *, input_size, kernel_size, stride, padding):
    """Gradient of avg_pool2d for an input of spatial size ``input_size`` (H, W): each window's dy spread evenly
    over its kH·kW pixels; overlapping windows add up."""
    _avg_pool_grad_spec(Spec(dy.shape, dy.dtype), input_size, kernel_size, stride, padding)
    size = _expand(input_size)
    kernel, padding = _expand(kernel_size), _expand(padding)
    stride = kernel if stride is None else _expand(stride)
    share = dy * (1.0 / (kernel[0] * kernel[1]))
    dxp = np.zeros((*dy.shape[:2], size[0] + 2 * padding[0], size[1] + 2 * padding[1]), dy.dtype)
    for index in _taps(kernel, stride, (1, 1), dy.shape[2:]):
        dxp[index] += share
    return _crop(dxp, padding, size)


avg_pool2d_grad.check(_check_2d)


@avg_pool2d_grad.infer
def _(dy, *, input_size, kernel_size, stride, padding):
    return _avg_pool_grad_spec(dy, input_size, kernel_size, stride, padding)


@avg_pool2d_grad.grad
def _(ddx, *, kernel_size, stride, padding):
    return F.avg_pool2d(ddx, kernel_size=kernel_size, stride=stride, padding=padding)  # the transpose of a transpose


@avg_pool2d_grad.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 3, 3), input_size=[6, 7], kernel_size=2)
    yield Sample.of(_randn(rng, 2, 2, 4, 3), input_size=[7, 5], kernel_size=3, stride=2, padding=1)
