"""A small character-level transformer, trained with opforge on the project's own documentation (README.md and
docs/ops.md, found next to this file: nothing is downloaded), then asked to continue a prompt.

Decoder-only: token and learned positional embeddings, 2 blocks of pre-LayerNorm causal self-attention and a GELU
MLP, a final LayerNorm and a linear head. The training step (forward, backward, AdamW update) is one compiled
program; sampling runs eagerly, recomputing the whole window at each step (there is no KV cache).

    python examples/char_transformer.py             # about a minute on 2 cores
    python examples/char_transformer.py --steps 20  # a few seconds: the loss goes down, a (rough) sample
    python examples/char_transformer.py --device cuda  # the same on a GPU (CuPy)

Exits non-zero if the held-out loss misses its target (below 1.5 nats/char for the default run, merely lower than
at the start for a shorter one), a loss is not finite, or the sample is missing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import opforge as of
from opforge import nn
from opforge import ops as F

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", ROOT / "docs" / "ops.md"]
SEED = 0
STEPS, BATCH, BLOCK = 600, 32, 64  # default run: 600 steps of 32 windows of 64 characters
D_MODEL, HEADS, LAYERS = 64, 4, 2
LR, WEIGHT_DECAY = 3e-3, 0.01
TARGET = 1.5  # held-out nats/char the default run must get below (uniform guessing: about 4.8)
PROMPT, TEMPERATURE = "### soft", 0.5  # the start of an op's entry in docs/ops.md


def section(title):
    print(f"\n== {title} " + "=" * max(0, 96 - len(title)), flush=True)


# -- the model -------------------------------------------------------------------------------------------------


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)): the pre-LayerNorm residual block of GPT-2."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)  # (N, T, E) inputs
        self.ln2 = nn.LayerNorm(d_model)
        # GELU with GPT-2's tanh approximation: a fifth less time per step here than erf's
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=True)[0]  # i attends to j <= i
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """(N, T) character indices -> (N, T, vocab) logits for the character that follows each position."""

    def __init__(self, vocab: int, block: int = BLOCK, d_model: int = D_MODEL, heads: int = HEADS,
                 layers: int = LAYERS):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(block, d_model)  # learned positions 0 .. block-1
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        for emb in (self.tok, self.pos):  # GPT-2's N(0, 0.02) rather than N(0, 1): a calmer start
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx):
        length = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:length]  # (N, T, d) + (T, d)
        return self.head(self.ln_f(self.blocks(x)))


def make_model(vocab: int) -> CharTransformer:
    of.manual_seed(SEED)
    return CharTransformer(vocab)


def make_train_step(model, opt):
    """One AdamW step on a batch of windows; the same function runs eagerly or under ``of.compile``."""

    def train_step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()  # eager: autograd; compiled: backward ops appended to the program
        opt.step()       # eager: update ops, written in place; compiled: recorded, run in place
        opt.zero_grad()
        return loss

    return train_step


# -- the data --------------------------------------------------------------------------------------------------


def load_text() -> str:
    return "\n\n".join(path.read_text(encoding="utf-8") for path in SOURCES)


class Vocab:
    """Characters <-> int64 indices, over the characters the text uses."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def batches(data: np.ndarray, batch: int, block: int, rng: np.random.Generator):
    """Endless random windows: x = data[i : i+block], y = data[i+1 : i+block+1] (the next character)."""
    while True:
        starts = rng.integers(0, len(data) - block - 1, size=batch)
        windows = np.stack([data[s:s + block + 1] for s in starts])
        yield of.tensor(windows[:, :-1]), of.tensor(windows[:, 1:])


def evaluate(model, data: np.ndarray, block: int, windows: int = 16) -> float:
    """Mean cross-entropy (nats per character) over evenly spaced windows of held-out text."""
    starts = np.linspace(0, len(data) - block - 1, windows).astype(np.int64)
    w = np.stack([data[s:s + block + 1] for s in starts])
    with of.no_grad():
        logits = model(of.tensor(w[:, :-1]))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), of.tensor(w[:, 1:]).reshape(-1)).item()


def generate(model, vocab: Vocab, prompt: str, length: int, temperature: float = TEMPERATURE,
             seed: int = SEED) -> str:
    """Continue ``prompt`` by ``length`` characters, each drawn from softmax(logits / temperature) with a seeded
    generator (temperature 0: the most likely one). Without a KV cache, every character recomputes its window."""
    rng = np.random.default_rng(seed)
    ids = list(vocab.encode(prompt))
    with of.no_grad():
        for _ in range(length):
            window = of.tensor(np.array([ids[-model.block:]], np.int64))
            logits = model(window)[0, -1]  # the prediction after the last character
            if temperature == 0:
                ids.append(int(F.argmax(logits).item()))
                continue
            p = F.softmax(logits * (1.0 / temperature)).cpu().numpy().astype(np.float64)
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(ids)


# -- the run ---------------------------------------------------------------------------------------------------


def one_blas_thread() -> None:
    """Run NumPy's BLAS on one thread. These matrices are small ((2048, 64) @ (64, 256) at most): a second thread
    gains nothing, and on a busy machine its spin-waiting made steps several times slower. Needs threadpoolctl
    (installed with scikit-learn, which the demo uses); without it, nothing changes."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1, user_api="blas")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps (default {STEPS})")
    parser.add_argument("--quick", action="store_true", help="20 steps and a short sample: a smoke test")
    parser.add_argument("--sample", type=int, default=None, help="characters to generate (default 300)")
    parser.add_argument("--device", default="cpu", help='where to train: "cpu" (default) or "cuda" (a GPU, CuPy)')
    args = parser.parse_args(argv)
    steps = 20 if args.quick and args.steps == STEPS else args.steps
    sample_length = args.sample if args.sample is not None else (60 if args.quick else 300)
    if steps < 1 or sample_length < 1:
        parser.error("--steps and --sample must be positive")
    start = time.perf_counter()
    one_blas_thread()
    with of.using_device(args.device):  # the model, the batches, everything made without an input: there
        return run(steps, sample_length, start)


def run(steps: int, sample_length: int, start: float) -> int:
    section("1. The text: the project's own docs, read from disk next to this script (no download)")
    text = load_text()
    vocab = Vocab(text)
    data = vocab.encode(text)
    split = int(0.9 * len(data))
    train, held_out = data[:split], data[split:]
    names = " + ".join(str(p.relative_to(ROOT)) for p in SOURCES)
    print(f"{names}: {len(text):,} characters, {len(vocab)} distinct; {len(train):,} to train on, "
          f"{len(held_out):,} held out (the last 10%)")

    section(f"2. The model: {LAYERS} pre-LayerNorm blocks of causal self-attention + GELU MLP")
    model = make_model(len(vocab))
    print(model)
    size = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"{size:,} parameters; context {BLOCK} characters; batch {BATCH} windows")

    section(f"3. Training: {steps} AdamW steps, each one compiled program (forward, backward, update)")
    opt = of.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    sched = of.optim.CosineAnnealingLR(opt, T_max=steps, eta_min=LR / 10)  # writes the lr the program reads
    step = of.compile(make_train_step(model, opt))
    held_out_before = evaluate(model, held_out, BLOCK)
    print(f"before training: held-out loss {held_out_before:.3f} nats/char (uniform guessing: "
          f"ln {len(vocab)} = {math.log(len(vocab)):.3f})")
    losses, stream = [], batches(train, BATCH, BLOCK, np.random.default_rng(SEED))
    every = max(1, steps // 6)
    began = time.perf_counter()
    bar = tqdm(range(steps), desc="training", unit="step", file=sys.stdout, disable=None, leave=False)
    for k in bar:
        x, y = next(stream)
        losses.append(step(x, y).item())
        sched.step()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if (k + 1) % every == 0 or k + 1 == steps:
            recent = np.mean(losses[-every:])
            tqdm.write(f"step {k + 1:5d}: training loss {recent:.3f} (mean of the last {min(every, k + 1)})",
                       file=sys.stdout)
    seconds = time.perf_counter() - began
    bar.close()
    held_out_after = evaluate(model, held_out, BLOCK)
    print(f"after training: held-out loss {held_out_after:.3f} nats/char; {steps / seconds:.1f} steps/s "
          f"({seconds:.0f} s, the first step includes tracing)")

    section(f"4. A sample: {sample_length} characters after {PROMPT!r}, temperature {TEMPERATURE}, seeded (eager)")
    began = time.perf_counter()
    sample = generate(model, vocab, PROMPT, sample_length)
    print(sample)
    print(f"({sample_length / (time.perf_counter() - began):.0f} characters/s)")

    section("Summary")
    k = max(1, min(10, steps // 4))  # training losses are noisy: compare means of the first and last k
    target = TARGET if steps >= STEPS else held_out_before  # a short run need only lower the loss
    print(f"{size:,} parameters, {steps} steps: training loss {np.mean(losses[:k]):.3f} -> "
          f"{np.mean(losses[-k:]):.3f}, held-out {held_out_before:.3f} -> {held_out_after:.3f} nats/char "
          f"(target: below {target:.3f}); {time.perf_counter() - start:.0f} s in all")
    ok = (bool(np.all(np.isfinite(losses))) and held_out_after < target
          and sample.startswith(PROMPT) and len(sample) == len(PROMPT) + sample_length)
    if not ok:
        print("FAILED: the held-out loss did not reach its target, a loss was not finite, or the sample is missing")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
