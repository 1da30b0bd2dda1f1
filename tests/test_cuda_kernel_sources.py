"""The dedicated CUDA kernels (opforge/ops/cuda_kernels.py), checked without a GPU: they are registered for "cuda"
without importing CuPy, ``import opforge`` works with CuPy absent, each kernel's fallback is the op's generic kernel,
and — where CuPy is importable (``pip install 'opforge[cuda]'``; NVRTC needs no GPU) — every kernel source compiles
for float and double: the row kernels as written, each ElementwiseKernel as CuPy's own generator writes it out.
tests/cuda/test_cuda_kernels.py compares them with the CPU on a GPU."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opforge as of
from opforge import ops as F
from opforge.core.opdef import registry
from opforge.ops import cuda_kernels as CK

ROOT = Path(__file__).resolve().parents[1]
KERNEL_OPS = ("leaky_relu", "leaky_relu_grad", "gelu", "gelu_grad", "softmax", "log_softmax", "softmax_grad",
              "log_softmax_grad", "cross_entropy", "cross_entropy_grad", "layer_norm", "normalize_grad", "sgd_update",
              "adam_exp_avg", "adam_exp_avg_sq", "adam_update", "embedding_grad")


# -- registration and fallbacks -------------------------------------------------------------------------------


def test_every_op_has_its_cuda_kernel_for_float32_and_float64():
    for name in KERNEL_OPS:
        op = registry.get(name)
        for dtype in CK.FLOATS:
            kernel = op.kernels.get(("cuda", dtype))
            assert kernel is not None and kernel.fn.__module__ == CK.__name__, f"{name}: no cuda kernel for {dtype}"


def test_the_op_reference_lists_the_cuda_kernels_dtypes():
    from opforge import docgen

    text = docgen._kernels_text(registry.get("softmax"))
    assert text.endswith("`cuda`: float32, float64"), text  # (no "others": float16 runs the generic kernel there)


def test_the_fallback_is_the_generic_kernel_not_the_cuda_one():
    for name in KERNEL_OPS:
        op = registry.get(name)
        for dtype in CK.FLOATS:
            generic = CK._generic(op, dtype)
            assert generic is op.find_kernel("cpu", dtype).fn, name
            assert generic is not op.kernels[("cuda", dtype)].fn, name


def test_row_calls_are_told_from_the_others():
    rows = np.zeros((3, 5), np.float32)
    assert CK._rows_of(rows, -1) == 5 and CK._rows_of(rows, 1) == 5
    assert not CK._rows_of(rows, 0)  # another axis
    assert not CK._rows_of(rows.T, -1)  # not contiguous
    assert not CK._rows_of(np.zeros((), np.float32), -1) and not CK._rows_of(np.zeros((0, 4), np.float32), -1)
    target = np.zeros(3, np.int64)
    assert CK._class_rows(rows, target, None, 0.0)
    assert CK._class_rows(rows, target.astype(np.int32), None, 0.0)
    assert not CK._class_rows(rows, target, np.ones(5, np.float32), 0.0)  # a class weight
    assert not CK._class_rows(rows, target, None, 0.1)  # label smoothing
    assert not CK._class_rows(rows, rows, None, 0.0)  # probability targets
    assert not CK._class_rows(np.zeros((3, 5, 2), np.float32), np.zeros((3, 2), np.int64), None, 0.0)  # (N, C, d)
    assert not CK._class_rows(np.zeros(5, np.float32), np.zeros((), np.int64), None, 0.0)  # one sample
    assert [CK._block(n) for n in (1, 128, 129, 1000, 4096, 1 << 20)] == [32, 32, 64, 256, 1024, 1024]


def test_an_index_out_of_range_is_the_same_error_on_a_cupy_like_device():
    """embedding's and embedding_grad's check of the indices (which the cuda kernel runs too) on the strict device."""
    from opforge.testing import strict  # noqa: F401  (registers the device "strict")

    for fn in (lambda d, i: F.embedding_grad(d, i, num_embeddings=4), lambda d, i: F.embedding(i, d)):
        messages = []
        for device in ("strict", "cpu"):
            with pytest.raises(of.ArgumentError) as e:
                fn(of.tensor(np.ones((3, 2), np.float32), device=device),
                   of.tensor(np.array([0, 5, 1]), device=device))
            messages.append(str(e.value))
        assert messages[0] == messages[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_import_opforge_with_cupy_absent_registers_the_cuda_kernels():
    done = _python(f"""
        import sys
        sys.modules["cupy"] = None  # import cupy raises ImportError, as where it is not installed
        import opforge
        from opforge.core.opdef import registry
        missing = [n for n in {KERNEL_OPS!r} if ("cuda", opforge.float32) not in registry.get(n).kernels]
        assert not missing, missing
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_import_opforge_does_not_import_cupy():
    done = _python("""
        import sys
        import opforge
        assert "cupy" not in sys.modules, "import opforge imported cupy"
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# -- the sources, compiled with NVRTC (no GPU needed) --------------------------------------------------------------


def _nvrtc_compile(source: str, what: str) -> None:
    cupy = pytest.importorskip("cupy")
    from cupy_backends.cuda.libs import nvrtc

    include = Path(cupy.__file__).parent / "_core" / "include"
    cccl = include / "cupy" / "_cccl"  # (what CuPy's complex.cuh includes)
    try:
        program = nvrtc.createProgram(source, f"{what}.cu", [], [])
    except Exception as e:  # no libnvrtc where CuPy is
        pytest.skip(f"NVRTC is not usable here: {e}")
    try:
        nvrtc.compileProgram(program, ["-arch=compute_90", f"-I{include}", *(f"-I{cccl / d}" for d in
                                                                               ("libcudacxx", "thrust", "cub"))])
    except nvrtc.NVRTCError:
        pytest.fail(f"{what} does not compile:\n{nvrtc.getProgramLog(program)}\n--- source ---\n{source}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_row_kernels_compile(dtype):
    _nvrtc_compile(CK.rows_source(getattr(of, dtype)), f"rows_{dtype}")


SCALARS = {"alpha", "wd", "beta2", "one_minus_beta2", "eps", "shrink"}  # the parameters given Python numbers


def _elementwise_code_compiles(name: str, in_params: str, out_params: str, operation: str, preamble: str = "",
                               loop_prep: str = "") -> None:
    """The code CuPy generates for a cupy.ElementwiseKernel (its own generator, for float and double parameters, 0-d
    raw hyper-parameters of another float type), compiled with CuPy's headers, as CuPy compiles it."""
    cupy = pytest.importorskip("cupy")
    from cupy._core import _carray
    from cupy._core import _kernel as K

    kernel = cupy.ElementwiseKernel(in_params, out_params, operation, name, preamble=preamble, loop_prep=loop_prep)
    ndarray, indexer, scalar = 1, 2, 3  # CuPy 14's _ArgKind values
    for t in (np.float32, np.float64):
        other = np.float64 if t == np.float32 else np.float32
        types = {"T": t, "L": other, "M": other, "B": other, "S": np.int64}
        infos = []
        for p in kernel.params[:-1]:
            dtype = p.dtype or types[p.ctype]
            if p.raw:
                infos.append(K._ArgInfo(ndarray, cupy.ndarray, dtype, 0, True, True))
            elif p in kernel.in_params and p.name in SCALARS:
                infos.append(K._ArgInfo(scalar, cupy._core._scalar.CScalar, dtype, 0, True, True))
            else:
                infos.append(K._ArgInfo(ndarray, cupy.ndarray, dtype, 1, True, True))
        infos.append(K._ArgInfo(indexer, _carray.Indexer, None, 1, True, True))
        used = {p.ctype for p in kernel.params[:-1] if p.dtype is None}
        type_map = K._TypeMap(tuple(sorted((c, types[c]) for c in used)))
        code = K._get_elementwise_kernel_code(tuple(infos), type_map, kernel.params, operation, kernel.name,
                                              kernel.preamble, loop_prep, "")
        headers = "".join(f"#include <cupy/{h}>\n" for h in ("complex.cuh", "carray.cuh", "atomics.cuh"))
        _nvrtc_compile(headers + code, f"{name}_{np.dtype(t).name}")


@pytest.mark.parametrize("name", sorted(CK.ELEMENTWISE))
def test_optimizer_kernels_compile(name):
    in_params, out_params, operation, loop_prep = CK.ELEMENTWISE[name]
    _elementwise_code_compiles(f"opforge_{name}", in_params, out_params, operation, CK._MATH, loop_prep)


@pytest.mark.parametrize("name", sorted(CK.ACTIVATIONS))
def test_activation_kernels_compile(name):
    """Both of core.cuda.Elementwise's forms: its vectorised RawKernel, and the cupy.ElementwiseKernel it runs on
    other layouts."""
    kernel = CK._activation(name)
    for ctype in ("float", "double"):
        _nvrtc_compile(kernel.source(ctype), f"{name}_{ctype}")
    _elementwise_code_compiles(kernel.name + "_general", ", ".join(f"T {n}" for n in (*kernel.inputs, *kernel.scalars)),
                               ", ".join(f"T {n}" for n in kernel.outputs), kernel.body)


