"""The GPU bench (issue 26): opforge on "cuda" against PyTorch CUDA and raw CuPy, in one process and one run.

    python bench/gpu.py --out DIR                       # DIR/gpu.md and DIR/gpu.json; sized for < 150 s on an H100
    python bench/gpu.py --out DIR --quick               # fewer, shorter repeats (< 60 s): a time-limited run
    python bench/gpu.py --out DIR --rows mlp            # some rows only: small, large, mlp
    python bench/gpu.py --out DIR --device cpu --quick  # dry run without a GPU: the same rows on the CPU, PyTorch
                                                        # CPU, NumPy in CuPy's place (the numbers mean nothing)
    python bench/gpu.py --out DIR --device strict --quick --small   # opforge on the CuPy-strict test device
                                                        # (a host leak in opforge's path fails as on a GPU);
                                                        # --small: smaller sizes (tests/test_bench_gpu.py)

Rows (issue 26's targets):
1. eager small op: ``a + b`` on 16 float32 elements, µs per call: opforge eager, PyTorch, CuPy (target ≤ 1.5× torch);
2. large ops, GB/s (bytes read + written over the median time): leaky_relu over 2^26 float32 (opforge eager,
   PyTorch, a raw ``cupy.ElementwiseKernel``; target ≥ 0.8× torch's bandwidth), softmax over the last dim of
   4096×4096 and layer_norm over 8192×1024 (PyTorch's functions; CuPy composed of its array functions);
3. the MLP 784-512-512-10 SGD step (cross_entropy, lr 0.01; bench/cases/mlp.py's step, weights and data) at batch
   64, 512 and 4096: opforge eager, opforge compiled (``of.compile`` on the step), PyTorch eager, and PyTorch's time
   for the step's 8 GEMMs alone (mlp.floor's products; the issue's stretch reference); target: compiled ≥ 2× faster
   than PyTorch eager at every batch, stretch: within 1.5× of the GEMMs;
4. the first call of each step (the compiled one traces, plans and, on a cold cache, has CuPy compile its kernels).

Every implementation's result is checked against a float64 reference on the host before it is timed (the MLP: the
loss, the updated weights, also against PyTorch's step from the same weights and batch, rtol 1e-4, and the size of
the update); a mismatch is a failure and that implementation is not timed. Timing: the first call (the check) and one
more warm up; then N calls between two device synchronisations (``torch.cuda.synchronize``: the whole device, CuPy's
streams too), N chosen so that a repeat lasts at least --min-time; the repeats go round-robin over a row's
implementations (one that has spent --max-seconds stops at 3: a pathologically slow path cannot eat a time-limited
run); tables give the median of --repeats repeats. Small ops are measured as a training loop issues them, queued
without a sync in between: per-call time is what the host spends issuing one.

A failure (an exception in any implementation's path, a check that does not pass) is written into the table and the
JSON, the other implementations and rows go on, and the script exits 1 at the end. DIR/gpu.json and DIR/gpu.md are
rewritten after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import mlp  # noqa: E402
from cases.common import threads  # noqa: E402
from harness import limit_pools  # noqa: E402
from run import cpu_model, git_commit, num, write  # noqa: E402

ALPHA = 0.01  # leaky_relu's slope (PyTorch's default)
EPS = 1e-5  # layer_norm's
SIZES = {  # the sizes, and --small's
    "full": {"add": 16, "leaky_relu": 2 ** 26, "softmax": (4096, 4096), "layer_norm": (8192, 1024),
             "batches": (64, 512, 4096)},
    "small": {"add": 16, "leaky_relu": 2 ** 16, "softmax": (64, 256), "layer_norm": (128, 64), "batches": (8, 64)},
}
ROWS = ("small", "large", "mlp")
RTOL = {"small": 1e-6, "large": 1e-5, "mlp": 1e-4}
NAMES = {"opforge": "opforge eager", "opforge.compiled": "opforge compiled", "torch": "PyTorch",
         "gemms": "PyTorch GEMMs alone"}  # and "raw": CuPy, or NumPy on the CPU


class CheckFailed(AssertionError):
    """An implementation's result is not the reference's."""


# -- the devices -----------------------------------------------------------------------------------------------------


class Backend:
    """Where each implementation runs: opforge's device, PyTorch's, the raw array module (CuPy, or NumPy on the CPU),
    and the synchronisation that makes a timing include the device's work."""

    def __init__(self, device: str):
        self.device = device  # opforge's
        self.torch_device = "cuda" if device == "cuda" else "cpu"
        self._torch = self._xp = None

    @property
    def torch(self):
        if self._torch is None:
            from cases.common import load_torch

            torch = load_torch()
            if self.device == "cuda" and not torch.cuda.is_available():
                raise RuntimeError(f"PyTorch {torch.__version__} sees no CUDA device")
            self._torch = torch
        return self._torch

    @property
    def xp(self):
        """CuPy on "cuda", NumPy elsewhere."""
        if self._xp is None:
            if self.device == "cuda":
                import cupy

                self._xp = cupy
            else:
                self._xp = np
        return self._xp

    @property
    def raw_name(self) -> str:
        return "CuPy" if self.device == "cuda" else "NumPy"

    def sync(self) -> None:
        if self.device != "cuda":
            return
        if self._torch is not None:
            self._torch.cuda.synchronize()  # cudaDeviceSynchronize: every stream, CuPy's too
        else:
            self.xp.cuda.runtime.deviceSynchronize()

    def opforge(self, array: np.ndarray, requires_grad: bool = False):
        import opforge as of

        if self.device == "strict":
            import opforge.testing.strict  # registers the device
        return of.tensor(array.copy(), requires_grad=requires_grad, device=self.device)

    def to_torch(self, array: np.ndarray, requires_grad: bool = False):
        return self.torch.from_numpy(array.copy()).to(self.torch_device).requires_grad_(requires_grad)

    def to_raw(self, array: np.ndarray):
        return self.xp.asarray(array.copy())

    def release(self) -> None:
        """Give back cached device memory between rows (2^26-element arrays add up)."""
        gc.collect()
        if self.device == "cuda":
            if self._xp is not None:
                self._xp.get_default_memory_pool().free_all_blocks()
            if self._torch is not None:
                self._torch.cuda.empty_cache()

    def device_name(self) -> str:
        if self.device == "cuda":
            try:
                return self.torch.cuda.get_device_name()
            except Exception:  # no torch CUDA: ask CuPy
                name = self.xp.cuda.runtime.getDeviceProperties(0)["name"]
                return name.decode() if isinstance(name, bytes) else name
        return f"{cpu_model()} (CPU{', opforge on the strict test device' if self.device == 'strict' else ''})"


def host(value) -> np.ndarray:
    """A result of any implementation as a NumPy array of its own (on the CPU, torch's and opforge's ``numpy()``
    share the tensor's memory, which the next step overwrites): opforge and torch tensors, CuPy arrays."""
    if hasattr(value, "detach"):  # a torch or opforge tensor
        value = value.detach().cpu().numpy()
    elif type(value).__module__.startswith("cupy"):
        return value.get()
    return np.array(value, copy=True)


def compare(what: str, got, want, rtol: float, atol: float = 0.0, dtype=np.float32) -> None:
    """Raise CheckFailed saying where and by how much ``got`` (of ``dtype``) differs from ``want`` (float64)."""
    got, want = host(got), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or got.dtype != dtype:
        raise CheckFailed(f"{what}: {got.dtype} of shape {got.shape}, expected {np.dtype(dtype)} of shape "
                          f"{want.shape}")
    err = got.astype(np.float64)  # in place from here: 2^26 values take seconds on the host otherwise
    err -= want
    np.abs(err, out=err)
    bound = np.abs(want)
    bound *= rtol
    bound += atol
    bad = ~(err <= bound)  # NaN is off too
    if bad.any():
        err -= bound
        i = np.unravel_index(int(np.argmax(np.where(np.isnan(err), np.inf, err))), want.shape)
        raise CheckFailed(f"{what}: {int(bad.sum())} of {want.size} values off (rtol {rtol:g}, atol {atol:.3g}); "
                          f"the worst at {tuple(int(k) for k in i)}: got {got[i]!r}, expected {want[i]!r} (float64)")


# -- timing ----------------------------------------------------------------------------------------------------------


@dataclass
class Impl:
    """One implementation of a row: ``build()`` makes the call to time (and may raise: that is recorded), ``check(fn)``
    calls it once and compares with the reference."""

    name: str
    build: Callable[[], Callable]
    check: Callable[[Callable], None]
    result: dict = field(default_factory=dict)


def run_calls(fn, number: int, sync) -> float:
    """Seconds for ``number`` calls, the device's work included."""
    sync()
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return time.perf_counter() - start


def calibrate(fn, sync, min_time: float) -> int:
    """Calls per repeat: enough for at least ``min_time`` seconds."""
    number = 1
    while True:
        seconds = run_calls(fn, number, sync)
        if seconds >= min_time / 2 or number >= 1 << 20:
            return max(1, math.ceil(number * min_time / max(seconds, 1e-9)))
        number *= 2


def measure(impls: list[Impl], backend: Backend, args) -> None:
    """Check, warm up, calibrate, then time the implementations round-robin; failures go into ``impl.result``."""
    ready = []
    for impl in impls:
        try:
            fn = impl.build()
            backend.sync()
            start = time.perf_counter()
            impl.check(fn)  # the first call: compiles what it compiles
            backend.sync()
            impl.result["first_call"] = time.perf_counter() - start
            fn()  # warm-up
            impl.result["number"] = calibrate(fn, backend.sync, args.min_time)
            ready.append((impl, fn))
        except Exception as exc:  # recorded, and the row goes on
            fail(impl, exc)
    samples = {impl.name: [] for impl, _ in ready}
    spent = dict.fromkeys(samples, 0.0)
    failed = set()
    for _ in range(args.repeats):
        for impl, fn in ready:
            # a pathologically slow implementation stops after 3 repeats once it has had its share of the run
            if impl.name in failed or (len(samples[impl.name]) >= 3 and spent[impl.name] > args.max_seconds):
                continue
            try:
                seconds = run_calls(fn, impl.result["number"], backend.sync)
            except Exception as exc:
                fail(impl, exc)
                failed.add(impl.name)
                continue
            samples[impl.name].append(seconds / impl.result["number"])
            spent[impl.name] += seconds
    for impl, _ in ready:
        if impl.name not in failed:
            s = samples[impl.name]
            impl.result |= {"median": statistics.median(s), "min": min(s), "max": max(s), "samples": s}


def fail(impl: Impl, exc: BaseException) -> None:
    impl.result["error"] = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, CheckFailed):
        impl.result["traceback"] = traceback.format_exc()


# -- the rows --------------------------------------------------------------------------------------------------------


def checker(want: np.ndarray, rtol: float, atol: float = 0.0):
    """A check of a call's result against ``want`` (float64)."""

    def check(fn):
        compare("result", fn(), want, rtol, atol)

    return check


def row_small(b: Backend, sizes: dict) -> list[dict]:
    rng = np.random.default_rng(1)
    a, c = (rng.standard_normal(sizes["add"], dtype=np.float32) for _ in range(2))
    want = a.astype(np.float64) + c
    check = checker(want, RTOL["small"])

    def opforge():
        x, y = b.opforge(a), b.opforge(c)
        return lambda: x + y

    def torch():
        x, y = b.to_torch(a), b.to_torch(c)
        return lambda: x + y

    def raw():
        x, y = b.to_raw(a), b.to_raw(c)
        return lambda: x + y

    impls = [Impl("opforge", opforge, check), Impl("torch", torch, check), Impl("raw", raw, check)]
    return [{"id": "add", "title": f"a + b, {sizes['add']} float32", "unit": "µs", "impls": impls}]


def leaky_relu_raw(b: Backend):
    """A raw CuPy ElementwiseKernel (NumPy's where on the CPU)."""
    if b.device != "cuda":
        return lambda x: np.where(x > 0, x, x * np.float32(ALPHA))
    kernel = b.xp.ElementwiseKernel("T x, T alpha", "T y", "y = x > 0 ? x : alpha * x", "bench_leaky_relu")
    alpha = np.float32(ALPHA)
    return lambda x: kernel(x, alpha)


def softmax_raw(b: Backend):
    xp = b.xp

    def softmax(x):
        e = xp.exp(x - x.max(axis=-1, keepdims=True))
        e /= e.sum(axis=-1, keepdims=True)
        return e

    return softmax


def layer_norm_raw(b: Backend):
    xp = b.xp

    def layer_norm(x, w, bias):
        mean = x.mean(axis=-1, keepdims=True)
        centred = x - mean
        var = (centred * centred).mean(axis=-1, keepdims=True)
        return centred / xp.sqrt(var + np.float32(EPS)) * w + bias

    return layer_norm


def row_large(b: Backend, sizes: dict) -> list[dict]:
    rng = np.random.default_rng(2)
    rows = []

    def case(case_id, title, inputs, want, opforge_fn, torch_fn, raw_fn, nbytes):
        """``raw_fn(b)`` makes the raw function (CuPy compiles an ElementwiseKernel when it is built)."""

        def on(convert, make):
            def build():
                fn, args = make(), [convert(a) for a in inputs]
                return lambda: fn(*args)

            return build

        check = checker(want, RTOL["large"], atol=RTOL["large"] * float(np.abs(want).max()))
        impls = [Impl("opforge", on(b.opforge, lambda: opforge_fn), check),
                 Impl("torch", on(b.to_torch, lambda: torch_fn), check),
                 Impl("raw", on(b.to_raw, lambda: raw_fn(b)), check)]
        rows.append({"id": case_id, "title": title, "unit": "GB/s", "bytes": nbytes, "impls": impls})

    def F():
        from opforge import ops

        return ops

    def TF():
        return b.torch.nn.functional

    n = sizes["leaky_relu"]
    x = rng.standard_normal(n, dtype=np.float32)
    x64 = x.astype(np.float64)
    case("leaky_relu", f"leaky_relu, 2^{n.bit_length() - 1} float32", [x], np.where(x64 > 0, x64, ALPHA * x64),
         lambda x: F().leaky_relu(x, ALPHA), lambda x: TF().leaky_relu(x, ALPHA), leaky_relu_raw, 2 * x.nbytes)
    del x64

    shape = sizes["softmax"]
    x = rng.standard_normal(shape, dtype=np.float32)
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    case("softmax", f"softmax over the last dim, {shape[0]}×{shape[1]} float32", [x], e / e.sum(-1, keepdims=True),
         lambda x: F().softmax(x, -1), lambda x: b.torch.softmax(x, -1), softmax_raw, 2 * x.nbytes)
    del e

    shape = sizes["layer_norm"]
    x = rng.standard_normal(shape, dtype=np.float32)
    w = (1 + 0.1 * rng.standard_normal(shape[-1])).astype(np.float32)
    bias = (0.1 * rng.standard_normal(shape[-1])).astype(np.float32)
    x64 = x.astype(np.float64)
    centred = x64 - x64.mean(-1, keepdims=True)
    want = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + EPS) * w + bias
    norm_shape = [shape[-1]]
    case("layer_norm", f"layer_norm over the last dim, {shape[0]}×{shape[1]} float32 (weight, bias)", [x, w, bias],
         want, lambda x, w, bias: F().layer_norm(x, norm_shape, w, bias, eps=EPS),
         lambda x, w, bias: TF().layer_norm(x, norm_shape, w, bias, EPS), layer_norm_raw, 2 * x.nbytes)
    return rows


def row_mlp(b: Backend, sizes: dict) -> list[dict]:
    return [mlp_row(b, batch) for batch in sizes["batches"]]


def mlp_row(b: Backend, batch: int) -> dict:
    arrays, x, y = mlp.init(batch)
    # the float64 reference: one step from the same weights and batch
    loss64, grads64, _ = mlp.numpy_forward_backward([a.astype(np.float64) for a in arrays], x.astype(np.float64), y)
    after64 = [a.astype(np.float64) - mlp.LR * g for a, g in zip(arrays, grads64)]
    update64 = sum(float(np.square(mlp.LR * g).sum()) for g in grads64)
    torch_after: list = []  # PyTorch's updated weights: its step is checked first

    def checker_of(params: list, keep: list | None = None):
        def check(step):
            before = [host(p).astype(np.float64) for p in params]
            compare("loss", step(), loss64, RTOL["mlp"])
            after = [host(p) for p in params]
            for i, (got, want) in enumerate(zip(after, after64)):
                compare(f"updated {mlp_param(i)} against float64", got, want, RTOL["mlp"], atol=1e-6)
            for i, (got, want) in enumerate(zip(after, torch_after)):
                compare(f"updated {mlp_param(i)} against PyTorch's step", got, want, RTOL["mlp"], atol=1e-6)
            update = sum(float(np.square(a - p).sum()) for a, p in zip(after, before))
            if not abs(update - update64) <= 1e-2 * update64:  # a step that leaves the weights as they were fails
                raise CheckFailed(f"the step moved the weights by Σ(after − before)² = {update:.6g}, expected "
                                  f"{update64:.6g} (float64)")
            if keep is not None:
                keep.extend(after)

        return check

    def opforge_build(params: list, compiled: bool):
        def build():
            params[:] = [b.opforge(a, requires_grad=True) for a in arrays]
            return mlp.opforge_step(params, b.opforge(x), b.opforge(y), compiled)

        return build

    def torch_build(params: list):
        def build():
            params[:] = [b.to_torch(a, requires_grad=True) for a in arrays]
            return mlp.torch_step(params, b.to_torch(x), b.to_torch(y))

        return build

    def gemms_check(fn):
        """The 8 products against the same float32 operands multiplied in float64."""
        wants = mlp.floor(arrays, x, y, to=lambda a: a.astype(np.float64))()
        for k, (got, want) in enumerate(zip(fn(), wants)):
            compare(f"GEMM {k + 1} of 8", got, want, RTOL["mlp"], atol=RTOL["mlp"] * float(np.abs(want).max()))

    eager, compiled, torch_params = [], [], []
    impls = [Impl("torch", torch_build(torch_params), checker_of(torch_params, keep=torch_after)),
             Impl("opforge", opforge_build(eager, False), checker_of(eager)),
             Impl("opforge.compiled", opforge_build(compiled, True), checker_of(compiled)),
             Impl("gemms", lambda: mlp.floor(arrays, x, y, to=b.to_torch), gemms_check)]
    return {"id": f"mlp {batch}", "title": f"MLP SGD step, batch {batch}", "unit": "ms", "batch": batch,
            "impls": impls}


def name_of(impl: str, backend: Backend) -> str:
    return backend.raw_name if impl == "raw" else NAMES.get(impl, impl)


def mlp_param(i: int) -> str:
    return ("W", "b")[i % 2] + str(i // 2 + 1)


BUILDERS = {"small": row_small, "large": row_large, "mlp": row_mlp}


# -- the report ------------------------------------------------------------------------------------------------------


def results(row: dict) -> dict:
    return {impl.name: impl.result for impl in row["impls"]}


def value(row: dict, name: str):
    """The row's figure for an implementation: µs or ms per call, or GB/s; None if it failed or did not run."""
    r = results(row).get(name, {})
    if "median" not in r:
        return None
    if row["unit"] == "GB/s":
        return row["bytes"] / r["median"] / 1e9
    return r["median"] * {"µs": 1e6, "ms": 1e3}[row["unit"]]


def cell(row: dict, name: str) -> str:
    r = results(row).get(name)
    if r is None:
        return ""
    if "error" in r:
        return "**failed** (below)"
    v = value(row, name)
    return num(v) if v is not None else "—"


def ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "—"


def targets(rows: list) -> list:
    by_id = {r["id"]: r for r in rows}
    out = []

    def target(text, parts, ok):
        """parts: (label, value or None); ok(value) says whether a measured value meets the target."""
        measured = ", ".join(f"{label} {v:.2f}×" for label, v in parts if v is not None) or "not measured"
        values = [v for _, v in parts]
        met = None if not values or any(v is None for v in values) else all(ok(v) for v in values)
        out.append({"target": text, "measured": measured, "met": met, "values": dict(parts)})

    def quotient(row_id, a, b_):
        row = by_id.get(row_id)
        if row is None:
            return None
        va, vb = value(row, a), value(row, b_)
        return va / vb if va is not None and vb else None

    if "add" in by_id:
        target("Eager small op (a + b, 16 float32) ≤ 1.5× PyTorch per call",
               [("opforge / torch", quotient("add", "opforge", "torch"))], lambda v: v <= 1.5)
    if "leaky_relu" in by_id:
        target("leaky_relu over 2^26 float32 ≥ 0.8× PyTorch's bandwidth",
               [("opforge / torch", quotient("leaky_relu", "opforge", "torch"))], lambda v: v >= 0.8)
    steps = [r for r in rows if r["id"].startswith("mlp ")]
    if steps:
        target("Compiled MLP step ≥ 2× faster than PyTorch eager, every batch",
               [(f"batch {r['batch']}: torch / compiled", quotient(r["id"], "torch", "opforge.compiled"))
                for r in steps], lambda v: v >= 2)
        target("Stretch: compiled MLP step within 1.5× of its 8 GEMMs in PyTorch, every batch",
               [(f"batch {r['batch']}: compiled / GEMMs", quotient(r["id"], "opforge.compiled", "gemms"))
                for r in steps], lambda v: v <= 1.5)
    return out


def failures(rows: list) -> list:
    return [{"row": r["title"], "impl": impl.name, "error": impl.result["error"],
             "traceback": impl.result.get("traceback", "")}
            for r in rows for impl in r["impls"] if "error" in impl.result]


def markdown(report: dict, rows: list, backend: Backend) -> str:
    meta = report["meta"]
    raw = backend.raw_name
    lines = [f"# GPU bench (issue 26): opforge on {backend.device!r} against PyTorch and raw {raw}", ""]
    if meta["device"] != "cuda":
        lines += [f"**--device {meta['device']}: a dry run without a GPU (every framework on {threads()} thread(s)). "
                  "The numbers mean nothing.**", ""]
    if meta["quick"]:
        lines += ["**--quick run: few, short repeats.**", ""]
    lines += [f"{meta['date']} · **{meta['device_name']}** · opforge {meta['commit']} · Python {meta['python']} · "
              + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), "",
              f"`{meta['command']}`: each implementation's result checked against a float64 reference first; then "
              f"the median of {meta['repeats']} repeats, each at least {meta['min_time'] * 1e3:.0f} ms of calls "
              "between two device synchronisations, round-robin over a row's implementations (one that has spent "
              f"{meta['max_seconds']:g} s stops at 3). Ratios divide medians of this run.", ""]
    lines += ["## Targets", "", "| target | measured | |", "|---|---|---|"]
    for t in report["targets"]:
        status = {True: "met", False: "**missed**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['measured']} | {status} |")
    small = [r for r in rows if r["id"] == "add"]
    if small:
        lines += ["", "## 1. Eager small op (µs per call, queued without a sync between calls)", "",
                  f"| case | opforge eager | PyTorch | {raw} | opforge / PyTorch | {raw} / PyTorch |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in small:
            lines.append(f"| {r['title']} | {cell(r, 'opforge')} | {cell(r, 'torch')} | {cell(r, 'raw')} | "
                         f"{ratio(value(r, 'opforge'), value(r, 'torch'))} | "
                         f"{ratio(value(r, 'raw'), value(r, 'torch'))} |")
    large = [r for r in rows if r["unit"] == "GB/s"]
    if large:
        kernel = "a raw ElementwiseKernel for leaky_relu, else its array functions" if raw == "CuPy" else "by hand"
        lines += ["", "## 2. Large ops (GB/s: bytes read + written / median time; higher is better)", "",
                  f"{raw}: {kernel}.", "",
                  f"| case | opforge eager | PyTorch | {raw} | opforge / PyTorch | opforge ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in large:
            ms = results(r)["opforge"].get("median")
            lines.append(f"| {r['title']} | {cell(r, 'opforge')} | {cell(r, 'torch')} | {cell(r, 'raw')} | "
                         f"{ratio(value(r, 'opforge'), value(r, 'torch'))} | "
                         f"{num(ms * 1e3) if ms is not None else '—'} |")
    steps = [r for r in rows if r["id"].startswith("mlp ")]
    if steps:
        lines += ["", "## 3. MLP 784-512-512-10 SGD step (ms per step; cross_entropy, lr 0.01)", "",
                  "| batch | opforge eager | opforge compiled | PyTorch eager | PyTorch GEMMs alone | "
                  "PyTorch / compiled | compiled / GEMMs | PyTorch / opforge eager |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in steps:
            lines.append(f"| {r['batch']} | {cell(r, 'opforge')} | {cell(r, 'opforge.compiled')} | "
                         f"{cell(r, 'torch')} | {cell(r, 'gemms')} | "
                         f"{ratio(value(r, 'torch'), value(r, 'opforge.compiled'))} | "
                         f"{ratio(value(r, 'opforge.compiled'), value(r, 'gemms'))} | "
                         f"{ratio(value(r, 'torch'), value(r, 'opforge'))} |")
        lines += ["", "## 4. First call of the step (s; the compiled one traces, plans and compiles; CuPy compiles "
                  "its kernels on first use unless its disk cache has them)", "",
                  "| batch | opforge compiled | opforge eager | PyTorch eager |", "|---:|---:|---:|---:|"]
        for r in steps:
            first = {k: v.get("first_call") for k, v in results(r).items()}
            lines.append(f"| {r['batch']} | " + " | ".join(f"{first[k]:.3f}" if first.get(k) is not None else "—"
                                                           for k in ("opforge.compiled", "opforge", "torch")) + " |")
    if report["failures"]:
        lines += ["", "## Failures", ""]
        for f in report["failures"]:
            lines.append(f"- **{f['row']} / {name_of(f['impl'], backend)}**: {f['error']}")
        lines += ["", "Tracebacks are in gpu.json (`failures`) and were printed."]
    return "\n".join(lines) + "\n"


def versions(backend: Backend) -> dict:
    out = {"numpy": np.__version__}
    for name in ("torch", "cupy", "opforge"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", "?")
    torch = sys.modules.get("torch")
    if backend.device == "cuda" and torch is not None and torch.version.cuda:
        out["torch CUDA"] = torch.version.cuda
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            v = cupy.cuda.runtime.runtimeGetVersion()
            out["CuPy's CUDA runtime"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception:  # no driver: leave it out
            pass
    return out


def report_of(rows: list, backend: Backend, args, device_name: str) -> dict:
    def impl_json(impl):
        return {k: v for k, v in impl.result.items() if k != "traceback"}

    return {"meta": {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                     "device": backend.device, "device_name": device_name,
                     "commit": args.commit or git_commit(), "python": platform.python_version(),
                     "versions": versions(backend), "quick": args.quick, "small": args.small,
                     "repeats": args.repeats, "min_time": args.min_time, "max_seconds": args.max_seconds,
                     "command": "python bench/gpu.py " + " ".join(args.argv)},
            "targets": targets(rows), "failures": failures(rows),
            "rows": [{"id": r["id"], "title": r["title"], "unit": r["unit"],
                      **({"bytes": r["bytes"]} if "bytes" in r else {}),
                      "results": {impl.name: impl_json(impl) for impl in r["impls"]},
                      "values": {impl.name: value(r, impl.name) for impl in r["impls"]}} for r in rows]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for gpu.md and gpu.json")
    parser.add_argument("--device", choices=("cuda", "cpu", "strict"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repeats (5 × 10 ms)")
    parser.add_argument("--small", action="store_true", help="smaller sizes: a smoke test (the numbers mean nothing)")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--repeats", type=int, help="timed repeats per implementation (default 15; --quick 5)")
    parser.add_argument("--min-time", type=float, help="seconds per repeat, at least (default 0.04; --quick 0.01)")
    parser.add_argument("--max-seconds", type=float, help="timed seconds per implementation after which it stops at 3 "
                        "repeats (default 3; --quick 1)")
    parser.add_argument("--commit", help="the commit to report where the tree has no .git (default: git's HEAD)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv
    args.repeats = args.repeats or (5 if args.quick else 15)
    args.min_time = args.min_time or (0.01 if args.quick else 0.04)
    args.max_seconds = args.max_seconds or (1.0 if args.quick else 3.0)
    sizes = SIZES["small" if args.small else "full"]
    backend = Backend(args.device)
    if args.device != "cuda":  # on the CPU every framework gets the thread count PyTorch gets (1 unless BENCH_THREADS);
        limit_pools(threads())  # on a GPU machine the host's BLAS only makes the references: all its threads
    start = time.perf_counter()
    try:
        device_name = backend.device_name()
    except Exception as exc:  # named in the report; the rows say what fails
        device_name = f"unknown ({type(exc).__name__}: {exc})"
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list = []
    report: dict = {}
    for name in args.rows:
        try:
            built = BUILDERS[name](backend, sizes)
        except Exception as exc:  # a row whose inputs could not be made
            built = [{"id": name, "title": f"{name} (setting up)", "unit": "ms",
                      "impls": [Impl("setup", None, None, {"error": f"{type(exc).__name__}: {exc}",
                                                           "traceback": traceback.format_exc()})]}]
        for row in built:
            if row["impls"][0].name != "setup":
                measure(row["impls"], backend, args)
            for impl in row["impls"]:  # their inputs and references: up to a GB for leaky_relu's row
                impl.build = impl.check = None
            rows.append(row)
            backend.release()
            summary = ", ".join(f"{name_of(i.name, backend)} " + ("FAILED" if "error" in i.result else
                                                                   f"{value(row, i.name):.4g} {row['unit']}")
                                for i in row["impls"])
            print(f"[{time.perf_counter() - start:6.1f} s] {row['title']}: {summary}", flush=True)
            report = report_of(rows, backend, args, device_name)
            write(args.out / "gpu.json", json.dumps(report, indent=1, ensure_ascii=False))
            write(args.out / "gpu.md", markdown(report, rows, backend))
    # the tracebacks' last lines, the tables, then a summary: a log read by its tail (tests/cuda/run_on_gpu.sh shows
    # 40 lines) ends with the targets and the failures
    for f in report["failures"]:
        if f["traceback"]:
            print(f"\n{f['row']} / {name_of(f['impl'], backend)}:\n" + "\n".join(f["traceback"].splitlines()[-12:]))
    print()
    print(markdown(report, rows, backend))
    for t in report["targets"]:
        status = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        print(f"TARGET {t['target']}: {t['measured']} -> {status}")
    for f in report["failures"]:
        print(f"FAILED {f['row']} / {name_of(f['impl'], backend)}: {f['error']}"[:300])
    print(f"{time.perf_counter() - start:.1f} s in all; {len(report['failures'])} failure(s)")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
