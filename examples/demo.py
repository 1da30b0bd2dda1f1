"""opforge in two minutes: define an op in a dozen lines, check it, and train a CNN with it on real data —
eagerly for one epoch, then as a compiled program — with every gradient it uses checked.

Run with ``make demo`` (or ``python examples/demo.py``). Exits non-zero if anything is off.
"""

import sys
import time
from pathlib import Path

import numpy as np
from custom_op import isru  # a new op, defined in a dozen lines next to this file
from sklearn.datasets import load_digits
from tqdm import tqdm

import opforge as of
from opforge import nn
from opforge import ops as F

OUT = Path(__file__).resolve().parents[1] / "out"
EPOCHS, BATCH, SEED = 12, 64, 0


def section(title):
    print(f"\n== {title} " + "=" * max(0, 96 - len(title)), flush=True)


class Softsign(nn.Module):
    """The new op as a layer."""

    def forward(self, x):
        return isru(x)


def make_model():
    of.manual_seed(SEED)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), Softsign(), nn.MaxPool2d(2),   # 8x8 -> 4x4
        nn.Conv2d(16, 32, 3, padding=1), Softsign(), nn.MaxPool2d(2),  # 4x4 -> 2x2
        nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
    )


def accuracy(model, x, y) -> float:
    model.eval()
    with of.no_grad():
        predicted = F.argmax(model(of.tensor(x)), axis=1).numpy()
    model.train()
    return float((predicted == y).mean())


def main() -> int:
    start = time.perf_counter()
    section("1. check_op: the conformance suite every op goes through, run on the new op isru")
    print(of.testing.check_op(isru))

    section("2. Its gradient rule is written with ops, so it differentiates again: isru''(0.5)")
    x = of.tensor(0.5, dtype="float64", requires_grad=True)
    (d1,) = of.grad(isru(x), [x], create_graph=True)
    (d2,) = of.grad(d1, [x])
    exact = -3 * 0.5 / (1 + 0.5**2) ** 2.5
    print(f"isru''(0.5) = {d2.item():+.6f}   exact -3x/(1+x^2)^(5/2) = {exact:+.6f}")

    section("3. A CNN with isru activations learns scikit-learn's handwritten digits (8x8, 10 classes)")
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(labels))
    test, train = order[:360], order[360:]
    loader = of.data.DataLoader(images[train], labels[train], batch_size=BATCH, shuffle=True, drop_last=True,
                                seed=SEED)
    model = make_model()
    opt = of.optim.Adam(model.parameters(), lr=5e-3)
    print(model)

    def train_step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # eager: autograd; compiled: backward ops appended to the program
        opt.step()       # eager: update ops, written in place; compiled: recorded, run in place
        opt.zero_grad()
        return loss

    compiled_step = of.compile(train_step)
    history = {"loss": [], "accuracy": []}
    speed = {}
    for epoch in range(EPOCHS):
        mode = "eager" if epoch == 0 else "compiled"
        step = train_step if mode == "eager" else compiled_step
        began, losses = time.perf_counter(), []
        bar = tqdm(loader, desc=f"epoch {epoch + 1:2d}/{EPOCHS} {mode:8s}", unit="step", leave=False,
                   file=sys.stdout, disable=None)
        for xb, yb in bar:
            losses.append(step(xb, yb).item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        seconds = time.perf_counter() - began
        if epoch <= 1:  # epoch 2 includes the one-off tracing; measure compiled speed later
            speed.setdefault(mode, len(losses) / seconds)
        else:
            speed[mode] = max(speed.get(mode, 0), len(losses) / seconds)
        history["loss"].append(float(np.mean(losses)))
        history["accuracy"].append(accuracy(model, images[test], labels[test]))
        print(f"epoch {epoch + 1:2d} ({mode:8s}): loss {history['loss'][-1]:.4f}, held-out accuracy "
              f"{history['accuracy'][-1]:.2%}, {len(losses) / seconds:6.0f} steps/s", flush=True)
    final = history["accuracy"][-1]

    section("4. Checkpoint, reload into a fresh model, plot")
    OUT.mkdir(exist_ok=True)
    of.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, OUT / "digits.ckpt")
    restored = make_model()
    with of.no_grad():
        for p in restored.parameters():  # a different starting point, to show the load really replaces it
            p.zero_()  # in place, as torch's: autograd counts the write (writing through .numpy() it could not)
    restored.load_state_dict(of.load(OUT / "digits.ckpt")["model"])
    reloaded = accuracy(restored, images[test], labels[test])
    print(f"saved {OUT / 'digits.ckpt'}; reloaded model: held-out accuracy {reloaded:.2%} (trained: {final:.2%})")
    plot(history)

    section("Summary")
    print(f"held-out accuracy {final:.2%} (target 97%); eager {speed['eager']:.0f} steps/s, compiled "
          f"{speed['compiled']:.0f} steps/s ({speed['compiled'] / speed['eager']:.1f}x); "
          f"{time.perf_counter() - start:.0f} s in all")
    ok = final >= 0.97 and reloaded == final and abs(d2.item() - exact) < 1e-9
    if not ok:
        print("FAILED: accuracy below 97%, a reload that changed it, or a wrong second derivative")
    return 0 if ok else 1


def plot(history) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = np.arange(1, len(history["loss"]) + 1)
    fig, left = plt.subplots(figsize=(7, 4))
    left.plot(epochs, history["loss"], "o-", color="tab:blue", label="training loss")
    left.set_xlabel("epoch (1: eager, then compiled)")
    left.set_ylabel("cross-entropy", color="tab:blue")
    right = left.twinx()
    right.plot(epochs, np.array(history["accuracy"]) * 100, "s-", color="tab:green", label="held-out accuracy")
    right.set_ylabel("held-out accuracy (%)", color="tab:green")
    right.axhline(97, color="tab:green", linestyle=":", linewidth=1)
    left.set_title("opforge: a CNN with a custom op on scikit-learn digits")
    fig.tight_layout()
    path = OUT / "training.png"
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)  # atomic: a crash never leaves half a picture
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
