"""conv2d, max_pool2d, softmax and cross_entropy, forward + backward: opforge (eager) vs PyTorch and plain NumPy,
in one run.

    python bench/conv_softmax.py              # 7 rounds (median reported), about a minute
    python bench/conv_softmax.py --quick      # one short round: a smoke test, numbers mean little
    python bench/conv_softmax.py --threads 1  # torch threads (default: what NumPy's BLAS uses, see below)

Each case computes the forward pass and the gradients of every float input for a fixed output gradient, in
float32. The NumPy column is a hand-written im2col convolution (and the textbook softmax / cross-entropy
formulas): what one would write without a framework. PyTorch gets as many threads as NumPy's BLAS may use
(OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, else the CPU count) unless --threads says otherwise.

softmax and cross_entropy are timed only if those ops are registered when the bench runs.

The machine is shared and noisy, so every round times every case once, interleaved, and the table reports the
median over rounds (with min and max); ratios are computed within the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import opforge as of
from opforge import ops as F

try:
    import torch
except ImportError:  # the bench extras are not installed: report opforge and NumPy only
    torch = None

# -- plain NumPy -----------------------------------------------------------------------------------------------------


def numpy_conv2d_fwd_bwd(x, w, b, dy, padding):
    """im2col convolution (stride 1, no groups) and its gradients dx, dw, db."""
    p = padding
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    o, c, kh, kw = w.shape
    n, _, oh, ow = dy.shape
    cols = sliding_window_view(xp, (kh, kw), axis=(2, 3))  # (N, C, OH, OW, kH, kW), a view
    cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * kh * kw)  # the im2col copy
    w2 = w.reshape(o, -1)
    y = (cols @ w2.T).reshape(n, oh, ow, o).transpose(0, 3, 1, 2) + b.reshape(-1, 1, 1)
    d2 = dy.transpose(0, 2, 3, 1).reshape(-1, o)
    dw = (d2.T @ cols).reshape(w.shape)
    db = dy.sum(axis=(0, 2, 3))
    dcols = (d2 @ w2).reshape(n, oh, ow, c, kh, kw)
    dxp = np.zeros_like(xp)
    for i in range(kh):  # col2im: each tap adds its share back
        for j in range(kw):
            dxp[:, :, i:i + oh, j:j + ow] += dcols[..., i, j].transpose(0, 3, 1, 2)
    return y, dxp[:, :, p:p + x.shape[2], p:p + x.shape[3]], dw, db


def numpy_max_pool2d_fwd_bwd(x, dy, k):
    """k×k max pooling, stride k (H and W multiples of k), and its gradient: each window's argmax takes dy."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // k, k, w // k, k).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // k, w // k, k * k)
    idx = win.argmax(axis=-1)[..., None]
    y = np.take_along_axis(win, idx, axis=-1)[..., 0]
    dwin = np.zeros(win.shape, x.dtype)
    np.put_along_axis(dwin, idx, dy[..., None], axis=-1)
    return y, dwin.reshape(n, c, h // k, w // k, k, k).transpose(0, 1, 2, 4, 3, 5).reshape(x.shape)


def numpy_softmax_fwd_bwd(x, dy):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    y = e / e.sum(axis=-1, keepdims=True)
    return y, y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def numpy_cross_entropy_fwd_bwd(logits, target):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    n = logits.shape[0]
    loss = -logp[np.arange(n), target].mean()
    g = np.exp(logp)
    g[np.arange(n), target] -= 1
    return loss, g / np.float32(n)


# -- the cases -------------------------------------------------------------------------------------------------------


def conv_case(rng, n, c, o, hw, k, padding) -> dict:
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    out = hw + 2 * padding - k + 1
    dy = rng.standard_normal((n, o, out, out)).astype(np.float32)
    ox, ow_, ob = (of.tensor(a, requires_grad=True) for a in (x, w, b))
    ody = of.tensor(dy)

    def opforge_run():
        y = F.conv2d(ox, ow_, ob, padding=padding)
        return of.grad(y, [ox, ow_, ob], grad_outputs=ody)

    fns = {"numpy": lambda: numpy_conv2d_fwd_bwd(x, w, b, dy, padding), "opforge": opforge_run}
    if torch is not None:
        tx, tw, tb = (torch.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
        tdy = torch.from_numpy(dy)

        def torch_run():
            y = torch.nn.functional.conv2d(tx, tw, tb, padding=padding)
            return torch.autograd.grad(y, [tx, tw, tb], tdy)

        fns["torch"] = torch_run
    return fns


def max_pool_case(rng, n, c, hw, k) -> dict:
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    dy = rng.standard_normal((n, c, hw // k, hw // k)).astype(np.float32)
    ox, ody = of.tensor(x, requires_grad=True), of.tensor(dy)
    fns = {"numpy": lambda: numpy_max_pool2d_fwd_bwd(x, dy, k),
           "opforge": lambda: of.grad(F.max_pool2d(ox, kernel_size=k), [ox], grad_outputs=ody)}
    if torch is not None:
        tx, tdy = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(dy)
        fns["torch"] = lambda: torch.autograd.grad(torch.nn.functional.max_pool2d(tx, k), [tx], tdy)
    return fns


def softmax_case(rng, n, classes) -> dict:
    x = rng.standard_normal((n, classes)).astype(np.float32)
    dy = rng.standard_normal((n, classes)).astype(np.float32)
    ox, ody = of.tensor(x, requires_grad=True), of.tensor(dy)
    fns = {"numpy": lambda: numpy_softmax_fwd_bwd(x, dy),
           "opforge": lambda: of.grad(F.softmax(ox, axis=-1), [ox], grad_outputs=ody)}
    if torch is not None:
        tx, tdy = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(dy)
        fns["torch"] = lambda: torch.autograd.grad(torch.softmax(tx, dim=-1), [tx], tdy)
    return fns


def cross_entropy_case(rng, n, classes) -> dict:
    logits = rng.standard_normal((n, classes)).astype(np.float32)
    target = rng.integers(0, classes, n)
    ol, ot = of.tensor(logits, requires_grad=True), of.tensor(target)
    fns = {"numpy": lambda: numpy_cross_entropy_fwd_bwd(logits, target),
           "opforge": lambda: of.grad(F.cross_entropy(ol, ot), [ol])}
    if torch is not None:
        tl, tt = torch.from_numpy(logits.copy()).requires_grad_(), torch.from_numpy(target)
        fns["torch"] = lambda: torch.autograd.grad(torch.nn.functional.cross_entropy(tl, tt), [tl])
    return fns


def cases() -> tuple[dict, list]:
    """name -> {framework: zero-argument callable doing forward + backward}, and notes on skipped cases."""
    rng = np.random.default_rng(0)
    table = {
        "conv2d 32×3×32×32 → 16, 3×3": conv_case(rng, 32, 3, 16, 32, 3, 0),
        "conv2d 128×1×8×8 → 16, 3×3, pad 1 (digits)": conv_case(rng, 128, 1, 16, 8, 3, 1),
        "conv2d 128×16×4×4 → 32, 3×3, pad 1 (digits, 2nd)": conv_case(rng, 128, 16, 32, 4, 3, 1),
        "conv2d 16×32×16×16 → 32, 3×3, pad 1": conv_case(rng, 16, 32, 32, 16, 3, 1),
        "max_pool2d 128×16×8×8, 2×2 (digits)": max_pool_case(rng, 128, 16, 8, 2),
    }
    notes = []
    if hasattr(F, "softmax"):
        table["softmax 128×10"] = softmax_case(rng, 128, 10)
        table["softmax 64×1000"] = softmax_case(rng, 64, 1000)
    else:
        notes.append("softmax skipped: opforge.ops.softmax is not registered")
    if hasattr(F, "cross_entropy"):
        table["cross_entropy 128×10"] = cross_entropy_case(rng, 128, 10)
        table["cross_entropy 64×1000"] = cross_entropy_case(rng, 64, 1000)
    else:
        notes.append("cross_entropy skipped: opforge.ops.cross_entropy is not registered")
    return table, notes


def _arrays(result) -> list:
    """A case's result (a tuple of opforge/torch tensors or arrays) as NumPy arrays."""
    items = result if isinstance(result, (tuple, list)) else [result]
    return [np.asarray(t.detach() if hasattr(t, "detach") else t.numpy() if hasattr(t, "numpy") else t)
            for t in items]


def check_agreement(table: dict) -> None:
    """Every framework computes the same numbers (float32 tolerance), so the timings compare like with like.
    The NumPy functions return the forward value first, then the gradients; the frameworks the gradients."""
    for case, fns in table.items():
        want = _arrays(fns["numpy"]())[1:]
        for fw, fn in fns.items():
            got = _arrays(fn())[-len(want):]
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4, err_msg=f"{case}: {fw}")


# -- timing and the report -------------------------------------------------------------------------------------------


def per_call_us(fn, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def measure(table: dict, rounds: int, number: int) -> dict:
    samples = {(case, fw): [] for case, fns in table.items() for fw in fns}
    for fns in table.values():  # warm-up: dispatch caches, lazy imports, BLAS thread pools
        for fn in fns.values():
            per_call_us(fn, max(1, number // 4))
    for _ in range(rounds):
        for case, fns in table.items():
            for fw, fn in fns.items():
                samples[(case, fw)].append(per_call_us(fn, number))
    return {key: (statistics.median(v), min(v), max(v)) for key, v in samples.items()}


def report(results: dict, rounds: int, number: int, notes: list, threads: str) -> str:
    frameworks = ["numpy", "torch", "opforge"] if torch is not None else ["numpy", "opforge"]
    head = "| case (float32, forward + backward) | " + " | ".join(f"{fw} µs (min–max)" for fw in frameworks)
    head += " | opforge / torch | opforge / numpy |" if torch is not None else " | opforge / numpy |"
    lines = [f"median of {rounds} round(s) of {number} calls each, per call; {threads}", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for case in dict.fromkeys(c for c, _ in results):
        cells = [f"{results[(case, fw)][0]:.0f} ({results[(case, fw)][1]:.0f}–{results[(case, fw)][2]:.0f})"
                 for fw in frameworks]
        ours = results[(case, "opforge")][0]
        ratios = [f"{ours / results[(case, 'torch')][0]:.2f}×"] if torch is not None else []
        ratios.append(f"{ours / results[(case, 'numpy')][0]:.2f}×")
        lines.append(f"| {case} | " + " | ".join(cells + ratios) + " |")
    lines += [f"\n{note}" for note in notes]
    return "\n".join(lines)


def blas_threads() -> int:
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return os.cpu_count() or 1


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short round (smoke test)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=100, help="calls per case per round")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: BLAS threads)")
    args = parser.parse_args(argv)
    rounds, number = (1, 3) if args.quick else (args.rounds, args.number)
    threads = f"NumPy BLAS threads: {blas_threads()} (OPENBLAS_NUM_THREADS/OMP_NUM_THREADS or CPU count)"
    if torch is not None:
        torch.set_num_threads(args.threads or blas_threads())
        threads = f"torch.set_num_threads({torch.get_num_threads()}); " + threads
    table, notes = cases()
    check_agreement(table)
    print(report(measure(table, rounds, number), rounds, number, notes, threads))


if __name__ == "__main__":
    main()
