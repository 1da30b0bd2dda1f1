"""Native code for compiled programs: a fused group of pointwise ops (``opforge.program.fusion``) becomes one
generated C loop, compiled by the machine's C compiler and called with its arrays' data pointers: through
``opforge.program.fastcall`` (a small extension built the same way, where Python's headers are installed), else
through ctypes (from the standard library).

Each op of a group declares its value at one element once, beside its NumPy kernel (``OpDef.scalar``, e.g.
``tanh.scalar("tanh(x)")``); this module translates those expressions into one loop over the group's output, with
broadcast inputs read through static strides (a plan is made for one set of shapes), every intermediate in a register
and the output written once. A group with an op that has no expression, or a dtype other than float32, float64 and
bool, keeps its NumPy blocks, as does every group when the backend is off.

What changes against the NumPy kernels (so against eager), and only that: (1) the transcendental functions (exp, log,
tanh, erf, ...) come from glibc's vector math library (libmvec, the loop is vectorised), whose results may differ from
NumPy's SIMD functions in the last bits (glibc documents at most 4 ulp; on this project's machine float32 tanh and exp
agree with NumPy's to 1 ulp); (2) the softmax family's row sums (below): NumPy's pairwise order, not the kernels'
BLAS dot, so a row sum and what follows from it may differ in the last bits (the tests allow 8 ulp; measured 1–2).
Arithmetic, comparisons and selects give NumPy's bits: each op rounds to its dtype, as NumPy's ufuncs do, and the
compiler may not contract a·b + c into one FMA (``-ffp-contract=off``) nor reorder (no ``-ffast-math``: NaN,
infinities, signed zeros and subnormals as NumPy has them). The GEMM steps of ``opforge.program.gemm`` differ within
rounding too (their docstring says how).

Why C through the system compiler, and not Numba: measured on this machine (Xeon with AVX-512, 1 thread, 1,000,000
float32, medians), ``1/(1+exp(-x))·y`` takes 11.8 ms as a Numba loop (its llvmlite has no SVML here, so every exp is
a scalar libm call), 1.8 ms in NumPy and 0.47 ms in C (libmvec's 16-wide expf); tanh alone takes 67 ms in Numba
against 0.35 ms in NumPy and 0.37 ms in C. Numba's import (0.7 s) and first compile (0.9 s for two loops) are
slower than gcc's 0.07 s for a file of loops; arithmetic alone is fast in both. C needs no new dependency either:
without a compiler (``CC``, else ``cc``) everything runs as before.

A parameter's Adam or AdamW step (``adam_exp_avg``, ``adam_exp_avg_sq``, ``adam_update``: ``AdamStep``) is one
loop too, written here from the three ops' arithmetic (they are not pointwise ops with one expression: they read 0-d
step, lr and beta1 tensors and choose a lerp's end per step); its scalars come from ``adam_update``'s own
``step_factors``. It gives their bits: each operation rounded as NumPy rounds it, in their order, no FMA, IEEE sqrt and
division. amsgrad (its update reads a ``maximum`` of the moments), a moment read by another op, or a step whose state is
read after it keep the three ops.

A ``layer_norm`` over rows of float32 or float64 (``LayerNormStep``) and its backward, a centred ``normalize_grad``
(``NormalizeGradStep``), are one loop per row each, written here from their kernels' steps (they are reductions, not
pointwise ops): NumPy's pairwise sum for each mean, the kernel's recentring, each operation rounded to the dtype in its
order, so the kernels' bits; a row whose variance overflows, another layout or mixed dtypes take the kernel.

``softmax``, ``log_softmax``, ``softmax_grad`` and ``log_softmax_grad`` over the last axis of C-ordered float32 or
float64 rows (``SoftmaxRowStep``) are one loop per row each too, in the kernels' steps and rounding; what differs is
the order of each row sum (NumPy's pairwise sum here, a BLAS dot in the kernels: a few ulp) and exp/log from glibc.
So is ``cross_entropy_grad`` of 2-D logits against class indices without class weights (``CrossEntropyGradStep``:
ignore_index, label smoothing and every reduction, in the kernel's steps); with class weights, or the forward pass's
saved rows, it keeps its kernel. So is ``cross_entropy`` itself there without label smoothing (``CrossEntropyStep``:
each row's log(Σ exp / exp at the target), then the losses' pairwise sum, as the kernel); smoothed, its kernel.
These are the only loops here whose results are not the kernels' bits up to libm: a compiled program with any of these
ops (attention, a classifier's loss) gives eager's values within a few ulp per row, not eager's bits, and where a
value is rounding noise in exact arithmetic (the gradient of attention's key bias, which softmax cancels) the two
noises differ, and an optimizer that divides by √v (Adam) can make them differ by its step size.

Switch: ``OPFORGE_NATIVE=0`` keeps the NumPy path: compiled programs give eager's bits (``Executor(native=False)`` for
one program).
Compiled libraries are cached on disk by the hash of their source, the compiler and the CPU
(``$OPFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opforge`` or ``~/.cache/opforge``), so another process reuses them.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import hashlib
import heapq
import math
import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..core.opdef import Kernel, registry
from ..core.spec import Spec
from . import fastcall
from .desc import OpDesc
from .fastcall import cache_dir, compiler
from .fusion import FusedOp, _allocator

CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.bool_): "unsigned char"}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fPIC", "-shared"]
LIBS = ["-lmvec", "-lm"]

# The functions a scalar expression may call: name -> (C name for float, for double, whether libmvec has a vector
# form of it). maximum/minimum/where are NumPy's (a NaN in either input gives NaN); isnan(x), sign(x) too.
FUNCTIONS = {
    "exp": ("expf", "exp", True), "log": ("logf", "log", True), "tanh": ("tanhf", "tanh", True),
    "expm1": ("expm1f", "expm1", True), "log1p": ("log1pf", "log1p", True), "sin": ("sinf", "sin", True),
    "cos": ("cosf", "cos", True), "erf": ("erff", "erf", True), "sqrt": ("sqrtf", "sqrt", False),
    "abs": ("fabsf", "fabs", False), "floor": ("floorf", "floor", False), "ceil": ("ceilf", "ceil", False),
    "maximum": ("of_maxf", "of_max", False), "minimum": ("of_minf", "of_min", False),
    "isnan": ("isnan", "isnan", False), "isinf": ("isinf", "isinf", False), "sign": ("of_signf", "of_sign", False),
}
HELPERS = """
static inline float of_maxf(float a, float b) { return (a != a || a > b) ? a : b; }
static inline double of_max(double a, double b) { return (a != a || a > b) ? a : b; }
static inline float of_minf(float a, float b) { return (a != a || a < b) ? a : b; }
static inline double of_min(double a, double b) { return (a != a || a < b) ? a : b; }
static inline float of_signf(float a) { return a > 0 ? 1.0f : a < 0 ? -1.0f : a; }
static inline double of_sign(double a) { return a > 0 ? 1.0 : a < 0 ? -1.0 : a; }
"""
BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def switched_on() -> bool:
    """Whether ``OPFORGE_NATIVE`` leaves generated code on (not "0"): a C loop on the host, a generated kernel on a
    device that makes them (``Device.makes_elementwise_kernels``)."""
    return os.environ.get("OPFORGE_NATIVE", "1") != "0"


def enabled() -> bool:
    """Whether compiled programs use native code by default: ``OPFORGE_NATIVE`` is not "0" and a compiler exists."""
    return switched_on() and compiler() is not None


class Unsupported(Exception):
    """A group (or an op's expression) the backend does not translate: it keeps its NumPy blocks."""


# -- scalar expressions to C ---------------------------------------------------------------------------------------


@functools.cache
def _parsed(expression: str):
    return ast.parse(expression, mode="eval").body


def c_expression(opdef, names: dict, attrs: dict, ctype: str) -> str:
    """``opdef``'s scalar expression in C: ``names`` maps its inputs to C expressions, its attrs are constants, and
    every constant is of ``ctype`` (the type the op computes in, as NumPy treats a Python scalar)."""
    if opdef.scalar_expression is None:
        raise Unsupported(f"op '{opdef.name}' declares no scalar expression")
    single = ctype == "float"

    def constant(value) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise Unsupported(f"op '{opdef.name}': constant {value!r}")
        return f"(({ctype}){float(value)!r})"

    def c(node) -> str:
        if isinstance(node, ast.Name):
            if node.id in names:
                return names[node.id]
            if node.id in attrs:
                return constant(attrs[node.id])
            raise Unsupported(f"op '{opdef.name}': unknown name {node.id!r}")
        if isinstance(node, ast.Constant):
            return constant(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
            return f"({c(node.left)} {BINOPS[type(node.op)]} {c(node.right)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"(-{c(node.operand)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return f"(!{c(node.operand)})"
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE:
            return f"({c(node.left)} {COMPARE[type(node.ops[0])]} {c(node.comparators[0])})"
        if isinstance(node, ast.BoolOp):
            return "(" + (" && " if isinstance(node.op, ast.And) else " || ").join(map(c, node.values)) + ")"
        if isinstance(node, ast.IfExp):
            return f"({c(node.test)} ? {c(node.body)} : {c(node.orelse)})"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
            name = FUNCTIONS[node.func.id][0 if single else 1]
            return f"{name}({', '.join(f'(({ctype}){c(a)})' for a in node.args)})"  # as NumPy: in the op's type
        raise Unsupported(f"op '{opdef.name}': {ast.unparse(node)!r} is not in the scalar language")

    return c(_parsed(opdef.scalar_expression))


def _functions_called(opdefs) -> set:
    return {n.func.id for d in opdefs for n in ast.walk(_parsed(d.scalar_expression))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


# -- a fused group as a C function ---------------------------------------------------------------------------------


def _strides(shape: tuple, out_shape: tuple) -> list:
    """Element strides of a C-ordered array of ``shape`` broadcast to ``out_shape`` (0 along broadcast dims)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(0 if size == 1 else step)
        step *= size
    return strides[::-1]


def _loops(out_shape: tuple, strides: list) -> tuple[list, list]:
    """Merge adjacent dims every operand walks as one (contiguous, or broadcast along both): (sizes, strides)."""
    sizes, merged = [], [[] for _ in strides]
    for d, size in enumerate(out_shape):
        if size == 1:
            continue
        if sizes and all(m[-1] == s[d] * size for m, s in zip(merged, strides)):
            sizes[-1] *= size
            for m, s in zip(merged, strides):
                m[-1] = s[d]
            continue
        sizes.append(size)
        for m, s in zip(merged, strides):
            m.append(s[d])
    return sizes, merged


def _compute_type(op, specs) -> str:
    """The C type an op of a group computes in: its output's, or for a comparison its inputs' (Unsupported if NumPy
    would compute it otherwise: a float result from a wider float input, a dtype C is not given here)."""
    names = [*op.input_names(), *op.output_names()]
    if any(specs[n].dtype not in CTYPES for n in names):
        raise Unsupported(f"{op.type}: dtypes {[str(specs[n].dtype) for n in names]}")
    dtype = specs[op.output_names()[0]].dtype
    floats = [specs[n].dtype for n in op.input_names() if specs[n].dtype in FLOATS]
    if dtype in FLOATS:
        if any(d.itemsize > dtype.itemsize for d in floats):
            raise Unsupported(f"{op.type}: computes {dtype} from wider inputs")
        return CTYPES[dtype]
    return "double" if any(d == np.float64 for d in floats) else "float"  # a comparison or a logical op


def group_source(fused, name: str) -> str:
    """The C function ``void <name>(inputs..., outputs...)`` computing a fused group (one output, or a
    ``NativeGroup``'s several), or ``Unsupported``."""
    specs, out_spec = fused.specs, fused.spec
    outputs = fused.output_names()
    check_dtypes(fused)
    out_shape = out_spec.shape
    strides = [_strides(specs[n].shape, out_shape) for n in fused.inputs] + [_strides(out_shape, out_shape)]
    sizes, walk = _loops(out_shape, strides)
    params = [f"const {CTYPES[specs[n].dtype]} *i{k}" for k, n in enumerate(fused.inputs)]
    params += [f"{CTYPES[specs[n].dtype]} *o{k}" for k, n in enumerate(outputs)]
    lines = [f"void {name}({', '.join(params)}) {{"]
    index = [" + ".join(f"a{d} * {s[d]}L" for d in range(len(sizes)) if s[d]) or "0" for s in walk]
    indent = "  "
    for d, size in enumerate(sizes):
        lines.append(f"{indent}for (int64_t a{d} = 0; a{d} < {size}L; a{d}++) {{")
        indent += "  "
    reads = [f"i{k}[{index[k]}]" for k in range(len(fused.inputs))]
    lines += element_lines(fused, reads, [f"o{k}[{index[-1]}]" for k in range(len(outputs))], indent)
    for _ in sizes:
        indent = indent[:-2]
        lines.append(f"{indent}}}")
    lines.append("}")
    return "\n".join(lines)


def check_dtypes(fused) -> None:
    """``Unsupported`` unless every input and output of the group has a C type here (an output too: a group ending
    in a cast to int32 has none)."""
    for n in [*fused.inputs, *fused.output_names()]:
        if fused.specs[n].dtype not in CTYPES:
            raise Unsupported(f"{n}: dtype {fused.specs[n].dtype}")


def element_lines(fused, reads: list, writes: list, indent: str) -> list:
    """The statements computing a group at one element, in C: each input read once into a local (``reads``: the C
    expressions of its inputs' values there), each member's scalar expression into a local of its dtype, each result
    written (``writes``: where each of ``fused.output_names()`` goes). The one translation of a group, for the C
    loop here and for a device's generated kernel (``opforge.program.device_kernels``). ``Unsupported`` if a member
    cannot be translated."""
    check_dtypes(fused)
    specs, local, lines = fused.specs, {}, []
    for k, (n, read) in enumerate(zip(fused.inputs, reads)):
        local[n] = f"x{k}"
        lines.append(f"{indent}{CTYPES[specs[n].dtype]} x{k} = {read};")
    for j, (op, attrs, _) in enumerate(fused.members):
        opdef = registry.get(op.type)
        out = op.output_names()[0]
        compute = _compute_type(op, specs)
        names = {p.name: local[op.inputs[p.name][0]] for p in opdef.inputs if op.inputs[p.name]}
        expression = c_expression(opdef, names, attrs, compute)
        local[out] = f"t{j}"
        lines.append(f"{indent}{CTYPES[specs[out].dtype]} t{j} = {expression};")
    return lines + [f"{indent}{write} = {local[n]};" for write, n in zip(writes, fused.output_names())]


def helpers(qualifier: str = "static inline") -> str:
    """NumPy's max/min and sign as C functions (``HELPERS``) declared with ``qualifier`` (``__device__ inline`` in a
    CUDA kernel's preamble)."""
    return HELPERS.replace("static inline ", qualifier + " ")


def header(opdefs) -> str:
    """Includes, vector forms of the libm functions called (so the loops vectorise), NumPy's max/min."""
    lines = ["#include <math.h>", "#include <stdint.h>"]
    for f in sorted(_functions_called(opdefs)):
        fl, db, vector = FUNCTIONS[f]
        if vector:
            lines += [f'__attribute__((simd("notinbranch"))) float {fl}(float);',
                      f'__attribute__((simd("notinbranch"))) double {db}(double);']
    return "\n".join(lines) + "\n" + HELPERS


# -- regions with several results -----------------------------------------------------------------------------------


class NativeGroup(FusedOp):
    """Pointwise ops over one shape whose results are read outside the region too (a forward value its backward reads
    again, say): one loop computes them all and writes each result read outside (``outputs``). Made only for native
    code; if the compiler fails after all, the members' own kernels run one after another, on whole arrays."""

    def __init__(self, members: list, inputs: list, outputs: list, spec, specs: dict):
        self.members, self.inputs, self.outputs, self.spec, self.specs = members, inputs, outputs, spec, specs
        self.scratch, self.inplace_inputs, self.donated, self.native = [], [], set(), None

    def output_names(self) -> list:
        return list(self.outputs)

    def prepare(self, out_input) -> None:
        pass  # the outputs are new arrays: the plan hands no buffer to a step with several

    def set_native(self, fn, c_source: str) -> None:
        self.native, self.c_source = fn, c_source

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        args = [f"i{k}" for k in range(len(self.inputs))]
        local = dict(zip(self.inputs, args))
        lines = [f"def {name}({''.join(a + ', ' for a in args)}W, out=None):  # {self!r}, "
                 + ("native" if self.native is not None else "several results")]
        if self.native is None:  # the members' kernels in order
            labels = {}
            for j, (op, attrs, kernel) in enumerate(self.members):
                env[f"{name}_k{j}"], env[f"{name}_a{j}"] = kernel.bind(env["_device"]), attrs
                call = [local[op.inputs[p.name][0]] if op.inputs[p.name] else "None"
                        for p in registry.get(op.type).inputs]
                labels[len(lines)] = f"{op.type} -> {op.output_names()[0]}"
                local[op.output_names()[0]] = f"t{j}"
                lines.append(f"    t{j} = _array({name}_k{j}({', '.join(call)}, **{name}_a{j}))")
            lines.append(f"    return {''.join(local[n] + ', ' for n in self.outputs)}")
            return lines, labels
        body, labels = self._native_source(name, env)
        outs = [f"o{k}" for k in range(len(self.outputs))]
        for k, n in enumerate(self.outputs):
            env[f"{name}_e{k}"] = _allocator(env["_empty"], self.specs[n])
        call = next(j for j, line in enumerate(body) if f"{name}_n(" in line or f"{name}_n_at," in line)
        lines = [lines[0], *body[1:call - 1], *(f"    {o} = {name}_e{k}()" for k, o in enumerate(outs)),
                 f"    {fastcall.pointer_call(name + '_n', [*args, *outs], env)}",
                 f"    return {''.join(o + ', ' for o in outs)}"]
        return lines, {call - 1 + len(outs): " -> ".join(op.type for op, _, _ in self.members[:8])}


def translatable(op, specs) -> bool:
    """Whether an op of a plan can be a member of a native region: pointwise, one output, its value at an element
    declared (``OpDef.scalar``), every value a dtype of the loop's."""
    if not isinstance(op, OpDesc):
        return False
    opdef = registry.get(op.type)
    if ("pointwise" not in opdef.traits or opdef.scalar_expression is None or len(opdef.outputs) != 1
            or opdef.outputs[0].is_list or any(p.is_list for p in opdef.inputs)
            or specs[op.output_names()[0]].shape == ()):
        return False
    try:
        _compute_type(op, specs)
    except Unsupported:
        return False
    return True


def several_results(ops: list, kernels: list, specs: dict, keep: set, updates: set = frozenset()) -> tuple[list, list]:
    """Group the pointwise ops that can run natively into regions over one shape, each run as one loop, where a
    region may hand several results to the rest of the plan (``NativeGroup``); a region with one result is left to
    ``fusion.fuse``, whose groups may write into a dying input. Regions are convex: an op joins a region only if
    none of its inputs from outside depends on the region, so the region can run as one step, and the plan is
    reordered (a stable topological order) so that every reader of a region's result runs after the region. A region
    computing a persistable variable's new value (``updates``) is not made: its results are new arrays, where a
    one-result group writes the new value into the variable's own buffer."""
    producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
    group_of, groups, depends = {}, [], {}  # depends: value -> the regions it is computed from
    region_deps = []  # region -> the regions its members' outside inputs are computed from (grows as it does)

    def reaches(regions, g) -> bool:
        """Whether any of ``regions`` is ``g`` or depends on it, through the regions' present members."""
        seen, todo = set(), list(regions)
        while todo:
            r = todo.pop()
            if r == g:
                return True
            if r not in seen:
                seen.add(r)
                todo.extend(region_deps[r])
        return False

    for i, (op, _) in enumerate(ops):
        ins = op.input_names()
        upstream = set().union(*(depends.get(n, ()) for n in ins))
        if translatable(op, specs):
            shape = specs[op.output_names()[0]].shape
            candidates = sorted({group_of[producer[n]] for n in ins if producer.get(n) in group_of
                                 and groups[group_of[producer[n]]][0] == shape}, reverse=True)
            # joining g must not make two regions each read the other's results: no input from outside g may be
            # computed from g, or from a region that (since its later members joined) reads g's results
            g = next((g for g in candidates if not any(group_of.get(producer.get(n)) != g
                                                      and reaches(depends.get(n, ()), g) for n in ins)), None)
            if g is None:
                g = len(groups)
                groups.append((shape, []))
                region_deps.append(set())
            groups[g][1].append(i)
            group_of[i] = g
            region_deps[g] |= {r for n in ins if group_of.get(producer.get(n)) != g
                               for r in depends.get(n, ())} - {g}
            upstream = upstream | {g}
        for n in op.output_names():
            depends[n] = upstream
    readers = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            readers.setdefault(n, set()).add(i)
    made = {}  # region -> its NativeGroup
    for g, (shape, members) in enumerate(groups):
        inside = set(members)
        outputs = [ops[m][0].output_names()[0] for m in members]
        outputs = [n for n in outputs if n in keep or not readers.get(n, set()) <= inside]
        if len(members) < 2 or len(outputs) < 2 or any(n in updates for n in outputs):
            continue
        made_inside = {ops[m][0].output_names()[0] for m in members}
        inputs = list(dict.fromkeys(n for m in members for n in ops[m][0].input_names() if n not in made_inside))
        made[g] = NativeGroup([(ops[m][0], ops[m][1], kernels[m]) for m in members], inputs, outputs,
                              Spec(shape, specs[outputs[0]].dtype), specs)
    if not made:
        return ops, kernels
    # units: each region made, each other op; a stable topological order, by the position of a unit's last op
    unit_of = {m: ("g", g) for g in made for m in groups[g][1]}
    units = {}
    for i in range(len(ops)):
        units.setdefault(unit_of.get(i, ("op", i)), []).append(i)
    after = {u: set() for u in units}
    waiting = {u: 0 for u in units}
    for u, members in units.items():
        for m in members:
            for n in ops[m][0].input_names():
                p = producer.get(n)
                if p is not None and unit_of.get(p, ("op", p)) != u and u not in after[unit_of.get(p, ("op", p))]:
                    after[unit_of.get(p, ("op", p))].add(u)
                    waiting[u] += 1
    ready = [(max(members), u) for u, members in units.items() if waiting[u] == 0]
    heapq.heapify(ready)
    new_ops, new_kernels = [], []
    while ready:
        _, u = heapq.heappop(ready)
        if u[0] == "g":
            new_ops.append((made[u[1]], {}))
            new_kernels.append(Kernel(None, None, None, False, False, False))
        else:
            new_ops.append(ops[u[1]])
            new_kernels.append(kernels[u[1]])
        for v in after[u]:
            waiting[v] -= 1
            if waiting[v] == 0:
                heapq.heappush(ready, (max(units[v]), v))
    return new_ops, new_kernels


# -- compiling and loading -----------------------------------------------------------------------------------------


def _machine() -> str:
    """What a library compiled with -march=native depends on besides its source: the compiler, the CPU, the flags."""
    return fastcall.toolchain() + " ".join(FLAGS + LIBS)


_loaded: dict = {}  # hash -> the CDLL (kept: its functions are called by plans)


def build(functions: dict, opdefs) -> dict:
    """Compile C functions (name -> (source, number of pointer arguments)) into one library, or load it from the
    cache; name -> ctypes function."""
    source = header(opdefs) + "\n".join(text for text, _ in functions.values()) + "\n"
    key = hashlib.sha256((_machine() + source).encode()).hexdigest()[:32]
    lib = _loaded.get(key)
    if lib is None:
        path = cache_dir() / f"{key}.so"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                c_file, so_file = Path(tmp) / f"{key}.c", Path(tmp) / f"{key}.so"
                c_file.write_text(source)
                done = subprocess.run([compiler(), *FLAGS, str(c_file), "-o", str(so_file), *LIBS],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    raise Unsupported(f"the C compiler failed:\n{done.stderr[-2000:]}")
                os.replace(so_file, path)  # atomic: another process sees the whole library or none
        lib = _loaded[key] = ctypes.CDLL(str(path))
    out = {}
    for name, (_, arguments) in functions.items():
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * arguments  # data pointers: a Python int must not pass as a C int
        out[name] = fn
    return out


_warned = []


# What a native call costs from Python, measured on this project's machine (CPU time): through ctypes, each array's
# data pointer (``.ctypes.data``) 1.1 µs, the shape and dtype checks and the call about 1.5 µs; a member's NumPy kernel
# on a small array about 1 µs. A bias update (mul, sub on 512 floats) took 7.2 µs as a native call and about 1 µs in
# NumPy. Through ``fastcall`` a pointer costs next to nothing and the checks and call about 1 µs: a program of that
# bias update runs in 4.1 µs with the loop against 4.9 with the two kernels (9.0 with the loop through ctypes). The
# rule below keeps ctypes' costs all the same: a small group given a loop would take glibc's exp/tanh in place of
# NumPy's (the module's docstring), and small programs keep eager's bits.
POINTER_US, CALL_US, KERNEL_US = 1.1, 1.5, 1.0
SMALL = 4096  # elements: beyond this the one pass over memory counts, whatever the call costs


def worth_a_call(fused) -> bool:
    """Whether a group runs faster as one native call than as its members' NumPy kernels: always past ``SMALL``
    elements, below that when its members' kernel calls cost more than the call's pointers and checks (a chain of
    many tiny ops: yes; a bias update: no)."""
    if math.prod(fused.spec.shape) >= SMALL:
        return True
    pointers = len(fused.inputs) + len(fused.output_names())
    return len(fused.members) * KERNEL_US > pointers * POINTER_US + CALL_US


# An expression's operations (arithmetic, comparisons, calls, selects): a NumPy kernel makes about one pass over
# memory for each (relu_grad's ``y if isnan(y) else dy * (y > 0)``: a comparison, a product, a NaN check).
_OPERATIONS = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.IfExp, ast.BoolOp)
SINGLE_MIN_OPERATIONS = 3


def _operations(expression: str) -> int:
    return sum(isinstance(node, _OPERATIONS) for node in ast.walk(ast.parse(expression, mode="eval")))


def single_loops(ops: list, kernels: list, specs: dict) -> tuple[list, list]:
    """A pointwise op standing alone (no neighbour to fuse with) over at least ``SMALL`` elements whose expression
    has ``SINGLE_MIN_OPERATIONS`` or more becomes a group of one, for ``compile_groups`` to give a loop: one pass
    instead of its kernel's several. Measured on this project's machine (one thread, float32, 64 × 512): relu_grad's
    kernel 20 µs; a program of that one op 23.3 µs a run unfused, 13.4 with the loop; an add, one pass either way,
    stays (the call's pointers cost more). Run after
    the passes that look for single ops (GEMM sums and updates); ``unwrap_singles`` puts back those left without a
    loop. The same bits: a loop computes what the ops compute (see the module's docstring)."""
    new_ops, new_kernels = [], []
    for (op, attrs), kernel in zip(ops, kernels):
        opdef = None if isinstance(op, FusedOp) else registry.get(op.type)
        if (opdef is not None and "pointwise" in opdef.traits and opdef.scalar_expression is not None
                and len(opdef.outputs) == 1 and not opdef.outputs[0].is_list
                and not any(p.is_list for p in opdef.inputs)):
            (out,) = op.output_names()
            spec = specs[out]
            if (None not in spec.shape and math.prod(spec.shape) >= SMALL and spec.dtype in CTYPES
                    and _operations(opdef.scalar_expression) >= SINGLE_MIN_OPERATIONS):
                inputs = list(dict.fromkeys(op.input_names()))
                alone = FusedOp([(op, attrs, kernel)], inputs, out, spec, specs, set())
                alone.alone = True
                new_ops.append((alone, {}))
                new_kernels.append(Kernel(None, None, None, True, False, False))
                continue
        new_ops.append((op, attrs))
        new_kernels.append(kernel)
    return new_ops, new_kernels


def unwrap_singles(ops: list, kernels: list) -> tuple[list, list]:
    """The groups of one that ``compile_groups`` gave no loop, back as their op and kernel."""
    new_ops, new_kernels = [], []
    for (op, attrs), kernel in zip(ops, kernels):
        if isinstance(op, FusedOp) and op.alone and op.native is None:
            member_op, member_attrs, kernel = op.members[0]
            op, attrs = member_op, member_attrs
        new_ops.append((op, attrs))
        new_kernels.append(kernel)
    return new_ops, new_kernels


def compile_groups(groups: list) -> None:
    """Give each fused group it can translate its native function (``fused.native``); the others keep NumPy's."""
    sources, chosen = {}, []
    for k, fused in enumerate(groups):
        if isinstance(fused, (AdamStep, LayerNormStep)):  # (always worth it: each makes ~5-15 NumPy calls)
            arguments = (len(fused.inputs) + len(fused.output_names()) + fused.extra_pointers
                         if isinstance(fused, LayerNormStep) else 5)
            sources[f"opforge_group{k}"] = (fused.c_function(f"opforge_group{k}"), arguments)
            chosen.append((f"opforge_group{k}", fused))
            continue
        if not worth_a_call(fused):
            continue
        try:
            sources[f"opforge_group{k}"] = (group_source(fused, f"opforge_group{k}"),
                                            len(fused.inputs) + len(fused.output_names()))
            chosen.append((f"opforge_group{k}", fused))
        except Unsupported:
            continue
    if not chosen:
        return
    opdefs = {registry.get(op.type) for _, fused in chosen if not isinstance(fused, (AdamStep, LayerNormStep))
              for op, _, _ in fused.members}
    if any(isinstance(fused, SoftmaxRowStep) for _, fused in chosen):  # their exp and log: libmvec's vector forms
        opdefs |= {registry.get("exp"), registry.get("log")}
    try:
        functions = build(sources, opdefs)
    except (Unsupported, OSError) as e:  # no working compiler after all (no libmvec, a read-only cache...)
        if not _warned:
            _warned.append(e)
            warnings.warn(f"opforge: native code for compiled programs is off: {e}", RuntimeWarning, stacklevel=2)
        return
    for name, fused in chosen:
        fused.set_native(functions[name], sources[name][0])


# -- Adam's step: one loop per parameter -----------------------------------------------------------------------------


class AdamStep(FusedOp):
    """A parameter's Adam (or AdamW) step, ``adam_exp_avg``, ``adam_exp_avg_sq`` and ``adam_update`` (``members``),
    as one loop that reads param, grad, exp_avg and exp_avg_sq once at each element and writes the new exp_avg,
    exp_avg_sq and param into those three variables' own buffers (``inputs`` [param, grad, exp_avg, exp_avg_sq,
    step, lr, beta1]; ``outputs`` [exp_avg's, exp_avg_sq's, param's new value]). The step's scalars come from
    ``adam_update``'s own ``step_factors``, in double, once per step; the loop does each member's arithmetic in its
    order and rounding (no FMA contraction, ``-ffp-contract=off``; sqrt and division are IEEE's, as NumPy's), so its
    results are the members' bit for bit. Without a compiler after all, the members' kernels run in order."""

    type = "adam_step"

    def __init__(self, members: list, inputs: list, outputs: list, specs: dict):
        self.members, self.inputs, self.outputs, self.specs = members, inputs, outputs, specs
        self.spec = specs[outputs[2]]
        self.scratch, self.inplace_inputs, self.donated, self.native = [], [], set(), None
        # new value -> the variable whose buffer it is written into (the executor then copies nothing)
        self.writes_into = dict(zip(outputs, [inputs[2], inputs[3], inputs[0]]))

    def output_names(self) -> list:
        return list(self.outputs)

    def __repr__(self) -> str:
        return f"adam_step({self.inputs[0]})"

    def prepare(self, out_input) -> None:
        pass  # its outputs are its state's own buffers

    def set_native(self, fn, c_source: str) -> None:
        self.native, self.c_source = fn, c_source

    def c_function(self, name: str) -> str:
        """``void <name>(param, grad, exp_avg, exp_avg_sq, factors)``, ``factors`` three doubles: 1 − beta1, the
        step size lr/(1 − beta1ᵗ) and √(1 − beta2ᵗ), and AdamW's decay 1 − lr·weight_decay."""
        (_, m_attrs, _), (_, v_attrs, _), (_, attrs, _) = self.members
        t = CTYPES[self.spec.dtype]

        def const(value: float) -> str:
            return f"(({t}){float(value)!r})"

        def decayed(weight_decay: float) -> str:  # the members' _decayed: g + λ·p
            return f"(g[i] + {const(weight_decay)} * p[i])" if weight_decay else "g[i]"

        beta2 = attrs["beta2"]
        decay = "p[i] * (" + t + ")f[3]" if attrs["decoupled"] and attrs["weight_decay"] else "p[i]"
        return "\n".join([
            f"void {name}({t} *p, const {t} *g, {t} *m, {t} *v, const double *f) {{",
            "  /* adam_exp_avg's lerp from its nearer end (torch.lerp), chosen once per step as _lerp chooses */",
            "  const int near = fabs(f[0]) < 0.5;",
            f"  const {t} w = ({t})f[0], w1 = ({t})(1 - f[0]), size = ({t})(-f[1]), bc2 = ({t})f[2];",
            f"  for (int64_t i = 0; i < {math.prod(self.spec.shape)}L; i++) {{",
            f"    {t} gm = {decayed(m_attrs['weight_decay'])}, gv = {decayed(v_attrs['weight_decay'])};",
            f"    {t} d = gm - m[i];",
            f"    {t} mi = near ? m[i] + w * d : gm - d * w1;",
            f"    {t} vi = v[i] * {const(beta2)} + ({const(1 - beta2)} * gv) * gv;",
            f"    {t} change = (mi / (sqrt{'f' if t == 'float' else ''}(vi) / bc2 + {const(attrs['eps'])})) * size;",
            f"    m[i] = mi; v[i] = vi; p[i] = {decay} + change;",
            "  }", "}"])

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        device = env["_device"]
        (_, m_attrs, _), (_, v_attrs, _), (_, attrs, _) = self.members
        k = [kernel.bind(device) for _, _, kernel in self.members]

        def members(p, g, m, v, s, lr, b1):  # the members' kernels in order, each writing into its variable
            m = k[0](m, g, p, b1, **m_attrs, out=m)
            v = k[1](v, g, p, **v_attrs, out=v)
            return m, v, k[2](p, m, v, s, lr, b1, **attrs, out=p)

        env[f"{name}_members"] = members
        lines = [f"def {name}(p, g, m, v, s, lr, b1, W, out=None):  # {self!r}, "
                 + ("native" if self.native is not None else "members")]
        if self.native is None:
            lines.append(f"    return {name}_members(p, g, m, v, s, lr, b1)")
            return lines, {1: "adam_exp_avg -> adam_exp_avg_sq -> adam_update"}
        factors = np.empty(4)
        env[f"{name}_n"], env[f"{name}_f"], env[f"{name}_fp"] = self.native, factors, factors.ctypes.data
        env[f"{name}_sf"] = functools.partial(registry.get("adam_update").step_factors, beta2=attrs["beta2"],
                                              weight_decay=attrs["weight_decay"])
        env[f"{name}_spec"] = (self.spec.shape, self.spec.dtype)
        env.setdefault("_shares", np.may_share_memory)
        env.setdefault("_contiguous", np.ascontiguousarray)
        # The loop reads and writes through the plan's static shape, C-ordered: other arrays (an op breaking its
        # shape rule, a state array in another layout, a grad sharing a state's memory) take the members' kernels.
        same = " and ".join(f"{a}.shape == {name}_spec[0] and {a}.dtype == {name}_spec[1]" for a in "pgmv")
        lines += [f"    if not ({same} and p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous",
                  "            and not (_shares(g, p) or _shares(g, m) or _shares(g, v))):",
                  f"        return {name}_members(p, g, m, v, s, lr, b1)",
                  "    if not g.flags.c_contiguous: g = _contiguous(g)",
                  f"    f = {name}_f",
                  f"    f[1], f[2], f[3] = {name}_sf(s, lr, b1)  # (checks the step and beta1)",
                  "    f[0] = 1 - b1.item()  # adam_exp_avg's lerp weight, a Python float as there",
                  f"    {fastcall.pointer_call(name + '_n', ['p', 'g', 'm', 'v'], env, (name + '_fp',))}",
                  "    return m, v, p"]
        return lines, {len(lines) - 1: "adam_exp_avg -> adam_exp_avg_sq -> adam_update (one loop)"}

ADAM_MEMBERS = ("adam_exp_avg", "adam_exp_avg_sq", "adam_update")


def adam_steps(ops: list, kernels: list, specs: dict, updates: dict) -> tuple[list, list]:
    """Replace each parameter's Adam step (``AdamStep``) at its ``adam_update``'s place: an ``adam_update`` reading
    the new moments of an ``adam_exp_avg`` and an ``adam_exp_avg_sq`` of the same grad and param, read by it alone,
    the three results the new values of the persistable variables they update (``updates``: variable -> its new
    value), whose old values nothing reads after it; one float dtype and shape throughout. Any other form keeps its
    ops: amsgrad (its update reads a maximum, not the new second moment), a moment read elsewhere, other dtypes."""
    producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
    readers = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            readers.setdefault(n, set()).add(i)
    new_value_of = {n: target for target, n in updates.items()}
    replaced, gone = {}, set()
    for k, (op, attrs) in enumerate(ops):
        if not isinstance(op, OpDesc) or op.type != "adam_update":
            continue
        (p,), (m_new,), (v_new,) = op.inputs["param"], op.inputs["exp_avg"], op.inputs["exp_avg_sq"]
        (s,), (lr,), (b1,) = op.inputs["step"], op.inputs["lr"], op.inputs["beta1"]
        i, j = producer.get(m_new), producer.get(v_new)
        if i is None or j is None or not all(isinstance(ops[x][0], OpDesc) for x in (i, j)):
            continue
        m_op, v_op = ops[i][0], ops[j][0]
        if m_op.type != "adam_exp_avg" or v_op.type != "adam_exp_avg_sq":
            continue
        (g,), (m,), (v,) = m_op.inputs["grad"], m_op.inputs["exp_avg"], v_op.inputs["exp_avg_sq"]
        (p_new,) = op.output_names()
        state = {m: m_new, v: v_new, p: p_new}
        if (v_op.inputs["grad"] != [g] or m_op.inputs["param"] != [p] or v_op.inputs["param"] != [p]
                or m_op.inputs["beta1"] != [b1] or len(state) != 3 or g in state
                or any(new_value_of.get(n) != target for target, n in state.items())
                or readers[m_new] != {k} or readers[v_new] != {k}
                or any(r > k for n in state for r in readers.get(n, ()))  # the old values: none read after
                or any(specs[n] != specs[p] for n in (g, m, v, m_new, v_new, p_new))
                or specs[p].dtype not in FLOATS or len(specs[p].shape) == 0
                or specs[s].dtype not in (np.dtype(np.int64), np.dtype(np.int32))):
            continue
        replaced[k] = AdamStep([(m_op, ops[i][1], kernels[i]), (v_op, ops[j][1], kernels[j]), (op, attrs, kernels[k])],
                               [p, g, m, v, s, lr, b1], [m_new, v_new, p_new], specs)
        gone |= {i, j}
    if not replaced:
        return ops, kernels
    new_ops, new_kernels = [], []
    for x, (entry, kernel) in enumerate(zip(ops, kernels)):
        if x in gone:
            continue
        if x in replaced:
            new_ops.append((replaced[x], {}))
            new_kernels.append(Kernel(None, None, None, False, False, False))
        else:
            new_ops.append(entry)
            new_kernels.append(kernel)
    return new_ops, new_kernels


# -- layer_norm: one row loop ----------------------------------------------------------------------------------------


# A row loop's flag (set where a row needs the kernel's path), new at each call: threads may run one plan at once,
# and a flag kept in the plan could be set by one run and cleared by another, which would then return an unfinished
# result.
_new_flag = functools.partial(np.zeros, 1, np.int64)


def _loop_head(step, name: str, env: dict, params: str, call: str, label: str) -> tuple[list, dict | None]:
    """The first lines of a one-op loop step's Python side: its kernel and attrs bound in ``env`` (``<name>_k``,
    ``<name>_a``) and its ``def`` line; where no loop was compiled, the kernel's ``call`` after it and the labels
    (the step is then whole); else labels None, with the loop and its output's allocator in ``env``
    (``<name>_n``, ``<name>_e``)."""
    (_, attrs, kernel), = step.members
    env[f"{name}_k"], env[f"{name}_a"] = kernel.bind(env["_device"]), attrs
    lines = [f"def {name}({params}W, out=None):  # {step!r}, " + ("native" if step.native is not None else "kernel")]
    if step.native is None:
        return [*lines, f"    return {call}"], {1: label}
    env[f"{name}_n"], env[f"{name}_e"] = step.native, _allocator(env["_empty"], step.spec)
    return lines, None


def _as_planned(step, name: str, env: dict, args) -> str:
    """The generated test that the arrays ``args`` (the step's first inputs) have the plan's shapes and dtypes and are
    C-ordered, as the loop reads them; ``<name>_specs`` in ``env``."""
    env[f"{name}_specs"] = [(step.specs[n].shape, step.specs[n].dtype) for n in step.inputs]
    if fastcall.checks(env):  # the same test in one C call
        env[f"{name}_plan"] = fastcall.plan_specs(env[f"{name}_specs"])
        return f"_planned({name}_plan, {', '.join(args)})"
    return " and ".join(f"({a}.shape, {a}.dtype) == {name}_specs[{k}] and {a}.flags.c_contiguous"
                        for k, a in enumerate(args))


class LayerNormStep(FusedOp):
    """A ``layer_norm`` over C-ordered rows (``inputs`` [x, weight?, bias?], one dtype, float32 or float64) as one loop
    per row: mean, x − μ, the variance, the kernel's recentring (``_recentred``) where the rounding of μ matters, then
    (x − μ)/√(σ² + ε)·weight + bias, written once into y. Each sum is NumPy's pairwise sum of the row (8 partial sums,
    halves above 128 elements) and every operation rounds to the dtype in the kernel's order (no FMA, IEEE sqrt and
    division), so the results are the kernel's bits where NumPy sums the row in one pass (what ``row_buffers`` makes
    its reductions do). A row whose variance overflows although its values are finite (the kernel's ``_big_groups``),
    an array of another shape or layout, or no compiler: the op's own kernel runs."""

    type = "layer_norm_step"
    extra_pointers = 1  # its C function takes a flag after its inputs and output: set where a row needs the kernel

    def __init__(self, member: tuple, inputs: list, output: str, specs: dict):
        self.members, self.inputs, self.output, self.specs = [member], inputs, output, specs
        self.spec = specs[output]
        self.scratch, self.inplace_inputs, self.donated, self.native = [], [], set(), None

    def __repr__(self) -> str:
        return f"layer_norm_step({self.inputs[0]})"

    def prepare(self, out_input) -> None:
        pass  # y is a new array: the plan hands no buffer to this step

    def set_native(self, fn, c_source: str) -> None:
        self.native, self.c_source = fn, c_source

    def c_function(self, name: str) -> str:
        """``void <name>(x, weight?, bias?, y, flag)``: flag[0] is set to 1 where a row needs the kernel's
        overflow path (then y is incomplete and the kernel runs instead)."""
        (op, attrs, _), = self.members
        t = CTYPES[self.spec.dtype]
        n = math.prod(attrs["normalized_shape"])
        rows = math.prod(self.spec.shape) // n
        digit = float(np.finfo(self.spec.dtype).eps)
        has_w, has_b = bool(op.inputs.get("weight")), bool(op.inputs.get("bias"))
        params = [f"const {t} *x", *[f"const {t} *w"] * has_w, *[f"const {t} *b"] * has_b, f"{t} *y", "int64_t *flag"]
        sqrt = "sqrtf" if t == "float" else "sqrt"
        affine = "v" + (" * w[i]" if has_w else "")
        affine = f"({affine}) + b[i]" if has_b else affine
        return "\n".join([
            _row_sums(name, t),
            f"void {name}({', '.join(params)}) {{",
            f"  const int64_t n = {n}L;",
            f"  const {t} count = ({t}){n}L, eps = ({t}){float(attrs['eps'])!r}, digit = ({t}){digit!r};",
            f"  {t} sq[{n}];",
            f"  for (int64_t row = 0; row < {rows}L; row++) {{",
            f"    const {t} *xr = x + row * n;",
            f"    {t} *yr = y + row * n;",
            f"    const {t} mean = (({t})0 + {name}_sum(xr, n)) / count;",
            "    for (int64_t i = 0; i < n; i++) yr[i] = xr[i] - mean;",
            f"    {t} var = (({t})0 + {name}_sumsq(yr, n, sq)) / count;",
            f"    const {t} c = (({t})0 + {name}_sum(yr, n)) / count;  /* _recentred */",
            "    if (c * c > var * (digit * digit)) {",
            "      for (int64_t i = 0; i < n; i++) yr[i] = yr[i] - c;",
            f"      var = (({t})0 + {name}_sumsq(yr, n, sq)) / count;",
            "    }",
            "    if (!isfinite(var)) {  /* _big_groups: a row of finite values whose variance overflowed */",
            "      int finite = 1;",
            "      for (int64_t i = 0; i < n; i++) finite &= isfinite(xr[i]);",
            "      if (finite) { flag[0] = 1; return; }",
            "    }",
            f"    const {t} d = {sqrt}(var + eps);",
            "    for (int64_t i = 0; i < n; i++) {",
            f"      const {t} v = yr[i] / d;",
            f"      yr[i] = {affine};",
            "    }",
            "  }",
            "}"])

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        op = self.members[0][0]
        args = [f"i{k}" for k in range(len(self.inputs))]
        given = iter(args)  # the kernel's x, weight, bias: None where the op has none
        call = ", ".join(next(given) if op.inputs.get(p) else "None" for p in ("x", "weight", "bias"))
        lines, labels = _loop_head(self, name, env, "".join(a + ", " for a in args), f"{name}_k({call}, **{name}_a)",
                                   "layer_norm")
        if labels:
            return lines, labels
        env[f"{name}_flag"] = _new_flag
        # The loop reads rows of the plan's static shapes, C-ordered: other arrays take the kernel (which also
        # names a shape error as layer_norm's).
        same = _as_planned(self, name, env, args)
        lines += [f"    if not ({same}):",
                  f"        return {name}_k({call}, **{name}_a)",
                  f"    y, flag = {name}_e(), {name}_flag()",
                  f"    {fastcall.pointer_call(name + '_n', [*args, 'y', 'flag'], env)}",
                  "    if flag[0]:  # a row whose variance overflowed: the kernel's scaled path",
                  f"        return {name}_k({call}, **{name}_a)",
                  "    return y"]
        return lines, {4: "layer_norm (one row loop)"}


class NormalizeGradStep(LayerNormStep):
    """layer_norm's backward, ``normalize_grad`` (centred, over the trailing axes of C-ordered rows; x and g of one
    dtype, float32 or float64), as one loop per row writing dx and x̂: the kernel's statistics (x − μ, σ², the
    recentring; its means are sums times 1/n) and dx = r·((g − mean(g)) − x̂·mean(g·x̂)) in its order and rounding,
    so its bits. Where the kernel would take its overflow path, another layout or no compiler: the kernel runs."""

    type = "normalize_grad_step"

    def __init__(self, member: tuple, inputs: list, outputs: list, specs: dict):
        super().__init__(member, inputs, outputs[0], specs)
        self.outputs = outputs

    def output_names(self) -> list:
        return list(self.outputs)

    def __repr__(self) -> str:
        return f"normalize_grad_step({self.inputs[0]})"

    def c_function(self, name: str) -> str:
        """``void <name>(x, g, dx, xhat, flag)``, flag as LayerNormStep's."""
        (_, attrs, _), = self.members
        t = CTYPES[self.spec.dtype]
        shape = self.spec.shape
        n = math.prod(shape[a] for a in attrs["axes"])
        rows = math.prod(shape) // n
        digit = float(np.finfo(self.spec.dtype).eps)
        sqrt = "sqrtf" if t == "float" else "sqrt"
        return "\n".join([
            _row_sums(name, t),
            f"void {name}(const {t} *x, const {t} *g, {t} *dx, {t} *xh, int64_t *flag) {{",
            f"  const int64_t n = {n}L;",
            f"  const {t} inv_n = ({t}){1.0 / n!r}, eps = ({t}){float(attrs['eps'])!r}, digit = ({t}){digit!r};",
            f"  {t} sq[{n}];",
            f"  for (int64_t row = 0; row < {rows}L; row++) {{",
            f"    const {t} *xr = x + row * n, *gr = g + row * n;",
            f"    {t} *dr = dx + row * n, *hr = xh + row * n;",
            f"    const {t} mean = (({t})0 + {name}_sum(xr, n)) * inv_n;",
            "    for (int64_t i = 0; i < n; i++) hr[i] = xr[i] - mean;",
            f"    {t} var = (({t})0 + {name}_sumsq(hr, n, sq)) * inv_n;",
            f"    const {t} c = (({t})0 + {name}_sum(hr, n)) * inv_n;  /* _recentred */",
            "    if (c * c > var * (digit * digit)) {",
            "      for (int64_t i = 0; i < n; i++) hr[i] = hr[i] - c;",
            f"      var = (({t})0 + {name}_sumsq(hr, n, sq)) * inv_n;",
            "    }",
            "    if (!isfinite(var)) {  /* _big_groups: a row of finite values whose variance overflowed */",
            "      int finite = 1;",
            "      for (int64_t i = 0; i < n; i++) finite &= isfinite(xr[i]);",
            "      if (finite) { flag[0] = 1; return; }",
            "    }",
            f"    const {t} r = ({t})1 / {sqrt}(var + eps);",
            "    for (int64_t i = 0; i < n; i++) { hr[i] = hr[i] * r; sq[i] = gr[i] * hr[i]; }",
            f"    const {t} mgx = (({t})0 + {name}_sum(sq, n)) * inv_n;",
            f"    const {t} mg = (({t})0 + {name}_sum(gr, n)) * inv_n;",
            "    for (int64_t i = 0; i < n; i++) dr[i] = ((gr[i] - mg) - hr[i] * mgx) * r;",
            "  }",
            "}"])

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        lines, labels = _loop_head(self, name, env, "x, g, ", f"{name}_k(x, g, **{name}_a)", "normalize_grad")
        if labels:
            return lines, labels
        env[f"{name}_flag"] = _new_flag
        lines += [f"    if not ({_as_planned(self, name, env, ('x', 'g'))}):",
                  f"        return {name}_k(x, g, **{name}_a)",
                  f"    dx, xh, flag = {name}_e(), {name}_e(), {name}_flag()",
                  f"    {fastcall.pointer_call(name + '_n', ['x', 'g', 'dx', 'xh', 'flag'], env)}",
                  "    if flag[0]:  # the kernel's overflow path",
                  f"        return {name}_k(x, g, **{name}_a)",
                  "    return dx, xh"]
        return lines, {4: "normalize_grad (one row loop)"}


def _row_sums(name: str, t: str) -> str:
    """C functions ``<name>_sum(a, n)``: NumPy's pairwise_sum of a row (what its add.reduce does along a contiguous
    row), and ``<name>_sumsq(a, n, sq)``: the sum of a·a, each square rounded first (into ``sq``) as np.square does."""
    return "\n".join([
        f"static {t} {name}_sum(const {t} *a, int64_t n) {{  /* NumPy's pairwise_sum */",
        "  if (n < 8) {",
        f"    {t} res = -0.0;",
        "    for (int64_t i = 0; i < n; i++) res += a[i];",
        "    return res;",
        "  }",
        "  if (n <= 128) {",
        f"    {t} r[8];",
        "    int64_t i;",
        "    for (int j = 0; j < 8; j++) r[j] = a[j];",
        "    for (i = 8; i < n - (n % 8); i += 8)",
        "      for (int j = 0; j < 8; j++) r[j] += a[i + j];",
        f"    {t} res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));",
        "    for (; i < n; i++) res += a[i];",
        "    return res;",
        "  }",
        "  int64_t n2 = n / 2;",
        "  n2 -= n2 % 8;",
        f"  return {name}_sum(a, n2) + {name}_sum(a + n2, n - n2);",
        "}",
        f"static {t} {name}_sumsq(const {t} *a, int64_t n, {t} *sq) {{",
        "  for (int64_t i = 0; i < n; i++) sq[i] = a[i] * a[i];",
        f"  return {name}_sum(sq, n);",
        "}"])


def layer_norms(ops: list, kernels: list, specs: dict) -> tuple[list, list]:
    """Replace each ``layer_norm`` over float32 or float64 whose weight and bias (if any) have x's dtype by a
    ``LayerNormStep``, and each centred ``normalize_grad`` over trailing axes (its backward) by a
    ``NormalizeGradStep``; others (another dtype, mixed dtypes, an empty or very long row) keep the op."""
    new_ops, new_kernels = [], []
    for (op, attrs), kernel in zip(ops, kernels):
        if isinstance(op, OpDesc) and op.type == "layer_norm":
            names = [op.inputs[p][0] for p in ("x", "weight", "bias") if op.inputs.get(p)]
            (y,) = op.output_names()
            x_spec = specs[names[0]]
            n = math.prod(attrs["normalized_shape"])
            # (rows up to 64 KiB: the loop keeps a row of squares on the stack)
            if (x_spec.dtype in FLOATS and all(specs[m].dtype == x_spec.dtype for m in names) and n > 0
                    and all(None not in specs[m].shape for m in names) and n * x_spec.dtype.itemsize <= 1 << 16):
                new_ops.append((LayerNormStep((op, attrs, kernel), names, y, specs), {}))
                new_kernels.append(Kernel(None, None, None, False, False, False))
                continue
        if isinstance(op, OpDesc) and op.type == "normalize_grad" and attrs["center"]:
            (x,), (g,) = op.inputs["x"], op.inputs["g"]
            spec = specs[x]
            axes = sorted(a % len(spec.shape) for a in attrs["axes"]) if spec.shape else None
            n = math.prod(spec.shape[a] for a in axes) if axes else 0
            if (spec.dtype in FLOATS and specs[g] == spec and None not in spec.shape and n > 0
                    and axes == list(range(len(spec.shape) - len(axes), len(spec.shape)))
                    and n * spec.dtype.itemsize <= 1 << 16):
                new_ops.append((NormalizeGradStep((op, attrs, kernel), [x, g], op.output_names(), specs), {}))
                new_kernels.append(Kernel(None, None, None, False, False, False))
                continue
        new_ops.append((op, attrs))
        new_kernels.append(kernel)
    return new_ops, new_kernels


# -- softmax and log_softmax rows, and their gradients: one row loop each ---------------------------------------------


class SoftmaxRowStep(LayerNormStep):
    """``softmax``, ``log_softmax``, ``softmax_grad`` or ``log_softmax_grad`` over the last axis of C-ordered rows of
    one dtype (float32 or float64) as one loop per row, in the kernels' steps (``opforge.ops.nn``): softmax's
    exp(x) and its sum, taken again from x − max x in a row whose sum is not in [1, ∞) (``_exp_sums``), then e·(1/Σ);
    log_softmax's (x − max) − log Σ exp(x − max); softmax_grad's (dy − Σ dy·y)·y; log_softmax_grad's
    dy − exp(y)·Σ dy. Each operation rounds to the dtype in the kernel's order (no FMA, IEEE division); what changes
    is the order of each row sum: NumPy's pairwise sum here, a BLAS dot (``np.vecdot``) in the kernels, so a sum may
    differ in its last bits (and what follows it); exp and log are glibc's (libmvec's in the loop), NumPy's SIMD
    functions in the kernels (within their few ulp). NaN and ±inf propagate as in the kernels (a NaN max, −inf − −inf).
    Another shape or layout, or no compiler: the op's kernel runs."""

    type = "softmax_row_step"
    extra_pointers = 0  # no flag: no path of these loops needs the kernel

    def __init__(self, member: tuple, inputs: list, output: str, specs: dict):
        super().__init__(member, inputs, output, specs)
        self.kind = member[0].type

    def __repr__(self) -> str:
        return f"{self.kind}_row_step({self.inputs[0]})"

    def c_function(self, name: str) -> str:
        """``void <name>(x, y)`` for softmax and log_softmax, ``void <name>(y, dy, dx)`` for their gradients."""
        t = CTYPES[self.spec.dtype]
        n = self.spec.shape[-1]
        rows = math.prod(self.spec.shape) // n
        f = "f" if t == "float" else ""
        body = {
            "softmax": [
                f"    {t} s = ({t})0 + {name}_sum_exp(xr, yr, n, ({t})0);",
                f"    if (!(s >= 1 && s < INFINITY)) s = ({t})0 + {name}_sum_exp(xr, yr, n, {name}_max(xr, n));",
                f"    const {t} r = ({t})1 / s;",
                "    for (int64_t i = 0; i < n; i++) yr[i] = yr[i] * r;"],
            "log_softmax": [
                f"    const {t} m = {name}_max(xr, n);",
                "    for (int64_t i = 0; i < n; i++) { yr[i] = xr[i] - m; sq[i] = exp" + f + "(yr[i]); }",
                f"    const {t} l = log{f}(({t})0 + {name}_sum(sq, n));",
                "    for (int64_t i = 0; i < n; i++) yr[i] = yr[i] - l;"],
            "softmax_grad": [
                "    for (int64_t i = 0; i < n; i++) sq[i] = dr[i] * xr[i];",
                f"    const {t} s = ({t})0 + {name}_sum(sq, n);",
                "    for (int64_t i = 0; i < n; i++) yr[i] = (dr[i] - s) * xr[i];"],
            "log_softmax_grad": [
                f"    const {t} s = ({t})0 + {name}_sum(dr, n);",
                "    for (int64_t i = 0; i < n; i++) yr[i] = dr[i] - exp" + f + "(xr[i]) * s;"],
        }[self.kind]
        grad = self.kind.endswith("_grad")
        params = f"const {t} *x, " + (f"const {t} *dy, " if grad else "") + f"{t} *y"
        return "\n".join([
            self.row_helpers(name, t),
            f"void {name}({params}) {{",
            f"  const int64_t n = {n}L;",
            f"  {t} sq[{n}];",
            "  (void)sq;",
            f"  for (int64_t row = 0; row < {rows}L; row++) {{",
            f"    const {t} *xr = x + row * n;",
            *([f"    const {t} *dr = dy + row * n;"] if grad else []),
            f"    {t} *yr = y + row * n;",
            *body,
            "  }",
            "}"])

    @staticmethod
    def row_helpers(name: str, t: str) -> str:
        """C functions of a row: ``<name>_sum`` and ``_sumsq`` (``_row_sums``), ``<name>_max`` (NaN-propagating, as
        np.maximum.reduce) and ``<name>_sum_exp(x, e, n, c)``: e = exp(x − c) and Σ e."""
        f = "f" if t == "float" else ""
        return "\n".join([
            _row_sums(name, t),
            f"static {t} {name}_max(const {t} *a, int64_t n) {{  /* np.maximum.reduce: a NaN wins */",
            f"  {t} lane[16], m = a[0];  /* 16 running maxima: the compiler makes them vector selects */",
            "  int64_t i = 0;",
            "  for (int j = 0; j < 16; j++) lane[j] = a[0];",
            "  for (; i + 16 <= n; i += 16)",
            "    for (int j = 0; j < 16; j++)",
            "      lane[j] = (lane[j] != lane[j] || lane[j] >= a[i + j]) ? lane[j] : a[i + j];",
            "  for (int j = 0; j < 16; j++) m = (m != m || m >= lane[j]) ? m : lane[j];",
            "  for (; i < n; i++) m = (m != m || m >= a[i]) ? m : a[i];",
            "  return m;",
            "}",
            f"static {t} {name}_sum_exp(const {t} *x, {t} *e, int64_t n, {t} c) {{  /* e = exp(x − c), Σ e */",
            f"  for (int64_t i = 0; i < n; i++) e[i] = exp{f}(x[i] - c);",
            f"  return {name}_sum(e, n);",
            "}"])

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        args = [f"i{k}" for k in range(len(self.inputs))]
        call = f"{name}_k({', '.join(args)}, **{name}_a)"
        lines, labels = _loop_head(self, name, env, "".join(a + ", " for a in args), call, self.kind)
        if labels:
            return lines, labels
        # The loop reads rows of the plan's static shape, C-ordered: other arrays take the kernel.
        same = _as_planned(self, name, env, args)
        lines += [f"    if not ({same}):",
                  f"        return {call}",
                  f"    y = {name}_e()",
                  f"    {fastcall.pointer_call(name + '_n', [*args, 'y'], env)}",
                  "    return y"]
        return lines, {4: f"{self.kind} (one row loop)"}


def _counted_targets(rows: int) -> list:
    """C lines of a cross_entropy row loop's function (``n`` classes, ``ignore``, ``count`` and ``flag`` declared):
    count the rows whose target is a class, as _targets reads them; a target out of range sets flag[0] and returns
    before anything is written (the kernel then names it)."""
    return [f"  for (int64_t row = 0; row < {rows}L; row++) {{  /* _targets: a class, or ignore_index */",
            "    const int64_t k = target[row];",
            "    if (k == ignore) continue;",
            "    if (k < 0 || k >= n) { flag[0] = 1; return; }",
            "    count++;",
            "  }"]


class CrossEntropyGradStep(SoftmaxRowStep):
    """``cross_entropy_grad`` of 2-D C-ordered logits (float32 or float64) against class indices, without class
    weights or the forward pass's saved rows (what compiled programs hold), as one loop per row in the kernel's steps:
    each row's scale s (dloss, or dloss over the number of rows that count for "mean"; 0 in an ignored row), the
    smoothed shares (hot = s·(1 − ε), spread = s·ε/C), exp(x − c) and its sum as softmax makes them (c the max where
    smoothing or an overflow asks for it), then e·((hot + spread·C)/Σ), minus hot at the target and spread everywhere.
    As SoftmaxRowStep: each row sum in NumPy's pairwise order, not the kernel's BLAS dot. A target out of range
    (neither a class nor ignore_index): the kernel runs, and names it."""

    type = "cross_entropy_grad_step"
    extra_pointers = 1  # the flag

    def c_function(self, name: str) -> str:
        """``void <name>(logits, target, dloss, dlogits, flag)``."""
        (_, attrs, _), = self.members
        t = CTYPES[self.spec.dtype]
        rows, n = self.spec.shape
        target = "int64_t" if self.specs[self.inputs[1]].dtype == np.int64 else "int32_t"
        eps, reduction = float(attrs["label_smoothing"]), attrs["reduction"]
        scale = {"mean": f"dloss[0] / ({t})count", "sum": "dloss[0]", "none": "dloss[row]"}[reduction]
        if eps:  # the kernel's hot·(1 − ε) and s·(ε/C), each constant rounded to the dtype as NumPy does
            shares = [f"    const {t} spread = s * ({t}){eps / n!r}, hot = s * ({t}){1 - eps!r};",
                      f"    const {t} sq = hot + spread * ({t}){n}L;",
                      f"    const {t} sum = ({t})0 + {name}_sum_exp(xr, pr, n, {name}_max(xr, n));"]
        else:
            shares = [f"    const {t} hot = s, sq = hot;",
                      f"    {t} sum = ({t})0 + {name}_sum_exp(xr, pr, n, ({t})0);",
                      "    if (!(sum >= 1 && sum < INFINITY))  /* an overflow, or all very negative: the max */",
                      f"      sum = ({t})0 + {name}_sum_exp(xr, pr, n, {name}_max(xr, n));"]
        return "\n".join([
            self.row_helpers(name, t),
            f"void {name}(const {t} *x, const {target} *target, const {t} *dloss, {t} *dx, int64_t *flag) {{",
            f"  const int64_t n = {n}L, ignore = {int(attrs['ignore_index'])}L;",
            "  int64_t count = 0;",
            *_counted_targets(rows),
            f"  const {t} total = {scale if reduction != 'none' else '0'};",
            "  (void)total; (void)count;",
            f"  for (int64_t row = 0; row < {rows}L; row++) {{",
            f"    const {t} *xr = x + row * n;",
            f"    {t} *pr = dx + row * n;",
            "    const int ignored = target[row] == ignore;",
            f"    const {t} s = ignored ? ({t})0 : {'dloss[row]' if reduction == 'none' else 'total'};",
            *shares,
            f"    const {t} factor = sq / sum;",
            "    for (int64_t i = 0; i < n; i++) pr[i] = pr[i] * factor;",
            "    pr[ignored ? 0 : target[row]] -= hot;",
            *(["    for (int64_t i = 0; i < n; i++) pr[i] -= spread;"] if eps else []),
            "  }",
            "}"])

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        call = f"{name}_k(x, t, d, None, None, None, **{name}_a)"
        lines, labels = _loop_head(self, name, env, "x, t, d, ", call, self.kind)
        if labels:
            return lines, labels
        env[f"{name}_flag"] = _new_flag
        env[f"{name}_c"] = np.ascontiguousarray
        same = _as_planned(self, name, env, ("x", "t"))
        # (dloss per row is often a broadcast of one value, the gradient of a sum: a copy of it costs little)
        lines += [f"    if not ({same} and (d.shape, d.dtype) == {name}_specs[2]):",
                  f"        return {call}",
                  f"    y, dc, flag = {name}_e(), d if d.flags.c_contiguous else {name}_c(d), {name}_flag()",
                  f"    {fastcall.pointer_call(name + '_n', ['x', 't', 'dc', 'y', 'flag'], env)}",
                  "    if flag[0]:  # a target out of range: the kernel names it",
                  f"        return {call}",
                  "    return y"]
        return lines, {4: "cross_entropy_grad (one row loop)"}


class CrossEntropyStep(SoftmaxRowStep):
    """``cross_entropy`` of 2-D C-ordered logits (float32 or float64) against class indices, without class weights or
    label smoothing, as one loop per row in the kernel's steps (``opforge.ops.loss``): exp(x − c) and its sum as
    softmax makes them (c = 0, or the row's max where that sum is not in [1, ∞)), the loss log(Σ/e[t]), or
    log Σ − (x[t] − c) where e[t] is under the smallest normal number or the ratio overflows; 0 in an ignored row;
    then the losses' pairwise sum for "sum", over the number of rows that count for "mean" (0/0: nan). As
    SoftmaxRowStep: each row sum in NumPy's pairwise order, not the kernel's BLAS dot, and log from glibc. A target
    out of range (neither a class nor ignore_index): the kernel runs, and names it."""

    type = "cross_entropy_step"
    extra_pointers = 2  # each row's loss (before the reduction) and the flag

    def __repr__(self) -> str:
        return f"cross_entropy_row_step({self.inputs[0]})"

    def c_function(self, name: str) -> str:
        """``void <name>(logits, target, losses, loss, flag)``: losses holds each row's (it is the result for
        "none"), loss their reduction."""
        (_, attrs, _), = self.members
        logits = self.specs[self.inputs[0]]
        t = CTYPES[logits.dtype]
        rows, n = logits.shape
        f = "f" if t == "float" else ""
        target = "int64_t" if self.specs[self.inputs[1]].dtype == np.int64 else "int32_t"
        reduce = {"none": [],
                  "sum": [f"  loss[0] = {name}_sum(losses, {rows}L);"],
                  "mean": [f"  loss[0] = {name}_sum(losses, {rows}L) / ({t})count;"]}[attrs["reduction"]]
        return "\n".join([
            self.row_helpers(name, t),
            f"void {name}(const {t} *x, const {target} *target, {t} *losses, {t} *loss, int64_t *flag) {{",
            f"  const int64_t n = {n}L, ignore = {int(attrs['ignore_index'])}L;",
            f"  const {t} tiny = ({t}){float(np.finfo(logits.dtype).tiny)!r};  /* the smallest normal number */",
            f"  {t} e[{n}];",
            "  int64_t count = 0;",
            *_counted_targets(rows),
            "  (void)count; (void)loss;",
            f"  for (int64_t row = 0; row < {rows}L; row++) {{",
            f"    const {t} *xr = x + row * n;",
            "    const int64_t k = target[row];",
            f"    if (k == ignore) {{ losses[row] = ({t})0; continue; }}",
            f"    {t} c = ({t})0, sum = ({t})0 + {name}_sum_exp(xr, e, n, ({t})0);",
            "    if (!(sum >= 1 && sum < INFINITY)) {  /* an overflow, or all very negative: the max */",
            f"      c = {name}_max(xr, n);",
            f"      sum = ({t})0 + {name}_sum_exp(xr, e, n, c);",
            "    }",
            f"    const {t} ratio = sum / e[k];",
            f"    losses[row] = (e[k] >= tiny && ratio < INFINITY) ? log{f}(ratio) : log{f}(sum) - (xr[k] - c);",
            "  }",
            *reduce,
            "}"])

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        call = f"{name}_k(x, t, None, **{name}_a)"  # (the plan makes a 0-d result, a NumPy scalar, an array)
        lines, labels = _loop_head(self, name, env, "x, t, ", call, "cross_entropy")
        if labels:
            return lines, labels
        rows = self.specs[self.inputs[0]].shape[0]
        env[f"{name}_rows"] = _allocator(env["_empty"], Spec((rows,), self.spec.dtype))
        env[f"{name}_flag"] = _new_flag
        same = _as_planned(self, name, env, ("x", "t"))
        none = self.members[0][1]["reduction"] == "none"
        lines += [f"    if not ({same}):",
                  f"        return {call}",
                  f"    y, flag = {name}_e(), {name}_flag()",
                  f"    losses = {'y' if none else name + '_rows()'}",
                  f"    {fastcall.pointer_call(name + '_n', ['x', 't', 'losses', 'y', 'flag'], env)}",
                  "    if flag[0]:  # a target out of range: the kernel names it",
                  f"        return {call}",
                  "    return y"]
        return lines, {5: "cross_entropy (one row loop)"}


SOFTMAX_ROWS = {"softmax": ("x",), "log_softmax": ("x",), "softmax_grad": ("y", "dy"), "log_softmax_grad": ("y", "dy")}


def softmax_rows(ops: list, kernels: list, specs: dict) -> tuple[list, list]:
    """Replace each op of ``SOFTMAX_ROWS`` over the last axis of float32 or float64 rows (its inputs of its output's
    shape and dtype, the row not empty and at most 64 KiB: the loop keeps a row on the stack) by a
    ``SoftmaxRowStep``, each ``cross_entropy_grad`` of 2-D float32 or float64 logits without class weights or
    saved rows by a ``CrossEntropyGradStep``, and each ``cross_entropy`` of such logits (a row of at most 64 KiB)
    against class indices without class weights or label smoothing by a ``CrossEntropyStep``; the others keep the
    op."""
    new_ops, new_kernels = [], []
    for (op, attrs), kernel in zip(ops, kernels):
        if isinstance(op, OpDesc) and op.type in SOFTMAX_ROWS:
            names = [op.inputs[p][0] for p in SOFTMAX_ROWS[op.type]]
            (y,) = op.output_names()
            spec = specs[y]
            if (spec.dtype in FLOATS and spec.shape and None not in spec.shape and spec.shape[-1] > 0
                    and attrs["axis"] in (-1, len(spec.shape) - 1) and all(specs[m] == spec for m in names)
                    and spec.shape[-1] * spec.dtype.itemsize <= 1 << 16):
                new_ops.append((SoftmaxRowStep((op, attrs, kernel), names, y, specs), {}))
                new_kernels.append(Kernel(None, None, None, False, False, False))
                continue
        if (isinstance(op, OpDesc) and op.type == "cross_entropy" and not op.inputs.get("weight")
                and not attrs["label_smoothing"]):
            names = [op.inputs[p][0] for p in ("logits", "target")]
            (y,) = op.output_names()
            logits, target = specs[names[0]], specs[names[1]]
            if (logits.dtype in FLOATS and len(logits.shape) == 2 and None not in logits.shape
                    and 0 not in logits.shape and logits.shape[1] * logits.dtype.itemsize <= 1 << 16
                    and specs[y].dtype == logits.dtype
                    and target.dtype in (np.dtype(np.int64), np.dtype(np.int32))):
                new_ops.append((CrossEntropyStep((op, attrs, kernel), names, y, specs), {}))
                new_kernels.append(Kernel(None, None, None, False, False, False))
                continue
        if isinstance(op, OpDesc) and op.type == "cross_entropy_grad" and not any(
                op.inputs.get(p) for p in ("weight", "exp_rows", "row_sums")):
            names = [op.inputs[p][0] for p in ("logits", "target", "dloss")]
            (y,) = op.output_names()
            spec, target, dloss = specs[y], specs[names[1]], specs[names[2]]
            if (spec.dtype in FLOATS and len(spec.shape) == 2 and None not in spec.shape and 0 not in spec.shape
                    and specs[names[0]] == spec and dloss.dtype == spec.dtype
                    and target.dtype in (np.dtype(np.int64), np.dtype(np.int32))):
                new_ops.append((CrossEntropyGradStep((op, attrs, kernel), names, y, specs), {}))
                new_kernels.append(Kernel(None, None, None, False, False, False))
                continue
        new_ops.append((op, attrs))
        new_kernels.append(kernel)
    return new_ops, new_kernels
