"""Calling native code from a plan without ctypes' per-argument cost: a small CPython extension, compiled on first
use like the plans' loops (``opforge.program.native``) and cached beside them.

A native step used to pass each array as ``a.ctypes.data`` to a ctypes function. That property builds a Python
object per array (NumPy's ``_ctypes`` class, written in Python) and ctypes converts each argument again: measured on
this project's machine (one thread), 1.3 µs per array, and 12 µs for the first array after a large GEMM has pushed
the interpreter's data out of the core's caches (every step of a compiled Hessian-vector product runs in that state);
a GEMM through ``add_product`` (layout checks in Python, three pointers, fourteen ctypes arguments) 8.6 µs of Python
a call, 22.6 µs cold. Here the same calls take the arrays themselves:

- ``call(address, *arguments)``: calls the C function at ``address`` (``void f(T *a, T *b, ...)``, every argument
  a pointer) with each argument's data pointer: an array's (``PyArray_DATA``), or an int taken as an address. The GIL
  is released during the call, as ctypes releases it.
- ``gemm(sgemm, dgemm, c, alpha, a, b, beta[, bias])``: ``c = alpha · a @ b + beta · c`` through a CBLAS ``?gemm``
  with 64-bit ints (the two addresses, by dtype), each operand read in place (row-major or its transpose); with a bias
  (one per column), c's rows are set to it first and beta is 1, as ``linear`` adds it. It returns False and writes
  nothing where the caller's Python path must take over: an operand BLAS cannot read in place, ``c`` not a writeable
  C-ordered array, ``c`` sharing memory with an operand or the bias (the bounds test of ``np.may_share_memory``).
  Arrays of other dtypes or ranks, or shapes that do not fit, are errors.
- ``disjoint(c, *arrays)``: whether ``c`` is a writeable C-ordered array sharing no memory with any of ``arrays``
  (the same bounds test): what a GEMM sum checks before it writes its other terms into ``c``.
- ``planned(specs, *arrays)``: whether each array has its spec's shape and dtype and is C-ordered, as a native
  loop reads it; ``into(out, *inputs)``: whether a loop may write into ``out`` (writeable, C-ordered, sharing memory
  with no input but itself). A native step's Python side asks these first and runs its own checks (which name the
  mismatch, or copy) only where one says no.

Nothing changes in what is computed: the same C functions and the same BLAS calls get the same pointers. Where the
extension cannot be built (no C compiler, no Python headers; a compiler that fails on it says so once, as a
RuntimeWarning), ``module()`` is None and the callers keep ctypes.
It is built once per machine, Python and NumPy (0.25 s here) into the native cache (``cache_dir``; the C compiler,
``compiler``, is the one the loops use), and loaded from there by every later process.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

import numpy as np

MAX_ARGUMENTS = 32  # pointers a native function called through ``call`` may take (a fused group's inputs and outputs)

_CALL_CASE = "    case {n}: ((void (*)({types}))f)({args}); break;"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>

static int pointer(PyObject *o, void **p, Py_ssize_t k) {
  if (PyArray_Check(o)) { *p = PyArray_DATA((PyArrayObject *)o); return 0; }
  if (PyLong_Check(o)) { *p = PyLong_AsVoidPtr(o); return PyErr_Occurred() ? -1 : 0; }
  PyErr_Format(PyExc_TypeError, "opforge native call: argument %zd is %.200s, not a NumPy array or an address",
               k, Py_TYPE(o)->tp_name);
  return -1;
}

static PyObject *call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  void *p[MAX_ARGUMENTS];
  if (nargs < 1 || nargs > MAX_ARGUMENTS + 1) {
    PyErr_Format(PyExc_TypeError, "opforge native call: %zd arguments (1 to %d)", nargs, MAX_ARGUMENTS + 1);
    return NULL;
  }
  void *f = PyLong_AsVoidPtr(args[0]);
  if (f == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "opforge native call: a null function address");
    return NULL;
  }
  for (Py_ssize_t k = 1; k < nargs; k++)
    if (pointer(args[k], &p[k - 1], k) < 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  switch (nargs - 1) {
CASES
  }
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

typedef void (*sgemm_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                        int64_t, float, float *, int64_t);
typedef void (*dgemm_t)(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t, const double *,
                        int64_t, double, double *, int64_t);

/* (trans, leading dimension) of a 2-D array as row-major BLAS reads it in place; 0 if it cannot */
static int row_major(PyArrayObject *m, int *trans, int64_t *ld) {
  npy_intp item = PyArray_ITEMSIZE(m), *s = PyArray_STRIDES(m), *d = PyArray_DIMS(m);
  if (s[1] == item && s[0] % item == 0 && s[0] >= (d[1] > 1 ? d[1] : 1) * item) {
    *trans = 111; *ld = s[0] / item; return 1;
  }
  if (s[0] == item && s[1] % item == 0 && s[1] >= (d[0] > 1 ? d[0] : 1) * item) {
    *trans = 112; *ld = s[1] / item; return 1;
  }
  return 0;
}

/* the bytes an array's elements span, [lo, hi); lo == hi when it has none */
static void span(PyArrayObject *m, char **lo, char **hi) {
  npy_intp low = 0, high = PyArray_ITEMSIZE(m);
  for (int i = 0; i < PyArray_NDIM(m); i++) {
    npy_intp d = PyArray_DIM(m, i), s = PyArray_STRIDE(m, i);
    if (d == 0) { *lo = *hi = PyArray_BYTES(m); return; }
    if (s > 0) high += s * (d - 1); else low += s * (d - 1);
  }
  *lo = PyArray_BYTES(m) + low; *hi = PyArray_BYTES(m) + high;
}

static int overlap(PyArrayObject *x, PyArrayObject *y) {  /* np.may_share_memory's bounds test */
  char *xl, *xh, *yl, *yh;
  span(x, &xl, &xh); span(y, &yl, &yh);
  return xl < xh && yl < yh && xl < yh && yl < xh;
}

static PyObject *gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 7 && nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "gemm(sgemm, dgemm, c, alpha, a, b, beta[, bias])");
    return NULL;
  }
  PyObject *c = args[2], *a = args[4], *b = args[5];
  if (!PyArray_Check(c) || !PyArray_Check(a) || !PyArray_Check(b)) {
    PyErr_SetString(PyExc_TypeError, "opforge gemm: c, a and b must be NumPy arrays");
    return NULL;
  }
  PyArrayObject *C = (PyArrayObject *)c, *A = (PyArrayObject *)a, *B = (PyArrayObject *)b;
  int type = PyArray_TYPE(C);
  if (PyArray_NDIM(A) != 2 || PyArray_NDIM(B) != 2 || PyArray_NDIM(C) != 2
      || PyArray_TYPE(A) != type || PyArray_TYPE(B) != type || (type != NPY_FLOAT32 && type != NPY_FLOAT64)
      || !PyArray_ISNOTSWAPPED(A) || !PyArray_ISNOTSWAPPED(B) || !PyArray_ISNOTSWAPPED(C)) {
    PyErr_SetString(PyExc_TypeError, "opforge gemm: c, a and b must be 2-D arrays of one dtype, float32 or float64");
    return NULL;
  }
  int64_t m = PyArray_DIM(A, 0), k = PyArray_DIM(A, 1), n = PyArray_DIM(B, 1);
  if (PyArray_DIM(B, 0) != k || PyArray_DIM(C, 0) != m || PyArray_DIM(C, 1) != n) {
    PyErr_Format(PyExc_ValueError, "opforge gemm: shapes (%lld, %lld) @ (%lld, %lld) into (%lld, %lld)",
                 (long long)m, (long long)k, (long long)PyArray_DIM(B, 0), (long long)n,
                 (long long)PyArray_DIM(C, 0), (long long)PyArray_DIM(C, 1));
    return NULL;
  }
  PyArrayObject *bias = NULL;
  if (nargs == 8) {
    if (!PyArray_Check(args[7]) || PyArray_NDIM((PyArrayObject *)args[7]) != 1
        || PyArray_TYPE((PyArrayObject *)args[7]) != type || !PyArray_ISNOTSWAPPED((PyArrayObject *)args[7])
        || PyArray_DIM((PyArrayObject *)args[7], 0) != n) {
      PyErr_SetString(PyExc_TypeError, "opforge gemm: the bias must be a 1-D array of c's dtype, one per column");
      return NULL;
    }
    bias = (PyArrayObject *)args[7];
    if (!PyArray_IS_C_CONTIGUOUS(bias) || overlap(C, bias)) Py_RETURN_FALSE;
  }
  /* what the caller's Python path takes instead: c in another layout or read-only, c sharing memory with an
     operand (the GEMM would read what it writes), an operand BLAS cannot read in place */
  if (!PyArray_IS_C_CONTIGUOUS(C) || !PyArray_ISWRITEABLE(C) || overlap(C, A) || overlap(C, B)) Py_RETURN_FALSE;
  int ta, tb;
  int64_t lda, ldb;
  if (!row_major(A, &ta, &lda) || !row_major(B, &tb, &ldb)) Py_RETURN_FALSE;
  double alpha = PyFloat_AsDouble(args[3]), beta = PyFloat_AsDouble(args[6]);
  if (PyErr_Occurred()) return NULL;
  if (bias != NULL) {  /* c's rows start as the bias (np.copyto's bits: a copy), then the product adds onto them */
    npy_intp row = n * PyArray_ITEMSIZE(C);
    for (int64_t i = 0; i < m; i++) memcpy(PyArray_BYTES(C) + i * row, PyArray_BYTES(bias), row);
    beta = 1.0;
  }
  void *f = PyLong_AsVoidPtr(args[type == NPY_FLOAT32 ? 0 : 1]);
  if (f == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "opforge gemm: a null function address");
    return NULL;
  }
  int64_t ldc = n > 1 ? n : 1;
  Py_BEGIN_ALLOW_THREADS
  if (type == NPY_FLOAT32)
    ((sgemm_t)f)(101, ta, tb, m, n, k, (float)alpha, PyArray_DATA(A), lda, PyArray_DATA(B), ldb, (float)beta,
                 PyArray_DATA(C), ldc);
  else
    ((dgemm_t)f)(101, ta, tb, m, n, k, alpha, PyArray_DATA(A), lda, PyArray_DATA(B), ldb, beta, PyArray_DATA(C), ldc);
  Py_END_ALLOW_THREADS
  Py_RETURN_TRUE;
}

static PyObject *disjoint(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  for (Py_ssize_t k = 0; k < nargs; k++)
    if (!PyArray_Check(args[k])) {
      PyErr_Format(PyExc_TypeError, "opforge disjoint: argument %zd is %.200s, not a NumPy array", k,
                   Py_TYPE(args[k])->tp_name);
      return NULL;
    }
  if (nargs < 1) { PyErr_SetString(PyExc_TypeError, "disjoint(c, *arrays)"); return NULL; }
  PyArrayObject *C = (PyArrayObject *)args[0];
  if (!PyArray_IS_C_CONTIGUOUS(C) || !PyArray_ISWRITEABLE(C)) Py_RETURN_FALSE;
  for (Py_ssize_t k = 1; k < nargs; k++)
    if (overlap(C, (PyArrayObject *)args[k])) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
}

/* planned(specs, *arrays): each array has its spec's shape and dtype (specs: a tuple of (shape, dtype), one per
   array, in order) and is C-ordered */
static PyObject *planned(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 1 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) < nargs - 1) {
    PyErr_SetString(PyExc_TypeError, "planned(specs, *arrays): specs a tuple of (shape, dtype), one per array");
    return NULL;
  }
  for (Py_ssize_t k = 1; k < nargs; k++) {
    PyObject *spec = PyTuple_GET_ITEM(args[0], k - 1);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(spec, 0))
        || !PyArray_DescrCheck(PyTuple_GET_ITEM(spec, 1))) {
      PyErr_SetString(PyExc_TypeError, "planned(specs, *arrays): a spec is not a (shape tuple, dtype)");
      return NULL;
    }
    if (!PyArray_Check(args[k])) Py_RETURN_FALSE;
    PyArrayObject *a = (PyArrayObject *)args[k];
    PyObject *shape = PyTuple_GET_ITEM(spec, 0);
    if (PyTuple_GET_SIZE(shape) != PyArray_NDIM(a)) Py_RETURN_FALSE;
    for (int i = 0; i < PyArray_NDIM(a); i++) {
      PyObject *d = PyTuple_GET_ITEM(shape, i);
      if (!PyLong_Check(d) || PyLong_AsSsize_t(d) != PyArray_DIM(a, i)) {
        PyErr_Clear();
        Py_RETURN_FALSE;
      }
    }
    if (!PyArray_EquivTypes(PyArray_DESCR(a), (PyArray_Descr *)PyTuple_GET_ITEM(spec, 1))
        || !PyArray_IS_C_CONTIGUOUS(a)) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

/* into(out, *inputs): out is a writeable C-ordered array sharing memory with no input but itself */
static PyObject *into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 1) { PyErr_SetString(PyExc_TypeError, "into(out, *inputs)"); return NULL; }
  if (!PyArray_Check(args[0])) Py_RETURN_FALSE;
  PyArrayObject *out = (PyArrayObject *)args[0];
  if (!PyArray_IS_C_CONTIGUOUS(out) || !PyArray_ISWRITEABLE(out)) Py_RETURN_FALSE;
  for (Py_ssize_t k = 1; k < nargs; k++)
    if (args[k] != args[0] && PyArray_Check(args[k]) && overlap(out, (PyArrayObject *)args[k])) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
  {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call(address, *arrays): a native function's call"},
  {"gemm", (PyCFunction)(void (*)(void))gemm, METH_FASTCALL,
   "gemm(sgemm, dgemm, c, alpha, a, b, beta[, bias]) -> bool"},
  {"disjoint", (PyCFunction)(void (*)(void))disjoint, METH_FASTCALL,
   "disjoint(c, *arrays) -> bool: c writeable, C-ordered, sharing no memory with the arrays"},
  {"planned", (PyCFunction)(void (*)(void))planned, METH_FASTCALL,
   "planned(specs, *arrays) -> bool: each array of its (shape, dtype) and C-ordered"},
  {"into", (PyCFunction)(void (*)(void))into, METH_FASTCALL,
   "into(out, *inputs) -> bool: out writeable, C-ordered, sharing memory with no input but itself"},
  {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "opforge_fastcall", NULL, -1, methods};

PyMODINIT_FUNC PyInit_opforge_fastcall(void) {
  import_array();
  return PyModule_Create(&module);
}
"""


@functools.cache
def compiler() -> str | None:
    """The C compiler native code is built with (``CC``, else ``cc``), or None."""
    return shutil.which(os.environ.get("CC", "cc"))


def cache_dir() -> Path:
    """Where built libraries are kept for other processes (the module docstring of ``opforge.program.native``)."""
    if os.environ.get("OPFORGE_CACHE_DIR"):
        return Path(os.environ["OPFORGE_CACHE_DIR"]) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opforge" / "native"


@functools.cache
def toolchain() -> str:
    """What a built library depends on besides its source: the compiler's version and the CPU's flags."""
    version = subprocess.run([compiler(), "--version"], capture_output=True, text=True).stdout
    try:
        cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        cpu = ""
    return version + cpu


def _source() -> str:
    cases = []
    for n in range(1, MAX_ARGUMENTS + 1):
        cases.append(_CALL_CASE.format(n=n, types=", ".join(["void *"] * n),
                                       args=", ".join(f"p[{k}]" for k in range(n))))
    return f"#define MAX_ARGUMENTS {MAX_ARGUMENTS}\n" + SOURCE.replace("CASES", "\n".join(cases))


def _load(path: Path):
    loader = importlib.machinery.ExtensionFileLoader("opforge_fastcall", str(path))
    spec = importlib.util.spec_from_file_location("opforge_fastcall", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.cache
def module():
    """The extension (``call``, ``gemm``), built or loaded from the native cache; None where it cannot be (no
    compiler, no Python or NumPy headers), or with ``OPFORGE_FASTCALL=0``."""
    if os.environ.get("OPFORGE_FASTCALL", "1").strip() == "0" or compiler() is None:
        return None
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        return None
    source = _source()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256("\n".join([toolchain(), sys.version, np.__version__, np.get_include(), include,
                                    suffix, source]).encode()).hexdigest()[:32]
    path = cache_dir() / f"fastcall-{key}{suffix}"
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                c_file, so_file = Path(tmp) / "fastcall.c", Path(tmp) / f"fastcall{suffix}"
                c_file.write_text(source)
                # (macOS links an extension's Python symbols when it is loaded, as Linux does by default)
                lazy = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
                done = subprocess.run([compiler(), "-O2", "-fPIC", "-shared", *lazy, f"-I{include}",
                                       f"-I{np.get_include()}", str(c_file), "-o", str(so_file)],
                                      capture_output=True, text=True)
                if done.returncode != 0:  # (unexpected where the headers are there: say so, once)
                    warnings.warn("opforge: the extension calling native code did not build, plans call it through "
                                  f"ctypes (slower per call):\n{done.stderr[-1000:]}", RuntimeWarning, stacklevel=2)
                    return None
                os.replace(so_file, path)  # atomic: another process sees the whole file or none
        return _load(path)
    except (OSError, ImportError):
        return None


def address(fn) -> int:
    """The address of a ctypes function (what ``call`` takes)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def pointer_call(function: str, arrays: list, env: dict, addresses: tuple = ()) -> str:
    """The Python expression calling the native function ``env[function]`` with the data pointers of ``arrays`` (the
    names of array variables) and then ``addresses`` (names of ints): through ``call`` here where the extension
    is built (the arrays passed as they are), else ctypes with each ``.ctypes.data``."""
    fast = module()
    if fast is not None and len(arrays) + len(addresses) <= MAX_ARGUMENTS:
        env.setdefault("_call", fast.call)
        env[f"{function}_at"] = address(env[function])
        return f"_call({function}_at, {', '.join([*arrays, *addresses])})"
    return f"{function}({', '.join([*(a + '.ctypes.data' for a in arrays), *addresses])})"


def checks(env: dict) -> bool:
    """Put ``_planned`` and ``_into`` in a plan's ``env`` where the extension is built; whether they are there."""
    fast = module()
    if fast is None:
        return False
    env.setdefault("_planned", fast.planned)
    env.setdefault("_into", fast.into)
    return True


def plan_specs(specs: list) -> tuple:
    """(shape, dtype) pairs as ``planned`` reads them: shapes of Python ints (a dim that is none, unknown until run
    time, as -1: no array matches it, and the caller's own checks run)."""
    return tuple((tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape), np.dtype(dtype))
                 for shape, dtype in specs)
