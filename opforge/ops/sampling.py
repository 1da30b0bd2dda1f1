"""``F.grid_sample`` for 4-D and 5-D inputs, written with ops: the sampling positions, the neighbours' indices and
their weights are ops of ``grid``, the neighbours' values gathers from ``input``, so both get gradients of every
order from the ops' own rules (the input's is the gathers' scatter-add; the grid's is the weights' derivative, 0 for
"nearest", as torch's).
"""

import itertools
import math

from opforge import ops as F

from ..core.errors import ArgumentError, ShapeError
from ._common import D, function
from .resize import cubic_weights

_MODES = ("bilinear", "nearest", "bicubic")
_PADDING = ("zeros", "border", "reflection")


def _unnormalized(coord, size: int, align_corners: bool):
    """grid's coordinates in [−1, 1] as positions in pixels along a dim of ``size`` (torch's
    grid_sampler_unnormalize)."""
    if align_corners:
        return (coord + 1.0) * ((size - 1) / 2)
    return ((coord + 1.0) * size - 1.0) / 2


def _padded(pos, size: int, align_corners: bool, padding_mode: str):
    """Positions with border or reflection padding applied (torch's compute_coordinates): clipped into the
    image, or mirrored at its edges and then clipped; "zeros" leaves them (reading outside gives 0)."""
    if padding_mode == "border":
        return F.clip(pos, 0.0, float(size - 1))
    if padding_mode == "reflection":  # torch's reflect_coordinates, then clipped into the image
        low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
        if span <= 0:
            return F.zeros_like(pos)
        d = F.abs(pos - low)
        extra = F.remainder(d, span)
        even = F.remainder(F.floor(d.detach() / span), 2.0) == 0
        return F.clip(F.where(even, extra + low, span - extra + low), 0.0, float(size - 1))
    return pos


def _base_coordinates(steps: int, align_corners: bool, dtype):
    """torch's linspace_from_neg_one: the pixel centres along a dim of ``steps`` in [−1, 1] coordinates."""
    i = F.arange(start=0, stop=steps, step=1, dtype=dtype)
    if steps <= 1:
        return i * 0.0
    values = i * (2.0 / (steps - 1)) - 1.0
    return values if align_corners else values * ((steps - 1) / steps)


@function
def affine_grid(theta, size, align_corners=None):
    """``torch.nn.functional.affine_grid``: the sampling grid of the affine maps ``theta`` (N, 2, 3) for an output
    of ``size`` (N, C, H, W), (N, H, W, 2); or of ``theta`` (N, 3, 4) for (N, C, D, H, W), (N, D, H, W, 3): each
    output pixel's (x, y[, z]) in [−1, 1] mapped by theta, for ``grid_sample``. ``align_corners`` None is False, as
    torch's default. The gradient flows to theta."""
    size = [int(v) for v in size]
    spatial = len(size) - 2
    if spatial not in (2, 3):
        raise ShapeError(f"affine_grid(): size must be (N, C, H, W) or (N, C, D, H, W), got {tuple(size)}")
    if not D.is_floating(theta.dtype) or tuple(theta.shape) != (size[0], spatial, spatial + 1):
        raise ShapeError(f"affine_grid(): theta must be a floating tensor of shape {(size[0], spatial, spatial + 1)} "
                         f"for size {tuple(size)}, got {theta.dtype} {tuple(theta.shape)}")
    dims = size[2:]  # (H, W) or (D, H, W); a grid point is (x, y[, z]): x runs along the last dim
    columns = []
    for k, n in enumerate(reversed(dims)):  # x, y, z
        axis = spatial - 1 - k
        shape = [n if a == axis else 1 for a in range(spatial)]
        columns.append(F.broadcast_to(F.reshape(_base_coordinates(n, bool(align_corners), theta.dtype), shape),
                                      dims))
    columns.append(F.ones_like(columns[0]))
    points = F.concat([F.reshape(c, [1, -1, 1]) for c in columns], axis=2)  # (1, D·H·W, spatial + 1)
    grid = F.matmul(points, F.transpose(theta, perm=[0, 2, 1]))  # (N, D·H·W, spatial)
    return F.reshape(grid, [size[0], *dims, spatial])


@function
def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """``torch.nn.functional.grid_sample``: an input (N, C, H, W) read at a grid (N, Ho, Wo, 2) of (x, y)
    positions, or a volume (N, C, D, H, W) at a grid (N, Do, Ho, Wo, 3) of (x, y, z) positions, each in [−1, 1]
    (−1 the left/top/front edge, or the first pixel's centre with ``align_corners``): (N, C, Ho, Wo) or
    (N, C, Do, Ho, Wo). ``mode``: "bilinear" (the 2 or 2×2×2 neighbours' blend: trilinear for volumes), "nearest"
    (the nearest pixel, halves to even) or "bicubic" (4-D only, as torch: the 4×4 neighbours weighted by the cubic
    convolution kernel, A = −0.75). Positions outside read 0 ("zeros"), the edge ("border") or the image mirrored
    ("reflection"); for "bicubic", each neighbour is padded so, as torch's. ``align_corners`` None is False, as
    torch's default. With "nearest" the grid gets no gradient (None; torch's is zeros)."""
    if mode not in _MODES:
        raise ArgumentError(f"grid_sample(): mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
    if padding_mode not in _PADDING:
        raise ArgumentError(f"grid_sample(): padding_mode must be one of {', '.join(map(repr, _PADDING))}, got "
                            f"{padding_mode!r}")
    if len(input.shape) not in (4, 5):
        raise ShapeError(f"grid_sample(): input must be (N, C, H, W) or (N, C, D, H, W), got shape "
                         f"{tuple(input.shape)}")
    k = len(input.shape) - 2  # spatial dims
    n, c, sizes = input.shape[0], input.shape[1], tuple(input.shape[2:])  # (D,) H, W
    if len(grid.shape) != k + 2 or grid.shape[-1] != k or grid.shape[0] != n:
        want = "(N, Ho, Wo, 2)" if k == 2 else "(N, Do, Ho, Wo, 3)"
        raise ShapeError(f"grid_sample(): for an input of shape {tuple(input.shape)}, grid must be {want} with "
                         f"N = {n}, got shape {tuple(grid.shape)}")
    if mode == "bicubic" and k != 2:
        raise ArgumentError("grid_sample(): mode 'bicubic' takes a 4-D input (N, C, H, W), as torch's; got a 5-D "
                            "one")
    out = tuple(grid.shape[1:-1])
    align = bool(align_corners)
    # the positions, in the input's dim order ((z,) y, x: grid's last axis holds them reversed)
    coords = F.unbind(grid, k + 1)[::-1]
    flat = F.reshape(input, shape=[n, c, math.prod(sizes)])

    def read(indices):
        """input at integer positions (each (N, *out), in the input's dim order) as (N, C, *out), 0 outside."""
        inside, index = None, None
        for i, size in zip(indices, sizes):
            within = F.logical_and(i >= 0, i <= size - 1)
            inside = within if inside is None else F.logical_and(inside, within)
            i = F.clip(i, 0, size - 1)
            index = i if index is None else index * size + i
        index = F.cast(index, dtype=D.int64)
        index = F.broadcast_to(F.reshape(index, shape=[n, 1, math.prod(out)]), shape=[n, c, math.prod(out)])
        values = F.reshape(F.gather(flat, 2, index), shape=[n, c, *out])
        return F.where(F.unsqueeze(inside, axis=1), values, 0.0)

    if mode == "bicubic":
        return _bicubic(read, coords, sizes, align, padding_mode)
    pos = [_padded(_unnormalized(g, size, align), size, align, padding_mode) for g, size in zip(coords, sizes)]
    if mode == "nearest":
        return read([F.round(p.detach()) for p in pos])
    lows = [F.floor(p.detach()) for p in pos]
    highs = [p - low for p, low in zip(pos, lows)]  # the weights carry the grid's gradient
    total = None
    for corner in itertools.product((0, 1), repeat=k):  # the 2^k neighbours
        weight = None
        for up, high in zip(corner, highs):
            w = high if up else 1.0 - high
            weight = w if weight is None else weight * w
        term = read([low + 1 if up else low for up, low in zip(corner, lows)]) * F.unsqueeze(weight, axis=1)
        total = term if total is None else total + term
    return total


def _bicubic(read, coords, sizes, align: bool, padding_mode: str):
    """torch's bicubic grid sampling: the unpadded position's 4×4 neighbours, each padded (border, reflection)
    and read, blended along x in each of the four rows, then the rows along y."""
    (gy, gx), (h, w) = coords, sizes
    y, x = _unnormalized(gy, h, align), _unnormalized(gx, w, align)
    y0, x0 = F.floor(y.detach()), F.floor(x.detach())
    wy, wx = cubic_weights(y - y0), cubic_weights(x - x0)  # the weights carry the grid's gradient
    total = None
    for j in range(4):
        yj = _padded(y0 + (j - 1), h, align, padding_mode)
        row = None
        for i in range(4):
            xi = _padded(x0 + (i - 1), w, align, padding_mode)
            term = read([yj, xi]) * F.unsqueeze(wx[i], axis=1)
            row = term if row is None else row + term
        term = row * F.unsqueeze(wy[j], axis=1)
        total = term if total is None else total + term
    return total
