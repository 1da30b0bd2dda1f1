"""The seeded random generator that creation functions and ``random`` kernels draw from."""

import threading

import numpy as np


class _RandomState(threading.local):
    generator = np.random.default_rng(0)


state = _RandomState()


def manual_seed(seed: int) -> None:
    """Seed the generator of this thread: the same seed gives the same numbers, op for op."""
    state.generator = np.random.default_rng(int(seed))


def generator() -> np.random.Generator:
    return state.generator
