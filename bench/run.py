"""The benchmark suite: opforge against PyTorch, JAX and hand-written NumPy, each case in a fresh process per framework.

    python bench/run.py                          # every group, 2 rounds × 7 repeats: about ten minutes
    python bench/run.py --quick                  # every case once: a smoke test, the numbers mean nothing
    python bench/run.py --cases mlp hvp          # some groups only (names below)
    python bench/run.py --frameworks opforge torch
    python bench/run.py --profile mlp:opforge    # pyinstrument profile of that worker's timed repeats, printed

Groups: per_op, chain, mlp, cnn, hvp, memory (issue 6's cases 1–6), conv_softmax (bench/conv_softmax.py's
cases), fusion and workspace (issue 12's compiled programs: a fused 10-op expression, the executor's workspace),
transformer (issue 28: a small nn.TransformerEncoder step, and attention fused or composed of ops), rnn (issue 28's
LSTM and GRU, forward and backward).
Frameworks: numpy (by hand), floor (the MLP's matmuls alone), opforge, opforge.compiled, torch, torch.compile, jax,
jax.jit; one whose packages are not installed is skipped and said so.

Writes ``latest.json`` (every sample, check values, thread pools and BLAS kernels per worker), ``latest.md`` (also
printed) and ``latest.png`` (bar chart) to bench/results/ (--out DIR elsewhere). Exits 1 if a worker failed or two
frameworks disagree on a check value (the same loss, gradient norm, ...: the timings compare like with like).

Fairness on this shared 2-core machine: every framework runs with 1 thread (--threads): OMP/OpenBLAS/MKL variables,
NPROC, torch.set_num_threads and XLA's flags are set for each worker, threadpoolctl caps what it finds, and each
worker pins itself to one core (the last this process may use; --core picks another): jaxlib 0.10 ignores XLA's
thread flags and sizes its pools from the cores it may run on. The workers also
run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (both together; --keep-blas-env keeps them): the machine may set
them for old OpenBLAS builds, and they slow current NumPy. Each worker reports the BLAS kernel it ran (threadpoolctl)
and its CPU time over wall time (≈ 1: one busy thread; well below 1: the machine was busy elsewhere).
Ratios are taken between medians measured in the same run: absolute times drift by 20–50% between runs here, and
other work on the machine comes and goes within a run, so by default each framework's worker runs twice, in turn with
the others (--rounds; every other round in reverse order), and the repeats of both are pooled.
"""

from __future__ import annotations

import argparse
import compileall
import datetime
import importlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cases import ALL_FRAMEWORKS, FRAMEWORK_NAMES, GROUPS, PACKAGES  # noqa: E402
from cases.fusion import CASES as FUSION_CASES  # noqa: E402

REF_NAMES = {"numpy": "NumPy", "floor": "floor", "torch": "PyTorch", "torch.compile": "torch.compile",
             "jax.jit": "jax.jit"}
COMPILERS = ("opforge.compiled", "torch.compile", "jax.jit")  # their first call compiles
CHECK_RTOL = 1e-3  # float32 values from different kernels and summation orders
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# -- running the workers ---------------------------------------------------------------------------------------------


def worker_env(threads: int, keep_blas_env: bool) -> dict:
    env = dict(os.environ)
    for name in THREAD_VARS:
        env[name] = str(threads)
    env["BENCH_THREADS"] = str(threads)
    env["JAX_PLATFORMS"] = "cpu"
    if threads == 1:
        env["NPROC"] = "1"
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    if not keep_blas_env:
        for name in BLAS_ENV:
            env.pop(name, None)
    return env


def installed(framework: str) -> bool:
    return all(importlib.util.find_spec(p) is not None for p in PACKAGES[framework])


def run_worker(group: str, framework: str, args, env: dict, profile: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(HERE / "harness.py"), group, framework, "--out", str(out),
               "--repeats", str(args.repeats), "--min-time", str(args.min_time)]
        cmd += ["--quick"] if args.quick else []
        cmd += ["--profile", profile] if profile else []
        cmd += ["--core", str(args.core)] if args.threads == 1 else []
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout} s"}
        seconds = time.perf_counter() - start
        if not out.exists():
            return {"error": f"worker exited {proc.returncode} without a result", "stderr": proc.stderr[-4000:],
                    "seconds": seconds}
        result = json.loads(out.read_text())
    result["seconds"] = seconds
    if proc.returncode != 0 and "error" not in result:
        result["error"] = f"worker exited {proc.returncode}"
    if "error" in result:
        result["stderr"] = proc.stderr[-4000:]
    return result


def merge(first: dict, later: dict) -> dict:
    """Pool a later round's samples into the first round's result (checks and memory come from the first)."""
    if "error" in later:
        return later
    out = dict(first)
    for name, v in later.get("variants", {}).items():
        out["variants"][name] = v | {key: first["variants"][name].get(key, []) + v.get(key, [])
                                     for key in ("samples", "cpu")}
    out["seconds"] = first["seconds"] + later["seconds"]
    for name, seconds in later.get("first_call", {}).items():  # a later round may find caches warm: the first
        out.setdefault("first_call_later", {})[name] = seconds  # round's first call is the cold one
    if "cpu_per_wall" in later:
        out["cpu_per_wall"] = (first["cpu_per_wall"] + later["cpu_per_wall"]) / 2
    return out


# -- assembling the results ------------------------------------------------------------------------------------------


def stats(samples: list) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "samples": samples}


def assemble(group: str, module, workers: dict) -> dict:
    """One group's results: cases × frameworks, with ratios to the references and the check values."""
    cases: dict = {}
    # report order: the order of the framework with the most variants (the ones with a tape have them all)
    listed = [list(w.get("variants", w.get("measure", {}).get("cases", {}))) for w in workers.values()]
    for name in max(listed, key=len, default=[]):
        cases[name] = {"results": {}, "checks": {}}
    for fw in module.FRAMEWORKS:
        w = workers.get(fw, {})
        if "measure" in w:  # memory
            for name, value in w["measure"]["cases"].items():
                cases.setdefault(name, {"results": {}, "checks": {}})["results"][fw] = stats([value])
            for name in w["measure"]["cases"]:
                cases[name]["checks"][fw] = w["measure"]["checks"]
        for name, v in w.get("variants", {}).items():
            entry = cases.setdefault(name, {"results": {}, "checks": {}})
            entry["results"][fw] = stats(v["samples"]) | {"number": v["number"], "per": v["per"]}
            if v.get("cpu"):
                entry["results"][fw]["cpu_median"] = statistics.median(v["cpu"])
        for name, check in w.get("checks", {}).items():
            cases.setdefault(name, {"results": {}, "checks": {}})["checks"][fw] = check
    out = []
    for name, entry in cases.items():
        res = entry["results"]
        ratios = {fw: {ref: r["median"] / res[ref]["median"] for ref in module.REFERENCES
                       if ref in res and ref != fw and res[ref]["median"] > 0}
                  for fw, r in res.items()}
        out.append({"name": name, "results": res, "ratios": ratios, "checks": entry["checks"]})
    summary = {}
    for fw, w in workers.items():
        summary[fw] = {k: w[k] for k in ("status", "error", "stderr", "traceback", "seconds", "cpu_per_wall",
                                         "blas", "versions", "cores", "first_call", "first_call_later") if k in w}
        if "measure" in w:
            summary[fw]["bare interpreter"] = w["measure"]["bare interpreter"]
    return {"id": group, "title": module.TITLE, "unit": module.UNIT, "references": list(module.REFERENCES),
            "frameworks": [fw for fw in module.FRAMEWORKS if {"variants", "measure"} & set(workers.get(fw, {}))],
            "workers": summary, "cases": out}


def disagreements(groups: list) -> list:
    """Check values that differ between frameworks: the first framework with checks is the reference."""
    problems = []
    for g in groups:
        for case in g["cases"]:
            checks = case["checks"]
            if not checks:
                continue
            ref_fw = next(iter(checks))
            for fw, values in checks.items():
                for label, want in checks[ref_fw].items():
                    got = values.get(label)
                    if got is None or not math.isfinite(got) or abs(got - want) > CHECK_RTOL * max(abs(want), 1e-6):
                        problems.append(f"{g['id']} / {case['name']}: {FRAMEWORK_NAMES[fw]} gives {label} = {got}, "
                                        f"{FRAMEWORK_NAMES[ref_fw]} {want}")
    return problems


def find(groups: list, group: str, case: str, fw: str, ref: str | None = None, stat: str = "median"):
    """A median (or, with ref, the ratio of medians; stat="min": of minima, "cpu_median": of CPU-time medians) from
    the results, or None."""
    for g in groups:
        if g["id"] != group:
            continue
        for c in g["cases"]:
            res = c["results"]
            if c["name"] == case and fw in res:
                if ref is None:
                    return res[fw][stat]
                if stat == "median":
                    return c["ratios"][fw].get(ref)
                if ref not in res or stat not in res[fw] or not res[ref].get(stat):
                    return None
                return res[fw][stat] / res[ref][stat]
    return None


def targets(groups: list) -> list:
    """The issues' targets: what was measured against each, and whether it is met."""
    out = []

    def target(text, parts, limit, note=""):
        """parts: (label, ratio of medians, ratio of minima[, ratio of CPU-time medians]); met or not by the medians,
        as the table gives."""
        parts = [(*p, None)[:4] for p in parts]
        values = [v for _, v, _, _ in parts if v is not None]

        def brackets(m, c):
            inner = ", ".join(t for t in (f"min {m:.2f}×" if m is not None else "",
                                          f"CPU {c:.2f}×" if c is not None else "") if t)
            return f" ({inner})" if inner else ""

        measured = ", ".join(f"{label} {v:.2f}×" + brackets(m, c)
                             for label, v, m, c in parts if v is not None) or "not measured"
        met = None if len(values) < len(parts) or not values else max(values) <= limit
        out.append({"target": text, "limit": limit, "measured": measured + note, "met": met,
                    "values": {label: v for label, v, _, _ in parts},
                    "min_values": {label: m for label, _, m, _ in parts},
                    "cpu_values": {label: c for label, _, _, c in parts}})

    def both(group, case, fw, ref):
        return find(groups, group, case, fw, ref), find(groups, group, case, fw, ref, stat="min")

    def three(group, case, fw, ref):
        return (*both(group, case, fw, ref), find(groups, group, case, fw, ref, stat="cpu_median"))

    small = []
    small_ops = ("add", "mul by scalar", "relu", "leaky_relu")
    for op in small_ops:
        for suffix, label in (("", op), (", recording", f"{op} (rec.)")):
            small.append((label, *both("per_op", f"{op}, 16{suffix}", "opforge", "torch")))
    torch_us = [find(groups, "per_op", f"{op}, 16", "torch") for op in small_ops]
    note = f" (PyTorch {statistics.median(torch_us) * 1e6:.2f} µs)" if all(torch_us) else ""
    target("Eager small-tensor op (16 elements) ≤ 1.0× PyTorch eager", small, 1.0, note)

    chain = both("chain", "forward+backward", "opforge", "torch")
    torch_op = find(groups, "chain", "forward+backward", "torch")
    note = f" (PyTorch {torch_op * 1e6:.1f} µs/op; stretch goal 0.5×)" if torch_op else " (stretch goal 0.5×)"
    target("Eager chain forward+backward ≤ 0.8× PyTorch per op", [("opforge eager", *chain)], 0.8, note)

    parts = [(name, *both("cnn", "step, batch 128", fw, "torch")) for fw, name in
             (("opforge", "eager"), ("opforge.compiled", "compiled"))]
    target("Digits CNN SGD step, batch 128 ≤ 1.0× PyTorch eager", parts, 1.0)

    parts = [(name, *both("conv_softmax", name, "opforge", "torch")) for name in
             ("softmax 128×10", "softmax 64×1000", "cross_entropy 128×10", "cross_entropy 64×1000")]
    target("softmax / cross_entropy forward+backward ≤ 1.2× PyTorch eager", parts, 1.2)

    parts = [(f"batch {b}", *both("mlp", f"step, batch {b}", "opforge.compiled", "floor")) for b in (64, 512)]
    jit = [find(groups, "mlp", f"step, batch {b}", "jax.jit", "floor") for b in (64, 512)]
    note = f" (jax.jit {jit[0]:.2f}×, {jit[1]:.2f}×)" if all(j is not None for j in jit) else ""
    target("Compiled MLP step ≤ 1.15× its own matmuls in NumPy, batch 64 and 512", parts, 1.15, note)

    parts = [(name, *both("fusion", name, "opforge.compiled", "torch")) for name in
             ("10 arithmetic ops", "gelu-tanh × gate (10 ops, 1 tanh)")]
    target("Compiled 10-op elementwise expression over 1,000,000 float32 ≤ 0.5× PyTorch eager", parts, 0.5)

    hvp = both("hvp", "H·v, batch 64", "opforge.compiled", "torch")
    target("Compiled Hessian-vector product, batch 64 ≤ 1.0× PyTorch", [("compiled", *hvp)], 1.0)

    parts = [(f"{mode} {name}", *both("rnn", f"{mode} forward+backward", fw, "torch")) for mode in ("LSTM", "GRU")
             for fw, name in (("opforge", "eager"), ("opforge.compiled", "compiled"))]
    target("LSTM and GRU 2×256, 35 steps × batch 20, forward+backward ≤ 1.2× PyTorch eager", parts, 1.2)

    # issue 32: compiled programs at least as fast as jax.jit and torch.compile, each case measured in this run
    issue32 = [("chain", "forward+backward", "chain fwd+bwd"), ("chain", "forward", "chain fwd"),
               *[("fusion", name, name.split(" (")[0]) for name in FUSION_CASES],
               ("mlp", "step, batch 64", "MLP 64"), ("mlp", "step, batch 512", "MLP 512"),
               ("hvp", "H·v, batch 64", "H·v"), ("cnn", "step, batch 128", "CNN")]
    for ref in ("jax.jit", "torch.compile"):
        parts = [(label, *three(group, case, "opforge.compiled", ref)) for group, case, label in issue32]
        target(f"Compiled ≤ 1.0× {REF_NAMES[ref]}: chain, expressions, MLP 64/512, H·v, CNN", parts, 1.0)

    case = "after 20 MLP steps, batch 512"
    parts = [(name, find(groups, "memory", case, fw, "numpy"), None) for fw, name in
             (("opforge", "eager"), ("opforge.compiled", "compiled"))]
    numpy_mb, torch_mb = find(groups, "memory", case, "numpy"), find(groups, "memory", case, "torch")
    note = f" (NumPy {numpy_mb / 1e6:.0f} MB" if numpy_mb else ""
    note += f", PyTorch {torch_mb / 1e6:.0f} MB)" if numpy_mb and torch_mb else (")" if numpy_mb else "")
    target("Peak memory after 20 batch-512 MLP steps ≤ 1.3× the NumPy program", parts, 1.3, note)
    return out


# -- the report ------------------------------------------------------------------------------------------------------

SCALE = {"µs": 1e6, "ms": 1e3, "MB": 1e-6}


def num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def blas_line(worker: dict) -> str:
    pools = [p for p in worker.get("blas", []) if p.get("user_api") == "blas"]
    parts = []
    for p in pools:
        name = p.get("prefix") or p["internal_api"]  # NumPy's libscipy_openblas, SciPy's libscipy_openblas32
        text = " ".join(str(v) for v in (name, p.get("version"), p.get("architecture")) if v)
        parts.append(text + (f", {p['num_threads']} thread(s)" if p.get("num_threads") else ""))
    return "; ".join(parts) or "—"


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = ["# opforge benchmarks", ""]
    rounds = ("one round" if meta["rounds"] == 1 else
              f"{meta['rounds']} rounds, the frameworks in turn, samples pooled")
    if meta["quick"]:
        lines += ["**--quick run: every case once, no warm-up to speak of. The numbers mean nothing.**", ""]
    lines += [f"{meta['date']} · commit {meta['commit']} · {meta['cpu']} ({meta['cores']} cores, shared) · "
              f"Python {meta['python']} · " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), "",
              f"Each case runs in a fresh process per framework ({rounds}): warm-up, then {meta['repeats']} repeats "
              f"of at least {meta['min_time']} s, round-robin over the group's variants. Tables give the median "
              f"(min–max) over all repeats; ratios divide medians measured in this same run. {meta['threads_note']} "
              f"{meta['blas_env_note']}", ""]
    lines += ["## Targets", "", "Ratios of medians decide; ratios of minima (the least disturbed repeats) and, for "
              "issue 32's, of the medians of each process's CPU time per call (which other work on its core does not "
              "inflate) in brackets.", "", "| target | measured | |", "|---|---|---|"]
    for t in report["targets"]:
        status = {True: "met", False: "**missed**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['measured']} | {status} |")
    for g in report["groups"]:
        refs = [r for r in g["references"] if r in g["frameworks"]]
        unit = g["unit"] + (" per op" if g["id"] == "chain" else "")
        lines += ["", f"## {g['title']}", "",
                  f"| case | framework | {unit} | min–max | CPU | " + " | ".join(f"× {REF_NAMES[r]}" for r in refs)
                  + " |", "|---|---|---:|---:|---:|" + "---:|" * len(refs)]
        for case in g["cases"]:
            for fw in g["frameworks"]:
                r = case["results"].get(fw)
                if r is None:
                    continue
                s = SCALE[g["unit"]]
                ratios = [f"{case['ratios'][fw][ref]:.2f}×" if ref in case["ratios"][fw] else "" for ref in refs]
                spread = f"{num(r['min'] * s)}–{num(r['max'] * s)}" if len(r["samples"]) > 1 else ""
                cpu = num(r["cpu_median"] * s) if r.get("cpu_median") else ""
                lines.append(f"| {case['name']} | {FRAMEWORK_NAMES[fw]} | {num(r['median'] * s)} | {spread} | {cpu} | "
                             + " | ".join(ratios) + " |")
        if g["id"] == "memory":
            bare = [w.get("bare interpreter") for w in g["workers"].values() if w.get("bare interpreter")]
            if bare:
                lines += ["", f"A bare interpreter (with the worker's standard-library imports) peaks at "
                              f"{statistics.median(bare) / 1e6:.0f} MB."]
    first = [(g["id"], name, fw, seconds, w.get("first_call_later", {}).get(name))
             for g in report["groups"] for fw, w in g["workers"].items() if fw in COMPILERS
             for name, seconds in w.get("first_call", {}).items()]
    if first:
        lines += ["", "## First call (compiling)", "",
                  "The first call of each variant in a fresh process, compiling included: the first round's (caches "
                  "on disk as the previous runs left them), then the second round's (caches as the first left them).",
                  "", "| group | case | framework | first call, s | second round, s |", "|---|---|---|---:|---:|"]
        for group, name, fw, seconds, later in first:
            again = f"{later:.3f}" if later is not None else ""
            lines.append(f"| {group} | {name} | {FRAMEWORK_NAMES[fw]} | {seconds:.3f} | {again} |")
    lines += ["", "## Workers", "", "| group | framework | status | s | CPU/wall | cores | BLAS (threadpoolctl) |",
              "|---|---|---|---:|---:|---|---|"]
    for g in report["groups"]:
        for fw, w in g["workers"].items():
            status = "error" if "error" in w else w.get("status", "ok")
            cpu = f"{w['cpu_per_wall']:.2f}" if "cpu_per_wall" in w else ""
            secs = f"{w['seconds']:.1f}" if "seconds" in w else ""
            cores = ",".join(map(str, w.get("cores", [])))
            lines.append(f"| {g['id']} | {FRAMEWORK_NAMES[fw]} | {status} | {secs} | {cpu} | {cores} | "
                         f"{blas_line(w)} |")
    if report["problems"]:
        lines += ["", "## Problems", ""] + [f"- {p}" for p in report["problems"]]
    return "\n".join(lines) + "\n"


COLORS = {"floor": "#7f7f7f", "numpy": "#2ca02c", "opforge": "#1f77b4", "opforge.compiled": "#17becf",
          "torch": "#d62728", "torch.compile": "#e377c2", "jax": "#ff7f0e", "jax.jit": "#9467bd"}


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [g for g in report["groups"] if g["cases"]]
    fig, axes = plt.subplots(len(groups), 1, figsize=(14, 3.6 * max(len(groups), 1) + 0.8), squeeze=False)
    shown = {}
    for ax, g in zip(axes[:, 0], groups):
        fws = g["frameworks"]
        width = 0.8 / max(len(fws), 1)
        s = SCALE[g["unit"]]
        for i, fw in enumerate(fws):
            xs, med, lo, hi = [], [], [], []
            for j, case in enumerate(g["cases"]):
                r = case["results"].get(fw)
                if r is not None:
                    xs.append(j - 0.4 + (i + 0.5) * width)
                    med.append(r["median"] * s)
                    lo.append((r["median"] - r["min"]) * s)
                    hi.append((r["max"] - r["median"]) * s)
            shown[fw] = ax.bar(xs, med, width, yerr=[lo, hi], color=COLORS.get(fw), capsize=1.5)
        ax.set_xticks(range(len(g["cases"])))
        ax.set_xticklabels([c["name"] for c in g["cases"]], rotation=20 if len(g["cases"]) > 4 else 0,
                           ha="right" if len(g["cases"]) > 4 else "center", fontsize=8)
        if g["unit"] != "MB":
            ax.set_yscale("log")
        ax.set_ylabel(g["unit"] + (" per op" if g["id"] == "chain" else ""))
        ax.set_title(g["title"], fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    order = [fw for fw in COLORS if fw in shown]
    height = fig.get_figheight()  # inches: the title, then the legend, then the plots
    fig.suptitle("opforge vs PyTorch, JAX and NumPy: median, whiskers min–max, 1 thread each" +
                 (" (--quick: the numbers mean nothing)" if report["meta"]["quick"] else ""), y=1 - 0.1 / height,
                 va="top")
    fig.legend([shown[fw] for fw in order], [FRAMEWORK_NAMES[fw] for fw in order], loc="upper center",
               ncol=len(order), fontsize=9, bbox_to_anchor=(0.5, 1 - 0.45 / height))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.9 / height))
    tmp = path.with_suffix(".png.tmp")
    fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    os.replace(tmp, path)


# -- main ------------------------------------------------------------------------------------------------------------


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def meta(args, workers: list) -> dict:
    versions = {}
    for w in workers:
        versions |= w.get("versions", {})
    was_set = [n for n in BLAS_ENV if n in os.environ]
    if args.keep_blas_env:
        blas_note = ("OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE kept as set: " + (", ".join(f"{n}={os.environ[n]}"
                     for n in was_set) or "neither was set") + ".")
    else:
        blas_note = ("OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset in the workers (" +
                     (", ".join(f"{n}={os.environ[n]}" for n in was_set) + " here" if was_set else "neither was set")
                     + "); the BLAS kernel each ran is in the Workers table.")
    threads = (f"Every framework runs with {args.threads} thread(s) (OMP/OpenBLAS/MKL variables, "
               "torch.set_num_threads, XLA_FLAGS, threadpoolctl): equal and, on 2 shared cores, the fairest.")
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(),
            "cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "versions": {k: versions[k] for k in sorted(versions)}, "quick": args.quick, "rounds": args.rounds,
            "repeats": args.repeats,
            "min_time": args.min_time, "threads": args.threads, "threads_note": threads,
            "blas_env_unset": not args.keep_blas_env, "blas_env_note": blas_note}


def write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every case once (smoke test)")
    parser.add_argument("--cases", nargs="+", choices=list(GROUPS), default=list(GROUPS), metavar="GROUP")
    parser.add_argument("--frameworks", nargs="+", choices=[*ALL_FRAMEWORKS, "floor"], metavar="FRAMEWORK")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per variant (default 7)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="fresh processes per framework, in turn; their repeats are pooled (default 2)")
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per repeat, at least (default 0.1)")
    parser.add_argument("--threads", type=int, default=1, help="threads per framework (default 1)")
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)),
                        help="the core every worker is pinned to with --threads 1 (default: the last one allowed)")
    parser.add_argument("--keep-blas-env", action="store_true",
                        help="leave OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE as they are in the workers")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per worker")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="directory for latest.{json,md,png}")
    parser.add_argument("--profile", metavar="GROUP:FRAMEWORK", help="profile one worker with pyinstrument")
    args = parser.parse_args(argv)
    env = worker_env(args.threads, args.keep_blas_env)

    if args.quick:
        args.rounds, args.repeats = 1, 1
    if args.profile:
        group, framework = args.profile.split(":")
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "profile.txt")
            result = run_worker(group, framework, args, env, profile=path)
            if "error" in result:
                print(result["error"], result.get("traceback", ""), result.get("stderr", ""), file=sys.stderr)
                return 1
            print(Path(path).read_text())
        return 0

    # The workers import opforge from this checkout. Where PYTHONDONTWRITEBYTECODE is set (this machine sets it) no
    # bytecode gets cached, and every worker would compile the package from source, which an installed package
    # never does: 145 ms of each import here, and 3 MB of the memory group's peak RSS. Compiled once, as pip does.
    compileall.compile_dir(HERE.parent / "opforge", quiet=1)
    groups, all_workers, problems = [], [], []
    for group in args.cases:
        module = importlib.import_module(f"cases.{GROUPS[group]}")
        workers = {}
        for fw in module.FRAMEWORKS:
            if args.frameworks and fw not in args.frameworks and not (fw == "floor" and "numpy" in args.frameworks):
                continue
            if not installed(fw):
                workers[fw] = {"status": f"skipped: {' '.join(PACKAGES[fw])} not installed"}
                print(f"{group:>12} / {fw:<16} skipped (not installed)", file=sys.stderr)
        for round_ in range(args.rounds):  # each round: a fresh process per framework, in turn, every other round
            # in reverse order (a slow spell of the machine at a group's start or end does not always hit one side)
            for fw in module.FRAMEWORKS[::-1] if round_ % 2 else module.FRAMEWORKS:
                if fw not in workers and (not args.frameworks or fw in args.frameworks
                                          or (fw == "floor" and "numpy" in args.frameworks)):
                    workers[fw] = None
                if fw not in workers or (workers[fw] is not None and ("status" in workers[fw]
                                                                      or "error" in workers[fw])):
                    continue
                result = run_worker(group, fw, args, env)
                status = "error" if "error" in result else "ok"
                print(f"{group:>12} / {fw:<16} {status:<5} {result.get('seconds', 0):6.1f} s", file=sys.stderr)
                if "error" in result:
                    problems.append(f"{group} / {FRAMEWORK_NAMES[fw]}: {result['error']}")
                    print(result.get("traceback", "") or result.get("stderr", ""), file=sys.stderr)
                workers[fw] = result if workers[fw] is None else merge(workers[fw], result)
                all_workers.append(result)
        groups.append(assemble(group, module, workers))
    problems += disagreements(groups)
    report = {"meta": meta(args, all_workers), "targets": targets(groups), "groups": groups, "problems": problems}
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / "latest.json", json.dumps(report, indent=1, ensure_ascii=False))
    md = markdown(report)
    write(args.out / "latest.md", md)
    chart(report, args.out / "latest.png")
    print(md)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
