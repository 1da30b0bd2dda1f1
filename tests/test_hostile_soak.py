"""Soak: thousands of training steps, eager and compiled, must not leak memory or Tensors (``OPFORGE_FUZZ=long``)."""

import gc
import os

import numpy as np
import pytest
from fuzzing import LONG

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.tensor import Tensor

STEPS = 3000


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live_tensors() -> int:
    gc.collect()
    return sum(isinstance(o, Tensor) for o in gc.get_objects())


@pytest.mark.skipif(not LONG, reason="a soak test: OPFORGE_FUZZ=long")
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident size from /proc")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_thousands_of_training_steps_keep_memory_and_tensor_count_flat(compiled):
    of.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
    opt = of.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = of.compile(step) if compiled else step
    rng = np.random.default_rng(0)
    batches = [(of.tensor(rng.standard_normal((8, 16)).astype(np.float32)), of.tensor(rng.integers(0, 4, 8)))
               for _ in range(10)]
    for i in range(300):  # warm up: caches, the compiled plan, the allocator's pools
        run(*batches[i % 10])
    tensors, rss = live_tensors(), resident_bytes()
    losses = [float(run(*batches[i % 10]).item()) for i in range(STEPS)]
    grown_tensors, grown_rss = live_tensors() - tensors, resident_bytes() - rss
    print(f"{'compiled' if compiled else 'eager'}: {STEPS} steps, {grown_tensors:+d} live Tensors, resident memory "
          f"{grown_rss / 2**20:+.1f} MiB")
    assert np.isfinite(losses).all()
    assert grown_tensors <= 5, f"{grown_tensors} more live Tensors after {STEPS} steps"
    assert grown_rss < 16 << 20, f"resident memory grew by {grown_rss / 2**20:.1f} MiB over {STEPS} steps"
