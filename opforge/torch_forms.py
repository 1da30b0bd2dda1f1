"""torch's call forms that are not an op's own signature, written once over the ops and used both as ``Tensor``
methods (``x.std(0, True)``) and as top-level functions (``of.std(x, 0, True)``, ``torch.std`` through the mock):

* ``std``/``var`` with torch's ``unbiased`` (positional after ``dim``, or alone: ``x.std(False)``), beside the ops'
  ``correction=``;
* the reductions' ``dtype=`` (``x.sum(dtype=of.float64)``): the input is cast first, as torch casts it;
* ``norm`` with ``p='fro'`` or ``'nuc'`` (torch's default is ``'fro'``: the 2-norm of the elements);
* ``div``/``divide`` with ``rounding_mode='trunc'`` or ``'floor'``;
* ``dot`` (two 1-D tensors of one dtype and size, as torch refuses anything else: it is not ``matmul``);
* ``repeat_interleave`` with a tensor of repeats (its values read eagerly; torch's one-argument form too);
* ``clamp_min``, ``clamp_max``, ``fliplr``, ``flipud``, ``movedim``/``moveaxis``.

Each calls ops; no shape or gradient rule is written here.
"""

from __future__ import annotations

import numpy as np

from . import ops as F
from .core import dtypes as D
from .core.errors import ArgumentError, ShapeError, describe


def _deviation(op: str):
    def deviation(input, *args, unbiased=None, **kwargs):
        args = list(args)
        if args and isinstance(args[0], (bool, np.bool_)):  # std(x, False): unbiased or not, over every element
            if unbiased is not None or len(args) > 1:
                raise ArgumentError(f"{op}(): {op}(unbiased) takes no other positional argument (torch's form), got "
                                    f"{tuple(args)!r}")
            unbiased = bool(args.pop(0))
        elif len(args) >= 2 and isinstance(args[1], (bool, np.bool_)):  # std(x, dim, unbiased[, keepdim])
            if unbiased is not None:
                raise ArgumentError(f"{op}(): unbiased given twice (positionally and by name)")
            unbiased = bool(args.pop(1))
            if len(args) == 2:  # (the ops take keepdim by name)
                if "keepdim" in kwargs:
                    raise ArgumentError(f"{op}(): keepdim given twice (positionally and by name)")
                kwargs["keepdim"] = args.pop()
        if unbiased is not None:
            if kwargs.get("correction") is not None:
                raise ArgumentError(f"{op}(): give unbiased or correction, not both")
            kwargs["correction"] = 1 if unbiased else 0
        return getattr(F, op)(input, *args, **kwargs)

    deviation.__name__ = deviation.__qualname__ = op
    deviation.__doc__ = (f"torch's ``{op}``: ``(dim, unbiased, keepdim)`` positionally, ``unbiased=`` (True: "
                         f"correction 1, False: 0) or ``correction=``; ``F.{op}`` computes it.")
    return deviation


std, var = _deviation("std"), _deviation("var")


def _cast_first(op: str):
    def reduction(input, *args, dtype=None, **kwargs):
        return getattr(F, op)(input if dtype is None else F.cast(input, dtype=D.as_dtype(dtype, op=op)), *args,
                              **kwargs)

    reduction.__name__ = reduction.__qualname__ = op
    reduction.__doc__ = (f"torch's ``{op}``, with ``dtype=``: the input cast to it before ``F.{op}`` runs, as torch "
                         "casts it.")
    return reduction


sum, mean, prod, cumsum, cumprod, nansum, nanmean = (_cast_first(n) for n in (
    "sum", "mean", "prod", "cumsum", "cumprod", "nansum", "nanmean"))


def _dims(dim) -> list | None:
    if dim is None:
        return None
    return [int(dim)] if isinstance(dim, (int, np.integer)) else [int(d) for d in dim]


def matrix_reduction(input, dims: list, keepdim: bool, reduce):
    """``reduce`` (a reduction over the last axis) of the singular values of the matrices over ``dims`` (two dims),
    those dims kept as size 1 with ``keepdim``: the nuclear norm (sum) and the spectral norms (amax, amin)."""
    n = len(input.shape)
    a, b = (d % n for d in dims)
    rest = [d for d in range(n) if d not in (a, b)]
    y = reduce(F.linalg_svd(F.permute(input, dims=[*rest, a, b]), full_matrices=False)[1], axis=[-1])
    if keepdim:
        for d in sorted((a, b)):
            y = F.unsqueeze(y, d)
    return y


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """torch's ``norm``: ``p='fro'`` (the default) or None is the 2-norm of the elements over ``dim`` (all when
    None), a number ``p`` the vector p-norm over ``dim``, ``'nuc'`` the nuclear norm of the matrices over two dims (a
    2-D input when ``dim`` is None). ``dtype=`` casts the input first."""
    if dtype is not None:
        input = F.cast(input, dtype=D.as_dtype(dtype, op="norm"))
    dims = _dims(dim)
    if p is None or p == "fro":
        if p == "fro" and dims is not None and len(dims) > 2:
            raise ArgumentError(f"norm(): p='fro' takes one or two dims, got dim={dim!r}")
        return F.norm(input, 2.0, dims, keepdim)
    if p == "nuc":
        if dims is None:
            if len(input.shape) != 2:
                raise ShapeError(f"norm(): p='nuc' without dim needs a 2-D input, got shape {tuple(input.shape)}")
            dims = [0, 1]
        if len(dims) != 2:
            raise ArgumentError(f"norm(): p='nuc' takes two dims, got dim={dim!r}")
        return matrix_reduction(input, dims, keepdim, F.sum)
    if isinstance(p, str):
        raise ArgumentError(f"norm(): p must be a number, 'fro' or 'nuc', got {p!r}")
    return F.norm(input, float(p), dims, keepdim)


def div(input, other, *, rounding_mode=None):
    """torch's ``div``: true division (integers give float32), or with ``rounding_mode`` ``'trunc'`` (toward zero)
    or ``'floor'`` (toward −∞, as ``//``) in the operands' promoted dtype; the rounded forms have a zero
    gradient."""
    if rounding_mode is None:
        return F.div(input, other)
    if rounding_mode == "floor":
        return F.floor_divide(input, other)
    if rounding_mode != "trunc":
        raise ArgumentError(f"div(): rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    tensors = [v for v in (input, other) if hasattr(v, "dtype")]
    operands = [v if hasattr(v, "dtype") else np.empty((), D.scalar_dtype(v, tensors[0].dtype)) for v in (input, other)]
    if D.is_floating(D.result_type(*operands)):
        return F.trunc(F.div(input, other))
    # integers: |x| // |y| with the sign of x·y, exact (a float quotient would round large values)
    quotient = F.floor_divide(_abs(input), _abs(other))
    return F.where(F.not_equal(_negative(input), _negative(other)), F.neg(quotient), quotient)


def _abs(v):
    return F.abs(v) if hasattr(v, "dtype") else abs(v)


def _negative(v):
    return F.less(v, 0) if hasattr(v, "dtype") else v < 0


divide = div


def dot(input, other):
    """torch's ``dot``: the inner product of two 1-D tensors of one size and dtype (anything else is refused, as
    torch refuses it; ``matmul`` takes the other shapes)."""
    for name, t in (("input", input), ("other", other)):
        if len(t.shape) != 1:
            raise ShapeError(f"dot(): {name} must be 1-D, got shape {tuple(t.shape)}")
    if input.shape[0] != other.shape[0]:
        raise ShapeError(f"dot(): the vectors have {input.shape[0]} and {other.shape[0]} elements")
    if input.dtype != other.dtype:
        raise ArgumentError(f"dot(): both vectors must have one dtype, got {input.dtype} and {other.dtype}")
    return F.matmul(input, other)


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None, axis=None):
    """torch's ``repeat_interleave``: ``repeats`` an int, a list, or a 1-D integer tensor (its values are read: the
    result's shape depends on them); ``repeat_interleave(repeats)`` alone gives each index ``i`` repeated
    ``repeats[i]`` times."""
    if repeats is None:  # torch.repeat_interleave(repeats_tensor)
        counts = _counts(input, "repeats")
        return F.repeat_interleave(F.arange(start=0.0, stop=float(len(counts)), step=1.0, dtype=D.int64),
                                   counts, 0)
    if hasattr(repeats, "shape") and hasattr(repeats, "dtype"):
        repeats = _counts(repeats, "repeats") if len(repeats.shape) else int(repeats.item())
    y = F.repeat_interleave(input, repeats if isinstance(repeats, list) else [int(repeats)],
                            dim if dim is not None else axis)
    if output_size is not None and y.shape[dim if dim is not None else axis or 0] != output_size:
        raise ArgumentError(f"repeat_interleave(): output_size={output_size}, but the repeats give "
                            f"{y.shape[dim if dim is not None else axis or 0]} elements")
    return y


def _counts(t, name: str) -> list:
    if D.is_floating(t.dtype) or t.dtype == D.bool_ or len(t.shape) != 1:
        raise ArgumentError(f"repeat_interleave(): {name} must be a 1-D integer tensor (or an int), got "
                            f"{describe(t)}")
    return [int(v) for v in t.tolist()]


def clamp_min(input, min):
    """torch's ``clamp_min``: ``clamp(input, min=min)``."""
    return F.clip(input, min=min)


def clamp_max(input, max):
    """torch's ``clamp_max``: ``clamp(input, max=max)``."""
    return F.clip(input, max=max)


def movedim(input, source, destination):
    """torch's ``movedim``/``moveaxis``: the dims ``source`` (an int or a sequence) moved to ``destination``, the
    others kept in their order."""
    n = len(input.shape)
    src, dst = ([source] if isinstance(source, (int, np.integer)) else list(source),
                [destination] if isinstance(destination, (int, np.integer)) else list(destination))
    if len(src) != len(dst):
        raise ArgumentError(f"movedim(): source and destination must have one length, got {source!r} and "
                            f"{destination!r}")
    for d in (*src, *dst):
        if not -max(n, 1) <= d < max(n, 1):
            raise ShapeError(f"movedim(): dim {d} is out of range for a tensor of rank {n}")
    src, dst = [d % max(n, 1) for d in src], [d % max(n, 1) for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ArgumentError(f"movedim(): repeated dims in source {source!r} or destination {destination!r}")
    order = [d for d in range(n) if d not in src]
    for to, d in sorted(zip(dst, src)):
        order.insert(to, d)
    return F.permute(input, dims=order)


moveaxis = movedim


def fliplr(input):
    """torch's ``fliplr``: dim 1 reversed (at least 2-D)."""
    if len(input.shape) < 2:
        raise ShapeError(f"fliplr(): the input must be at least 2-D, got shape {tuple(input.shape)}")
    return F.flip(input, [1])


def flipud(input):
    """torch's ``flipud``: dim 0 reversed (at least 1-D)."""
    if len(input.shape) < 1:
        raise ShapeError("flipud(): the input must be at least 1-D, got a 0-d tensor")
    return F.flip(input, [0])


__all__ = ["clamp_max", "clamp_min", "cumprod", "cumsum", "div", "divide", "dot", "fliplr", "flipud",
           "matrix_reduction", "mean", "moveaxis", "movedim", "nanmean", "nansum", "norm", "prod", "repeat_interleave",
           "std", "sum", "var"]
