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

A forward epilogue: a ``linear`` whose result only pointwise ops read (its activation) leaves its bias to an ``add``
that joins their native loop (``bias_epilogues``): bias and activation in one pass after the GEMM, the same bits.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from ..core.opdef import Kernel, registry
from .desc import OpDesc
from .fusion import FusedOp, _allocator

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@functools.cache
def _numpy_cblas() -> dict:
    """NumPy's own OpenBLAS ``cblas_?gemm`` (64-bit ints, as NumPy's wheels build it), by dtype, or {} where it
    cannot be found: the GEMM then runs in the library that computes NumPy's matmul, as fast (SciPy's OpenBLAS,
    another build, took 8% longer at 512×512 by 512×784 here)."""
    libs = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    try:
        maps = Path("/proc/self/maps").read_text().split()
    except OSError:
        return {}
    path = next((m for m in maps if m.startswith(str(libs)) and "openblas" in m), None)
    if path is None:
        return {}
    try:
        lib = ctypes.CDLL(path)
        functions = {np.dtype(np.float32): (lib.scipy_cblas_sgemm64_, ctypes.c_float),
                     np.dtype(np.float64): (lib.scipy_cblas_dgemm64_, ctypes.c_double)}
    except (OSError, AttributeError):
        return {}
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for fn, real in functions.values():
        fn.restype = None  # order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
        fn.argtypes = [ctypes.c_int] * 3 + [i64] * 3 + [real, ptr, i64, ptr, i64, real, ptr, i64]
    return {dtype: fn for dtype, (fn, _) in functions.items()}


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


def add_product(c, alpha: float, a, b) -> None:
    """``c += alpha · (a @ b)`` in place: ``c`` a C-ordered (m, n) array, ``a`` (m, k), ``b`` (k, n), one dtype."""
    gemm = _numpy_cblas().get(c.dtype)
    if gemm is not None:
        a = a if _row_major(a) else np.ascontiguousarray(a)
        b = b if _row_major(b) else np.ascontiguousarray(b)
        (ta, lda), (tb, ldb) = _row_major(a), _row_major(b)
        (m, k), n = a.shape, b.shape[1]
        gemm(ROW_MAJOR, ta, tb, m, n, k, alpha, a.ctypes.data, lda, b.ctypes.data, ldb, 1.0, c.ctypes.data, n)
        return
    from scipy.linalg import blas  # SciPy's wrapper: column-major, c's memory is cᵀ's, cᵀ += alpha · bᵀ·aᵀ

    x, trans_x = _fortran(b.T)
    y, trans_y = _fortran(a.T)
    r = (blas.sgemm if c.dtype == np.float32 else blas.dgemm)(alpha, x, y, beta=1.0, c=c.T, trans_a=trans_x,
                                                              trans_b=trans_y, overwrite_c=1)
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
        self.few_rows = _few_rows(self.spec, products, specs)

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
        products = [f"(b{k}.T, a{k}.T)" if t else f"(a{k}, b{k})" for k, (_, _, t) in enumerate(self.products)]
        operands = " or ".join(f"_shares(dst, a{k}) or _shares(dst, b{k})" for k in range(len(self.products)))
        lines = [f"def {name}({''.join(o + ', ' for o in others)}{', '.join(factors)}, W, out=None):  # {self!r}",
                 "    dst = out if out is not None and out.flags.c_contiguous else None",
                 f"    if dst is None or {operands}:",  # a GEMM must not write what it reads
                 f"        dst = {name}_e()",
                 f"    _accumulate(dst, [{', '.join(others)}], [{', '.join(products)}]"
                 + (", True)" if self.few_rows else ")"),
                 "    if out is not None and dst is not out:", "        _copyto(out, dst)", "        dst = out",
                 "    return dst"]
        return lines, {5: " + ".join(op.type for op, _, _ in self.members) + " (products by GEMM)"}


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
        others = [n for n in summands if found[n] is None]
        members, products = [], []
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
