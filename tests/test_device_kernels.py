"""Fused groups as generated kernels of a device (opforge.program.device_kernels), without a GPU: on "kernelsim", the
strict device (arrays that follow CuPy's host rules, so the device path of a plan shows any host leak: no ``.ctypes``,
no NumPy allocation) whose ``elementwise_kernel`` compiles the kernel's text with the C compiler, as CuPy's
ElementwiseKernel would run it (each element: inputs read, the body, outputs written; CUDA's ``__device__`` helpers
become static C functions). Compiled programs there give the CPU's values: bit for bit where the ops are arithmetic,
comparisons and selects, within 4 ulp where they call exp, tanh ... (glibc's scalar functions against NumPy's SIMD
ones, as tests/test_native.py bounds the host's loops). tests/cuda/test_cuda_fusion.py runs the same on a GPU."""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import math
import subprocess

import numpy as np
import pytest
from test_fusion import _program, _samples
from test_native import DECLARED, _ulps, _vectorised

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.program import assign, device_kernels, native
from opforge.testing import strict

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler: kernelsim compiles kernels with it")

CTYPES = {"float32": "float", "float64": "double", "bool": "bool"}
MADE = []  # the kernels kernelsim was asked to make: (in_params, out_params, body, name)


class KernelDevice(strict.StrictDevice):
    """The strict device, making elementwise kernels: each compiled from its text by the C compiler (``MADE``
    lists what it was asked for)."""

    __slots__ = ()
    build_dir = None

    @property
    def makes_elementwise_kernels(self) -> bool:
        return True

    def elementwise_kernel(self, in_params, out_params, operation, name, preamble="", options=()):
        assert options == ("--fmad=false",)
        MADE.append((in_params, out_params, operation, name))
        return CKernel(in_params, out_params, operation, name, preamble, self.build_dir)


def _params(text: str) -> list:
    return [tuple(p.split()) for p in text.split(",")]  # [(dtype name, parameter name)]


class CKernel:
    """CuPy's ElementwiseKernel, on the host: ``kernel(*inputs)`` or ``kernel(*inputs, *outputs)`` over StrictArrays
    broadcast together, the declared dtypes required (CuPy's TypeError), outputs made or given (of the broadcast
    shape: CuPy's ValueError). As on the GPU, each element is read from and written to the arrays' own memory, through
    their strides, with nothing copied first: an output sharing memory with an input in another layout gives wrong
    values here too (one element after another in C order, where the GPU's threads race)."""

    def __init__(self, in_params, out_params, operation, name, preamble, build_dir):
        self.ins, self.outs = _params(in_params), _params(out_params)
        args = [f"const {CTYPES[t]} *{n}_, const int64_t *{n}_at" for t, n in self.ins]
        args += [f"{CTYPES[t]} *{n}_, const int64_t *{n}_at" for t, n in self.outs]
        self.source = "\n".join([
            "#include <math.h>", "#include <stdint.h>", "#include <stdbool.h>", "#define __device__ static",
            preamble,
            f"void {name}({', '.join(args)}, int64_t n) {{",
            "  for (int64_t i_ = 0; i_ < n; i_++) {",
            *[f"    const {CTYPES[t]} {n} = {n}_[{n}_at[i_]];" for t, n in self.ins],
            *[f"    {CTYPES[t]} {n};" for t, n in self.outs],
            "    {", operation, "    }",
            *[f"    {n}_[{n}_at[i_]] = {n};" for _, n in self.outs],
            "  }", "}"])
        key = hashlib.sha256(self.source.encode()).hexdigest()[:24]
        c_file, so_file = build_dir / f"{key}.c", build_dir / f"{key}.so"
        if not so_file.exists():
            c_file.write_text(self.source)
            done = subprocess.run([native.compiler(), "-O1", "-fno-math-errno", "-ffp-contract=off", "-fPIC",
                                   "-shared", str(c_file), "-o", str(so_file), "-lm"], capture_output=True, text=True)
            assert done.returncode == 0, f"the kernel's text does not compile:\n{self.source}\n{done.stderr}"
        self.fn = getattr(ctypes.CDLL(str(so_file)), name)
        self.fn.restype = None

    def __call__(self, *args):
        nin = len(self.ins)
        assert len(args) in (nin, nin + len(self.outs)), f"{len(args)} arguments for {nin} inputs"
        assert all(type(a) is strict.StrictArray for a in args), [type(a) for a in args]
        arrays = [a._a for a in args]
        for a, (t, n) in zip(arrays, self.ins + self.outs):
            if a.dtype != np.dtype(t):
                raise TypeError(f"Type is mismatched. {n} {a.dtype} {t}")
        shape = np.broadcast_shapes(*(a.shape for a in arrays[:nin]))
        if any(a.shape != shape for a in arrays[nin:]):
            raise ValueError("Out shape is mismatched")
        outputs = arrays[nin:] or [np.empty(shape, np.dtype(t)) for t, _ in self.outs]
        pointers = []
        for a in arrays[:nin] + outputs:  # each array's first element, and the offset of each element from it
            strides = np.broadcast_to(a, shape).strides
            at = sum(np.arange(size).reshape((-1,) + (1,) * (len(shape) - d - 1)) * (stride // a.itemsize)
                     for d, (size, stride) in enumerate(zip(shape, strides)))
            at = np.ascontiguousarray(np.broadcast_to(np.asarray(at, np.int64), shape))
            pointers += [ctypes.c_void_p(a.ctypes.data), ctypes.c_void_p(at.ctypes.data), at]
        self.fn(*(p for k, p in enumerate(pointers) if k % 3 != 2), ctypes.c_int64(math.prod(shape)))
        made = [strict.StrictArray(r) for r in outputs] if len(args) == nin else list(args[nin:])
        return made[0] if len(made) == 1 else tuple(made)


KERNELSIM = of.register_device("kernelsim", strict.xp, kernels_of="cpu", array_type=strict.StrictArray,
                               cls=KernelDevice)


@pytest.fixture(autouse=True)
def _build_dir(tmp_path_factory):
    KernelDevice.build_dir = tmp_path_factory.getbasetemp() / "kernelsim"
    KernelDevice.build_dir.mkdir(exist_ok=True)
    device_kernels._KERNELS.clear()  # (the kernels of another test session's build directory)
    MADE.clear()


def _on_devices(fn, feeds: dict, device=KERNELSIM):
    """``fn``'s program on ``device``, compiled (its plan and results as host arrays), and on the CPU, unoptimised."""
    specs = {k: of.Spec(v.shape, v.dtype) for k, v in feeds.items()}
    exe = of.Executor(of.trace(fn, device=device, **specs))
    got = {k: v.get() for k, v in exe.run(feeds).items()}
    want = of.Executor(of.trace(fn, device="cpu", **specs), optimize=False).run(feeds)
    return exe.plan(feeds), got, want


def _groups(plan) -> list:
    return [line for line in plan.source.splitlines() if line.startswith("def k") and "device kernel" in line]


def test_a_chain_is_one_kernel_of_the_device():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)

    def fn(x, y):
        return F.where(x > 0.5, F.tanh(x * 2.0 + y), F.maximum(x, y) - 1.0) * F.sigmoid(x)

    plan, got, want = _on_devices(fn, {"x": x, "y": y})
    assert len(_groups(plan)) == 1 and plan.steps == 1, plan.source
    assert _ulps(got["out"], want["out"]) <= 4
    (in_params, out_params, body, name), = MADE
    # x, y and the numbers 0.5, 2.0 and 1.0 (0-d constants of the program) in; the where's product out
    assert in_params == ", ".join(f"float32 in{k}" for k in range(5)) and out_params == "float32 out0"
    assert "tanhf(" in body and "of_maxf(" in body and "expf(" in body and body.endswith("out0 = t8;")
    assert name == "opforge_greater_mul_add_tanh"
    assert "__device__ inline float of_maxf(float a, float b)" in device_kernels.PREAMBLE  # NumPy's max, on CUDA


def test_the_kernel_text_of_a_small_group():
    """The body: the inputs read once, each op's scalar expression in its dtype (constants typed as NumPy types a
    Python scalar), the results written; float64 calls tanh, a comparison's bool result is a bool output."""
    x, y = np.linspace(-1, 1, 8), np.linspace(2, 3, 8)
    _, got, want = _on_devices(lambda x, y: F.tanh(F.leaky_relu(x, alpha=0.25) + y), {"x": x, "y": y})
    assert _ulps(got["out"], want["out"]) <= 4
    assert MADE[-1][:3] == ("float64 in0, float64 in1", "float64 out0", "\n".join([
        "double x0 = in0;", "double x1 = in1;",
        "double t0 = ((((double)0.25) <= ((double)1.0)) ? of_max(((double)x0), ((double)(x0 * ((double)0.25)))) "
        ": of_min(((double)x0), ((double)(x0 * ((double)0.25)))));", "double t1 = (t0 + x1);",
        "double t2 = tanh(((double)t1));", "out0 = t2;"]))
    _, got, want = _on_devices(lambda x, y: F.sigmoid(x) > y, {"x": x.astype(np.float32), "y": y.astype(np.float32)})
    assert np.array_equal(got["out"], want["out"])
    assert MADE[-1][:3] == ("float32 in0, float32 in1", "bool out0", "\n".join([
        "float x0 = in0;", "float x1 = in1;", "float t0 = (((float)1.0) / (((float)1.0) + expf(((float)(-x0)))));",
        "unsigned char t1 = (t0 > x1);", "out0 = t1;"]))


@pytest.mark.parametrize("name", DECLARED)
def test_every_op_with_a_scalar_expression_computes_its_cpu_values_in_a_kernel(name):
    """Each op between two others (test_fusion._program), on its first sample, in float64 and float32: bit for bit
    against its kernel on the CPU, within 4 ulp where the expression calls exp, tanh ..."""
    opdef = of.registry.get(name)
    sample = _samples(opdef)[0]
    for dtype in (np.float64, np.float32):
        feeds, cpu_program = _program(opdef, sample, dtype, rows=3)
        with of.using_device(KERNELSIM):
            _, program = _program(opdef, sample, dtype, rows=3)
        exe = of.Executor(program)
        with np.errstate(all="ignore"):
            got = exe.run(feeds)["out"].get()
            want = of.Executor(cpu_program, optimize=False).run(feeds)["out"]
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.kind == "f" and _vectorised(opdef):
            assert _ulps(got, want) <= 4, (name, dtype)
        else:
            assert np.array_equal(got, want, equal_nan=True), (name, dtype)
        assert "device kernel" in exe.plan(feeds).source, (name, dtype)


def test_an_op_without_a_scalar_expression_keeps_its_kernel_and_its_neighbours_fuse():
    x = np.linspace(-2, 2, 12).reshape(3, 4)
    plan, got, want = _on_devices(lambda x: F.elu(x * 2.0 + 1.0) * 3.0 - 1.0, {"x": x})  # elu has no expression
    assert np.array_equal(got["out"], want["out"])
    run = plan.source.split("def run")[1]
    assert len(_groups(plan)) == 2 and plan.steps == 3, plan.source
    assert "k0(" in run and "= k1(v" in run and "k2(" in run  # (k1: elu's own kernel, between the two launches)
    assert len(MADE) == 2 and "elu" not in "".join(name for *_, name in MADE)
    # the intermediates between the steps are dropped after their last reader (back to the device's memory pool)
    between = [line.split("=")[0].strip() for line in run.splitlines() if "= k0(" in line or "= k1(" in line]
    assert all(f"del {v}" in run for v in between), run


def test_a_group_that_cannot_be_translated_runs_its_members_kernels():
    x = np.linspace(-2, 2, 12).reshape(3, 4)
    plan, got, want = _on_devices(lambda x: F.leaky_relu(x * 2.0, alpha=math.inf) - 1.0, {"x": x})  # α: no C constant
    assert np.array_equal(got["out"], want["out"], equal_nan=True)
    assert not _groups(plan) and plan.steps == 3 and not MADE


def test_an_output_goes_into_a_dying_input_unless_another_input_views_it_in_another_layout():
    """a dies at the kernel, which may write into it; but aᵀ, a view of a, is read there too: a thread would read an
    element another one wrote. The kernel then gets a new array (the host loop's _overlap does the same)."""
    x = np.linspace(-1, 1, 16).reshape(4, 4)
    plan, got, want = _on_devices(lambda x: F.tanh(x * 2.0 + F.transpose(x * 2.0, perm=[1, 0]) * 0.5), {"x": x})
    assert _ulps(got["out"], want["out"]) <= 4
    assert ", out=" in plan.source.split("def run")[1], plan.source  # (the plan offers a's buffer)
    # a dying input of the same Spec that nothing views is written over (no new array)
    plan, got, want = _on_devices(lambda x: F.tanh((x @ x) * 2.0 - 1.0), {"x": x})
    assert "k1(v3, v1, v2, W, out=v3)" in plan.source.split("def run")[1], plan.source  # (matmul: an out= kernel)
    assert _ulps(got["out"], want["out"]) <= 4


def test_a_region_with_more_parameters_than_a_kernel_takes_runs_its_members(monkeypatch):
    def fn(x):  # the forward's 20 values, read by the backward: a region with 21 results
        h = x
        for _ in range(20):
            h = F.tanh(h) * 1.01
        return {"y": h, "g": of.grad(F.sum(h), [x])[0]}

    x = np.linspace(-1, 1, 16)
    plan, got, want = _on_devices(fn, {"x": x})
    assert max(len(out.split(",")) for _, out, _, _ in MADE) == 21
    monkeypatch.setattr(device_kernels, "PARAMETER_BYTES", 22 * 32 + 24)  # (1-d: 32 bytes an array, 24 the indexer)
    small, got_small, _ = _on_devices(fn, {"x": x})
    assert small.steps > plan.steps + 30, (small.steps, plan.steps)  # the 40 forward ops on their own
    for k in want:  # (glibc's tanh against NumPy's, an ulp or so a call, in the kernels left)
        assert _ulps(got[k], want[k]) <= 4 * 40 and _ulps(got_small[k], want[k]) <= 4 * 40


def test_kernels_are_made_once_per_source_and_the_switch_turns_them_off(monkeypatch):
    program = of.trace(lambda x: F.tanh(x * 2.0) + 1.0, device=KERNELSIM, x=of.Spec((None, 4), "float32"))
    for rows in (2, 5):  # two plans (feeds of two shapes), one kernel
        x = np.ones((rows, 4), np.float32)
        assert np.allclose(of.Executor(program).run(x=x)["out"].get(), np.tanh(2.0) + 1.0)
    assert len(MADE) == 1
    monkeypatch.setenv("OPFORGE_NATIVE", "0")
    assert not _groups(of.Executor(program).plan(x=x)) and of.Executor(program).plan(x=x).steps == 3
    monkeypatch.setenv("OPFORGE_NATIVE", "1")
    assert not _groups(of.Executor(program, native=False).plan(x=x))
    # a device without kernels of its own (the strict device: CuPy's rules, no ElementwiseKernel) runs every op
    assert not strict.DEVICE.makes_elementwise_kernels
    plan = of.Executor(of.trace(lambda x: F.tanh(x * 2.0) + 1.0, device=strict.DEVICE, x=of.Spec((2, 4), "float32"))
                       ).plan(x=x[:2])
    assert plan.steps == 3 and "device kernel" not in plan.source


def _mlp_training(device, compiled: bool, optimizer: str):
    """An MLP with layer_norm, gelu, leaky_relu and tanh, its loss and an optimizer's step."""
    of.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16, dtype="float64"), nn.LayerNorm(16, dtype="float64"), nn.GELU(),
                          nn.Linear(16, 16, dtype="float64"), nn.LeakyReLU(0.1), nn.Linear(16, 8, dtype="float64"),
                          nn.Tanh(), nn.Linear(8, 3, dtype="float64")).to(device)
    opt = (of.optim.Adam(model.parameters(), lr=1e-2) if optimizer == "adam" else
           of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, of.compile(step) if compiled else step


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_compiled_training_step_on_the_kernel_device_follows_the_cpu(optimizer):
    """Three steps compiled on kernelsim against eager on the CPU: the same parameters (float64: glibc's scalar exp,
    tanh, erf against NumPy's, a few ulp apart at most before the GEMMs mix them); fewer steps than one kernel per op;
    nothing of the host's native paths (GEMM epilogues, Adam and layer_norm loops: ctypes on host memory) in the
    plan, which the strict arrays would have refused anyway."""
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((10, 12)), rng.integers(0, 3, 10)) for _ in range(3)]
    runs = {}
    for device, compiled in ((KERNELSIM, True), ("cpu", False)):
        model, step = _mlp_training(device, compiled, optimizer)
        losses = [step(of.tensor(x, device=device), of.tensor(y, device=device)).cpu().numpy() for x, y in batches]
        runs[device] = losses, [p.cpu().numpy() for p in model.parameters()], step
    (got, got_params, compiled_step), (want, want_params, _) = runs[KERNELSIM], runs["cpu"]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)
    (plan,) = [p for entry in compiled_step.cache.values() for e in entry for p in e.exe._plans.values()]
    for host_only in (", native", "adam_step", "layer_norm_step", "normalize_grad_step", "gemm"):
        assert host_only not in plan.source


def functional_mlp(device, widths=(12, 16, 16, 8, 3), dtype=np.float64):
    """A hand-written MLP (each bias an add the activation after it can join: gelu has no scalar expression,
    leaky_relu and tanh have) and its SGD step ``p − 0.05·g``, each update one group written into its parameter.
    (tests/cuda/test_cuda_fusion.py runs it on a GPU, wider.)"""
    rng = np.random.default_rng(3)
    shapes = [s for a, b in itertools.pairwise(widths) for s in ((a, b), (b,))]
    params = [of.tensor((rng.standard_normal(s) / np.sqrt(s[0])).astype(dtype), device=device, requires_grad=True)
              for s in shapes]

    def step(x, y):
        w1, b1, w2, b2, w3, b3, w4, b4 = params
        h = F.gelu(x @ w1 + b1)
        h = F.leaky_relu(h @ w2 + b2, 0.1)
        h = F.tanh(h @ w3 + b3)
        loss = F.mean(F.square(h @ w4 + b4 - y))
        grads = of.grad(loss, params)
        with of.no_grad():
            for p, g in zip(params, grads):
                assign(p, p - 0.05 * g)
        return loss

    return params, step


def test_a_hand_written_mlp_step_is_fewer_launches_and_follows_the_cpu():
    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((10, 12)), rng.standard_normal((10, 3))) for _ in range(3)]
    params, step = functional_mlp(KERNELSIM)
    compiled = of.compile(step)
    got = [compiled(of.tensor(x, device=KERNELSIM), of.tensor(y, device=KERNELSIM)).cpu().numpy() for x, y in batches]
    cpu_params, cpu_step = functional_mlp("cpu")
    want = [cpu_step(of.tensor(x), of.tensor(y)).numpy() for x, y in batches]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for p, q in zip(params, cpu_params):
        np.testing.assert_allclose(p.cpu().numpy(), q.numpy(), rtol=1e-10, atol=1e-13)
    (entry,) = [e for entry in compiled.cache.values() for e in entry]
    (plan,) = entry.exe._plans.values()
    unfused = of.Executor(entry.exe.program, fetch=entry.exe.fetch, native=False).plan(x=batches[0][0],
                                                                                        y=batches[0][1])
    assert len(_groups(plan)) >= 10 and plan.steps < unfused.steps - 10, (plan.steps, unfused.steps)
    assert "out=v" in plan.source.split("def run")[1]  # (updates written into their parameters)
