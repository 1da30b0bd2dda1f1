"""GEMM epilogues and accumulating GEMMs: a matrix product whose only reader is an update of the form
``p − s·(a @ b)`` (an SGD step: ``assign(p, p - lr * g)`` or ``of.optim.SGD`` without momentum or weight decay, g a
weight gradient) runs as one BLAS call that adds ``−s·(a @ b)`` into ``p``'s buffer (GEMM with alpha = −s,
beta = 1): no gradient array, no second pass over the parameter.

What changes against the unfused program (the switch: ``OPFORGE_NATIVE=0`` or ``Executor(native=False)`` keeps it
bit for bit): the product is not rounded to its dtype before it is scaled and added (BLAS scales its accumulator and
adds, possibly in one FMA), and the GEMM's summation order may differ from ``matmul``'s (NumPy's OpenBLAS called
through its CBLAS entry point, or SciPy's where that is not found): each new value is within a few ulp (of the
update's size) of the unfused one. A step size of zero runs the unfused ops: BLAS may skip the product when alpha is
0 (the reference BLAS does; OpenBLAS does not), and an infinite or NaN gradient must still give NaN.

A sum (``add_n``, or an ``add`` of two operands of its result's shape) whose summands include 2-D matrix products
that it alone reads, directly or through a transpose (a second backward pass sums such products for every weight:
``d2ᵀ·Rh1 + Rd2ᵀ·h1``), runs as one step (``GemmSum``): the other summands are added as ``add_n`` adds them, then
each product is added into that buffer by a GEMM with beta = 1 (a transposed product ``(a·b)ᵀ`` as ``bᵀ·aᵀ``); with no
other summand the first product is written by ``matmul`` itself. No product array, no pass over it, no strided read
of a transposed one. What changes: the products are added after the other summands, in program order, each without
being rounded to its dtype first; a transposed product's summation order is BLAS's for ``bᵀ·aᵀ``: each sum is within
a few ulp (of its summands' size) of the unfused one. The same switch keeps the unfused program bit for bit.

Which BLAS (``blas()``): NumPy's own OpenBLAS, or Intel's MKL where it is installed (``opforge[mkl]``) and NumPy's BLAS
runs on one thread of an Intel CPU (``OPFORGE_BLAS`` chooses otherwise). With MKL the sums and updates above call it,
and so does every other 2-D matmul and linear of floats large enough (``GemmProduct``): its products differ from
NumPy's matmul (eager mode's) in the last bits, another summation order; the switch above keeps eager's bits.

A forward epilogue: a ``linear`` whose result only pointwise ops read (its activation) leaves its bias to an ``add``
that joins their native loop (``bias_epilogues``): bias and activation in one pass after the GEMM, the same bits.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import math
import os
from pathlib import Path

import numpy as np

from ..core.errors import ArgumentError
from ..core.opdef import Kernel, registry
from . import fastcall
from .desc import OpDesc
from .fusion import FusedOp, _allocator

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@functools.cache
def _numpy_openblas():
    """NumPy's own OpenBLAS (as NumPy's wheels build it: 64-bit ints, ``scipy_``-prefixed names), or None."""
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    try:
        maps = Path("/proc/self/maps").read_text().split()
    except OSError:
        return None
    path = next((m for m in maps if m.startswith(str(libs)) and "openblas" in m), None)
    try:
        return None if path is None else ctypes.CDLL(path)
    except OSError:
        return None


def _cblas_gemms(lib, sgemm: str, dgemm: str) -> dict:
    """A library's row-major ``cblas_?gemm`` with 64-bit ints, by dtype ({} if it lacks them)."""
    try:
        functions = {np.dtype(np.float32): (getattr(lib, sgemm), ctypes.c_float),
                     np.dtype(np.float64): (getattr(lib, dgemm), ctypes.c_double)}
    except AttributeError:
        return {}
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for fn, real in functions.values():
        fn.restype = None  # order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
        fn.argtypes = [ctypes.c_int] * 3 + [i64] * 3 + [real, ptr, i64, ptr, i64, real, ptr, i64]
    return {dtype: fn for dtype, (fn, _) in functions.items()}


@functools.cache
def _numpy_cblas() -> dict:
    """NumPy's own OpenBLAS ``cblas_?gemm`` by dtype, or {} where it cannot be found: the GEMM then runs in the library
    that computes NumPy's matmul, as fast (SciPy's OpenBLAS, another build, took 8% longer at 512×512 by 512×784
    here)."""
    lib = _numpy_openblas()
    return {} if lib is None else _cblas_gemms(lib, "scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_")


def _numpy_blas_threads() -> int | None:
    """The threads NumPy's OpenBLAS runs a GEMM on now, or None where that cannot be asked."""
    lib = _numpy_openblas()
    try:
        return None if lib is None else int(lib.scipy_openblas_get_num_threads64_())
    except AttributeError:
        return None


MKL_SEQUENTIAL = 1  # mkl_set_threading_layer's MKL_THREADING_SEQUENTIAL


@functools.cache
def _mkl():
    """(MKL's single library ``libmkl_rt``, its version) as the PyPI package ``mkl`` (``opforge[mkl]``) installs it,
    in its sequential threading layer; None where it is not installed or does not load."""
    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    path = next((f for f in files if f.name.startswith("libmkl_rt.so")), None)
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path.locate()))
        # before any other MKL call: one thread, no OpenMP runtime beside the ones NumPy and torch bring
        lib.MKL_Set_Threading_Layer(ctypes.c_int(MKL_SEQUENTIAL))
        text = ctypes.create_string_buffer(256)
        lib.mkl_get_version_string(text, ctypes.c_int(len(text)))
    except (OSError, AttributeError):
        return None
    return lib, text.value.decode(errors="replace").strip()


def _intel_cpu() -> bool:
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


class Blas:
    """The library a compiled program's GEMMs call (``blas()``): ``name`` "mkl" or "openblas" (NumPy's own),
    ``gemm`` its row-major ``cblas_?gemm`` with 64-bit ints by dtype, ``why`` how it was chosen."""

    def __init__(self, name: str, gemm: dict, version: str, why: str):
        self.name, self.gemm, self.version, self.why = name, gemm, version, why
        # (sgemm, dgemm) addresses for fastcall.gemm, or None
        self.addresses = tuple(fastcall.address(gemm[d]) for d in FLOATS) if all(d in gemm for d in FLOATS) else None

    def __repr__(self) -> str:
        return f"Blas({self.name}, {self.version!r}: {self.why})"


BLAS_CHOICES = ("auto", "mkl", "openblas")


@functools.cache
def blas() -> Blas:
    """Which BLAS the GEMMs of compiled programs call, chosen once per process by ``OPFORGE_BLAS``:

    - ``openblas``: NumPy's own OpenBLAS, the library of NumPy's matmul and of eager mode;
    - ``mkl``: Intel's MKL, sequential (``pip install 'opforge[mkl]'``); an error where it is not installed;
    - ``auto`` (the default): MKL where it is installed, the CPU is Intel's and NumPy's BLAS runs on one thread,
      else OpenBLAS. On one thread of this project's Xeon (AVX-512), float32, MKL's GEMMs of the bench's MLP took
      22-34% less time than OpenBLAS's (x·Wᵀ, 64 × 784 by 784 × 512: 343 against 507 µs; h·W2ᵀ 238 against 335;
      Rd2·W2 195 against 246; Rd1ᵀ·x 330 against 375); on AMD's CPUs MKL takes slower paths, and with several
      threads MKL would start a second thread pool beside OpenBLAS's: there OpenBLAS stays.

    With MKL, a compiled program's 2-D matmul and linear of floats (``GemmProduct``) and the sums and updates of this
    module call it: their results may differ from eager mode's (NumPy's OpenBLAS) in the last bits, as two BLAS
    libraries sum a dot product in different orders. ``OPFORGE_NATIVE=0`` keeps the eager bits."""
    choice = os.environ.get("OPFORGE_BLAS", "auto").strip().lower() or "auto"
    if choice not in BLAS_CHOICES:
        raise ArgumentError(f"OPFORGE_BLAS={os.environ['OPFORGE_BLAS']!r}: expected one of {', '.join(BLAS_CHOICES)}")
    openblas = Blas("openblas", _numpy_cblas(), "NumPy's", "OPFORGE_BLAS=openblas")
    if choice == "openblas":
        return openblas
    if choice == "mkl":
        mkl = _mkl()
        if mkl is None:
            raise ArgumentError("OPFORGE_BLAS=mkl: MKL is not installed (or does not load); "
                                "pip install 'opforge[mkl]', or set OPFORGE_BLAS=openblas")
        return Blas("mkl", _cblas_gemms(mkl[0], "cblas_sgemm_64", "cblas_dgemm_64"), mkl[1], "OPFORGE_BLAS=mkl")
    threads = _numpy_blas_threads()  # (MKL is loaded only where it would be taken)
    if threads != 1:
        openblas.why = f"NumPy's BLAS runs on {threads or 'several'} threads"
    elif not _intel_cpu():
        openblas.why = "not an Intel CPU"
    elif (mkl := _mkl()) is None:
        openblas.why = "MKL is not installed"
    else:
        gemm = _cblas_gemms(mkl[0], "cblas_sgemm_64", "cblas_dgemm_64")
        if gemm:
            return Blas("mkl", gemm, mkl[1], "installed, an Intel CPU, one BLAS thread")
    return openblas


ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _row_major(m) -> tuple | None:
    """(trans, leading dimension) of a 2-D array as row-major BLAS reads it in place, or None."""
    item = m.itemsize
    if m.strides[1] == item and m.strides[0] % item == 0 and m.strides[0] >= max(1, m.shape[1]) * item:
        return NO_TRANS, m.strides[0] // item
    if m.strides[0] == item and m.strides[1] % item == 0 and m.strides[1] >= max(1, m.shape[0]) * item:
        return TRANS, m.strides[1] // item
    return None


def _fortran(m):
    """(array, trans) such that op(array) is ``m`` and the array is Fortran-ordered, as BLAS reads it."""
    if m.flags.f_contiguous:
        return m, 0
    if m.flags.c_contiguous:
        return m.T, 1
    return np.asfortranarray(m), 0


def _gemm(dtype):
    """The ``cblas_?gemm`` compiled programs call for this dtype (``blas()``), or None (SciPy's then)."""
    chosen = blas()
    return chosen.gemm.get(dtype) if chosen.name == "mkl" else _numpy_cblas().get(dtype)


def _fast_gemm(env: dict) -> bool:
    """Put ``_gemm`` (fastcall.gemm) and the chosen BLAS's ``_gemm_s``/``_gemm_d`` addresses in a plan's ``env``,
    with ``_add_product`` for what it declines, where the extension is built; whether they are there."""
    chosen, fast = blas(), fastcall.module()
    if fast is None or chosen.addresses is None:
        return False
    env.setdefault("_gemm", fast.gemm)
    env.setdefault("_gemm_s", chosen.addresses[0])
    env.setdefault("_gemm_d", chosen.addresses[1])
    env.setdefault("_add_product", add_product)
    return True


def add_product(c, alpha: float, a, b, beta: float = 1.0) -> None:
    """``c = alpha · (a @ b) + beta · c`` in place: ``c`` a C-ordered (m, n) array, ``a`` (m, k), ``b`` (k, n), one
    dtype. With beta = 0, c's old values are not read (BLAS's contract: NaN there does not propagate)."""
    chosen, fast = blas(), fastcall.module()
    if fast is not None and chosen.addresses is not None:  # the same call, its checks in C (fastcall's docstring)
        if not (fast.gemm(*chosen.addresses, c, alpha, a, b, beta)  # or else an operand BLAS cannot read in place:
                or fast.gemm(*chosen.addresses, c, alpha, np.ascontiguousarray(a), np.ascontiguousarray(b), beta)):
            raise ValueError("add_product: c must be a writeable C-ordered array sharing no memory with a or b")
        return
    gemm = _gemm(c.dtype)
    if gemm is not None:
        a = a if _row_major(a) else np.ascontiguousarray(a)
        b = b if _row_major(b) else np.ascontiguousarray(b)
        (ta, lda), (tb, ldb) = _row_major(a), _row_major(b)
        (m, k), n = a.shape, b.shape[1]
        gemm(ROW_MAJOR, ta, tb, m, n, k, alpha, a.ctypes.data, lda, b.ctypes.data, ldb, beta, c.ctypes.data, n)
        return
    from scipy.linalg import blas as scipy_blas  # column-major, c's memory is cᵀ's, cᵀ = alpha · bᵀ·aᵀ + beta · cᵀ

    x, trans_x = _fortran(b.T)
    y, trans_y = _fortran(a.T)
    r = (scipy_blas.sgemm if c.dtype == np.float32 else scipy_blas.dgemm)(
        alpha, x, y, beta=beta, c=c.T, trans_a=trans_x, trans_b=trans_y, overwrite_c=1)
    if r.ctypes.data != c.ctypes.data:  # the wrapper copied c after all
        np.copyto(c, r.T)


class GemmUpdate(FusedOp):
    """One step of a plan for ``p − s·(a @ b)``: ``members`` the matmul and the ops it stands for (a fused mul and
    sub, or an ``sgd_update``); ``inputs`` [s, a, b, p]; ``unfused(p, g, s, device)`` those ops' own kernels, for a
    zero step. Its output may be written into p's buffer (an in-place parameter update)."""

    type = "gemm_update"

    def __init__(self, members: list, inputs: list, output: str, specs: dict, unfused):
        self.members, self.inputs, self.output, self.specs, self.unfused = members, inputs, output, specs, unfused
        self.spec = specs[output]
        self.scratch, self.donated, self.native = [], set(), None
        self.inplace_inputs = [inputs[3]]

    def __repr__(self) -> str:
        s, a, b, p = self.inputs
        return f"gemm_update({self.output} = {p} - {s}·({a} @ {b}))"

    def prepare(self, out_input) -> None:
        pass

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        device = env["_device"]
        env[f"{name}_e"] = _allocator(env["_empty"], self.spec)
        env.setdefault("_add_product", add_product)
        env.setdefault("_shares", np.may_share_memory)
        matmul, unfused = self.members[0][2].bind(device), self.unfused
        env[f"{name}_unfused"] = lambda p, a, b, s: unfused(p, matmul(a, b), s, device)
        lines = [f"def {name}(s, a, b, p, W, out=None):  # {self!r}",
                 "    if not s:  # a BLAS may skip the product: inf·0 must still be NaN",
                 f"        y = {name}_unfused(p, a, b, s)",
                 "        if out is not None:", "            _copyto(out, y)", "            y = out",
                 "        return y",
                 "    dst = out if out is not None and out.flags.c_contiguous else None",
                 "    if dst is None or _shares(dst, a) or _shares(dst, b) or (dst is not p and _shares(dst, p)):",
                 f"        dst = {name}_e()",
                 "    if dst is not p:", "        _copyto(dst, p)",
                 "    _add_product(dst, -s.item(), a, b)",
                 "    if out is not None and dst is not out:", "        _copyto(out, dst)", "        dst = out",
                 "    return dst"]
        return lines, {12: " -> ".join(op.type for op, _, _ in self.members) + " (one GEMM)"}


def _update(entry, kernel, specs):
    """(s, g, p, unfused) if a step of the plan computes p − s·g with s a 0-d value: a fused mul and sub (s of the
    update's dtype, as NumPy would compute it), or an ``sgd_update`` without momentum or weight decay."""
    op, attrs = entry
    if type(op) is FusedOp and len(op.members) == 2:
        (mul, _, mul_kernel), (sub, _, sub_kernel) = op.members
        if mul.type != "mul" or sub.type != "sub" or sub.inputs["y"] != mul.outputs["out"]:
            return None
        (x,), (y,), (p,) = mul.inputs["x"], mul.inputs["y"], sub.inputs["x"]
        s, g = (x, y) if specs[x].shape == () else (y, x)
        if specs[s].dtype != specs[p].dtype or specs[mul.output_names()[0]].dtype != specs[p].dtype:
            return None

        def unfused(p, g, s, device):
            return sub_kernel.bind(device)(p, mul_kernel.bind(device)(s, g))

        return s, g, p, unfused
    if isinstance(op, OpDesc) and op.type == "sgd_update" and not op.inputs.get("momentum_buffer") \
            and attrs.get("weight_decay") == 0:
        (s,), (g,), (p,) = op.inputs["lr"], op.inputs["grad"], op.inputs["param"]

        def unfused(p, g, s, device):
            return kernel.bind(device)(p, g, s, None, None, **attrs)  # (no momentum buffer, no momentum)

        return s, g, p, unfused
    return None


def gemm_updates(ops: list, kernels: list, specs: dict, keep: set) -> tuple[list, list]:
    """Replace each step computing ``p − s·g`` (``_update``) whose g is a 2-D matmul read by it alone by a
    ``GemmUpdate`` at the step's place, the matmul gone."""
    producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
    readers = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            readers.setdefault(n, set()).add(i)
    replaced, gone = {}, set()
    for i, (entry, kernel) in enumerate(zip(ops, kernels)):
        found = _update(entry, kernel, specs)
        if found is None:
            continue
        s, g, p, unfused = found
        j = producer.get(g)
        if (specs[s].shape != () or specs[s].dtype not in FLOATS or j is None or g in keep or readers[g] != {i}
                or not isinstance(ops[j][0], OpDesc) or ops[j][0].type != "matmul"):
            continue
        matmul = ops[j][0]
        (a,), (b,) = matmul.inputs["x"], matmul.inputs["y"]
        (out,) = entry[0].output_names()
        if (len({specs[n].dtype for n in (g, p, out, a, b)}) != 1 or specs[out].dtype not in FLOATS
                or specs[g] != specs[out] or specs[p] != specs[out] or len(specs[a].shape) != 2
                or len(specs[b].shape) != 2 or 0 in specs[a].shape or 0 in specs[b].shape):
            continue
        members = [(matmul, ops[j][1], kernels[j])]
        members += entry[0].members if isinstance(entry[0], FusedOp) else [(entry[0], entry[1], kernel)]
        replaced[i] = GemmUpdate(members, [s, a, b, p], out, specs, unfused)
        gone.add(j)
    return _spliced(ops, kernels, replaced, gone)


def accumulate(dst, others: list, products: list, few_rows: bool = False) -> None:
    """``dst = others[0] + others[1] + … + Σ a @ b`` over ``products`` ((a, b) pairs, 2-D, one dtype), the others
    summed as ``add_n`` sums them (into ``dst`` itself when it is one of them), each product added by a GEMM. With
    ``few_rows`` (``_few_rows``) and a ``b`` read transposed, the products are summed transposed (Σ bᵀ·aᵀ) into a
    new array and that sum is added to the others last."""
    if few_rows and any(b.strides[1] != b.itemsize for _, b in products):
        total = np.empty(dst.shape[::-1], dst.dtype)
        accumulate(total, [], [(b.T, a.T) for a, b in products])
        if not others:
            np.copyto(dst, total.T)
            return
        accumulate(dst, others, [])
        np.add(dst, total.T, out=dst)
        return
    if others:
        rest = list(others)
        into = next((k for k, x in enumerate(rest) if x is dst), None)
        if into is not None:
            del rest[into]
        elif len(rest) > 1:
            np.add(rest[0], rest[1], out=dst)
            rest = rest[2:]
        else:
            np.copyto(dst, rest.pop(0))
        for x in rest:
            np.add(dst, x, out=dst)
    elif blas().name == "mkl":
        add_product(dst, 1.0, *products[0], beta=0.0)
        products = products[1:]
    else:
        np.matmul(*products[0], out=dst)
        products = products[1:]
    for a, b in products:
        add_product(dst, 1.0, a, b)


def _few_rows(spec, products: list, specs: dict) -> bool:
    """Whether a sum of products is of the shapes where OpenBLAS runs a float32 product a·b with a row-major result of
    few rows far below its speed when it reads b transposed (x·Wᵀ: ``ops/linalg.py``'s ``_few_rows_linear``
    measures it for linear), so that ``accumulate`` sums the transposed products instead. The same rule as linear's:
    float32, 8 to 64 rows, the other dims >= 256. Measured on this project's machine (AVX-512, one thread): h·W2ᵀ
    (64 × 512 by 512 × 512) 340 µs, W2·hᵀ 260 µs; the Hessian-vector product's c + h·W2ᵀ + Rh·V2ᵀ 740 µs as written,
    630 µs transposed; h·W2 (b not transposed) 261 µs, W2ᵀ·hᵀ 251 µs: left as it is. Shapes and layouts decide alone:
    a plan gives the same bits at every run."""
    rows, features = spec.shape
    inner = [specs[a].shape[1] for a, _, _ in products]
    return spec.dtype == np.float32 and 8 <= rows <= 64 and features >= 256 and min(inner) >= 256


# A GemmSum costs about 9 µs more per call than NumPy's matmul and add (the CBLAS call through ctypes, the layout
# checks): it pays where the pass over a large result it saves costs more. Measured on this project's machine (one
# thread, float32, the sum of two products): a 128 × 128 result (K = 32) 22 µs unfused against 29, 256 × 256 (K = 64)
# 158 against 140, 512 × 512 697 against 512, 1024 × 256 (K = 20) 353 against 208; 64 × 512 (K = 10) 23 against 24.
LARGE = 65536  # elements of the result
FEW_ROWS_LARGE = 16384  # elements of a result with few rows (_few_rows): 64 × 256 and up


def _worth_it(spec, products: list, specs: dict) -> bool:
    size = spec.shape[0] * spec.shape[1]
    return size >= LARGE or (size >= FEW_ROWS_LARGE and _few_rows(spec, products, specs))


class GemmSum(FusedOp):
    """One step of a plan for a sum of which some summands are matrix products that nothing else reads: ``members``
    the products' ops (matmul, and transpose where the sum read the product transposed) then the sum; ``inputs`` the
    other summands then each product's two operands; ``transposed`` per product, whether the sum read it
    transposed. Its output may be written into an other summand's buffer (as add_n's may)."""

    type = "gemm_sum"

    def __init__(self, members: list, others: list, products: list, output: str, specs: dict):
        self.members, self.others, self.products = members, others, products
        self.inputs = [*others, *(n for a, b, _ in products for n in (a, b))]
        self.output, self.specs, self.spec = output, specs, specs[output]
        self.scratch, self.donated, self.native = [], set(), None
        self.inplace_inputs = [n for n in others if specs[n] == self.spec]
        self.few_rows = _few_rows(self.spec, products, specs) and blas().name != "mkl"  # (MKL has no such need)

    def __repr__(self) -> str:
        terms = [*self.others, *(f"({a} @ {b})" + ("ᵀ" if t else "") for a, b, t in self.products)]
        return f"gemm_sum({self.output} = {' + '.join(terms)})"

    def prepare(self, out_input) -> None:
        pass

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        env[f"{name}_e"] = _allocator(env["_empty"], self.spec)
        env.setdefault("_accumulate", accumulate)
        env.setdefault("_shares", np.may_share_memory)
        others = [f"o{k}" for k in range(len(self.others))]
        factors = [f"a{k}, b{k}" for k in range(len(self.products))]
        products = [(f"b{k}.T", f"a{k}.T") if t else (f"a{k}", f"b{k}") for k, (_, _, t) in enumerate(self.products)]
        operands = " or ".join(f"_shares(dst, a{k}) or _shares(dst, b{k})" for k in range(len(self.products)))
        lines = [f"def {name}({''.join(o + ', ' for o in others)}{', '.join(factors)}, W, out=None):  # {self!r}"]
        chosen, fast_at = blas(), None
        if not self.few_rows and _fast_gemm(env):
            # accumulate's work with its checks in C (each Python-level look costs ~4 µs with the caches cold after a
            # GEMM): the same order and calls; where the output cannot be written directly, the lines after these
            env.setdefault("_disjoint", fastcall.module().disjoint)
            env.setdefault("_matmul", np.matmul)
            pairs = products
            lines += [f"    dst = out if out is not None else {name}_e()",
                      f"    if _disjoint(dst, {', '.join(factors)}):"]
            fast_at = len(lines)  # (its first call's line: what names a failure there)
            row = self.specs[self.others[0]] if len(self.others) == 1 else None
            if row is not None and row.shape == self.spec.shape[1:] and row.dtype == self.spec.dtype:
                # one other term, a row broadcast over the result (a bias's tangent): the first GEMM copies it into
                # each row itself (np.copyto's values) and adds its product with beta = 1, as accumulate does
                (x, y), pairs = pairs[0], pairs[1:]
                lines += [f"        if not _gemm(_gemm_s, _gemm_d, dst, 1.0, {x}, {y}, 0.0, o0):",
                          "            _accumulate(dst, [o0], [])",
                          f"            _add_product(dst, 1.0, {x}, {y}, 1.0)"]
            elif others:
                lines.append(f"        _accumulate(dst, [{', '.join(others)}], [])")
            elif chosen.name != "mkl":  # (as accumulate: the first product by NumPy's matmul)
                lines.append(f"        _matmul({pairs[0][0]}, {pairs[0][1]}, out=dst)")
                pairs = pairs[1:]
            for k, (x, y) in enumerate(pairs):
                beta = "1.0" if others or k or chosen.name != "mkl" else "0.0"
                lines.append(f"        _gemm(_gemm_s, _gemm_d, dst, 1.0, {x}, {y}, {beta}) "
                             f"or _add_product(dst, 1.0, {x}, {y}, {beta})")  # (an operand to copy first)
            lines.append("        return dst")
        label = len(lines) + 3
        lines += ["    dst = out if out is not None and out.flags.c_contiguous else None",
                  f"    if dst is None or {operands}:",  # a GEMM must not write what it reads
                  f"        dst = {name}_e()",
                  f"    _accumulate(dst, [{', '.join(others)}], [{', '.join(f'({x}, {y})' for x, y in products)}]"
                  + (", True)" if self.few_rows else ")"),
                  "    if out is not None and dst is not out:", "        _copyto(out, dst)", "        dst = out",
                  "    return dst"]
        what = " + ".join(op.type for op, _, _ in self.members) + " (products by GEMM)"
        return lines, {label: what, **({} if fast_at is None else {fast_at: what})}


def _transposed(op, specs) -> bool:
    """Whether ``op`` is a transpose of a 2-D value (its two dims swapped)."""
    if not isinstance(op, OpDesc) or op.type != "transpose" or len(specs[op.input_names()[0]].shape) != 2:
        return False
    perm = op.attrs.get("perm")
    return perm is None or [p % 2 for p in perm] == [1, 0]


def gemm_sums(ops: list, kernels: list, specs: dict, keep: set) -> tuple[list, list]:
    """Replace each ``add_n`` (or same-shape ``add``) with a summand that is a 2-D matmul read by it alone (directly
    or through a transpose read by it alone) by a ``GemmSum`` at its place, those matmuls and transposes gone."""
    producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
    readers = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            readers.setdefault(n, []).append(i)

    def product(n, i):
        """(matmul index, transpose index or None) if the value n, summed by op i, is a product only it reads."""
        j = producer.get(n)
        if j is None or n in keep or readers[n] != [i] or not isinstance(ops[j][0], OpDesc):
            return None
        t = None
        if _transposed(ops[j][0], specs):
            t, n = j, ops[j][0].input_names()[0]
            j = producer.get(n)
            if j is None or n in keep or readers[n] != [t] or not isinstance(ops[j][0], OpDesc):
                return None
        matmul = ops[j][0]
        if matmul.type != "matmul":
            return None
        (a,), (b,) = matmul.inputs["x"], matmul.inputs["y"]
        if (len(specs[a].shape) != 2 or len(specs[b].shape) != 2 or 0 in specs[a].shape or 0 in specs[b].shape
                or specs[a].dtype != specs[n].dtype or specs[b].dtype != specs[n].dtype):
            return None
        return j, t

    replaced, gone = {}, set()
    for i, ((op, attrs), kernel) in enumerate(zip(ops, kernels)):
        if not isinstance(op, OpDesc) or op.type not in ("add_n", "add"):
            continue
        (out,) = op.output_names()
        summands = op.input_names()
        spec = specs[out]
        if (spec.dtype not in FLOATS or len(spec.shape) != 2 or 0 in spec.shape
                or any(specs[n].dtype != spec.dtype for n in summands)
                or (op.type == "add" and any(specs[n] != spec for n in summands))
                or len(set(summands)) != len(summands)):
            continue
        found = {n: product(n, i) for n in summands}
        if not any(found.values()):
            continue
        if not _worth_it(spec, [(ops[j][0].inputs["x"][0], None, None) for j, _ in filter(None, found.values())],
                         specs):
            continue
        others, members = [], []
        for n in summands:
            if found[n] is not None:
                continue
            j = producer.get(n)  # a broadcast summand (a bias's gradient's gradient) is read as it was broadcast:
            if (j is not None and n not in keep and readers[n] == [i] and isinstance(ops[j][0], OpDesc)
                    and ops[j][0].type == "broadcast_to" and specs[ops[j][0].input_names()[0]].dtype == spec.dtype):
                members.append((ops[j][0], ops[j][1], kernels[j]))  # the sum's first pass broadcasts it
                gone.add(j)
                n = ops[j][0].input_names()[0]
            others.append(n)
        products = []
        for n in summands:
            if found[n] is None:
                continue
            j, t = found[n]
            matmul = ops[j][0]
            members.append((matmul, ops[j][1], kernels[j]))
            if t is not None:
                members.append((ops[t][0], ops[t][1], kernels[t]))
                gone.add(t)
            gone.add(j)
            products.append((matmul.inputs["x"][0], matmul.inputs["y"][0], t is not None))
        members.append((op, attrs, kernel))
        replaced[i] = GemmSum(members, others, products, out, specs)
    return _spliced(ops, kernels, replaced, gone)


# MKL's call through ctypes costs more than NumPy's matmul on small products: measured on this project's machine
# (one thread, float32), 64 × 512 by 512 × 10 took 15.1 µs in MKL against 9.5 in NumPy, 64 × 10 by 10 × 512 13.7
# against 12.5; from 64 × 512 by 512 × 512 on MKL is ahead (242 against 325 µs).
PRODUCT_MIN_DIM = 32
PRODUCT_MIN_WORK = 1 << 18  # m·n·k


class GemmProduct(FusedOp):
    """A 2-D ``matmul``, or ``linear`` of a 2-D x (its weight read transposed, its bias, if any, broadcast into the
    result before the GEMM adds the product with beta = 1), as one call of the chosen BLAS (``blas()``: MKL; with
    NumPy's own BLAS the ops' kernels run as they are). ``inputs`` [a, b] or [x, weight(, bias)]."""

    type = "gemm_product"

    def __init__(self, member: tuple, specs: dict):
        op = member[0]
        self.members, self.linear = [member], op.type == "linear"
        self.inputs = op.input_names()
        self.output = op.output_names()[0]
        self.specs, self.spec = specs, specs[self.output]
        self.scratch, self.donated, self.native, self.inplace_inputs = [], set(), None, []

    def __repr__(self) -> str:
        a, b, *bias = self.inputs
        return f"gemm_product({self.output} = {a} @ {b}{'ᵀ' if self.linear else ''}{''.join(' + ' + n for n in bias)})"

    def prepare(self, out_input) -> None:
        pass

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        env[f"{name}_e"] = _allocator(env["_empty"], self.spec)
        env.setdefault("_add_product", add_product)
        env.setdefault("_shares", np.may_share_memory)
        bias = len(self.inputs) == 3
        b = "b.T" if self.linear else "b"
        lines = [f"def {name}(a, b, {'c, ' if bias else ''}W, out=None):  # {self!r}"]
        if _fast_gemm(env):
            # one C call doing the checks below (each Python-level look costs ~4 µs with the caches cold after a
            # GEMM); where it declines (out in another layout or sharing memory), the lines after it
            lines += [f"    dst = out if out is not None else {name}_e()",
                      f"    if _gemm(_gemm_s, _gemm_d, dst, 1.0, a, {b}, 0.0{', c' if bias else ''}):",
                      "        return dst"]
        labels = {len(lines) - 2: f"{self.members[0][0].type} ({blas().name})"} if len(lines) > 1 else {}
        lines += ["    dst = out if out is not None and out.flags.c_contiguous else None",
                 "    if dst is None or _shares(dst, a) or _shares(dst, b)" + (" or _shares(dst, c)" if bias else "")
                 + ":",
                 f"        dst = {name}_e()"]
        if bias:
            lines.append("    _copyto(dst, c)")
        lines += [f"    _add_product(dst, 1.0, a, {b}, {'1.0' if bias else '0.0'})",
                  "    if out is not None and dst is not out:", "        _copyto(out, dst)", "        dst = out",
                  "    return dst"]
        return lines, {len(lines) - 4: f"{self.members[0][0].type} ({blas().name})", **labels}


def _product_operands(op, specs) -> tuple | None:
    """(m, k, n) if ``op`` is a matmul of two 2-D floats or a linear of a 2-D x (bias absent or one per output
    feature), every operand of its result's dtype; else None."""
    if not isinstance(op, OpDesc) or op.type not in ("matmul", "linear"):
        return None
    names = op.input_names()
    (out,) = op.output_names()
    spec = specs[out]
    if spec.dtype not in FLOATS or any(specs[n].dtype != spec.dtype for n in names):
        return None
    a, b = specs[names[0]].shape, specs[names[1]].shape
    if len(a) != 2 or len(b) != 2:
        return None
    if op.type == "linear":
        if len(names) == 3 and specs[names[2]].shape != (b[0],):
            return None
        b = b[::-1]
    return a[0], a[1], b[1]


def gemm_products(ops: list, kernels: list, specs: dict) -> tuple[list, list]:
    """With MKL chosen (``blas()``), each 2-D matmul and linear of floats large enough (``PRODUCT_MIN_*``) not taken
    into a GEMM sum or update becomes a ``GemmProduct``."""
    if blas().name != "mkl":
        return ops, kernels
    replaced = {}
    for i, ((op, attrs), kernel) in enumerate(zip(ops, kernels)):
        dims = _product_operands(op, specs)
        if dims is not None and min(dims) >= PRODUCT_MIN_DIM and math.prod(dims) >= PRODUCT_MIN_WORK:
            replaced[i] = GemmProduct((op, attrs, kernel), specs)
    return _spliced(ops, kernels, replaced, set())


def bias_epilogues(ops: list, kernels: list, specs: dict, keep: set, device) -> tuple[list, list]:
    """A forward GEMM epilogue: ``linear(x, w, b)`` of 2-D float operands whose result only pointwise ops with a
    scalar expression read (an activation, say) becomes ``linear(x, w)`` and an ``add`` of the bias, which the
    native region of those readers then takes in (``native.several_results``, ``fusion.fuse``): the bias and the
    activation in one pass after the GEMM instead of two. The same bits: linear rounds the product and adds the
    bias in its dtype, as the add does (``ops/linalg.py``). Run before the regions are made."""
    readers = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            readers.setdefault(n, []).append(i)
    new_ops, new_kernels = [], []
    for (op, attrs), kernel in zip(ops, kernels):
        if isinstance(op, OpDesc) and op.type == "linear" and op.inputs["bias"]:
            (x,), (w,), (b,), (y,) = op.inputs["x"], op.inputs["weight"], op.inputs["bias"], op.output_names()
            pointwise = [registry.get(ops[j][0].type) if isinstance(ops[j][0], OpDesc) else None
                         for j in readers.get(y, [])]
            if (y not in keep and pointwise and all(d is not None and "pointwise" in d.traits
                                                      and d.scalar_expression is not None for d in pointwise)
                    and len(specs[x].shape) == 2 and specs[y].dtype in FLOATS
                    and len({specs[n].dtype for n in (x, w, b, y)}) == 1 and specs[b].shape == specs[y].shape[1:]):
                product = f"{y}@product"
                specs[product] = specs[y]
                new_ops.append((OpDesc("linear", {**op.inputs, "bias": []}, {"y": [product]}, op.attrs, op.role),
                                attrs))
                new_kernels.append(kernel)
                add = registry.get("add")
                new_ops.append((OpDesc("add", {"x": [product], "y": [b]}, {"out": [y]}, {}, op.role), {}))
                new_kernels.append(add.kernel_for(device, (specs[y].dtype,), {}))
                continue
        new_ops.append((op, attrs))
        new_kernels.append(kernel)
    return new_ops, new_kernels


def _spliced(ops: list, kernels: list, replaced: dict, gone: set) -> tuple[list, list]:
    """The plan's ops and kernels with each step in ``replaced`` (index -> step) where its first op stood and the
    other ops it took in (``gone``) left out."""
    if not replaced:
        return ops, kernels
    new_ops, new_kernels = [], []
    for i, (entry, kernel) in enumerate(zip(ops, kernels)):
        if i in gone:
            continue
        if i in replaced:
            new_ops.append((replaced[i], {}))
            new_kernels.append(Kernel(None, None, None, True, False, False))
        else:
            new_ops.append(entry)
            new_kernels.append(kernel)
    return new_ops, new_kernels
