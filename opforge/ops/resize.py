"""Resizing images: ``interpolate`` (nearest, linear, bicubic and area; 1-, 2- and 3-D) and
``pixel_shuffle``/``pixel_unshuffle``.

Interpolation is separable: along each spatial dim every output reads one input (nearest) or blends two (linear),
four (bicubic) or a window of them (area), at positions and weights that depend on that dim's sizes only —
PyTorch's, to the rounding: source positions for "nearest" are computed in float32 as PyTorch does, so that outputs
pick the same inputs. The kernel applies one dim at a time, the last first, which is also the order of PyTorch's
arithmetic for bilinear. The gradient op, ``interpolate_grad``, applies the transposed maps: each output's gradient
added back to the inputs it read, with their weights; since the positions never decrease along a dim, the additions
are one ``np.add.reduceat`` per dim. interpolate and interpolate_grad are each other's transposes.
"""

import math

from opforge import ops as F

from ..core.errors import ArgumentError
from . import _window as win
from ._common import Sample, ShapeError, Spec, function, np, op

_LINEAR = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}  # mode -> the spatial rank it needs
_NEAREST = ("nearest", "nearest-exact", "area")  # (the modes that take no align_corners)
_CUBIC_A = -0.75  # torch's (and OpenCV's) cubic convolution coefficient


def _check(*, size, scale_factor, mode, align_corners, **_) -> None:
    if mode not in _NEAREST and mode not in _LINEAR:
        raise ValueError(f"argument 'mode' must be one of {', '.join(map(repr, (*_NEAREST, *_LINEAR)))}, "
                         f"got {mode!r}")
    if (size is None) == (scale_factor is None):
        raise ValueError("exactly one of 'size' and 'scale_factor' must be given, got "
                         + ("both" if size is not None else "neither"))
    if size is not None and any(isinstance(s, int) and s < 1 for s in size):
        raise ValueError(f"argument 'size' must hold sizes >= 1, got {list(size)}")
    if scale_factor is not None and not all(math.isfinite(s) and s > 0 for s in scale_factor):
        raise ValueError(f"argument 'scale_factor' must hold finite numbers > 0, got {list(scale_factor)}")
    if align_corners is not None and mode in _NEAREST:
        raise ValueError(f"argument 'align_corners' can only be set with the linear and cubic modes, not "
                         f"mode={mode!r}")


def _sizes(op_name, shape, size, scale_factor, mode) -> tuple:
    """Check the input's rank against the mode; return the output's spatial size."""
    nd = len(shape) - 2
    if not 1 <= nd <= 3:
        raise ShapeError(f"{op_name}(): input must have rank 3, 4 or 5 (N, C, *spatial), got shape {tuple(shape)}")
    if mode in _LINEAR and _LINEAR[mode] != nd:
        raise ShapeError(f"{op_name}(): mode={mode!r} needs an input of rank {_LINEAR[mode] + 2}, got shape "
                         f"{tuple(shape)}")
    win.fit_rank(op_name, nd, size=size, scale_factor=scale_factor)
    if size is not None:
        return win.expand(size, nd)
    try:
        return tuple(None if n is None else math.floor(n * s) for n, s in zip(shape[2:], win.expand(scale_factor, nd)))
    except OverflowError:  # a size no float holds (an input_size of 10**400): no output size to compute
        shown = [n if n is None or abs(n).bit_length() <= 64 else f"an int of {abs(n).bit_length()} bits"
                 for n in shape[2:]]  # str() of a huge int is slow, or refused
        raise ShapeError(f"{op_name}(): the spatial size {shown} times scale_factor {list(scale_factor)} is too "
                         "large to compute") from None


def _maps(n_in, n_out, mode, align_corners, scale) -> list:
    """Along one dim: [(input index, weight or None) per output], as terms: one (nearest), two (linear), four
    (bicubic), or as many as the longest window (area). ``scale`` is the user's scale factor for this dim (None:
    sizes decide). Each term's indices never decrease (interpolate_grad relies on it)."""
    dst = np.arange(n_out)
    if mode == "area":  # adaptive average pooling's windows, ⌊i·n/o⌋ … ⌈(i+1)·n/o⌉ − 1, each input weighing 1/len
        start, end = dst * n_in // n_out, -(-(dst + 1) * n_in // n_out)
        weight = 1.0 / (end - start)
        return [(np.minimum(start + j, end - 1), np.where(start + j < end, weight, 0.0))
                for j in range(int((end - start).max(initial=1)))]
    if mode == "bicubic":
        return _cubic_maps(n_in, dst, align_corners, scale)
    if mode in _NEAREST:  # PyTorch computes these positions in float32
        ratio = np.float32(1.0 / scale) if scale is not None else np.float32(n_in) / np.float32(n_out)
        if mode == "nearest":
            src = np.floor(dst.astype(np.float32) * ratio) if n_out not in (n_in, 2 * n_in) else dst * n_in // n_out
        else:
            src = np.floor(((dst + 0.5) * np.float64(ratio)).astype(np.float32))
        return [(np.minimum(src.astype(np.int64), n_in - 1), None)]
    if align_corners:
        ratio = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        src = ratio * dst
    else:
        ratio = 1.0 / scale if scale is not None else n_in / n_out
        src = np.maximum(ratio * (dst + 0.5) - 0.5, 0.0)
    i0 = src.astype(np.int64)
    i1 = i0 + (i0 < n_in - 1)
    w1 = src - i0
    return [(i0, 1.0 - w1), (i1, w1)]


def _cubic_maps(n_in, dst, align_corners, scale) -> list:
    """Bicubic along one dim, as torch's upsample_bicubic2d: the source position (not clamped at 0, unlike
    linear's), its four neighbours ⌊src⌋ − 1 … ⌊src⌋ + 2 clamped into the input, weighted by the cubic
    convolution kernel (A = −0.75) at their distances."""
    if align_corners:
        src = ((n_in - 1) / (len(dst) - 1) if len(dst) > 1 else 0.0) * dst
    else:
        src = (1.0 / scale if scale is not None else n_in / len(dst)) * (dst + 0.5) - 0.5
    base = np.floor(src)
    weights = cubic_weights(src - base)
    return [(np.clip(base.astype(np.int64) + k - 1, 0, n_in - 1), w) for k, w in enumerate(weights)]


def cubic_weights(t) -> tuple:
    """The weights of the four inputs ⌊s⌋ − 1 … ⌊s⌋ + 2 around a position s, with t = s − ⌊s⌋: torch's cubic
    convolution kernel (A = −0.75) at their distances. Arithmetic only, so that it serves NumPy arrays (resize's
    maps) and Tensors (grid_sample, whose grid gets its gradient through t) alike."""
    a = _CUBIC_A

    def near(x):  # |x| ≤ 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _all_maps(in_size, out_size, scale_factor, mode, align_corners, recompute_scale_factor):
    nd = len(in_size)
    scales = (None,) * nd if scale_factor is None or recompute_scale_factor else win.expand(scale_factor, nd)
    return [_maps(n, o, mode, bool(align_corners), s) for n, o, s in zip(in_size, out_size, scales)]


def _along(shape, axis, values):
    """``values`` (one per position along ``axis``) shaped to broadcast against an array of ``shape``."""
    return values.reshape([-1 if a == axis else 1 for a in range(len(shape))])


@op('interpolate(Tensor<floating> x, int[] size=None, float[] scale_factor=None, str mode="nearest", '
    "bool? align_corners=None, bool? recompute_scale_factor=None) -> Tensor y")
def interpolate(x, *, size, scale_factor, mode, align_corners, recompute_scale_factor):
    """Resize x (N, C, *spatial) to ``size``, or by ``scale_factor`` (the output ⌊n·s⌋), as PyTorch's
    ``F.interpolate``: mode "nearest" (output i reads input ⌊i·n/o⌋), "nearest-exact" (⌊(i + ½)·n/o⌋), or
    "linear"/"bilinear"/"trilinear" for 1/2/3 spatial dims (a blend of the two nearest inputs; ``align_corners``
    maps the corner pixels' centres onto each other), "bicubic" for 2 (four inputs per dim, torch's cubic
    convolution with A = −0.75, the border repeated), or "area" (the mean over adaptive average pooling's windows,
    as torch computes it). With a scale factor the positions use it unless
    ``recompute_scale_factor``."""
    out = _sizes("interpolate", x.shape, size, scale_factor, mode)
    maps = _all_maps(x.shape[2:], out, scale_factor, mode, align_corners, recompute_scale_factor)
    for axis in reversed(range(2, x.ndim)):  # the last dim first, as PyTorch's arithmetic
        terms = []
        for i, wt in maps[axis - 2]:  # (host geometry: copied to x's device)
            read = np.take(x, np.asarray(i, like=x), axis)
            terms.append(read if wt is None else read * _along(x.shape, axis, np.asarray(wt, x.dtype, like=x)))
        x = terms[0]
        for term in terms[1:]:
            x = x + term
    return x


interpolate.check(_check)


@interpolate.infer
def _(x, *, size, scale_factor, mode, align_corners, recompute_scale_factor):
    return Spec((*x.shape[:2], *_sizes("interpolate", x.shape, size, scale_factor, mode)), x.dtype)


@interpolate.grad
def _(dy, x_spec, *, size, scale_factor, mode, align_corners, recompute_scale_factor):
    return F.interpolate_grad(dy, input_size=x_spec.shape[2:], size=size, scale_factor=scale_factor, mode=mode,
                              align_corners=align_corners, recompute_scale_factor=recompute_scale_factor)


@interpolate.samples
def _(rng):
    yield Sample.of(rng.standard_normal((1, 2, 4, 5)), size=[7, 3], mode="bicubic")
    yield Sample.of(rng.standard_normal((1, 2, 3, 4)), scale_factor=[1.7, 0.6], mode="bicubic", align_corners=True)
    yield Sample.of(rng.standard_normal((2, 2, 7)), size=3, mode="area")
    yield Sample.of(rng.standard_normal((1, 2, 5, 3)), scale_factor=[0.5, 1.5], mode="area")
    yield Sample.of(rng.standard_normal((2, 2, 3, 4)), size=[5, 7])
    yield Sample.of(rng.standard_normal((2, 2, 5)), scale_factor=1.5, mode="linear")
    yield Sample.of(rng.standard_normal((1, 2, 3, 5)), size=[4, 3], mode="bilinear", align_corners=True)
    yield Sample.of(rng.standard_normal((1, 2, 4, 3)), scale_factor=[0.6, 2.5], mode="bilinear",
                    recompute_scale_factor=True)
    yield Sample.of(rng.standard_normal((1, 1, 2, 3, 2)), scale_factor=[1.5, 1.0, 2.0], mode="trilinear")
    yield Sample.of(rng.standard_normal((1, 2, 7)), size=3, mode="nearest-exact")


def _grad_sizes(dy, input_size, size, scale_factor, mode) -> tuple:
    nd = len(dy.shape) - 2
    if not 1 <= nd <= 3:
        raise ShapeError(f"interpolate_grad(): dy must have rank 3, 4 or 5 (N, C, *out), got shape {dy.shape}")
    win.fit_rank("interpolate_grad", nd, input_size=input_size)
    x = (*dy.shape[:2], *win.expand(input_size, nd))
    win.check_dy("interpolate_grad", dy.shape, (*x[:2], *_sizes("interpolate_grad", x, size, scale_factor, mode)))
    return x


@op('interpolate_grad(Tensor<floating> dy, *, int[] input_size, int[] size=None, float[] scale_factor=None, '
    'str mode="nearest", bool? align_corners=None, bool? recompute_scale_factor=None) -> Tensor dx')
def interpolate_grad(dy, *, input_size, size, scale_factor, mode, align_corners, recompute_scale_factor):
    """Gradient of interpolate for an input of spatial size ``input_size``: each output's dy added back to the
    inputs it read, times the weights it read them with."""
    shape = _grad_sizes(Spec(dy.shape, dy.dtype), input_size, size, scale_factor, mode)
    maps = _all_maps(shape[2:], dy.shape[2:], scale_factor, mode, align_corners, recompute_scale_factor)
    for axis in range(2, dy.ndim):
        out = np.zeros((*dy.shape[:axis], shape[axis], *dy.shape[axis + 1:]), dy.dtype, like=dy)
        for i, wt in maps[axis - 2]:
            weighted = dy if wt is None else dy * _along(dy.shape, axis, np.asarray(wt, dy.dtype, like=dy))
            starts = np.flatnonzero(np.diff(i, prepend=-1))  # i never decreases: runs of one input
            index = [slice(None)] * dy.ndim
            index[axis] = i[starts]
            out[tuple(index)] += np.add.reduceat(weighted, np.asarray(starts, like=dy), axis=axis)
        dy = out
    return dy


interpolate_grad.check(_check)


@interpolate_grad.infer
def _(dy, *, input_size, size, scale_factor, mode, align_corners, recompute_scale_factor):
    return Spec(_grad_sizes(dy, input_size, size, scale_factor, mode), dy.dtype)


@interpolate_grad.grad
def _(ddx, *, size, scale_factor, mode, align_corners, recompute_scale_factor):
    return F.interpolate(ddx, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor)


@interpolate_grad.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 2, 5, 7)), input_size=[3, 4], size=[5, 7])
    yield Sample.of(rng.standard_normal((2, 2, 7)), input_size=[5], scale_factor=1.5, mode="linear")
    yield Sample.of(rng.standard_normal((1, 2, 2, 5)), input_size=[4, 3], scale_factor=[0.6, 1.7], mode="bilinear",
                    align_corners=True)


# -- pixel_shuffle and pixel_unshuffle -------------------------------------------------------------------------------


def _check_factor(name):
    def check(**attrs):
        if attrs[name] < 1:
            raise ValueError(f"argument '{name}' must be >= 1, got {attrs[name]}")
    return check


def _shuffle_shape(op_name, shape, r: int, up: bool) -> tuple:
    if len(shape) < 3:
        raise ShapeError(f"{op_name}(): input must have rank 3 or more (*, C, H, W), got shape {tuple(shape)}")
    *lead, c, h, w = shape
    if up:
        if c is not None and c % (r * r):
            raise ShapeError(f"{op_name}(): the input's {c} channels are not a multiple of upscale_factor² = {r * r}")
        return (*lead, None if c is None else c // (r * r), *(None if n is None else n * r for n in (h, w)))
    if any(n is not None and n % r for n in (h, w)):
        raise ShapeError(f"{op_name}(): the input's height and width {(h, w)} are not multiples of "
                         f"downscale_factor = {r}")
    return (*lead, None if c is None else c * r * r, *(None if n is None else n // r for n in (h, w)))


@function
def channel_shuffle(input, groups):
    """``torch.nn.functional.channel_shuffle``: the C channels of ``input`` (N, C, *) seen as ``groups`` groups of
    C / groups and read group-interleaved (ShuffleNet's shuffle): channel g·(C/groups) + k goes to k·groups + g."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups <= 0:
        raise ArgumentError(f"channel_shuffle(): groups must be a positive int, got {groups!r}")
    if len(input.shape) < 3 or input.shape[1] % groups:
        raise ShapeError(f"channel_shuffle(): expects (N, C, *) with C divisible by groups={groups}, got shape "
                         f"{tuple(input.shape)}")
    n, c, *rest = input.shape
    y = F.reshape(input, [n, groups, c // groups, *rest])
    return F.reshape(F.transpose(y, perm=[0, 2, 1, *range(3, 3 + len(rest))]), [n, c, *rest])


@op("pixel_shuffle(Tensor x, int upscale_factor) -> Tensor y")
def pixel_shuffle(x, *, upscale_factor):
    """x (*, C·r², H, W) rearranged to (*, C, H·r, W·r), r = upscale_factor: y[..., c, h·r + i, w·r + j] =
    x[..., c·r² + i·r + j, h, w] (sub-pixel convolution's upsampling, as PyTorch)."""
    r = upscale_factor
    *lead, c, h, w = _shuffle_shape("pixel_shuffle", x.shape, r, True)
    y = x.reshape(*lead, c, r, r, h // r, w // r)
    n = len(lead)
    return y.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2).reshape(*lead, c, h, w)


pixel_shuffle.check(_check_factor("upscale_factor"))


@pixel_shuffle.infer
def _(x, *, upscale_factor):
    return Spec(_shuffle_shape("pixel_shuffle", x.shape, upscale_factor, True), x.dtype)


@pixel_shuffle.grad
def _(dy, *, upscale_factor):
    return F.pixel_unshuffle(dy, downscale_factor=upscale_factor)  # a permutation: its transpose is its inverse


@pixel_shuffle.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 8, 2, 3)), upscale_factor=2)
    yield Sample.of(rng.standard_normal((9, 1, 2)), upscale_factor=3)
    yield Sample.of(rng.standard_normal((2, 1, 4, 1, 2)), upscale_factor=2)


@op("pixel_unshuffle(Tensor x, int downscale_factor) -> Tensor y")
def pixel_unshuffle(x, *, downscale_factor):
    """The inverse of pixel_shuffle: x (*, C, H·r, W·r) rearranged to (*, C·r², H, W), r = downscale_factor."""
    r = downscale_factor
    *lead, c, h, w = _shuffle_shape("pixel_unshuffle", x.shape, r, False)
    n = len(lead)
    y = x.reshape(*lead, c // (r * r), h, r, w, r)
    return y.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3).reshape(*lead, c, h, w)


pixel_unshuffle.check(_check_factor("downscale_factor"))


@pixel_unshuffle.infer
def _(x, *, downscale_factor):
    return Spec(_shuffle_shape("pixel_unshuffle", x.shape, downscale_factor, False), x.dtype)


@pixel_unshuffle.grad
def _(dy, *, downscale_factor):
    return F.pixel_shuffle(dy, upscale_factor=downscale_factor)


@pixel_unshuffle.samples
def _(rng):
    yield Sample.of(rng.standard_normal((2, 2, 4, 6)), downscale_factor=2)
    yield Sample.of(rng.standard_normal((1, 3, 6)), downscale_factor=3)



# -- ONNX export --------------------------------------------------------------------------------------------------


@interpolate.onnx
def _(g, x, *, size, scale_factor, mode, align_corners, recompute_scale_factor):
    nd = x.ndim - 2
    scales = None if scale_factor is None else win.expand(scale_factor, nd)
    if mode == "nearest" and scales is not None and all(float(s).is_integer() for s in scales):
        # output i reads input ⌊i/s⌋, exactly, also in float32: ONNX's Resize says so for any (run-time) size
        return g.op("Resize", x, None, g.const(np.array([1, 1, *scales], np.float32)), mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor", spec=g.outputs[0])
    if None in x.shape[2:]:
        if mode in _LINEAR and x.dtype != np.float64:
            return _onnx_linear_resize(g, x, size, scales, align_corners, recompute_scale_factor)
        raise g.unsupported(f"interpolate mode={mode!r} over spatial sizes {list(x.shape[2:])} known only at run "
                            "time (written then: 'nearest' by whole scale factors, and the linear modes below "
                            "float64, whose Resize computes its positions in float32)")
    # the kernel's own maps, one dim at a time, the last first: each output a Gather of the inputs it reads, times
    # their weights (ONNX's Resize computes its positions in float32: float64 models would differ)
    maps = _all_maps(x.shape[2:], g.outputs[0].shape[2:], scale_factor, mode, align_corners, recompute_scale_factor)
    for axis in reversed(range(2, x.ndim)):
        spec = Spec(tuple(len(maps[axis - 2][0][0]) if a == axis else d for a, d in enumerate(x.shape)), x.dtype)
        terms = []
        for i, wt in maps[axis - 2]:
            term = g.op("Gather", x, g.const(i), axis=axis, spec=spec)
            if wt is not None:
                term = g.op("Mul", term, g.const(_along(spec.shape, axis, wt.astype(x.dtype))), spec=spec)
            terms.append(term)
        x = terms[0]
        for term in terms[1:]:  # (bicubic reads four inputs per output; ONNX's Add takes two)
            x = g.op("Add", x, term, spec=spec)
    return x


def _onnx_shuffle(g, x, r, up):
    """pixel_shuffle (up) or pixel_unshuffle as the kernel writes them: Reshape, Transpose, Reshape, with the
    shapes read from x's at run time."""
    n = x.ndim - 3
    lead = g.op("Shape", x, start=0, end=n, spec=Spec((n,), np.dtype(np.int64)))
    c, h, w = (g.op("Shape", x, start=i, end=i + 1, spec=Spec((1,), np.dtype(np.int64))) for i in range(n, n + 3))
    rr = g.ints([r])
    if up:
        split = g.op("Concat", lead, g.ints([-1, r, r]), h, w, axis=0)
        perm = [*range(n), n, n + 3, n + 1, n + 4, n + 2]
        whole = g.op("Concat", lead, g.ints([-1]), g.op("Mul", h, rr), g.op("Mul", w, rr), axis=0)
    else:
        split = g.op("Concat", lead, c, g.op("Div", h, rr), rr, g.op("Div", w, rr), rr, axis=0)
        perm = [*range(n), n, n + 2, n + 4, n + 1, n + 3]
        whole = g.op("Concat", lead, g.ints([-1]), g.op("Div", h, rr), g.op("Div", w, rr), axis=0)
    y = g.op("Transpose", g.op("Reshape", x, split), perm=perm)
    return g.op("Reshape", y, whole, spec=g.outputs[0])


pixel_shuffle.onnx(lambda g, x, *, upscale_factor: _onnx_shuffle(g, x, upscale_factor, True))
pixel_unshuffle.onnx(lambda g, x, *, downscale_factor: _onnx_shuffle(g, x, downscale_factor, False))


def _onnx_linear_resize(g, x, size, scales, align_corners, recompute_scale_factor):
    """The linear modes over sizes known only at run time: ONNX's Resize, whose source positions are the kernel's
    (align_corners: i·(n − 1)/(o − 1); else (i + ½)/s − ½, clamped to the input) computed in float32: within
    float32's rounding of ours, so for float32 and the half types only."""
    transform = "align_corners" if align_corners else "half_pixel"
    if scales is not None and not recompute_scale_factor and not align_corners:  # positions by the given scale
        return g.op("Resize", x, None, g.const(np.array([1, 1, *scales], np.float32)), mode="linear",
                    coordinate_transformation_mode=transform, spec=g.outputs[0])
    if size is None:  # the output size ⌊n·s⌋, positions by n/o
        spatial = g.op("Shape", x, start=2, spec=Spec((x.ndim - 2,), np.dtype(np.int64)))
        size_value = g.cast(g.op("Floor", g.op("Mul", g.cast(spatial, np.float64), g.const(np.array(scales)))),
                            np.int64)
    else:
        size_value = g.ints(win.expand(size, x.ndim - 2))
    sizes = g.op("Concat", g.op("Shape", x, start=0, end=2), size_value, axis=0)
    return g.op("Resize", x, None, None, sizes, mode="linear", coordinate_transformation_mode=transform,
                spec=g.outputs[0])
