"""``F.grid_sample`` for 4-D inputs, written with ops: the sampling positions, the corner indices and their
weights are ops of ``grid``, the corner values gathers from ``input``, so both get gradients of every order from the
ops' own rules (the input's is the gathers' scatter-add; the grid's is the bilinear weights' derivative, 0 for
"nearest", as torch's).
"""

from opforge import ops as F

from ..core.errors import ArgumentError, ShapeError
from ._common import D, function

_MODES = ("bilinear", "nearest")
_PADDING = ("zeros", "border", "reflection")


def _source(coord, size: int, align_corners: bool, padding_mode: str):
    """grid's coordinates in [−1, 1] as positions in pixels along a dim of ``size`` (torch's
    grid_sampler_compute_source_index), with border or reflection padding applied."""
    if align_corners:
        pos = (coord + 1.0) * ((size - 1) / 2)
    else:
        pos = ((coord + 1.0) * size - 1.0) / 2
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


@function
def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """``torch.nn.functional.grid_sample`` for an input (N, C, H, W) and a grid (N, Ho, Wo, 2) of (x, y) positions
    in [−1, 1] (−1 the left/top edge, or the first pixel's centre with ``align_corners``): (N, C, Ho, Wo), each
    output the input read at its position — "bilinear" (the four neighbours' blend) or "nearest" (the nearest
    pixel, halves to even); positions outside read 0 ("zeros"), the edge ("border") or the image mirrored
    ("reflection"). ``align_corners`` None is False, as torch's default. With "nearest" the grid gets no gradient
    (None; torch's is zeros). 5-D inputs and "bicubic" are refused."""
    if mode not in _MODES:
        raise ArgumentError(f"grid_sample(): mode must be one of {', '.join(map(repr, _MODES))} (bicubic is not "
                            f"supported), got {mode!r}")
    if padding_mode not in _PADDING:
        raise ArgumentError(f"grid_sample(): padding_mode must be one of {', '.join(map(repr, _PADDING))}, got "
                            f"{padding_mode!r}")
    if len(input.shape) != 4:
        raise ShapeError(f"grid_sample(): input must be (N, C, H, W) (5-D volumes are not supported), got shape "
                         f"{tuple(input.shape)}")
    n, c, h, w = input.shape
    if len(grid.shape) != 4 or grid.shape[3] != 2 or grid.shape[0] != n:
        raise ShapeError(f"grid_sample(): grid must be (N, Ho, Wo, 2) with N = {n}, got shape {tuple(grid.shape)}")
    out_h, out_w = grid.shape[1], grid.shape[2]
    align = bool(align_corners)
    gx, gy = F.unbind(grid, 3)
    x = _source(gx, w, align, padding_mode)
    y = _source(gy, h, align, padding_mode)
    flat = F.reshape(input, shape=[n, c, h * w])

    def read(xi, yi):
        """input at integer positions (N, Ho, Wo) as (N, C, Ho, Wo), 0 outside."""
        inside = F.logical_and(F.logical_and(xi >= 0, xi <= w - 1), F.logical_and(yi >= 0, yi <= h - 1))
        index = F.cast(F.clip(yi, 0, h - 1) * w + F.clip(xi, 0, w - 1), dtype=D.int64)
        index = F.broadcast_to(F.reshape(index, shape=[n, 1, out_h * out_w]), shape=[n, c, out_h * out_w])
        values = F.reshape(F.gather(flat, 2, index), shape=[n, c, out_h, out_w])
        return F.where(F.unsqueeze(inside, axis=1), values, 0.0)

    if mode == "nearest":
        return read(F.round(x.detach()), F.round(y.detach()))
    x0, y0 = F.floor(x.detach()), F.floor(y.detach())
    wx1, wy1 = x - x0, y - y0  # the weights carry the grid's gradient
    wx0, wy0 = 1.0 - wx1, 1.0 - wy1
    total = None
    for xi, yi, weight in ((x0, y0, wx0 * wy0), (x0 + 1, y0, wx1 * wy0), (x0, y0 + 1, wx0 * wy1),
                           (x0 + 1, y0 + 1, wx1 * wy1)):
        term = read(xi, yi) * F.unsqueeze(weight, axis=1)
        total = term if total is None else total + term
    return total
