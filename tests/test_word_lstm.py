"""examples/word_lstm.py: the script runs end to end in quick mode and draws its perplexity plot, its compiled training
step computes what the eager one does (loss, carried state, updated parameters), and the corpus helpers do what they
say. No timing is asserted."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge as of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import word_lstm as wl  # noqa: E402


def test_script_trains_and_plots_perplexity(tmp_path):
    done = subprocess.run([sys.executable, "examples/word_lstm.py", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "held-out perplexity" in done.stdout and "== 4. A sample" in done.stdout
    assert (tmp_path / "word_lstm_perplexity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_script_refuses_a_bad_epoch_count():
    done = subprocess.run([sys.executable, "examples/word_lstm.py", "--epochs", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode != 0 and "--epochs" in done.stderr


def test_corpus_helpers():
    words = wl.tokenize("The cat, the hat.\n\nA cat")
    assert words == ["the", "cat", ",", "the", "hat", ".", "<eos>", "a", "cat", "<eos>"]
    vocab = wl.Vocab(words, min_count=2)
    assert vocab.words == ["<unk>", "<eos>", "cat", "the"]
    assert vocab.decode(vocab.encode(["the", "dog"])) == "the <unk>"
    data = wl.batchify(np.arange(14), 3)  # 3 streams of 4 (the tail dropped), one per column
    np.testing.assert_array_equal(data, [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]])
    pairs = [(x.numpy(), y.numpy()) for x, y in wl.windows(data, 2)]
    assert len(pairs) == 2
    np.testing.assert_array_equal(pairs[0][0], data[0:2])
    np.testing.assert_array_equal(pairs[0][1], data[1:3])  # the next word
    np.testing.assert_array_equal(pairs[1][0], data[2:3])  # the last window is shorter
    np.testing.assert_array_equal(pairs[1][1], data[3:4])


def _tiny(seed=0):
    of.manual_seed(seed)
    return wl.WordLSTM(13, hidden=8, layers=2, dropout=0.0)


@pytest.mark.parametrize("steps", [1, 3])
def test_compiled_training_step_equals_eager(steps):
    models = _tiny(), _tiny()
    opts = [of.optim.Adam(m.parameters(), lr=1e-2) for m in models]
    eager, compiled = wl.make_train_step(models[0], opts[0]), of.compile(wl.make_train_step(models[1], opts[1]))
    data = np.random.default_rng(0).integers(0, 13, (6 * steps + 1, 4))
    states = [models[0].initial_state(4), models[1].initial_state(4)]
    for x, y in wl.windows(data, 6):
        le, *states[0] = eager(x, y, *states[0])
        lc, *states[1] = compiled(x, y, *states[1])
        np.testing.assert_allclose(lc.numpy(), le.numpy(), rtol=1e-5)
        for a, b in zip(states[1], states[0]):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    for (name, pe), (_, pc) in zip(models[0].named_parameters(), models[1].named_parameters()):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    assert models[1].decoder.weight is models[1].encoder.weight  # tied: one parameter
    start = _tiny()
    assert all(not np.allclose(p.numpy(), s.numpy()) for p, s in zip(models[1].parameters(), start.parameters()))


def test_training_lowers_the_perplexity_and_generation_is_seeded():
    words = ("the cat sat on the mat . <eos> " * 30).split()
    vocab = wl.Vocab(words, min_count=1)
    data = wl.batchify(vocab.encode(words), 4)
    of.manual_seed(0)
    model = wl.WordLSTM(len(vocab), hidden=16, layers=1, dropout=0.0)
    opt = of.optim.Adam(model.parameters(), lr=2e-2)
    step = of.compile(wl.make_train_step(model, opt))
    before = wl.perplexity(model, data, bptt=8)
    for _ in range(4):
        state = model.initial_state(4)
        for x, y in wl.windows(data, 8):
            _, *state = step(x, y, *state)
    assert wl.perplexity(model, data, bptt=8) < before / 3
    first, again = (wl.generate(model, vocab, "the cat", 8, seed=3) for _ in range(2))
    assert first == again and first.startswith("the cat ") and len(first.split()) >= 8
