"""The copy of an (N, C, …) array into batch-last memory (C, …, N) that convolution and pooling kernels make of an
input or gradient in the usual layout (``opforge.ops._window.copy_batch_last``): one NumPy copy against copies of
8 and of 32 samples at a time, over batch sizes N and per-sample sizes M, float32.

    PYTHONPATH=. python bench/batch_last_copy.py [--rounds 5] [--repeats 20] [--core 0]

One process pinned to one core; each size times the three ways in turn, ``--rounds`` times, and the table gives
CPU-time (process_time) medians in µs, and which way ``copy_batch_last`` takes there.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import numpy as np

from opforge.ops import _window as win


def blocks(size: int):
    def copy(dst, src):
        for i in range(0, src.shape[-1], size):
            np.copyto(dst[..., i:i + size], src[..., i:i + size])
    return copy


def cpu_us(fn, repeats: int) -> float:
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--core", type=int, default=0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})
    ways = {"one copy": np.copyto, "8 at a time": blocks(8), "32 at a time": blocks(32)}
    print(f"| N × M | {' | '.join(ways)} | copy_batch_last |")
    print(f"|---|{'---:|' * len(ways)}---:|")
    rng = np.random.default_rng(0)
    for n in (16, 32, 48, 64, 128, 256):
        for m in (256, 1024, 4096, 16384):
            src = win.batch_last(rng.standard_normal((n, m // 16, 4, 4), np.float32))
            dst = np.empty(src.shape, np.float32)
            times = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, copy in ways.items():
                    step = functools.partial(copy, dst, src)
                    times[name].append(cpu_us(step, args.repeats))
            taken = "32 at a time" if n > 32 and src.size >= 256 * n else "one copy"
            cells = " | ".join(f"{statistics.median(times[name]):.0f}" for name in ways)
            print(f"| {n} × {m} | {cells} | {taken} |", flush=True)


if __name__ == "__main__":
    main()
