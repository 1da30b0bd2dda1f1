"""Dedicated CUDA kernels (issue 26): one pass over memory where the generic kernel, run on CuPy arrays, takes
several — the activations with their gradients, softmax/log_softmax/cross_entropy rows, layer_norm and the
normalize_grad of its backward pass, the SGD and Adam updates in place, embedding's gradient by atomic scatter-add.

Each is registered with ``@<op>.kernel(device="cuda", dtypes=[float32, float64])``: it wins over the generic kernel
there and gets CuPy arrays. A call it does not cover (another axis, a class weight, mixed dtypes, a layout that is
not contiguous rows ...) runs the op's generic kernel (``_generic``), so every call means what it means on the CPU.
Nothing here imports CuPy until a kernel runs on a GPU (``_cupy``): ``import opforge`` stays free of it.

The kernels compute the CPU kernels' formulas, operation for operation, in the parameter's dtype (float math for
float32, double for float64); hyper-parameters that the CPU kernel turns into Python floats (Adam's and SGD's
factors from their 0-d ``lr``/``step``/``beta1``/``momentum``) are made in double on the device, as on the host,
and read there without a device-to-host copy. What differs is the order of sums (a block's tree reduction, where
NumPy sums pairwise or by BLAS dot) and CUDA's own exp/log/erf/tanh (within 2 ulp) and fused multiply-adds: the same
values within float rounding, not the same bits (embedding_grad's atomic adds: not even from run to run). The sources
are module constants so that tests can compile them with NVRTC without a GPU (tests/test_cuda_kernel_sources.py);
tests/cuda/test_cuda_kernels.py compares each kernel with the CPU on a GPU.
"""

import functools

from ..core.cuda import Elementwise
from ..core.devices import get_device
from ..core.errors import ArgumentError
from ._common import D, normalize_axes, np
from .elementwise import _INV_SQRT_2PI, _SQRT_HALF, _TANH_C, _TANH_K, gelu, gelu_grad, leaky_relu, leaky_relu_grad
from .loss import cross_entropy, cross_entropy_grad
from .nn import (
    _check_indices,
    embedding_grad,
    log_softmax,
    log_softmax_grad,
    softmax,
    softmax_grad,
)
from .nn import _validate as _validate_nn
from .normalization import _trailing, layer_norm, normalize_grad
from .optim import _validate as _validate_optim
from .optim import adam_exp_avg, adam_exp_avg_sq, adam_update, sgd_update

FLOATS = (D.float32, D.float64)  # the dtypes these kernels take; the others run the generic kernels


@functools.cache
def _cupy():
    import cupy  # only once a kernel runs on a GPU

    return cupy


def _generic(opdef, dtype):
    """The kernel ``opdef`` runs on "cuda" without this module's, as ``OpDef.find_kernel`` would find it with the
    "cuda" entries left out (else this kernel would find itself): the one for every device, else the CPU's (which
    the cuda device borrows), bound to the device's CuPy where it takes ``xp``."""
    kernels = opdef.kernels
    for name in (None, "cpu"):
        kernel = kernels.get((name, dtype)) or kernels.get((name, None))
        if kernel is not None:
            return kernel.bind(get_device("cuda")) if kernel.takes_xp else kernel.fn
    raise LookupError(f"op '{opdef.name}' has no generic kernel for {dtype}")  # (every op here has one)


def _rows_of(x, axis: int) -> int:
    """The length of the rows a row kernel takes — x's last axis when ``axis`` is it and x is C-contiguous — or 0 where
    the call is not such a row call (a 0-d or empty x, another axis, a strided layout)."""
    if x.ndim == 0 or x.size == 0 or not x.flags.c_contiguous:
        return 0
    if axis not in (-1, x.ndim - 1):
        return 0
    return x.shape[-1]


def _fits(out, like) -> bool:
    """An ``out=`` a row kernel can write: none, or a C-contiguous array of ``like``'s shape and dtype."""
    return out is None or (out.flags.c_contiguous and out.shape == like.shape and out.dtype == like.dtype)


def _block(n: int) -> int:
    """Threads per row: a power of two from a warp to 1024, about one per 4 elements (each thread strides the row)."""
    threads = 32
    while threads < 1024 and threads * 4 < n:
        threads *= 2
    return threads


# -- elementwise: cupy.ElementwiseKernel --------------------------------------------------------------------------

# Math by name for both dtypes (CUDA's float overloads, without relying on which C++ overloads a header brings).
_MATH = r"""
__device__ __forceinline__ float of_exp(float v) { return expf(v); }
__device__ __forceinline__ double of_exp(double v) { return exp(v); }
__device__ __forceinline__ float of_erf(float v) { return erff(v); }
__device__ __forceinline__ double of_erf(double v) { return erf(v); }
__device__ __forceinline__ float of_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double of_tanh(double v) { return tanh(v); }
__device__ __forceinline__ float of_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double of_sqrt(double v) { return sqrt(v); }
"""

# torch's lerp weight w = 1 − β₁ and its choice of end, made in double as the host makes them from Python floats
_LERP_PREP = ("const double lerp_w = 1.0 - (double)beta1[0]; const bool near = fabs(lerp_w) < 0.5;"
              "const T w = (T)lerp_w; const T rest = (T)(1.0 - lerp_w)")

# The activations: core.cuda.Elementwise's C bodies (16-byte loads and stores over contiguous arrays, else a
# cupy.ElementwiseKernel), name -> (inputs, output, body, scalars), each the CPU kernel's formula in NumPy's order of
# operations, in the inputs' type T (Python floats the CPU kernels mix in are cast to T there, as here).
_T = "typedef decltype(x + x) T; "  # (the raw kernel's lanes know no T)
ACTIVATIONS = {
    # leaky_relu: max(x, αx) for α <= 1, min for α > 1, where(x > 0, x, αx) for a NaN α (the CPU kernel chooses on
    # the Python float). NumPy's maximum and minimum keep a NaN x, and x on a tie.
    "leaky_relu_max": (("x",), "y", _T + "const T s = x * alpha; y = (x >= s || x != x) ? x : s;", ("alpha",)),
    "leaky_relu_min": (("x",), "y", _T + "const T s = x * alpha; y = (x <= s || x != x) ? x : s;", ("alpha",)),
    "leaky_relu_where": (("x",), "y", _T + "const T s = x * alpha; y = x > (T)0 ? x : s;", ("alpha",)),
    "leaky_relu_grad": (("x", "dy"), "dx", _T + "dx = x != x ? x : (x > (T)0 ? dy : dy * alpha);", ("alpha",)),
    "gelu_none": (("x",), "y", _T + f"y = (T)0.5 * x * ((T)1 + erf(x * (T){_SQRT_HALF!r}));", ()),
    "gelu_tanh": (("x",), "y",
                  _T + f"y = (T)0.5 * x * ((T)1 + tanh((T){_TANH_K!r} * (x + (T){_TANH_C!r} * x * x * x)));", ()),
    "gelu_grad_none": (("x", "dy"), "dx",
                       _T + f"dx = dy * ((T)0.5 * ((T)1 + erf(x * (T){_SQRT_HALF!r}))"
                       f" + x * (T){_INV_SQRT_2PI!r} * exp((T)-0.5 * x * x));", ()),
    "gelu_grad_tanh": (("x", "dy"), "dx",
                       _T + f"const T t = tanh((T){_TANH_K!r} * (x + (T){_TANH_C!r} * x * x * x));"
                       f"const T du = (T){_TANH_K!r} * ((T)1 + (T){3 * _TANH_C!r} * x * x);"
                       "dx = dy * ((T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * du);", ()),
}


@functools.cache
def _activation(name: str):
    inputs, output, body, scalars = ACTIVATIONS[name]
    return Elementwise(f"opforge_{name}", inputs, (output,), body, scalars)


# The optimizer updates: cupy.ElementwiseKernel, name -> (in_params, out_params, operation, loop_prep), each the CPU
# kernel's formula (optim.py) in NumPy's order of operations.
ELEMENTWISE = {
    # SGD: d = grad (+ λ·param), then the momentum buffer b itself, or d + μ·b (Nesterov); param − lr·d. lr and μ are
    # 0-d device arrays (raw: read once per thread, in loop_prep), as doubles — the host's Python floats.
    "sgd_plain": ("T param, T grad, raw L lr", "T param_out",
                  "param_out = param + grad * step", "const T step = (T)(-(double)lr[0])"),
    "sgd_plain_decay": ("T param, T grad, raw L lr, T wd", "T param_out",
                        "const T d = grad + wd * param; param_out = param + d * step",
                        "const T step = (T)(-(double)lr[0])"),
    "sgd_buffer": ("T param, T buf, raw L lr", "T param_out",
                   "param_out = param + buf * step", "const T step = (T)(-(double)lr[0])"),
    "sgd_nesterov": ("T param, T grad, T buf, raw L lr, raw M momentum", "T param_out",
                     "const T d = grad + mom * buf; param_out = param + d * step",
                     "const T step = (T)(-(double)lr[0]); const T mom = (T)(double)momentum[0]"),
    "sgd_nesterov_decay": ("T param, T grad, T buf, raw L lr, raw M momentum, T wd", "T param_out",
                           "T d = grad + wd * param; d = d + mom * buf; param_out = param + d * step",
                           "const T step = (T)(-(double)lr[0]); const T mom = (T)(double)momentum[0]"),
    # Adam's first moment, torch's lerp m + w·(g − m) from the nearer end (w = 1 − β₁, chosen as the host does, in
    # double).
    "adam_exp_avg": ("T exp_avg, T grad, raw L beta1", "T exp_avg_out",
                     "const T diff = grad - exp_avg; exp_avg_out = near ? exp_avg + w * diff : grad - diff * rest",
                     _LERP_PREP),
    "adam_exp_avg_decay": ("T exp_avg, T grad, T param, raw L beta1, T wd", "T exp_avg_out",
                           "const T g = grad + wd * param; const T diff = g - exp_avg;"
                           "exp_avg_out = near ? exp_avg + w * diff : g - diff * rest",
                           _LERP_PREP),
    "adam_exp_avg_sq": ("T exp_avg_sq, T grad, T beta2, T one_minus_beta2", "T exp_avg_sq_out",
                        "const T g2 = one_minus_beta2 * grad * grad; exp_avg_sq_out = exp_avg_sq * beta2 + g2", ""),
    "adam_exp_avg_sq_decay": ("T exp_avg_sq, T grad, T param, T beta2, T one_minus_beta2, T wd", "T exp_avg_sq_out",
                              "const T g = grad + wd * param; const T g2 = one_minus_beta2 * g * g;"
                              "exp_avg_sq_out = exp_avg_sq * beta2 + g2", ""),
    # Adam's parameter: p − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε), p shrunk by 1 − lr·λ first for AdamW. The
    # factors as adam_factors makes them on the host (Python floats, doubles), once per thread.
    "adam_update": ("T param, T exp_avg, T exp_avg_sq, raw S step, raw L lr, raw B beta1, float64 beta2, T eps, "
                    "float64 wd, int32 shrink", "T param_out",
                    "const T change = exp_avg / (of_sqrt(exp_avg_sq) / bc2 + eps) * step_size;"
                    "param_out = (shrink ? param * decay : param) + change",
                    "const double t = (double)step[0]; const double lr_ = (double)lr[0];"
                    "const T step_size = (T)(-(lr_ / (1.0 - pow((double)beta1[0], t))));"
                    "const T bc2 = (T)sqrt(1.0 - pow(beta2, t)); const T decay = (T)(1.0 - lr_ * wd)"),
}


@functools.cache
def _elementwise(name: str):
    in_params, out_params, operation, loop_prep = ELEMENTWISE[name]
    return _cupy().ElementwiseKernel(in_params, out_params, operation, f"opforge_{name}", preamble=_MATH,
                                     loop_prep=loop_prep)


def _same(*arrays) -> bool:
    """Whether the arrays have one shape and one dtype (else the generic kernel: promotion, broadcasting)."""
    first = arrays[0]
    return all(a.shape == first.shape and a.dtype == first.dtype for a in arrays[1:])


@leaky_relu.kernel(device="cuda", dtypes=FLOATS)
def _(x, *, alpha):
    mode = "where" if alpha != alpha else "max" if alpha <= 1 else "min"
    return _activation(f"leaky_relu_{mode}")(x, alpha=alpha)


@leaky_relu_grad.kernel(device="cuda", dtypes=FLOATS)
def _(x, dy, *, alpha):
    if not _same(x, dy):
        return _generic(leaky_relu_grad, x.dtype)(x, dy, alpha=alpha)
    return _activation("leaky_relu_grad")(x, dy, alpha=alpha)


@gelu.kernel(device="cuda", dtypes=FLOATS)
def _(x, *, approximate):
    return _activation(f"gelu_{approximate}")(x)


@gelu_grad.kernel(device="cuda", dtypes=FLOATS)
def _(x, dy, *, approximate):
    if x.dtype != dy.dtype:  # (shapes that broadcast are fine: ElementwiseKernel broadcasts, as the CPU kernel)
        return _generic(gelu_grad, x.dtype)(x, dy, approximate=approximate)
    return _activation(f"gelu_grad_{approximate}")(x, dy)


# -- optimizer updates: in place when out= is the state's own array -------------------------------------------------
# The ElementwiseKernel writes into ``out`` (the executor's buffer, which may be the declared inplace input itself:
# CuPy reads an input that *is* the output element by element before writing it, and copies one that only overlaps).


def _write(kernel, args: tuple, out):
    return kernel(*args) if out is None else kernel(*args, out)


@sgd_update.kernel(device="cuda", dtypes=FLOATS)
def _(param, grad, lr, momentum_buffer, momentum, *, weight_decay, nesterov, out=None):
    _validate_optim(sgd_update, param, grad, lr, momentum_buffer, momentum, weight_decay=weight_decay,
                    nesterov=nesterov)
    if momentum_buffer is not None and nesterov and momentum is None:  # (the generic kernel's error)
        return _generic(sgd_update, param.dtype)(param, grad, lr, momentum_buffer, momentum,
                                                 weight_decay=weight_decay, nesterov=nesterov, out=out)
    decay = (weight_decay,) if weight_decay else ()  # (λ = 0 adds no 0·param: an infinite param stays as it is)
    suffix = "_decay" if decay else ""
    if momentum_buffer is None:
        return _write(_elementwise("sgd_plain" + suffix), (param, grad, lr, *decay), out)
    if not nesterov:  # d is the buffer itself (the decayed gradient went into it)
        return _write(_elementwise("sgd_buffer"), (param, momentum_buffer, lr), out)
    return _write(_elementwise("sgd_nesterov" + suffix), (param, grad, momentum_buffer, lr, momentum, *decay), out)


@adam_exp_avg.kernel(device="cuda", dtypes=FLOATS)
def _(exp_avg, grad, param, beta1, *, weight_decay, out=None):
    _validate_optim(adam_exp_avg, exp_avg, grad, param, beta1, weight_decay=weight_decay)
    if weight_decay:
        return _write(_elementwise("adam_exp_avg_decay"), (exp_avg, grad, param, beta1, weight_decay), out)
    return _write(_elementwise("adam_exp_avg"), (exp_avg, grad, beta1), out)


@adam_exp_avg_sq.kernel(device="cuda", dtypes=FLOATS)
def _(exp_avg_sq, grad, param, *, beta2, weight_decay, out=None):
    _validate_optim(adam_exp_avg_sq, exp_avg_sq, grad, param, beta2=beta2, weight_decay=weight_decay)
    if weight_decay:
        args = (exp_avg_sq, grad, param, beta2, 1 - beta2, weight_decay)
        return _write(_elementwise("adam_exp_avg_sq_decay"), args, out)
    return _write(_elementwise("adam_exp_avg_sq"), (exp_avg_sq, grad, beta2, 1 - beta2), out)


@adam_update.kernel(device="cuda", dtypes=FLOATS)
def _(param, exp_avg, exp_avg_sq, step, lr, beta1, *, beta2, eps, weight_decay, decoupled, out=None):
    _validate_optim(adam_update, param, exp_avg, exp_avg_sq, step, lr, beta1, beta2=beta2, eps=eps,
                    weight_decay=weight_decay, decoupled=decoupled)
    shrink = int(bool(decoupled and weight_decay))
    args = (param, exp_avg, exp_avg_sq, step, lr, beta1, float(beta2), eps, float(weight_decay), shrink)
    return _write(_elementwise("adam_update"), args, out)


# -- embedding's gradient: an atomic scatter-add ----------------------------------------------------------------


@embedding_grad.kernel(device="cuda", dtypes=FLOATS)
def _(dy, index, *, num_embeddings, padding_idx):
    """Rows of dy added into zeros at their index with atomic adds (cupyx.scatter_add): rows picked several times
    add up in the order the GPU runs them, so such sums may differ from the CPU's (and from run to run) in the last
    bits."""
    _validate_nn(embedding_grad, dy, index, num_embeddings=num_embeddings, padding_idx=padding_idx)
    _check_indices("embedding_grad", index, num_embeddings)  # (the CPU kernel's error; it reads the indices)
    import cupyx

    cupy = _cupy()
    width = dy.shape[-1]
    dw = cupy.zeros((num_embeddings, width), dy.dtype)
    if index.size:
        cupyx.scatter_add(dw, index.reshape(-1), dy.reshape(index.size, width))
    if padding_idx is not None:
        dw[padding_idx % num_embeddings] = 0
    return dw


# -- row kernels: one block per row (cupy.RawModule) --------------------------------------------------------------

# Each block reduces its row with a strided partial sum per thread, then warp shuffles: another order of terms than
# NumPy's (pairwise, or a BLAS dot), the same sums within rounding. Compiled once per dtype (``typedef ... T``).
ROWS = _MATH + r"""
__device__ __forceinline__ float of_log(float v) { return logf(v); }
__device__ __forceinline__ double of_log(double v) { return log(v); }
__device__ __forceinline__ float of_abs(float v) { return fabsf(v); }
__device__ __forceinline__ double of_abs(double v) { return fabs(v); }
__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double neg_inf(double) { return __longlong_as_double(0xfff0000000000000LL); }
__device__ __forceinline__ float digit(float) { return 1.1920928955078125e-07f; }  // np.finfo(float32).eps
__device__ __forceinline__ double digit(double) { return 2.220446049250313080847263336181640625e-16; }

// max keeping NaN (NumPy's max propagates it; fmax would drop it)
__device__ __forceinline__ T max_nan(T a, T b) { return (a >= b || a != a) ? a : b; }

__device__ __forceinline__ T warp_reduce(T v, bool is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    const T w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? max_nan(v, w) : v + w;
  }
  return v;
}

// The block's sum (or max) of v, in every thread. blockDim.x is a multiple of 32.
__device__ T block_reduce(T v, bool is_max) {
  __shared__ T partial[32];
  v = warp_reduce(v, is_max);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // the previous call's readers are done with partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : (is_max ? neg_inf(v) : (T)0);
  return warp_reduce(v, is_max);
}

// The block's sum (or min) of a count or an index, in every thread.
template <bool IS_MIN>
__device__ long long block_reduce_index(long long v) {
  __shared__ long long partial[32];
  for (int o = 16; o > 0; o >>= 1) {
    const long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = IS_MIN ? min(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : (IS_MIN ? 0x7fffffffffffffffLL : 0LL);
  for (int o = 16; o > 0; o >>= 1) {
    const long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = IS_MIN ? min(v, w) : v + w;
  }
  return v;
}

// max and Σ exp(x − max) of a row: softmax's shift (nn.py's _exp_sums with the max, as on a device)
__device__ void row_max_sum(const T* xr, long long n, T& m, T& s) {
  m = neg_inf((T)0);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) m = max_nan(m, xr[i]);
  m = block_reduce(m, true);
  s = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += of_exp(xr[i] - m);
  s = block_reduce(s, false);
}

// y may be x (inplace): every read of the row is done before the first write (block_reduce synchronises), and the
// last pass reads and writes element i in the same thread. Likewise for the other row kernels' out=.
extern "C" __global__ void softmax_rows(const T* x, T* y, long long n) {
  const T* xr = x + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  T m, s;
  row_max_sum(xr, n, m, s);
  const T inv = (T)1 / s;  // one reciprocal and a multiply, as the CPU kernel
  for (long long i = threadIdx.x; i < n; i += blockDim.x) yr[i] = of_exp(xr[i] - m) * inv;
}

extern "C" __global__ void log_softmax_rows(const T* x, T* y, long long n) {
  const T* xr = x + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  T m, s;
  row_max_sum(xr, n, m, s);
  const T ls = of_log(s);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - m) - ls;
}

// dx = (dy − Σ dy·y)·y
extern "C" __global__ void softmax_grad_rows(const T* y, const T* dy, T* dx, long long n) {
  const long long base = blockIdx.x * n;
  T s = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += dy[base + i] * y[base + i];
  s = block_reduce(s, false);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) dx[base + i] = (dy[base + i] - s) * y[base + i];
}

// dx = dy − exp(y)·Σ dy
extern "C" __global__ void log_softmax_grad_rows(const T* y, const T* dy, T* dx, long long n) {
  const long long base = blockIdx.x * n;
  T s = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += dy[base + i];
  s = block_reduce(s, false);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) dx[base + i] = dy[base + i] - of_exp(y[base + i]) * s;
}

// cross_entropy with class indices, per row: −log softmax(x)[t] = log Σ exp(x − m) − (x[t] − m), a sum of two
// terms >= 0 (nothing cancels); 0 where t is ignore_index or out of range (ce_finish reports the latter).
template <typename I>
__device__ void ce_rows(const T* x, const I* target, T* loss, long long n, long long ignore_index) {
  const long long row = blockIdx.x;
  const long long t = (long long)target[row];
  if (t == ignore_index || t < 0 || t >= n) {  // the same for the whole block: no thread waits in block_reduce
    if (threadIdx.x == 0) loss[row] = 0;
    return;
  }
  const T* xr = x + row * n;
  T m, s;
  row_max_sum(xr, n, m, s);
  if (threadIdx.x == 0) loss[row] = of_log(s) - (xr[t] - m);
}
extern "C" __global__ void ce_rows_i32(const T* x, const int* t, T* loss, long long n, long long ignore_index) {
  ce_rows(x, t, loss, n, ignore_index);
}
extern "C" __global__ void ce_rows_i64(const T* x, const long long* t, T* loss, long long n, long long ignore_index) {
  ce_rows(x, t, loss, n, ignore_index);
}


// One block: the sum of the row losses (for "mean" ÷ the number of counted targets: 0/0 is NaN, as torch's), and
// the first row whose target is out of range and not ignore_index (``rows`` where there is none).
template <typename I>
__device__ void ce_finish(const T* loss, const I* target, T* total, long long* first_bad, long long rows, long long n,
                          long long ignore_index, int mean) {
  T sum = 0;
  long long count = 0, bad = rows;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    const long long t = (long long)target[r];
    sum += loss[r];
    if (t != ignore_index) {
      if (t < 0 || t >= n) bad = min(bad, r); else count += 1;
    }
  }
  sum = block_reduce(sum, false);
  count = block_reduce_index<false>(count);
  bad = block_reduce_index<true>(bad);
  if (threadIdx.x == 0) {
    total[0] = mean ? sum / (T)count : sum;
    first_bad[0] = bad;
  }
}
extern "C" __global__ void ce_finish_i32(const T* loss, const int* t, T* total, long long* first_bad, long long rows,
                                         long long n, long long ignore_index, int mean) {
  ce_finish(loss, t, total, first_bad, rows, n, ignore_index, mean);
}
extern "C" __global__ void ce_finish_i64(const T* loss, const long long* t, T* total, long long* first_bad,
                                         long long rows, long long n, long long ignore_index, int mean) {
  ce_finish(loss, t, total, first_bad, rows, n, ignore_index, mean);
}

// One block: the number of targets that count (neither ignore_index nor out of range), for "mean"'s gradient.
template <typename I>
__device__ void ce_count(const I* target, long long* count, long long rows, long long n, long long ignore_index) {
  long long c = 0;
  for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
    const long long t = (long long)target[r];
    c += t != ignore_index && t >= 0 && t < n;
  }
  c = block_reduce_index<false>(c);
  if (threadIdx.x == 0) count[0] = c;
}
extern "C" __global__ void ce_count_i32(const int* t, long long* count, long long rows, long long n,
                                        long long ignore_index) {
  ce_count(t, count, rows, n, ignore_index);
}
extern "C" __global__ void ce_count_i64(const long long* t, long long* count, long long rows, long long n,
                                        long long ignore_index) {
  ce_count(t, count, rows, n, ignore_index);
}

// cross_entropy_grad per row: s·softmax(x) − s at the target, s = dloss (reduction 0: "none", per row; 1: "sum"),
// or dloss ÷ the count (2: "mean"), and 0 in rows that do not count (loss.py's _row_scale).
template <typename I>
__device__ void ce_grad_rows(const T* x, const I* target, const T* dloss, const long long* count, T* dx, long long n,
                             long long ignore_index, int reduction) {
  const long long row = blockIdx.x;
  const long long t = (long long)target[row];
  T s = reduction == 0 ? dloss[row] : reduction == 1 ? dloss[0] : dloss[0] / (T)count[0];
  if (t == ignore_index || t < 0 || t >= n) s = 0;
  const T* xr = x + row * n;
  T* dxr = dx + row * n;
  T m, sum;
  row_max_sum(xr, n, m, sum);
  const T sq = s / sum;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    T v = of_exp(xr[i] - m) * sq;
    if (i == t) v -= s;
    dxr[i] = v;
  }
}
extern "C" __global__ void ce_grad_rows_i32(const T* x, const int* t, const T* dloss, const long long* count, T* dx,
                                            long long n, long long ignore_index, int reduction) {
  ce_grad_rows(x, t, dloss, count, dx, n, ignore_index, reduction);
}
extern "C" __global__ void ce_grad_rows_i64(const T* x, const long long* t, const T* dloss, const long long* count,
                                            T* dx, long long n, long long ignore_index, int reduction) {
  ce_grad_rows(x, t, dloss, count, dx, n, ignore_index, reduction);
}

// A group's statistics as normalization.py's _normalize_np and normalize_grad make them: the mean mu (0 without
// centring), the remainder c of x − mu where it matters (_recentred; else 0, and subtracting 0 is exact), the
// variance, and where it overflowed for finite values, the scale s = max |x| that _big_groups divides by.
struct Stats { T s; bool big; T mu; T c; T var; };

__device__ __forceinline__ T centred(T xi, const Stats& st) {
  const T v = st.big ? xi / st.s : xi;
  return (v - st.mu) - st.c;
}

__device__ Stats row_stats(const T* xr, long long n, bool center) {
  Stats st;
  st.s = 1;
  st.big = false;
  while (true) {
    st.mu = 0;
    st.c = 0;
    if (center) {
      T a = 0;
      for (long long i = threadIdx.x; i < n; i += blockDim.x) a += st.big ? xr[i] / st.s : xr[i];
      st.mu = block_reduce(a, false) / (T)n;
    }
    T a = 0, b = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const T d = centred(xr[i], st);
      a += d * d;
      b += d;
    }
    st.var = block_reduce(a, false) / (T)n;
    if (center) {
      const T c = block_reduce(b, false) / (T)n;
      if (c * c > st.var * (digit(c) * digit(c))) {
        st.c = c;
        a = 0;
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
          const T d = centred(xr[i], st);
          a += d * d;
        }
        st.var = block_reduce(a, false) / (T)n;
      }
    }
    if (st.big || isfinite(st.var)) return st;
    T m = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) m = max_nan(m, of_abs(xr[i]));
    m = block_reduce(m, true);
    if (!isfinite(m)) return st;  // an infinity or NaN in x: NaN out, as on the CPU
    st.s = m;
    st.big = true;  // again on x / s, where nothing overflows
  }
}

// layer_norm over rows of n: (x − mu)/√(var + eps), then ·w and +b (has_w, has_b); x̂ = 0 where x − mu is, in a
// group whose variance overflowed (_big_groups).
extern "C" __global__ void layer_norm_rows(const T* x, const T* w, const T* b, T* y, long long n, T eps, int has_w,
                                           int has_b) {
  const T* xr = x + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  const Stats st = row_stats(xr, n, true);
  const T root = of_sqrt(st.var + eps);
  const T r = st.big ? (T)1 / of_sqrt(st.var + eps / st.s / st.s) : (T)0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    const T d = centred(xr[i], st);
    T v = st.big ? (d == (T)0 ? (T)0 : d * r) : d / root;
    if (has_w) v = v * w[i];
    if (has_b) v = v + b[i];
    yr[i] = v;
  }
}

// normalize_grad over rows of n: x̂ and dx = r·(g − mean(g) − x̂·mean(g·x̂)) (no mean(g) without centring).
extern "C" __global__ void normalize_grad_rows(const T* x, const T* g, T* dx, T* xhat, long long n, T eps,
                                               int center) {
  const long long base = blockIdx.x * n;
  const Stats st = row_stats(x + base, n, center);
  T r, rs = 0;
  if (!st.big) {
    r = (T)1 / of_sqrt(st.var + eps);
  } else {
    const T d = st.var + eps / st.s / st.s;
    rs = (T)1 / of_sqrt(d);
    r = d > (T)0 ? rs / st.s : (T)1 / of_sqrt(eps);
  }
  T a = 0, b = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    const T d = centred(x[base + i], st);
    const T h = st.big ? (d == (T)0 ? (T)0 : d * rs) : d * r;
    a += g[base + i];
    b += g[base + i] * h;
  }
  const T mean_g = center ? block_reduce(a, false) / (T)n : (T)0;
  const T mean_gh = block_reduce(b, false) / (T)n;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    const T d = centred(x[base + i], st);
    const T h = st.big ? (d == (T)0 ? (T)0 : d * rs) : d * r;
    const T gi = g[base + i];
    xhat[base + i] = h;
    dx[base + i] = ((center ? gi - mean_g : gi) - h * mean_gh) * r;
  }
}
"""


def rows_source(dtype) -> str:
    """The row kernels' CUDA source for float32 or float64."""
    return f"typedef {'float' if dtype == D.float32 else 'double'} T;\n" + ROWS


@functools.cache
def _rows_module(dtype):
    return _cupy().RawModule(code=rows_source(dtype))


def _launch(name: str, dtype, rows: int, n: int, args: tuple, threads: int | None = None) -> None:
    """Run row kernel ``name`` with one block per row (``rows`` blocks) of ``_block(n)`` threads."""
    kernel = _rows_module(dtype).get_function(name)
    kernel((rows,), (threads or _block(n),), args)


def _scalar(value, dtype):
    """A Python number as the kernel's T (a NumPy scalar: RawKernel passes it by value in that type)."""
    return np.dtype(dtype).type(value)


def _row_call(name: str, inputs: tuple, out, like):
    """A row kernel over ``inputs`` (contiguous rows of like's last axis) into ``out`` or a new array."""
    cupy = _cupy()
    y = cupy.empty_like(like) if out is None else out
    n = like.shape[-1]
    _launch(name, like.dtype, like.size // n, n, (*inputs, y, np.int64(n)))
    return y


@softmax.kernel(device="cuda", dtypes=FLOATS)
def _(x, *, axis, out=None):
    if not _rows_of(x, axis) or not _fits(out, x):
        return _generic(softmax, x.dtype)(x, axis=axis, out=out)
    return _row_call("softmax_rows", (x,), out, x)


@log_softmax.kernel(device="cuda", dtypes=FLOATS)
def _(x, *, axis, out=None):
    if not _rows_of(x, axis) or not _fits(out, x):
        return _generic(log_softmax, x.dtype)(x, axis=axis, out=out)
    return _row_call("log_softmax_rows", (x,), out, x)


@softmax_grad.kernel(device="cuda", dtypes=FLOATS)
def _(y, dy, *, axis, out=None):
    if not _rows_of(y, axis) or not _same(y, dy) or not dy.flags.c_contiguous or not _fits(out, y):
        return _generic(softmax_grad, y.dtype)(y, dy, axis=axis, out=out)
    return _row_call("softmax_grad_rows", (y, dy), out, y)


@log_softmax_grad.kernel(device="cuda", dtypes=FLOATS)
def _(y, dy, *, axis, out=None):
    if not _rows_of(y, axis) or not _same(y, dy) or not dy.flags.c_contiguous or not _fits(out, y):
        return _generic(log_softmax_grad, y.dtype)(y, dy, axis=axis, out=out)
    return _row_call("log_softmax_grad_rows", (y, dy), out, y)


def _class_rows(logits, target, weight, label_smoothing) -> bool:
    """Whether a cross_entropy call is the row kernels' case: (N, C) contiguous logits, int32/int64 class indices of
    shape (N,), no class weight, no label smoothing."""
    return (logits.ndim == 2 and logits.size and logits.flags.c_contiguous and target.shape == logits.shape[:1]
            and target.dtype in (np.int32, np.int64) and target.flags.c_contiguous and weight is None
            and not label_smoothing)


_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


@cross_entropy.kernel(device="cuda", dtypes=FLOATS)
def _(logits, target, weight, *, ignore_index, reduction, label_smoothing, save=None):
    """Class indices (the common case): each row's loss in one pass (max, Σ exp, the target's term), then one block
    sums them. The forward saves nothing for the backward pass (cross_entropy_grad's row kernel makes the softmax
    again from the logits, in the same pass that writes the gradient)."""
    if not _class_rows(logits, target, weight, label_smoothing) or reduction not in _REDUCTIONS:
        return _generic(cross_entropy, logits.dtype)(logits, target, weight, ignore_index=ignore_index,
                                                     reduction=reduction, label_smoothing=label_smoothing, save=save)
    cupy = _cupy()
    rows, classes = logits.shape
    kind = "i32" if target.dtype == np.int32 else "i64"
    losses = cupy.empty(rows, logits.dtype)
    _launch(f"ce_rows_{kind}", logits.dtype, rows, classes,
            (logits, target, losses, np.int64(classes), np.int64(ignore_index)))
    total = cupy.empty((), logits.dtype)
    first_bad = cupy.empty((), np.int64)
    _launch(f"ce_finish_{kind}", logits.dtype, 1, rows,
            (losses, target, total, first_bad, np.int64(rows), np.int64(classes), np.int64(ignore_index),
             np.int32(reduction == "mean")))
    bad = int(first_bad)  # the one read, as the generic kernel's check of the targets on a device
    if bad < rows:
        raise ArgumentError(f"cross_entropy(): target holds class {int(target[bad])}, outside [0, {classes}) and "
                            f"not ignore_index ({ignore_index})")
    return losses if reduction == "none" else total


@cross_entropy_grad.kernel(device="cuda", dtypes=FLOATS)
def _(logits, target, dloss, weight, exp_rows, row_sums, *, ignore_index, reduction, label_smoothing, out=None):
    if (not _class_rows(logits, target, weight, label_smoothing) or exp_rows is not None or row_sums is not None
            or reduction not in _REDUCTIONS or dloss.dtype != logits.dtype
            or dloss.shape != (target.shape if reduction == "none" else ()) or not _fits(out, logits)):
        return _generic(cross_entropy_grad, logits.dtype)(
            logits, target, dloss, weight, exp_rows, row_sums, ignore_index=ignore_index, reduction=reduction,
            label_smoothing=label_smoothing, out=out)
    cupy = _cupy()
    rows, classes = logits.shape
    kind = "i32" if target.dtype == np.int32 else "i64"
    count = cupy.empty((), np.int64)
    if reduction == "mean":
        _launch(f"ce_count_{kind}", logits.dtype, 1, rows,
                (target, count, np.int64(rows), np.int64(classes), np.int64(ignore_index)))
    dx = cupy.empty_like(logits) if out is None else out
    _launch(f"ce_grad_rows_{kind}", logits.dtype, rows, classes,
            (logits, target, cupy.ascontiguousarray(dloss), count, dx, np.int64(classes), np.int64(ignore_index),
             np.int32(_REDUCTIONS[reduction])))
    return dx


def _affine_fits(t, n: int, dtype) -> bool:
    return t is None or (t.dtype == dtype and t.size == n and t.flags.c_contiguous)


@layer_norm.kernel(device="cuda", dtypes=FLOATS)
def _(x, weight, bias, *, normalized_shape, eps):
    _validate_nn(layer_norm, x, weight, bias, normalized_shape=normalized_shape, eps=eps)
    n = int(np.prod(normalized_shape))
    if not x.size or not n or not x.flags.c_contiguous or not _affine_fits(weight, n, x.dtype) \
            or not _affine_fits(bias, n, x.dtype):
        return _generic(layer_norm, x.dtype)(x, weight, bias, normalized_shape=normalized_shape, eps=eps)
    y = _cupy().empty_like(x)
    _launch("layer_norm_rows", x.dtype, x.size // n, n,
            (x, x if weight is None else weight, x if bias is None else bias, y, np.int64(n), _scalar(eps, x.dtype),
             np.int32(weight is not None), np.int32(bias is not None)))
    return y


@normalize_grad.kernel(device="cuda", dtypes=FLOATS)
def _(x, g, *, axes, eps, center):
    _validate_nn(normalize_grad, x, g, axes=axes, eps=eps, center=center)
    trailing = tuple(normalize_axes("normalize_grad", axes, x.ndim)) if x.ndim else ()
    k = len(trailing)
    if (not x.size or not k or trailing != tuple(_trailing(x.ndim, [0] * k)) or not _same(x, g)
            or not x.flags.c_contiguous or not g.flags.c_contiguous):
        return _generic(normalize_grad, x.dtype)(x, g, axes=axes, eps=eps, center=center)
    cupy = _cupy()
    n = int(np.prod(x.shape[x.ndim - k:]))
    dx, xhat = cupy.empty_like(x), cupy.empty_like(x)
    _launch("normalize_grad_rows", x.dtype, x.size // n, n,
            (x, g, dx, xhat, np.int64(n), _scalar(eps, x.dtype), np.int32(bool(center))))
    return dx, xhat

