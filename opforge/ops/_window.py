"""Sliding windows over the spatial dims of (N, C, *spatial) arrays, shared by convolution and pooling: the geometry
(which input positions each output reads, output sizes, paddings) and the NumPy blocks the kernels are built of.

Geometry. Along a spatial dim of size n, output o reads the input padded by ``lo`` in front at o·s + i·d for the
taps i = 0 … k−1 (stride s, dilation d, kernel size k). A convolution pads ``lo`` in front and ``hi`` behind and
has ⌊(n + lo + hi − d·(k − 1) − 1) / s⌋ + 1 outputs; pooling with ``ceil_mode`` rounds up instead (PyTorch's rule:
the last window must start inside the input or the front padding). ``Windows`` holds this per dim; the buffer
padding behind (``Windows.hi``) is what the last window needs, nothing more.

Memory layout. NumPy runs an elementwise operation fast when its innermost loop is long; on a strided window of
an (N, C, H, W) array the innermost run is one image row (4 or 8 values in a small CNN), and strided copies and
ufuncs then cost 10–50× what they cost on contiguous data. So the kernels here work on the transposed view
(C, *spatial, N) — batch innermost — and hand back arrays whose memory is in that order (their shape is still
(N, C, *spatial): a transposed view). Every window of a batch-innermost array is a run of N (stride > 1) or of
row·N (stride 1) contiguous values, im2col becomes one fast copy and the tap loops of pooling and col2im run at
memory speed. Inputs in any layout are accepted; elementwise ops downstream keep the layout (NumPy's "K" order).
With a batch of 1 the two layouts are the same memory.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

from numpy.lib.stride_tricks import as_strided

from ._common import ShapeError, Spec, np, shapes_agree

# -- attrs -----------------------------------------------------------------------------------------------------------


def expand(values, nd: int) -> tuple:
    """An ``int[]`` attr as nd values: a lone value (the framework makes a 1-list of a bare int) repeats."""
    return tuple(values) * nd if len(values) == 1 else tuple(values)


LOWEST = {"kernel_size": 1, "stride": 1, "padding": 0, "dilation": 1, "output_padding": 0, "input_size": 1,
          "output_size": 1}


def check_lists(nd: int | None, attrs: dict) -> None:
    """Int-list attrs hold 1 or nd values (nd None: as many as the longest), each at least LOWEST[name]; groups ≥ 1.
    Raises ValueError, which the framework turns into an ArgumentError naming the op."""
    lists = {name: v for name, v in attrs.items() if name in LOWEST and isinstance(v, tuple)}
    n = nd or max((len(v) for v in lists.values()), default=1)
    for name, values in lists.items():
        if len(values) not in (1, n):
            raise ValueError(f"argument '{name}' must hold {'1 int' if n == 1 else f'1 or {n} ints'}, "
                             f"got {list(values)}")
        if any(isinstance(v, int) and v < LOWEST[name] for v in values):  # not a run-time Dim
            raise ValueError(f"argument '{name}' must be >= {LOWEST[name]}, got {list(values)}")
    if attrs.get("groups", 1) < 1:
        raise ValueError(f"argument 'groups' must be >= 1, got {attrs['groups']}")
    if attrs.get("divisor_override") is not None and attrs["divisor_override"] < 1:
        raise ValueError(f"argument 'divisor_override' must be >= 1, got {attrs['divisor_override']}")


def fit_rank(op_name: str, nd: int, **lists) -> None:
    """An n-d op's list attrs must hold 1 value or one per spatial dim of its input (nd, from the input's rank)."""
    for name, values in lists.items():
        if values is not None and not isinstance(values, str) and len(values) not in (1, nd):
            raise ShapeError(f"{op_name}(): argument '{name}' holds {len(values)} values, the input has {nd} "
                             f"spatial dims")


def spatial_rank(op_name: str, shape: tuple, nd: int, what: str = "input", batched_only: bool = False) -> bool:
    """Check that ``shape`` is (N, C, *spatial) or, unless batched_only, (C, *spatial) with nd spatial dims.
    Returns whether it is batched."""
    if len(shape) == nd + 2 or (len(shape) == nd + 1 and not batched_only):
        return len(shape) == nd + 2
    dims = ("L",) if nd == 1 else ("H", "W") if nd == 2 else ("D", "H", "W")
    batched = f"rank {nd + 2} (N, C, {', '.join(dims)})"
    expected = batched if batched_only else f"rank {nd + 1} (C, {', '.join(dims)}) or {batched}"
    raise ShapeError(f"{op_name}(): {what} must have {expected}, got shape {tuple(shape)}")


# -- geometry --------------------------------------------------------------------------------------------------------


class Windows(NamedTuple):
    """Where the windows lie along each spatial dim (tuples, one value per dim; see the module docstring)."""

    size: tuple  # input sizes (None: unknown until run time)
    kernel: tuple
    stride: tuple
    dilation: tuple
    lo: tuple  # padding in front
    out: tuple  # output sizes
    hi: tuple  # padding behind: as much as the last window reaches past the input (0 if none)

    @classmethod
    def of(cls, size, kernel, stride, dilation, lo, out) -> Windows:
        hi = tuple(None if None in (n, o) else max(0, (o - 1) * s + d * (k - 1) + 1 - a - n)
                   for n, k, s, d, a, o in zip(size, kernel, stride, dilation, lo, out))
        return cls(*map(tuple, (size, kernel, stride, dilation, lo, out)), hi)

    @property
    def padded(self) -> tuple:
        """The spatial size of the padded buffer."""
        return tuple(a + n + b for a, n, b in zip(self.lo, self.size, self.hi))

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    @property
    def disjoint(self) -> bool:
        """Whether no input position is read twice (by two taps or two outputs): each window fits in a stride."""
        return all(k == 1 or d * (k - 1) < s for k, s, d in zip(self.kernel, self.stride, self.dilation))


def conv_windows(op_name: str, size, kernel, stride, lo, hi, dilation) -> Windows:
    """Convolution windows: the padded input must hold the dilated kernel (else the output would be empty)."""
    out = []
    for n, k, s, a, b, d in zip(size, kernel, stride, lo, hi, dilation):
        m = None if n is None or k is None else (n + a + b - d * (k - 1) - 1) // s + 1
        if m is not None and m < 1:
            raise ShapeError(f"{op_name}(): the input's spatial size {tuple(size)} padded by {tuple(lo)} in front "
                             f"and {tuple(hi)} behind is smaller than the kernel {tuple(kernel)} dilated by "
                             f"{tuple(dilation)}: the output would be empty")
        out.append(m)
    return Windows.of(size, kernel, stride, dilation, lo, out)


def pool_windows(op_name: str, size, kernel, stride, padding, dilation, ceil_mode: bool) -> Windows:
    """Pooling windows, PyTorch's rule: padding at most half the kernel, the output rounded down (or up with
    ceil_mode, but the last window must start inside the input or the front padding), and not empty."""
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ShapeError(f"{op_name}(): padding {list(padding)} must be at most half the kernel size "
                         f"{list(kernel)}")
    out = []
    for n, k, s, p, d in zip(size, kernel, stride, padding, dilation):
        if n is None:
            out.append(None)
            continue
        m = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (m - 1) * s >= n + p:
            m -= 1
        if m < 1:
            raise ShapeError(f"{op_name}(): the input's spatial size {tuple(size)} padded by {tuple(padding)} is "
                             f"smaller than the kernel {tuple(kernel)} dilated by {tuple(dilation)}: the output "
                             "would be empty")
        out.append(m)
    return Windows.of(size, kernel, stride, dilation, padding, out)


def check_dy(op_name: str, dy, expected) -> None:
    """The incoming gradient must have the shape of the forward op's output."""
    if not shapes_agree(dy, expected):
        raise ShapeError(f"{op_name}(): dy has shape {tuple(dy)}, the forward op's output has {tuple(expected)}")


# -- ONNX export (opforge.onnx calls the mappings; nothing here imports onnx) -------------------------------------


def onnx_batched(g, x, nd: int, build):
    """ONNX's convolution and pooling nodes take batches: ``build(x, spec)`` writes the node for a batched x of the
    given output Spec; an unbatched x gets a batch of one around it."""
    out = g.outputs[0]
    if x.ndim == nd + 2:
        return build(x, out)
    x = g.op("Unsqueeze", x, g.ints([0]), spec=Spec((1, *x.shape), x.dtype))
    y = build(x, Spec((1, *out.shape), out.dtype))
    return g.op("Squeeze", y, g.ints([0]), spec=out)


def onnx_pad(g, x, w: Windows, value, spec=None):
    """x padded as ``pad`` pads it (w.lo in front, w.hi behind the spatial dims), as an ONNX Pad node."""
    if not any(w.lo) and not any(w.hi):
        return x
    lead = x.ndim - len(w.lo)
    pads = [0] * lead + list(w.lo) + [0] * lead + list(w.hi)
    return g.op("Pad", x, g.ints(pads), g.const(np.asarray(value, x.dtype)), mode="constant", spec=spec)


# -- layout ----------------------------------------------------------------------------------------------------------


def batch_last(x):
    """The (C, *spatial, N) view of an (N, C, *spatial) array (no copy)."""
    return x.transpose(*range(1, x.ndim), 0)


def copy_batch_last(dst, src) -> None:
    """Copy a batch-last view ``src`` (C, *spatial, N) into ``dst`` of that shape. Where ``src`` lies in (N, C, …)
    memory, NumPy's copy reads values a whole sample apart for every value it writes; 32 samples at a time (two
    cache lines of ``dst`` written whole) keep those reads in cache: against one copy, 142 → 78 µs at 128×1024
    values, 640 → 481 µs at 128×4096, 1174 → 852 µs at 64×16384 (float32, one core; bench/batch_last_copy.py);
    blocks of 8 lost to one copy on the larger arrays (881 µs at 128×4096). With 32 samples or fewer one copy is as
    fast."""
    n = src.shape[-1]
    if n > 32 and src.size >= 256 * n and src.strides[-1] > max(src.strides[:-1]):
        for i in range(0, n, 32):
            np.copyto(dst[..., i:i + 32], src[..., i:i + 32])
    else:
        np.copyto(dst, src)


def batch_last_array(a, name: str | None = None):
    """The (C, *spatial, N) view of an (N, C, *spatial) array ``a`` if it is in batch-last memory already, else a
    batch-last copy (in scratch buffer ``name`` if given)."""
    view = batch_last(a)
    if view.flags.c_contiguous:
        return view
    out = np.empty(view.shape, a.dtype, like=a) if name is None else scratch(name, view.shape, a.dtype, a)
    copy_batch_last(out, view)
    return out


def batch_first(a):
    """The (N, C, *spatial) view of a (C, *spatial, N) array (no copy): the inverse of batch_last."""
    return a.transpose(a.ndim - 1, *range(a.ndim - 1))


# -- scratch memory --------------------------------------------------------------------------------------------------

# A kernel's big temporaries (the padded input, the im2col matrix, the column gradient) live in buffers kept per
# thread and reused from call to call: allocated afresh, each call would map new pages from the OS and fault them
# in, which measured as much as the GEMM itself in a training step (glibc hands blocks this size back to the OS).
# Only temporaries use them — nothing a kernel returns — and only up to SCRATCH_LIMIT bytes each. Another device's
# arrays come from its own allocator (CuPy's memory pool reuses blocks already).
SCRATCH_LIMIT = 1 << 24  # 16 MB: beyond that the GEMM work dwarfs the page faults
_scratch = threading.local()


def scratch(name: str, shape: tuple, dtype, like):
    """An uninitialised array of ``shape`` and ``dtype`` in this thread's reusable buffer ``name``, on the device
    of the array ``like``."""
    dtype = np.dtype(dtype)
    if type(like) is not np.ndarray:
        return np.empty(shape, dtype, like=like)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > SCRATCH_LIMIT:
        return np.empty(shape, dtype)
    buffer = getattr(_scratch, name, None)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = np.empty(max(nbytes, 1 << 16), np.uint8)
        setattr(_scratch, name, buffer)
    return buffer[:nbytes].view(dtype).reshape(shape)


# -- NumPy building blocks on batch-last arrays (C, *spatial, N) ----------------------------------------------------


def _spatial(w: Windows, starts, counts, steps) -> tuple:
    return (slice(None), *(slice(a, a + (c - 1) * s + 1, s) for a, c, s in zip(starts, counts, steps)), slice(None))


@functools.lru_cache(maxsize=512)
def _interior_index(w: Windows) -> tuple:
    return _spatial(w, w.lo, w.size, (1,) * len(w.kernel))


def pad(a, w: Windows, value=0.0, name: str = "pad"):
    """A batch-last array inside a buffer padded by w.lo in front and w.hi behind with ``value``: a contiguous
    (C, *spatial, N) array in scratch buffer ``name`` (valid until its next use), or ``a`` itself where there is no
    padding and ``a`` is in batch-last memory already. (Windows read from another layout would gather their values
    a batch apart; one copy first is cheaper.)"""
    if not any(w.lo) and not any(w.hi) and (a.flags.c_contiguous or a.shape[-1] == 1):
        return a
    out = scratch(name, (a.shape[0], *w.padded, a.shape[-1]), a.dtype, a)
    out.fill(value)
    copy_batch_last(out[_interior_index(w)], a)
    return out


def interior(ap, w: Windows):
    """The inverse of ``pad``: the view of the input positions inside a padded buffer."""
    return ap[_interior_index(w)]


@functools.lru_cache(maxsize=512)
def tap_slices(w: Windows) -> tuple:
    """For each kernel tap (row-major): the index of the view, in a padded batch-last buffer, of what that tap
    reads at every output, shaped (C, *out, N)."""
    return tuple(_spatial(w, [i * d for i, d in zip(tap, w.dilation)], w.out, w.stride)
                 for tap in np.ndindex(*w.kernel))


def im2col(ap, w: Windows):
    """The windows of a padded batch-last buffer as a read-only view (C, *kernel, *out, N): the array each column
    of the convolution GEMM is a patch of, before the one copy that lays it out as a matrix."""
    nd = len(w.kernel)
    if type(ap) is not np.ndarray:  # a device's array: NumPy's as_strided and buffers are host memory's
        return _device_im2col(ap, w)
    spatial = ap.strides[1:nd + 1]
    shape = (ap.shape[0], *w.kernel, *w.out, ap.shape[-1])
    strides = (ap.strides[0], *(s * d for s, d in zip(spatial, w.dilation)),
               *(s * t for s, t in zip(spatial, w.stride)), ap.strides[-1])
    if ap.flags.c_contiguous:  # a padded buffer: the ndarray constructor is cheaper than as_strided
        view = np.ndarray(shape, ap.dtype, ap, 0, strides)
        view.flags.writeable = False
        return view
    return as_strided(ap, shape, strides, writeable=False)


def _device_im2col(ap, w: Windows):
    """im2col through ``sliding_window_view`` (which the device's array module has): every window of the dilated
    kernel's span, then the outputs' and the taps' steps."""
    nd = len(w.kernel)
    span = tuple(d * (k - 1) + 1 for k, d in zip(w.kernel, w.dilation))
    view = np.lib.stride_tricks.sliding_window_view(ap, span, axis=tuple(range(1, nd + 1)))  # (C, *starts, N, *span)
    view = view[(slice(None), *(slice(0, (o - 1) * s + 1, s) for o, s in zip(w.out, w.stride)), slice(None),
                 *(slice(None, None, d) for d in w.dilation))]
    return view.transpose(0, *range(nd + 2, 2 * nd + 2), *range(1, nd + 1), nd + 1)


def col2im(cols, w: Windows, shape: tuple):
    """The transpose of im2col: a zero padded buffer ``shape`` (C, *padded, N) to which every column value
    (cols: (C, *kernel, *out, N)) is added where im2col read it, one tap at a time, in place."""
    ap = np.zeros(shape, cols.dtype, like=cols)
    for tap, index in zip(np.ndindex(*w.kernel), tap_slices(w)):
        view = ap[index]
        np.add(view, cols[(slice(None), *tap)], out=view)
    return ap
