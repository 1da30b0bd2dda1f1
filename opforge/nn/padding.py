"""torch's padding layers (``ZeroPad2d``, ``ConstantPad1d``, ``ReflectionPad2d``, ``ReplicationPad3d``,
``CircularPad1d``...) and ``ChannelShuffle``: each is one call of ``F.pad`` (or ``F.channel_shuffle``)."""

from __future__ import annotations

from .. import ops as F
from ..core.errors import ArgumentError, ShapeError
from .module import Module


class _Pad(Module):
    """Pads the last ``_dims`` dims of an input of ``_dims + 1`` or ``_dims + 2`` dims (unbatched or batched):
    ``padding`` an int (every side) or torch's tuple, last dim first: (left, right[, top, bottom[, front, back]])."""

    _dims = 1
    _mode = "constant"

    def __init__(self, padding, value: float = 0.0):
        super().__init__()
        n = 2 * self._dims
        if isinstance(padding, int) and not isinstance(padding, bool):
            padding = (padding,) * n
        padding = tuple(padding)
        if len(padding) != n or not all(isinstance(p, int) and not isinstance(p, bool) for p in padding):
            raise ArgumentError(f"{type(self).__name__}(): padding must be an int or {n} ints, got {padding!r}")
        self.padding, self.value = padding, float(value)

    def forward(self, x):
        if len(x.shape) not in (self._dims + 1, self._dims + 2):
            raise ShapeError(f"{type(self).__name__}: expects a {self._dims + 1}-D or {self._dims + 2}-D input, got "
                             f"shape {tuple(x.shape)}")
        if self._mode == "constant":
            return F.pad(x, list(self.padding), value=self.value)
        return F.pad(x, list(self.padding), mode=self._mode)

    def extra_repr(self) -> str:
        return f"{self.padding}" + (f", value={self.value}" if self._mode == "constant" and self.value else "")


def _zero(dims: int):
    class ZeroPad(_Pad):
        _dims = dims

        def __init__(self, padding):
            super().__init__(padding, 0.0)

    ZeroPad.__name__ = ZeroPad.__qualname__ = f"ZeroPad{dims}d"
    return ZeroPad


def _padding(kind: str, mode: str, dims: int):
    return type(f"{kind}Pad{dims}d", (_Pad,), {"_dims": dims, "_mode": mode, "__module__": __name__})


ZeroPad1d, ZeroPad2d, ZeroPad3d = _zero(1), _zero(2), _zero(3)
ConstantPad1d, ConstantPad2d, ConstantPad3d = (_padding("Constant", "constant", d) for d in (1, 2, 3))
ReflectionPad1d, ReflectionPad2d, ReflectionPad3d = (_padding("Reflection", "reflect", d) for d in (1, 2, 3))
ReplicationPad1d, ReplicationPad2d, ReplicationPad3d = (_padding("Replication", "replicate", d) for d in (1, 2, 3))
CircularPad1d, CircularPad2d, CircularPad3d = (_padding("Circular", "circular", d) for d in (1, 2, 3))


class ChannelShuffle(Module):
    """``F.channel_shuffle(x, groups)`` as a layer."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        return F.channel_shuffle(x, self.groups)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


__all__ = ["ChannelShuffle", "CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d",
           "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d",
           "ReplicationPad2d", "ReplicationPad3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d"]
