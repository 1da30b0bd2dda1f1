"""One benchmark worker: runs one case group for one framework in this fresh process and writes JSON.

    python bench/harness.py GROUP FRAMEWORK --out FILE [--quick] [--repeats N] [--profile FILE] [--core N]

``bench/run.py`` starts one per (group, framework), with the thread-count variables set (NPROC=1 among them) and, unless
told otherwise, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset. With --core the process pins itself to that one core before
it imports anything: jaxlib 0.10 ignores XLA's thread flags and sizes its pools from the cores it may run on, so only
the affinity keeps jax.jit to one thread (unpinned it ran at 1.3–1.9 CPU/wall, and its small calls jumped between 12 and
70 µs as the scheduler moved them). Nothing heavy is imported before the group's module, so the memory group can read
the peak RSS of a bare interpreter, then of the framework's import alone.

Timing: every variant is called once for its check values (on fresh state; that first call's wall time, compiling
included for jax.jit, torch.compile and opforge compiled, is reported as ``first_call``), warmed up (first calls
compile, fill caches, start pools), and given a number of calls per repeat that takes at least --min-time seconds; then
the repeats go round-robin over the variants, so a slow spell of the shared machine hits them all alike. Each repeat's
process CPU time is kept too (``cpu``): pinned to one core, it counts what the process itself ran, which other work on
that core cannot inflate as it inflates wall time. The garbage collector stays on, as in a real training loop.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import time
import traceback


def time_variants(variants, repeats: int, quick: bool, min_time: float, profiler=None) -> dict:
    """name -> {"samples": seconds per call / per, "number": calls per repeat}."""
    numbers = {}
    for v in variants:
        v.fn()
        if quick:
            numbers[v.name] = 1
            continue
        calls, start = 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - start < max(0.2, min_time):
            v.fn()
            calls += 1
        per_call = (time.perf_counter() - start) / calls
        numbers[v.name] = max(1, round(min_time / per_call))
    samples = {v.name: [] for v in variants}
    cpu = {v.name: [] for v in variants}  # the process's CPU time per call: what other work on the core cannot inflate
    if profiler is not None:
        profiler.start()
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    for _ in range(repeats):
        for v in variants:
            fn, number = v.fn, numbers[v.name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(number):
                fn()
            samples[v.name].append((time.perf_counter() - start) / number / v.per)
            cpu[v.name].append((time.process_time() - start_cpu) / number / v.per)
    cpu_per_wall = (cpu_seconds() - cpu0) / max(time.perf_counter() - wall0, 1e-9)
    if profiler is not None:
        profiler.stop()
    return {v.name: {"samples": samples[v.name], "cpu": cpu[v.name], "number": numbers[v.name], "per": v.per}
            for v in variants}, cpu_per_wall


def cpu_seconds() -> float:
    """User + system CPU time of this process, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def blas_info() -> list:
    """threadpoolctl's view of the native thread pools loaded in this process (BLAS kernel, thread count)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "prefix", "version", "num_threads", "architecture", "threading_layer")
    pools = [{k: d.get(k) for k in keep} for d in threadpool_info()]
    torch = sys.modules.get("torch")
    if torch is not None:  # its MKL is linked in statically: threadpoolctl does not see it
        blas = "MKL" if torch.backends.mkl.is_available() else "own BLAS"
        pools.append({"user_api": "blas", "internal_api": f"torch ({blas}, oneDNN)",
                      "num_threads": torch.get_num_threads()})
    if "jax" in sys.modules:
        pools.append({"user_api": "blas", "internal_api": "XLA's own CPU kernels", "num_threads": None})
    gemm = sys.modules.get("opforge.program.gemm")
    if gemm is not None and gemm.blas.cache_info().currsize:  # a compiled program ran GEMMs: in which library
        chosen = gemm.blas()
        pools.append({"user_api": "blas", "internal_api": f"compiled GEMMs: {chosen.name} ({chosen.why})",
                      "num_threads": 1 if chosen.name == "mkl" else None})
    return pools


def limit_pools(threads: int) -> None:
    """Belt and braces next to the environment variables: cap every pool threadpoolctl finds."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(threads)


def versions() -> dict:
    out = {}
    for name in ("numpy", "opforge", "torch", "jax", "jaxlib"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", "?")
    return out


def run(args) -> dict:
    from cases import GROUPS

    module = importlib.import_module(f"cases.{GROUPS[args.group]}")
    result = {"group": args.group, "framework": args.framework}
    if hasattr(module, "measure"):  # memory: no timing
        result["measure"] = module.measure(args.framework, args.quick)
    else:
        variants = module.variants(args.framework, args.quick)
        limit_pools(int(os.environ.get("BENCH_THREADS", "1")))
        result["checks"], result["first_call"] = {}, {}
        for v in variants:
            if v.check is not None:
                start = time.perf_counter()
                result["checks"][v.name] = v.check()
                result["first_call"][v.name] = time.perf_counter() - start
        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005)
        # cpu_per_wall ≈ 1 when one thread does the work; below 1 when the machine was busy elsewhere
        result["variants"], result["cpu_per_wall"] = time_variants(variants, args.repeats, args.quick,
                                                                   args.min_time, profiler)
        if profiler is not None:
            with open(args.profile, "w") as f:
                f.write(profiler.output_text(unicode=True, color=False, show_all=False))
    result["blas"] = blas_info()
    result["cores"] = sorted(os.sched_getaffinity(0))
    result["versions"] = versions()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("group")
    parser.add_argument("framework")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="one call per variant: a smoke test")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per repeat, at least")
    parser.add_argument("--profile", help="write a pyinstrument profile of the timed repeats to this file")
    parser.add_argument("--core", type=int, help="pin this process to this one core before importing anything")
    args = parser.parse_args(argv)
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    if args.quick:
        args.repeats = 1
    try:
        result = run(args)
        status = 0
    except Exception as exc:
        result = {"group": args.group, "framework": args.framework,
                  "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        status = 1
    with open(args.out, "w") as f:
        json.dump(result, f)
    return status


if __name__ == "__main__":
    sys.exit(main())
