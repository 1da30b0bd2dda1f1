"""Convolution (1-, 2- and 3-D), its transpose, and unfold/fold (im2col/col2im as ops): one n-d implementation
behind thin op definitions.

Layouts are PyTorch's: inputs (N, C, *spatial) — or (C, *spatial) unbatched —, weights (out_channels,
in_channels / groups, *kernel), a transposed convolution's weight (in_channels, out_channels / groups, *kernel).
``groups`` splits the channels into groups convolved separately. The geometry (strides, paddings, dilations, output
sizes) and the batch-innermost memory layout the kernels compute in are described in ``_window.py``.

How the kernels compute, each direction one GEMM over the whole batch:

* forward: im2col — a strided view of the padded input, laid out as a (groups, C/groups·∏kernel, ∏out·N) matrix
  by one copy — multiplied by the weight as (groups, O/groups, C/groups·∏kernel). The product is already the output,
  in batch-innermost memory: no transposing copy.
* weight gradient: dy as (groups, O/groups, ∏out·N) times the same im2col matrix transposed (BLAS reads the
  transpose in place).
* input gradient: the weight transposed times dy gives the column gradient, which col2im adds back, tap by tap,
  into a zero padded buffer in place.

A batch-innermost dy (what the ops here and the elementwise ops between them produce) is used as it is; another
layout costs one copy. Gradient rules are written with ops and close over a small set, so every order of derivative
exists: conv → conv_grad_input, conv_grad_weight (and a sum for the bias); each of these is bilinear, and its
derivatives are convolutions again. A transposed convolution is conv_grad_input with a bias; unfold and fold are
each other's transposes.
"""

import functools
import math

from opforge import ops as F

from . import _window as win
from ._common import B, D, P, S, Sample, ShapeError, Spec, np, op

# -- geometry (shared by infer rules and kernels, so that kernels fail early with the same message) -----------------


def _padding(nd: int, padding, kernel, dilation) -> tuple:
    """(front, back) paddings per dim: "valid" is none, "same" keeps the size (stride 1; an odd total puts the
    extra one behind, as PyTorch), ints pad both sides alike."""
    if padding == "valid":
        return (0,) * nd, (0,) * nd
    if padding == "same":
        totals = [None if k is None else d * (k - 1) for k, d in zip(kernel, dilation)]
        front = tuple(None if t is None else t // 2 for t in totals)
        return front, tuple(None if t is None else t - f for t, f in zip(totals, front))
    padding = win.expand(padding, nd)
    return padding, padding


def _check(nd, *, padding, stride=(1,), **attrs) -> None:
    """The attrs of a convolution op (nd None: n-d, the lists' own length)."""
    win.check_lists(nd, {"stride": stride, **attrs} | ({} if isinstance(padding, str) else {"padding": padding}))
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"argument 'padding' must be 'same', 'valid' or ints, got {padding!r}")
        if padding == "same" and any(s != 1 for s in stride if isinstance(s, int)):
            raise ValueError(f"padding='same' needs stride 1 (the output keeps the input's size), got stride "
                             f"{list(stride)}")


@functools.lru_cache(maxsize=1024)  # the same shapes come back every step
def _conv_geometry(op_name, nd, x, w, bias, stride, padding, dilation, groups):
    """Check the shapes of a convolution's input ``x``, weight ``w`` (and bias); return (batched, Windows)."""
    batched = win.spatial_rank(op_name, x, nd)
    if len(w) != nd + 2:
        kernel = ("kL",) if nd == 1 else ("kH", "kW") if nd == 2 else ("kD", "kH", "kW")
        raise ShapeError(f"{op_name}(): weight must have rank {nd + 2} (out_channels, in_channels / groups, "
                         f"{', '.join(kernel)}), got shape {tuple(w)}")
    x = x if batched else (1, *x)
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
    stride, dilation = win.expand(stride, nd), win.expand(dilation, nd)
    front, back = _padding(nd, padding, w[2:], dilation)
    return batched, win.conv_windows(op_name, x[2:], w[2:], stride, front, back, dilation)


def _shape(spec):
    return None if spec is None else spec.shape


def _promoted(*specs):
    return D.promote(*(s.dtype for s in specs if s is not None))


# -- the NumPy kernels: (N, C, *spatial) arrays of one dtype in, batch-innermost results out -------------------------


def _columns(x, w: win.Windows, groups: int):
    """The im2col matrices of x, (groups, C/groups·∏kernel, ∏out·N), in scratch memory: one copy of a view of the
    padded input."""
    view = win.im2col(win.pad(win.batch_last(x), w), w)
    cols = win.scratch("cols", view.shape, x.dtype, x)
    np.copyto(cols, view)
    return cols.reshape(groups, -1, math.prod(w.out) * x.shape[0])


def _forward(x, weight, bias, w: win.Windows, groups: int):
    n, out_c = x.shape[0], weight.shape[0]
    if n == 0:  # an empty batch (as torch allows): no windows to lay out
        return np.zeros_like(x, shape=(0, out_c, *w.out))
    y = np.matmul(weight.reshape(groups, out_c // groups, -1), _columns(x, w, groups))
    y = y.reshape(out_c, *w.out, n)
    if bias is not None:
        y += bias.reshape(out_c, *(1,) * (len(w.out) + 1))
    return win.batch_first(y)


def _input_grad(dy, weight, w: win.Windows, groups: int):
    """The transposed convolution: dy (N, O, *out) back to the input (N, C, *size)."""
    n, out_c = dy.shape[:2]
    if n == 0:
        return np.zeros_like(dy, shape=(0, weight.shape[1] * groups, *w.size))
    flipped = _flipped_windows(w)
    if flipped is not None and out_c <= weight.shape[1] * groups:  # its im2col matrix is the larger with more
        return _input_grad_as_conv(dy, weight, flipped, groups)    # output channels than input channels
    dy2 = win.batch_last_array(dy, "dy").reshape(groups, out_c // groups, -1)  # no copy when dy is batch-last
    wt = weight.reshape(groups, out_c // groups, -1).transpose(0, 2, 1)
    cols = np.matmul(wt, dy2, out=win.scratch("cols", (groups, wt.shape[1], dy2.shape[2]), dy.dtype, dy))
    cols = cols.reshape(-1, *w.kernel, *w.out, n)  # (C, *kernel, *out, N)
    return win.batch_first(win.interior(win.col2im(cols, w, (cols.shape[0], *w.padded, n)), w))


@functools.lru_cache(maxsize=512)
def _flipped_windows(w: win.Windows):
    """With stride 1, the input gradient is a convolution of dy, padded by dilation·(kernel − 1) − padding on each
    side, with the weight flipped and its channel dims swapped: one im2col copy and one GEMM, where the transpose
    (GEMM, then col2im adding every tap back in turn) cost about twice as much (1.9 → 1.1 ms at 16×32×16×16 → 32,
    3×3). Its windows over dy, or None where a stride is not 1 or a padding exceeds the dilated kernel."""
    if any(s != 1 for s in w.stride) or None in w.size:
        return None
    reach = [d * (k - 1) for k, d in zip(w.kernel, w.dilation)]
    lo, hi = [r - a for r, a in zip(reach, w.lo)], [r - b for r, b in zip(reach, w.hi)]
    if min(lo + hi) < 0:
        return None
    flipped = win.conv_windows("conv_grad_input", w.out, w.kernel, w.stride, lo, hi, w.dilation)
    return flipped if flipped.out == w.size else None


def _input_grad_as_conv(dy, weight, flipped: win.Windows, groups: int):
    out_c, in_c = weight.shape[0], weight.shape[1] * groups
    nd = len(flipped.kernel)
    wf = weight.reshape(groups, out_c // groups, in_c // groups, *flipped.kernel)
    wf = wf[(..., *(slice(None, None, -1),) * nd)].swapaxes(1, 2)  # (groups, C/groups, O/groups, *kernel)
    dx = np.matmul(wf.reshape(groups, in_c // groups, -1), _columns(dy, flipped, groups))
    return win.batch_first(dx.reshape(in_c, *flipped.out, dy.shape[0]))


def _weight_grad(x, dy, w: win.Windows, groups: int):
    out_c = dy.shape[1]
    if x.shape[0] == 0:  # no windows: nothing to add up
        return np.zeros_like(x, shape=(out_c, x.shape[1] // groups, *w.kernel))
    dy2 = win.batch_last_array(dy, "dy").reshape(groups, out_c // groups, -1)
    # the im2col matrix times dyᵀ, then transposed: OpenBLAS runs this 20-30% faster than dy times its transpose
    dw = np.matmul(_columns(x, w, groups), dy2.transpose(0, 2, 1)).transpose(0, 2, 1)
    return dw.reshape(out_c, -1, *w.kernel)


def _conv_op(weight):
    """conv1d, conv2d or conv3d, by the weight's rank."""
    return (F.conv1d, F.conv2d, F.conv3d)[len(weight.shape) - 3]


# -- conv1d, conv2d, conv3d ------------------------------------------------------------------------------------------


def _conv(op_name, nd, x, weight, bias, *, stride, padding, dilation, groups):
    batched, w = _conv_geometry(op_name, nd, x.shape, weight.shape, None if bias is None else bias.shape, stride,
                                padding, dilation, groups)
    dtype = np.result_type(x, weight, *([] if bias is None else [bias]))
    x = x if batched else x[None]
    y = _forward(x.astype(dtype, copy=False), weight.astype(dtype, copy=False),
                 None if bias is None else bias.astype(dtype, copy=False), w, groups)
    return y if batched else y[0]


def _conv_spec(op_name, nd, x, weight, bias, *, stride, padding, dilation, groups):
    _, w = _conv_geometry(op_name, nd, x.shape, weight.shape, _shape(bias), stride, padding, dilation, groups)
    return Spec((*x.shape[:-nd - 1], weight.shape[0], *w.out), _promoted(x, weight, bias))


def _conv_grad(x, weight, dy, needs_input_grad, *, stride, padding, dilation, groups):
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    batched = len(x.shape) == len(weight.shape)
    if not batched:  # the grad ops take batches
        x, dy = F.unsqueeze(x, axis=0), F.unsqueeze(dy, axis=0)
    dx = dw = db = None
    if needs_input_grad[0]:
        dx = F.conv_grad_input(dy, weight, input_size=x.shape[2:], **geometry)
        dx = dx if batched else F.squeeze(dx, axis=[0])
    if needs_input_grad[1]:
        dw = F.conv_grad_weight(x, dy, kernel_size=weight.shape[2:], **geometry)
    if needs_input_grad[2]:
        db = F.sum(dy, axis=[0, *range(2, len(dy.shape))])
    return dx, dw, db


def _conv_onnx(g, x, weight, bias, *, stride, padding, dilation, groups):
    nd = weight.ndim - 2
    front, back = _padding(nd, padding, weight.shape[2:], win.expand(dilation, nd))
    return win.onnx_batched(g, x, nd, lambda x, spec: g.op(
        "Conv", x, weight, bias, strides=win.expand(stride, nd), pads=[*front, *back],
        dilations=win.expand(dilation, nd), group=groups, spec=spec))


def _sbp(x, weight, bias=None, **_):
    if len(x.shape) == len(weight.shape):  # a batch: split the images (data parallel)
        yield (S(0), B, None if bias is None else B), S(0)


def _define_conv(opdef, nd: int, samples) -> None:
    opdef.check(functools.partial(_check, nd))
    opdef.infer(functools.partial(_conv_spec, opdef.name, nd))
    opdef.grad(_conv_grad)
    opdef.onnx(_conv_onnx)
    opdef.sbp(_sbp)
    opdef.samples(samples)


def _randn(rng, *shape):
    return rng.standard_normal(shape)


@op("conv1d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, int[] stride=[1], "
    "int[]|str padding=[0], int[] dilation=[1], int groups=1) -> Tensor y", traits=["same_dtype"])
def conv1d(x, weight, bias, *, stride, padding, dilation, groups):
    """1-D convolution (cross-correlation, as PyTorch): x (N, C, L), weight (O, C/groups, kL), bias (O,) give
    y (N, O, OL) with y[n, o, p] = bias[o] + Σ_{c, i} weight[o, c, i] · x_pad[n, g·C/groups + c, p·s + i·d],
    g being the group of output channel o. ``padding`` is ints, "valid" (none) or "same" (stride 1)."""
    return _conv("conv1d", 1, x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


_define_conv(conv1d, 1, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 7), _randn(rng, 4, 3, 3)),  # no bias (first: the "missing argument" check)
    Sample.of(_randn(rng, 2, 2, 7), _randn(rng, 3, 2, 3), _randn(rng, 3), stride=2, padding=1),
    Sample.of(_randn(rng, 1, 4, 6), _randn(rng, 4, 2, 2), _randn(rng, 4), padding="same", dilation=3, groups=2),
    Sample.of(_randn(rng, 3, 6), _randn(rng, 2, 3, 3), _randn(rng, 2), padding="valid"),  # unbatched
])


@op("conv2d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, int[] stride=[1, 1], "
    "int[]|str padding=[0, 0], int[] dilation=[1, 1], int groups=1) -> Tensor y", traits=["same_dtype"])
def conv2d(x, weight, bias, *, stride, padding, dilation, groups):
    """2-D convolution (cross-correlation, as PyTorch): x (N, C, H, W), weight (O, C/groups, kH, kW), bias (O,)
    give y (N, O, OH, OW) with y[n, o, p, q] = bias[o] + Σ_{c, i, j} weight[o, c, i, j] · x_pad[n, g·C/groups + c,
    p·sH + i·dH, q·sW + j·dW], g being the group of output channel o. ``padding`` is ints, "valid" (none) or
    "same" (stride 1)."""
    return _conv("conv2d", 2, x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


_define_conv(conv2d, 2, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 5, 6), _randn(rng, 4, 3, 3, 3)),
    Sample.of(_randn(rng, 2, 2, 7, 7), _randn(rng, 3, 2, 3, 2), _randn(rng, 3), stride=[2, 2], padding=[1, 1]),
    Sample.of(_randn(rng, 2, 4, 6, 6), _randn(rng, 4, 2, 3, 3), _randn(rng, 4), padding=[1, 2], dilation=2,
              groups=2),
    Sample.of(_randn(rng, 2, 4, 7, 5), _randn(rng, 6, 2, 2, 2), None, stride=[2, 1], dilation=[1, 2], groups=2),
    Sample.of(_randn(rng, 2, 4, 5), _randn(rng, 2, 2, 2, 3), _randn(rng, 2), padding="same"),  # unbatched, odd
])


@op("conv3d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, int[] stride=[1, 1, 1], "
    "int[]|str padding=[0, 0, 0], int[] dilation=[1, 1, 1], int groups=1) -> Tensor y", traits=["same_dtype"])
def conv3d(x, weight, bias, *, stride, padding, dilation, groups):
    """3-D convolution (cross-correlation, as PyTorch): x (N, C, D, H, W), weight (O, C/groups, kD, kH, kW),
    bias (O,) give y (N, O, OD, OH, OW), each output the weighted sum of a dilated, strided window of the padded
    input over the channels of its group. ``padding`` is ints, "valid" (none) or "same" (stride 1)."""
    return _conv("conv3d", 3, x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)


_define_conv(conv3d, 3, lambda rng: [
    Sample.of(_randn(rng, 2, 2, 3, 4, 3), _randn(rng, 2, 2, 2, 2, 2)),
    Sample.of(_randn(rng, 2, 2, 4, 3, 5), _randn(rng, 4, 1, 2, 1, 3), _randn(rng, 4), stride=[2, 1, 2],
              padding=[1, 0, 1], dilation=[1, 1, 2], groups=2),
    Sample.of(_randn(rng, 1, 3, 3, 4), _randn(rng, 2, 1, 2, 3, 2), _randn(rng, 2), padding="same"),  # unbatched
])


# -- the gradient ops: n-d, batched, the spatial rank taken from the weight (grad_input) or the input ---------------


@functools.lru_cache(maxsize=1024)
def _grad_input_spec(op_name, dy, weight, input_size, stride, padding, dilation, groups):
    """The input Spec a convolution's grad_input op returns, after checking dy against the forward geometry."""
    nd = len(weight.shape) - 2
    if not 1 <= nd <= 3 or len(dy.shape) != nd + 2:
        raise ShapeError(f"{op_name}(): weight must have rank 3, 4 or 5 and dy the same rank, got shapes "
                         f"{tuple(weight.shape)} and {tuple(dy.shape)}")
    win.fit_rank(op_name, nd, input_size=input_size, stride=stride, padding=padding, dilation=dilation)
    x = (dy.shape[0], None if weight.shape[1] is None else weight.shape[1] * groups, *win.expand(input_size, nd))
    _, w = _conv_geometry(op_name, nd, x, weight.shape, None, stride, padding, dilation, groups)
    win.check_dy(op_name, dy.shape, (dy.shape[0], weight.shape[0], *w.out))
    return Spec(x, D.promote(dy.dtype, weight.dtype)), w


@op("conv_grad_input(Tensor<floating> dy, Tensor<floating> weight, *, int[] input_size, int[] stride=[1], "
    "int[]|str padding=[0], int[] dilation=[1], int groups=1) -> Tensor dx")
def conv_grad_input(dy, weight, *, input_size, stride, padding, dilation, groups):
    """Gradient of a convolution (1-, 2- or 3-D, by the weight's rank) with respect to its input of spatial size
    ``input_size``: the transposed convolution of dy with the weight. Input positions no output read get 0."""
    spec, w = _grad_input_spec("conv_grad_input", Spec(dy.shape, dy.dtype), Spec(weight.shape, weight.dtype),
                               input_size, stride, padding, dilation, groups)
    return _input_grad(dy.astype(spec.dtype, copy=False), weight.astype(spec.dtype, copy=False), w, groups)


conv_grad_input.check(functools.partial(_check, None))
conv_grad_input.sbp(lambda dy, weight, **_: [((S(0), B), S(0))])  # images split, as in the forward


@conv_grad_input.infer
def _(dy, weight, *, input_size, stride, padding, dilation, groups):
    return _grad_input_spec("conv_grad_input", dy, weight, input_size, stride, padding, dilation, groups)[0]


@conv_grad_input.grad
def _(dy, weight, ddx, needs_input_grad, *, input_size, stride, padding, dilation, groups):
    # dx = Aᵀ(w)·dy is linear in dy and in w: <ddx, Aᵀ(w)·dy> = <A(w)·ddx, dy> = <conv(ddx, w), dy>, so its
    # derivative in dy is conv(ddx, w) and in w that of a convolution of input ddx against output gradient dy.
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    ddy = _conv_op(weight)(ddx, weight, **geometry) if needs_input_grad[0] else None
    dw = F.conv_grad_weight(ddx, dy, kernel_size=weight.shape[2:], **geometry) if needs_input_grad[1] else None
    return ddy, dw


@conv_grad_input.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 4, 3, 4), _randn(rng, 4, 3, 3, 3), input_size=[5, 6])
    yield Sample.of(_randn(rng, 2, 3, 4, 4), _randn(rng, 3, 2, 3, 2), input_size=[7, 7], stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 6, 3, 3), _randn(rng, 6, 2, 2, 2), input_size=[7, 5], stride=[2, 1],
                    dilation=[1, 2], groups=2)
    yield Sample.of(_randn(rng, 2, 2, 6), _randn(rng, 2, 3, 2), input_size=[6], padding="same")
    yield Sample.of(_randn(rng, 1, 2, 2, 3, 2), _randn(rng, 2, 2, 2, 1, 2), input_size=[4, 3, 4], stride=[2, 1, 2])


@functools.lru_cache(maxsize=1024)
def _grad_weight_spec(op_name, x, dy, kernel_size, stride, padding, dilation, groups):
    """The weight Spec a convolution's grad_weight op returns, after checking dy against the forward geometry."""
    nd = len(x.shape) - 2
    if not 1 <= nd <= 3 or len(dy.shape) != nd + 2:
        raise ShapeError(f"{op_name}(): x must have rank 3, 4 or 5 and dy the same rank, got shapes "
                         f"{tuple(x.shape)} and {tuple(dy.shape)}")
    win.fit_rank(op_name, nd, kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation)
    in_c = x.shape[1]
    weight = (dy.shape[1], None if in_c is None else in_c // groups, *win.expand(kernel_size, nd))
    _, w = _conv_geometry(op_name, nd, x.shape, weight, None, stride, padding, dilation, groups)
    win.check_dy(op_name, dy.shape, (x.shape[0], weight[0], *w.out))
    return Spec(weight, D.promote(x.dtype, dy.dtype)), w


@op("conv_grad_weight(Tensor<floating> x, Tensor<floating> dy, *, int[] kernel_size, int[] stride=[1], "
    "int[]|str padding=[0], int[] dilation=[1], int groups=1) -> Tensor dweight")
def conv_grad_weight(x, dy, *, kernel_size, stride, padding, dilation, groups):
    """Gradient of a convolution (1-, 2- or 3-D, by the input's rank) with respect to its weight of spatial size
    ``kernel_size``: dweight[o, c, *i] = Σ_{n, *p} dy[n, o, *p] · x_pad[n, g·C/groups + c, *(p·s + i·d)]."""
    spec, w = _grad_weight_spec("conv_grad_weight", Spec(x.shape, x.dtype), Spec(dy.shape, dy.dtype), kernel_size,
                                stride, padding, dilation, groups)
    return _weight_grad(x.astype(spec.dtype, copy=False), dy.astype(spec.dtype, copy=False), w, groups)


conv_grad_weight.check(functools.partial(_check, None))
conv_grad_weight.sbp(lambda x, dy, **_: [((S(0), S(0)), P)])  # each rank's images add their part


@conv_grad_weight.infer
def _(x, dy, *, kernel_size, stride, padding, dilation, groups):
    return _grad_weight_spec("conv_grad_weight", x, dy, kernel_size, stride, padding, dilation, groups)[0]


@conv_grad_weight.grad
def _(x, dy, ddweight, needs_input_grad, *, kernel_size, stride, padding, dilation, groups):
    # dweight is bilinear in (x, dy): <ddweight, dweight(x, dy)> = <conv(x, ddweight), dy>, so its derivative
    # in dy is conv(x, ddweight) and in x the transposed convolution of dy with ddweight.
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    dx = F.conv_grad_input(dy, ddweight, input_size=x.shape[2:], **geometry) if needs_input_grad[0] else None
    ddy = _conv_op(ddweight)(x, ddweight, **geometry) if needs_input_grad[1] else None
    return dx, ddy


@conv_grad_weight.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 3, 5, 6), _randn(rng, 2, 4, 3, 4), kernel_size=[3, 3])
    yield Sample.of(_randn(rng, 2, 2, 7, 7), _randn(rng, 2, 3, 4, 4), kernel_size=[3, 2], stride=2, padding=1)
    yield Sample.of(_randn(rng, 2, 4, 6, 6), _randn(rng, 2, 4, 4, 6), kernel_size=[3, 3], padding=[1, 2],
                    dilation=2, groups=2)
    yield Sample.of(_randn(rng, 2, 2, 6), _randn(rng, 2, 3, 6), kernel_size=[2], padding="same")
    yield Sample.of(_randn(rng, 1, 2, 4, 3, 4), _randn(rng, 1, 2, 2, 3, 2), kernel_size=[2, 1, 2],
                    stride=[2, 1, 2])


# -- conv_transpose1d, conv_transpose2d, conv_transpose3d ------------------------------------------------------------


def _check_transpose(nd, *, stride, output_padding, **attrs) -> None:
    win.check_lists(nd, {"stride": stride, "output_padding": output_padding, **attrs})
    for s, p in zip(win.expand(stride, nd), win.expand(output_padding, nd)):
        if p >= s:
            raise ValueError(f"argument 'output_padding' must be smaller than the stride {list(stride)}, got "
                             f"{list(output_padding)}")


@functools.lru_cache(maxsize=1024)
def _transpose_geometry(op_name, nd, x, w, bias, stride, padding, output_padding, groups, dilation):
    """Check a transposed convolution's shapes; return (batched, output shape, Windows of the convolution whose
    input gradient it is)."""
    batched = win.spatial_rank(op_name, x, nd)
    if len(w) != nd + 2:
        raise ShapeError(f"{op_name}(): weight must have rank {nd + 2} (in_channels, out_channels / groups, "
                         f"*kernel), got shape {tuple(w)}")
    x = x if batched else (1, *x)
    if x[1] is not None and w[0] is not None and x[1] != w[0]:
        raise ShapeError(f"{op_name}(): the input has {x[1]} channels, the weight of shape {tuple(w)} expects "
                         f"{w[0]}")
    if w[0] is not None and w[0] % groups:
        raise ShapeError(f"{op_name}(): the weight's {w[0]} input channels do not split into groups={groups}")
    out_c = None if w[1] is None else w[1] * groups
    if bias is not None and (len(bias) != 1 or (None not in (bias[0], out_c) and bias[0] != out_c)):
        raise ShapeError(f"{op_name}(): bias must have shape ({out_c},), one value per output channel, "
                         f"got {tuple(bias)}")
    stride, padding, dilation = (win.expand(a, nd) for a in (stride, padding, dilation))
    size = []
    for n, k, s, p, d, extra in zip(x[2:], w[2:], stride, padding, dilation, win.expand(output_padding, nd)):
        m = None if n is None or k is None else (n - 1) * s - 2 * p + d * (k - 1) + extra + 1
        if m is not None and m < 1:
            raise ShapeError(f"{op_name}(): the output would be empty: the input's spatial size {tuple(x[2:])} "
                             f"with padding {list(padding)} gives {m} along a dim")
        size.append(m)
    w = win.conv_windows(op_name, size, w[2:], stride, padding, padding, dilation)
    return batched, (x[0], out_c, *size)[0 if batched else 1:], w


def _conv_transpose(op_name, nd, x, weight, bias, *, stride, padding, output_padding, groups, dilation):
    batched, _, w = _transpose_geometry(op_name, nd, x.shape, weight.shape, _shape(bias), stride, padding,
                                        output_padding, groups, dilation)
    dtype = np.result_type(x, weight, *([] if bias is None else [bias]))
    y = _input_grad((x if batched else x[None]).astype(dtype, copy=False), weight.astype(dtype, copy=False), w,
                    groups)
    if bias is not None:
        y += bias.astype(dtype, copy=False).reshape(-1, *(1,) * nd)
    return y if batched else y[0]


def _conv_transpose_spec(op_name, nd, x, weight, bias, *, stride, padding, output_padding, groups, dilation):
    _, shape, _ = _transpose_geometry(op_name, nd, x.shape, weight.shape, _shape(bias), stride, padding,
                                      output_padding, groups, dilation)
    return Spec(shape, _promoted(x, weight, bias))


def _conv_transpose_grad(x, weight, dy, needs_input_grad, *, stride, padding, output_padding, groups, dilation):
    # y = Aᵀ(w)·x, A the convolution it transposes: dx = A(w)·dy, a convolution of dy; dw as for a convolution
    # of input dy with output gradient x; output_padding only adds positions no input reaches.
    geometry = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    dx = dw = db = None
    if needs_input_grad[0]:
        dx = _conv_op(weight)(dy, weight, **geometry)
    batched = len(x.shape) == len(weight.shape)
    if needs_input_grad[1]:
        x2, dy2 = (x, dy) if batched else (F.unsqueeze(x, axis=0), F.unsqueeze(dy, axis=0))
        dw = F.conv_grad_weight(dy2, x2, kernel_size=weight.shape[2:], **geometry)
    if needs_input_grad[2]:
        db = F.sum(dy, axis=[*([0] if batched else []), *range(len(dy.shape) - len(weight.shape) + 2,
                                                                   len(dy.shape))])
    return dx, dw, db


def _define_conv_transpose(opdef, nd: int, samples) -> None:
    opdef.check(functools.partial(_check_transpose, nd))
    opdef.infer(functools.partial(_conv_transpose_spec, opdef.name, nd))
    opdef.grad(_conv_transpose_grad)
    opdef.sbp(_sbp)
    opdef.onnx(_conv_transpose_onnx)
    opdef.samples(samples)


def _conv_transpose_onnx(g, x, weight, bias, *, stride, padding, output_padding, groups, dilation):
    nd = weight.ndim - 2
    dtype = g.outputs[0].dtype
    x, weight = g.cast(x, dtype), g.cast(weight, dtype)
    bias = None if bias is None else g.cast(bias, dtype)
    geometry = {"strides": win.expand(stride, nd), "pads": win.expand(padding, nd) * 2,
                "output_padding": win.expand(output_padding, nd), "dilations": win.expand(dilation, nd)}

    def build(x, spec):
        if groups == 1 or weight.shape[0] is None or dtype != D.float64:
            return g.op("ConvTranspose", x, weight, bias, group=groups, **geometry, spec=spec)
        # float64: one ConvTranspose per group, concatenated. ONNX Runtime has no float64 kernel, and ONNX's
        # reference evaluator, which runs such models, gets group > 1 wrong (onnx 1.23)
        xs = g.op("Split", x, g.ints([weight.shape[0] // groups] * groups), axis=1, outputs=groups)
        ws = g.op("Split", weight, g.ints([weight.shape[0] // groups] * groups), axis=0, outputs=groups)
        ys = [g.op("ConvTranspose", xi, wi, **geometry, spec=spec) for xi, wi in zip(xs, ws)]
        y = g.op("Concat", *ys, axis=1, spec=spec)
        return y if bias is None else g.op("Add", y, g.op("Reshape", bias, g.ints([-1, *(1,) * nd])), spec=spec)

    return win.onnx_batched(g, x, nd, build)


@op("conv_transpose1d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, *, "
    "int[] stride=[1], int[] padding=[0], int[] output_padding=[0], int groups=1, int[] dilation=[1]) -> Tensor y",
    traits=["same_dtype"])
def conv_transpose1d(x, weight, bias, *, stride, padding, output_padding, groups, dilation):
    """1-D transposed convolution (PyTorch's): x (N, C, L), weight (C, O/groups, kL), bias (O,) give
    y (N, O, (L − 1)·s − 2·p + d·(kL − 1) + output_padding + 1), the gradient of conv1d with respect to its input,
    plus the bias. ``output_padding`` (less than the stride) adds positions behind."""
    return _conv_transpose("conv_transpose1d", 1, x, weight, bias, stride=stride, padding=padding,
                           output_padding=output_padding, groups=groups, dilation=dilation)


_define_conv_transpose(conv_transpose1d, 1, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 4), _randn(rng, 3, 2, 3)),
    Sample.of(_randn(rng, 2, 4, 3), _randn(rng, 4, 1, 3), _randn(rng, 2), stride=3, padding=1, output_padding=2,
              groups=2, dilation=2),
    Sample.of(_randn(rng, 2, 4), _randn(rng, 2, 3, 2), _randn(rng, 3), stride=2),  # unbatched
])


@op("conv_transpose2d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, *, "
    "int[] stride=[1, 1], int[] padding=[0, 0], int[] output_padding=[0, 0], int groups=1, "
    "int[] dilation=[1, 1]) -> Tensor y", traits=["same_dtype"])
def conv_transpose2d(x, weight, bias, *, stride, padding, output_padding, groups, dilation):
    """2-D transposed convolution (PyTorch's): x (N, C, H, W), weight (C, O/groups, kH, kW), bias (O,) give
    y (N, O, OH, OW) with OH = (H − 1)·sH − 2·pH + dH·(kH − 1) + output_padding + 1 (and so for OW), the gradient
    of conv2d with respect to its input, plus the bias."""
    return _conv_transpose("conv_transpose2d", 2, x, weight, bias, stride=stride, padding=padding,
                           output_padding=output_padding, groups=groups, dilation=dilation)


_define_conv_transpose(conv_transpose2d, 2, lambda rng: [
    Sample.of(_randn(rng, 2, 3, 3, 4), _randn(rng, 3, 2, 2, 3)),
    Sample.of(_randn(rng, 2, 4, 3, 3), _randn(rng, 4, 1, 3, 2), _randn(rng, 2), stride=[2, 3], padding=[1, 0],
              output_padding=[1, 2], groups=2, dilation=[1, 2]),
    Sample.of(_randn(rng, 2, 3, 2), _randn(rng, 2, 2, 2, 2), _randn(rng, 2), stride=2, padding=1),  # unbatched
])


@op("conv_transpose3d(Tensor<floating> x, Tensor<floating> weight, Tensor<floating>? bias=None, *, "
    "int[] stride=[1, 1, 1], int[] padding=[0, 0, 0], int[] output_padding=[0, 0, 0], int groups=1, "
    "int[] dilation=[1, 1, 1]) -> Tensor y", traits=["same_dtype"])
def conv_transpose3d(x, weight, bias, *, stride, padding, output_padding, groups, dilation):
    """3-D transposed convolution (PyTorch's): x (N, C, D, H, W), weight (C, O/groups, kD, kH, kW), bias (O,):
    the gradient of conv3d with respect to its input, plus the bias; each output size is
    (n − 1)·s − 2·p + d·(k − 1) + output_padding + 1."""
    return _conv_transpose("conv_transpose3d", 3, x, weight, bias, stride=stride, padding=padding,
                           output_padding=output_padding, groups=groups, dilation=dilation)


_define_conv_transpose(conv_transpose3d, 3, lambda rng: [
    Sample.of(_randn(rng, 2, 2, 2, 3, 2), _randn(rng, 2, 2, 2, 1, 2)),
    Sample.of(_randn(rng, 2, 2, 2, 2), _randn(rng, 2, 1, 2, 2, 1), _randn(rng, 2), stride=[1, 2, 2],
              padding=[0, 1, 0], output_padding=[0, 1, 1], groups=2),  # unbatched
])


# -- unfold and fold: im2col and col2im as ops (2-D, as PyTorch) ----------------------------------------------------


def _unfold_geometry(op_name, size, kernel_size, dilation, padding, stride) -> win.Windows:
    padding = win.expand(padding, 2)
    return win.conv_windows(op_name, size, win.expand(kernel_size, 2), win.expand(stride, 2), padding, padding,
                            win.expand(dilation, 2))


def _check_2d(**attrs):
    win.check_lists(2, attrs)


@op("unfold(Tensor<floating> x, int[] kernel_size, int[] dilation=[1, 1], int[] padding=[0, 0], "
    "int[] stride=[1, 1]) -> Tensor y")
def unfold(x, *, kernel_size, dilation, padding, stride):
    """im2col (PyTorch's ``F.unfold``): the sliding kH×kW windows of x (N, C, H, W) — or (C, H, W) — as columns,
    y (N, C·kH·kW, L), L the number of windows; rows run over (channel, kernel row, kernel column)."""
    batched = win.spatial_rank("unfold", x.shape, 2)
    x = x if batched else x[None]
    w = _unfold_geometry("unfold", x.shape[2:], kernel_size, dilation, padding, stride)
    n, c = x.shape[:2]
    cols = win.im2col(win.pad(win.batch_last(x), w), w).copy().reshape(c * w.taps, math.prod(w.out), n)  # (a copy)
    return (win.batch_first(cols)) if batched else cols[..., 0]


unfold.check(_check_2d)


@unfold.infer
def _(x, *, kernel_size, dilation, padding, stride):
    batched = win.spatial_rank("unfold", x.shape, 2)
    w = _unfold_geometry("unfold", x.shape[-2:], kernel_size, dilation, padding, stride)
    rows = None if x.shape[-3] is None else x.shape[-3] * w.taps
    cols = None if None in w.out else math.prod(w.out)
    return Spec((*x.shape[:1 if batched else 0], rows, cols), x.dtype)


@unfold.grad
def _(x, dy, *, kernel_size, dilation, padding, stride):
    return F.fold(dy, output_size=x.shape[-2:], kernel_size=kernel_size, dilation=dilation, padding=padding,
                  stride=stride)


@unfold.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 2, 4, 5), kernel_size=[2, 3])
    yield Sample.of(_randn(rng, 1, 2, 5, 4), kernel_size=2, dilation=[2, 1], padding=1, stride=[2, 1])
    yield Sample.of(_randn(rng, 2, 3, 3), kernel_size=2, stride=2, padding=1)  # unbatched


def _fold_geometry(op_name, x, output_size, kernel_size, dilation, padding, stride):
    """Check fold's input (N, C·kH·kW, L) or (C·kH·kW, L); return (batched, channels, Windows)."""
    if len(x) not in (2, 3):
        raise ShapeError(f"{op_name}(): input must have rank 2 (C·kH·kW, L) or 3 (N, C·kH·kW, L), got shape "
                         f"{tuple(x)}")
    w = _unfold_geometry(op_name, win.expand(output_size, 2), kernel_size, dilation, padding, stride)
    rows, cols = x[-2:]
    if rows is not None and rows % w.taps:
        raise ShapeError(f"{op_name}(): the input's {rows} rows are not a multiple of the kernel's "
                         f"{w.taps} taps {w.kernel}")
    if cols is not None and cols != math.prod(w.out):
        raise ShapeError(f"{op_name}(): the input has {cols} columns, but output_size {list(w.size)} holds "
                         f"{math.prod(w.out)} windows of the kernel {w.kernel}")
    return len(x) == 3, None if rows is None else rows // w.taps, w


@op("fold(Tensor<floating> x, int[] output_size, int[] kernel_size, int[] dilation=[1, 1], "
    "int[] padding=[0, 0], int[] stride=[1, 1]) -> Tensor y")
def fold(x, *, output_size, kernel_size, dilation, padding, stride):
    """col2im (PyTorch's ``F.fold``), the transpose of unfold: the columns of x (N, C·kH·kW, L) — or
    (C·kH·kW, L) — added back into an image y (N, C, *output_size) where their windows lie; overlaps add up."""
    batched, c, w = _fold_geometry("fold", x.shape, output_size, kernel_size, dilation, padding, stride)
    x = x if batched else x[None]
    cols = win.batch_last(x).reshape(c, *w.kernel, *w.out, x.shape[0])  # (no -1: the batch may be empty)
    y = win.batch_first(win.interior(win.col2im(cols, w, (c, *w.padded, cols.shape[-1])), w))
    return y if batched else y[0]


fold.check(_check_2d)


@fold.infer
def _(x, *, output_size, kernel_size, dilation, padding, stride):
    batched, c, w = _fold_geometry("fold", x.shape, output_size, kernel_size, dilation, padding, stride)
    return Spec((*x.shape[:1 if batched else 0], c, *w.size), x.dtype)


@fold.grad
def _(dy, *, kernel_size, dilation, padding, stride):
    return F.unfold(dy, kernel_size=kernel_size, dilation=dilation, padding=padding, stride=stride)


@fold.samples
def _(rng):
    yield Sample.of(_randn(rng, 2, 12, 9), output_size=[4, 5], kernel_size=[2, 3])
    yield Sample.of(_randn(rng, 1, 8, 15), output_size=[5, 4], kernel_size=2, dilation=[2, 1], padding=1,
                    stride=[2, 1])
    yield Sample.of(_randn(rng, 12, 4), output_size=[3, 3], kernel_size=2, stride=2, padding=1)  # unbatched


# -- ONNX export of unfold and fold: a convolution (and its transpose) of each channel with one-hot kernels -------


def _onnx_taps(g, kernel, dtype):
    """(taps, 1, kH, kW) weights, tap t reading kernel position t (row-major) alone: a convolution with them is
    im2col's gathering, exactly (every product is by 1 or 0)."""
    taps = math.prod(kernel)
    return g.const(np.eye(taps, dtype=dtype).reshape(taps, 1, *kernel))


def _onnx_window_attrs(kernel_size, dilation, padding, stride):
    return {"strides": win.expand(stride, 2), "pads": win.expand(padding, 2) * 2, "dilations": win.expand(dilation, 2)}


@unfold.onnx
def _(g, x, *, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    if not batched:
        x = g.op("Unsqueeze", x, g.ints([0]), spec=Spec((1, *x.shape), x.dtype))
    kernel = win.expand(kernel_size, 2)
    # every channel an image of its own (N·C, 1, H, W), so that one filter per tap serves all
    images = g.op("Reshape", x, g.ints([-1, 1, 0, 0]))
    cols = g.op("Conv", images, _onnx_taps(g, kernel, x.dtype), kernel_shape=kernel,
                **_onnx_window_attrs(kernel_size, dilation, padding, stride))
    rows = g.op("Mul", g.op("Shape", x, start=1, end=2), g.ints([math.prod(kernel)]))
    y = g.op("Reshape", cols, g.op("Concat", g.op("Shape", x, start=0, end=1), rows, g.ints([-1]), axis=0),
             spec=Spec((x.shape[0], *g.outputs[0].shape[-2:]), x.dtype))
    return y if batched else g.op("Squeeze", y, g.ints([0]), spec=g.outputs[0])


@fold.onnx
def _(g, x, *, output_size, kernel_size, dilation, padding, stride):
    batched, _, w = _fold_geometry("fold", x.shape, output_size, kernel_size, dilation, padding, stride)
    if not batched:
        x = g.op("Unsqueeze", x, g.ints([0]), spec=Spec((1, *x.shape), x.dtype))
    kernel = win.expand(kernel_size, 2)
    attrs = _onnx_window_attrs(kernel_size, dilation, padding, stride)
    # ConvTranspose's size is (o − 1)·s + d·(k − 1) + 1 − 2p: the positions no window reaches, behind, come as
    # output padding
    reached = [(o - 1) * s + d * (k - 1) + 1 - 2 * p for o, s, d, k, p in
               zip(w.out, attrs["strides"], attrs["dilations"], kernel, win.expand(padding, 2))]
    cols = g.op("Reshape", x, g.ints([-1, math.prod(kernel), *w.out]))  # (N·C, taps, oh, ow)
    images = g.op("ConvTranspose", cols, _onnx_taps(g, kernel, x.dtype), kernel_shape=kernel,
                  output_padding=[n - r for n, r in zip(w.size, reached)], **attrs)
    y = g.op("Reshape", images, g.op("Concat", g.op("Shape", x, start=0, end=1), g.ints([-1, *w.size]), axis=0),
             spec=Spec((x.shape[0], *g.outputs[0].shape[-3:]), x.dtype))
    return y if batched else g.op("Squeeze", y, g.ints([0]), spec=g.outputs[0])
