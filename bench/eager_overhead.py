"""Per-op cost of small eager ops: opforge vs plain NumPy and PyTorch eager, measured in the same run.

    python bench/eager_overhead.py            # 7 rounds (median reported), about half a minute
    python bench/eager_overhead.py --quick    # one short round: a smoke test, numbers mean little

The machine is shared and noisy, so every round times every case once, interleaved, and the table
reports the median over rounds (with min and max); ratios are computed within the same run.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np

import opforge as of
from opforge import ops as F

try:
    import torch
except ImportError:  # the bench extras are not installed: report opforge and NumPy only
    torch = None


def cases(n: int = 16) -> dict:
    """name -> {framework: zero-argument callable doing one op}."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x, y = of.tensor(a), of.tensor(b)
    xg = of.tensor(a, requires_grad=True)
    table = {
        "add": {"numpy": lambda: np.add(a, b), "opforge": lambda: F.add(x, y)},
        "add (requires_grad)": {"numpy": lambda: np.add(a, b), "opforge": lambda: F.add(xg, y)},
        "leaky_relu": {"numpy": lambda: np.where(a > 0, a, a * np.float32(0.01)),
                       "opforge": lambda: F.leaky_relu(x, alpha=0.01)},
        "leaky_relu (requires_grad)": {"numpy": lambda: np.where(a > 0, a, a * np.float32(0.01)),
                                       "opforge": lambda: F.leaky_relu(xg, alpha=0.01)},
    }
    if torch is not None:
        torch.set_num_threads(1)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        tg = torch.from_numpy(a.copy()).requires_grad_()
        leaky = torch.nn.functional.leaky_relu
        table["add"]["torch"] = lambda: torch.add(ta, tb)
        table["add (requires_grad)"]["torch"] = lambda: torch.add(tg, tb)
        table["leaky_relu"]["torch"] = lambda: leaky(ta, 0.01)
        table["leaky_relu (requires_grad)"]["torch"] = lambda: leaky(tg, 0.01)
    return table


def per_call_ns(fn, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e9


def measure(rounds: int, number: int) -> dict:
    table = cases()
    samples = {(case, fw): [] for case, fns in table.items() for fw in fns}
    for fns in table.values():  # warm-up: first calls fill dispatch caches and import lazily
        for fn in fns.values():
            per_call_ns(fn, 1000)
    for _ in range(rounds):
        for case, fns in table.items():
            for fw, fn in fns.items():
                samples[(case, fw)].append(per_call_ns(fn, number))
    return {key: (statistics.median(v), min(v), max(v)) for key, v in samples.items()}


def report(results: dict, rounds: int) -> str:
    frameworks = ["numpy", "torch", "opforge"] if torch is not None else ["numpy", "opforge"]
    head = "| case (16 float32) | " + " | ".join(f"{fw} ns (min–max)" for fw in frameworks)
    head += " | opforge / torch | opforge / numpy |" if torch is not None else " | opforge / numpy |"
    lines = [f"median of {rounds} rounds, per call", "", head, "|" + "---|" * (head.count("|") - 1)]
    for case in dict.fromkeys(c for c, _ in results):
        cells = [f"{results[(case, fw)][0]:.0f} ({results[(case, fw)][1]:.0f}–{results[(case, fw)][2]:.0f})"
                 for fw in frameworks]
        ours = results[(case, "opforge")][0]
        ratios = [f"{ours / results[(case, 'torch')][0]:.2f}×"] if torch is not None else []
        ratios.append(f"{ours / results[(case, 'numpy')][0]:.2f}×")
        lines.append(f"| {case} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round (smoke test)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20000, help="calls per case per round")
    args = parser.parse_args(argv)
    rounds, number = (1, 200) if args.quick else (args.rounds, args.number)
    print(report(measure(rounds, number), rounds))


if __name__ == "__main__":
    main()
