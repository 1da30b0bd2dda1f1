"""A word-level LSTM language model, trained with opforge on the project's own documentation (README.md and docs/*.md,
found next to this file: nothing is downloaded), with a progress bar and a perplexity plot.

The model is torch's word_language_model example in opforge: an embedding, a 2-layer LSTM (hidden 256, dropout between
the layers), a linear decoder that shares the embedding's weights, dropout before and after the LSTM. Training is
truncated backpropagation through time: the text is cut into 20 parallel streams and read 35 words at a time, the
LSTM's state carried from one window to the next (detached: gradients stop at the window's start). Each training step
(forward, backward, gradient clipping, Adam update) is one compiled program. Perplexity (e^cross-entropy) is measured
on the last 10% of the text, which training never sees.

    python examples/word_lstm.py            # 6 epochs: a few minutes on 2 cores
    python examples/word_lstm.py --quick    # a few steps: the perplexity goes down, the plot is drawn

Writes out/word_lstm_perplexity.png (--out DIR elsewhere). Exits non-zero if the held-out perplexity misses its
target (below 25 for the default run, which reaches 13; merely lower than before training for a shorter one) or a
loss is not finite.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

import opforge as of
from opforge import nn
from opforge import ops as F

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEED = 0
EPOCHS, BATCH, BPTT = 6, 20, 35  # 20 streams read 35 words at a time: the shape bench/cases/rnn.py times
HIDDEN, LAYERS, DROPOUT = 256, 2, 0.3
LR, CLIP = 2e-3, 0.5
MIN_COUNT = 2  # rarer words become <unk>
TARGET = 25.0  # held-out perplexity the default run must get below (13 here; a uniform guess: the vocabulary size)
PROMPT, TEMPERATURE = "the gradient", 0.7


def section(title):
    print(f"\n== {title} " + "=" * max(0, 96 - len(title)), flush=True)


# -- the data --------------------------------------------------------------------------------------------------------


def tokenize(text: str) -> list[str]:
    """Lower-case words, numbers and single punctuation marks, with <eos> at the end of each non-empty line."""
    words = []
    for line in text.lower().splitlines():
        tokens = re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", line)
        if tokens:
            words += [*tokens, "<eos>"]
    return words


class Vocab:
    """Words <-> int64 indices: the words seen at least ``min_count`` times, the others are <unk>."""

    def __init__(self, words: list[str], min_count: int = MIN_COUNT):
        counts = Counter(words)
        self.words = ["<unk>", *sorted(w for w, n in counts.items() if n >= min_count and w != "<unk>")]
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: list[str]) -> np.ndarray:
        return np.array([self.index.get(w, 0) for w in words], np.int64)

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids).replace(" <eos> ", "\n")


def load_corpus():
    """(vocabulary, training ids, held-out ids): the last 10% of the text is held out."""
    words = tokenize("\n".join(path.read_text(encoding="utf-8") for path in SOURCES))
    split = int(0.9 * len(words))
    vocab = Vocab(words[:split])
    return vocab, vocab.encode(words[:split]), vocab.encode(words[split:])


def batchify(ids: np.ndarray, streams: int) -> np.ndarray:
    """(T, streams): the text cut into ``streams`` consecutive pieces, one per column (the tail that does not fill
    a row is dropped)."""
    length = len(ids) // streams
    return ids[:length * streams].reshape(streams, length).T.copy()


def windows(data: np.ndarray, bptt: int):
    """(x, y) windows of up to ``bptt`` steps over the time-major ``data``: y is x one word later."""
    for start in range(0, len(data) - 1, bptt):
        stop = min(start + bptt, len(data) - 1)
        yield of.tensor(data[start:stop]), of.tensor(data[start + 1:stop + 1])


# -- the model -------------------------------------------------------------------------------------------------------


class WordLSTM(nn.Module):
    """(T, N) word indices and the LSTM's state -> (T, N, vocab) logits for each next word, and the new state."""

    def __init__(self, vocab: int, hidden: int = HIDDEN, layers: int = LAYERS, dropout: float = DROPOUT):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, hidden)
        self.rnn = nn.LSTM(hidden, hidden, layers, dropout=dropout)
        self.decoder = nn.Linear(hidden, vocab)
        self.decoder.weight = self.encoder.weight  # tied weights (Press & Wolf 2017): one matrix, both ways
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x, state):
        out, state = self.rnn(self.drop(self.encoder(x)), state)
        return self.decoder(self.drop(out)), state

    def initial_state(self, streams: int):
        shape = (self.rnn.num_layers, streams, self.rnn.hidden_size)
        return of.zeros(*shape), of.zeros(*shape)


def make_model(vocab: int, **sizes) -> WordLSTM:
    of.manual_seed(SEED)
    return WordLSTM(vocab, **sizes)


def make_train_step(model: WordLSTM, opt):
    """One step on a window: the loss, and the state to carry to the next window (detached: truncated BPTT). The same
    function runs eagerly or under ``of.compile``."""

    def train_step(x, y, h, c):
        logits, (h, c) = model(x, (h, c))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()  # eager: autograd; compiled: backward ops appended to the program
        of.optim.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        return loss, h.detach(), c.detach()

    return train_step


def perplexity(model: WordLSTM, data: np.ndarray, bptt: int = BPTT) -> float:
    """e^(mean cross-entropy per word) over the time-major ``data``, the state carried across windows (eval mode)."""
    model.eval()
    state = model.initial_state(data.shape[1])
    total, count = 0.0, 0
    with of.no_grad():
        for x, y in windows(data, bptt):
            logits, state = model(x, state)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            count += y.numpy().size
    model.train()
    return math.exp(total / count)


def generate(model: WordLSTM, vocab: Vocab, prompt: str, length: int, temperature: float = TEMPERATURE,
             seed: int = SEED) -> str:
    """Continue ``prompt`` by ``length`` words, each drawn from softmax(logits / temperature) with a seeded generator;
    the LSTM's state carries the context (one step per word)."""
    rng = np.random.default_rng(seed)
    ids = list(vocab.encode(tokenize(prompt)[:-1]))  # without the <eos> that closes the prompt's line
    model.eval()
    with of.no_grad():
        logits, state = model(of.tensor(np.array(ids)[:, None]), model.initial_state(1))
        for _ in range(length):
            p = F.softmax(logits[-1, 0] * (1.0 / temperature)).numpy().astype(np.float64)
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
            logits, state = model(of.tensor(np.array([[ids[-1]]])), state)
    model.train()
    return vocab.decode(ids)


def plot(history: dict, path: Path) -> None:
    """Training perplexity (windows averaged per log interval) and held-out perplexity against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*history["train"]), ".-", color="tab:blue", label="training (mean of recent windows)")
    ax.plot(*zip(*history["held_out"]), "o-", color="tab:orange", label="held out (last 10% of the text)")
    ax.set_yscale("log")
    ax.set_xlabel("training step (35 words × 20 streams)")
    ax.set_ylabel("perplexity")
    ax.set_title("opforge: a word-level LSTM on its own documentation")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)  # atomic: a crash never leaves half a picture


# -- the run ---------------------------------------------------------------------------------------------------------


def one_blas_thread() -> None:
    """NumPy's BLAS on one thread: these products are small, and on a busy machine a second thread's spin-waiting
    only slows them. Needs threadpoolctl (installed with scikit-learn); without it, nothing changes."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1, user_api="blas")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS, help=f"passes over the training text (default {EPOCHS})")
    parser.add_argument("--quick", action="store_true", help="a few steps and a short evaluation: a smoke test")
    parser.add_argument("--out", type=Path, default=ROOT / "out", help="directory for the plot (default out/)")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be positive")
    start = time.perf_counter()
    one_blas_thread()

    section("1. The text: the project's own docs, read from disk next to this script (no download)")
    vocab, train_ids, held_ids = load_corpus()
    names = ", ".join(str(p.relative_to(ROOT)) for p in SOURCES)
    print(f"{names}: {len(train_ids) + len(held_ids):,} words; a vocabulary of {len(vocab):,} (words seen at least "
          f"{MIN_COUNT} times; the rest are <unk>); {len(train_ids):,} to train on, {len(held_ids):,} held out")
    train = batchify(train_ids, BATCH)
    held_out = batchify(held_ids, 10)
    steps_per_epoch = math.ceil((len(train) - 1) / BPTT)
    epochs, limit = (1, 8) if args.quick else (args.epochs, None)
    if args.quick:
        held_out = held_out[:4 * BPTT + 1]

    section(f"2. The model: embedding, {LAYERS}-layer LSTM ({HIDDEN} hidden), tied decoder")
    model = make_model(len(vocab))
    print(model)
    size = sum(p.numpy().size for p in model.parameters())
    print(f"{size:,} parameters")

    section(f"3. Training: {epochs} epoch(s) of {limit or steps_per_epoch} compiled steps (forward, backward, "
            "clipping, Adam)")
    opt = of.optim.Adam(model.parameters(), lr=LR)
    step = of.compile(make_train_step(model, opt))
    before = perplexity(model, held_out)
    print(f"before training: held-out perplexity {before:,.1f} (a uniform guess: {len(vocab):,})")
    history = {"train": [], "held_out": [(0, before)]}
    losses, done = [], 0
    began = time.perf_counter()
    for epoch in range(1, epochs + 1):
        state = model.initial_state(BATCH)
        bar = tqdm(windows(train, BPTT), total=limit or steps_per_epoch, desc=f"epoch {epoch}", unit="step",
                   file=sys.stdout, disable=None, leave=False)
        recent = []
        for k, (x, y) in enumerate(bar):
            if limit is not None and k == limit:
                break
            loss, *state = step(x, y, *state)
            losses.append(loss.item())
            recent.append(losses[-1])
            done += 1
            bar.set_postfix(ppl=f"{math.exp(np.mean(recent[-10:])):.0f}")
            if len(recent) % 10 == 0:
                history["train"].append((done, math.exp(np.mean(recent[-10:]))))
        bar.close()
        held = perplexity(model, held_out)
        history["held_out"].append((done, held))
        if not history["train"] or history["train"][-1][0] != done:
            history["train"].append((done, math.exp(np.mean(recent[-10:]))))
        print(f"epoch {epoch}: training perplexity {math.exp(np.mean(recent)):.1f}, held-out {held:.1f}")
    seconds = time.perf_counter() - began
    print(f"{done / seconds:.1f} steps/s ({seconds:.0f} s, the first step includes tracing)")
    path = args.out / "word_lstm_perplexity.png"
    plot(history, path)
    print(f"plot: {path}")

    section(f"4. A sample: 30 words after {PROMPT!r}, temperature {TEMPERATURE}, seeded (eager)")
    print(generate(model, vocab, PROMPT, 30))

    section("Summary")
    after = history["held_out"][-1][1]
    target = TARGET if epochs >= EPOCHS else before  # a shorter run need only lower the perplexity
    print(f"{size:,} parameters, {done} steps: held-out perplexity {before:,.1f} -> {after:.1f} (target: below "
          f"{target:,.1f}); {time.perf_counter() - start:.0f} s in all")
    ok = bool(np.all(np.isfinite(losses))) and after < target
    if not ok:
        print("FAILED: the held-out perplexity did not reach its target, or a loss was not finite")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
