"""Batches from arrays: ``DataLoader(x, y, batch_size=32, shuffle=True, seed=0)`` yields ``(xb, yb)`` Tensors.

Shuffling is reproducible: the loader owns a generator seeded once (from ``seed``, or else with a draw from opforge's
generator when a shuffling loader is made, so ``of.manual_seed`` fixes it), and each pass over the data draws the next
permutation from it. Two loaders made the same way give the same batches, epoch after epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from .core import dtypes as D
from .core.devices import CPU
from .core.errors import ArgumentError, describe
from .tensor import Tensor, wrap


def _arrays(arrays: tuple, who: str) -> tuple:
    """The arrays as NumPy arrays of supported dtypes sharing their first dim; errors name them by position."""
    if not arrays:
        raise ArgumentError(f"{who}(): give at least one array")
    out = []
    for i, value in enumerate(arrays):
        array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if array.ndim == 0:
            raise ArgumentError(f"{who}(): array {i} is 0-d; each array needs a first dim that indexes samples")
        D.as_dtype(array.dtype, op=who, arg=f"array {i}")  # unsupported dtypes (uint8 images...) fail here
        out.append(array)
    if len({len(a) for a in out}) > 1:
        sizes = ", ".join(f"array {i} has {len(a)} (shape {a.shape})" for i, a in enumerate(out))
        raise ArgumentError(f"{who}(): the arrays must have the same number of samples (first dim): {sizes}")
    return tuple(out)


class TensorDataset:
    """Arrays (or Tensors) that share their first dim: ``ds[i]`` is the tuple of their i-th samples."""

    def __init__(self, *arrays):
        self.arrays = _arrays(arrays, "TensorDataset")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index) -> tuple:
        return tuple(a[index] for a in self.arrays)


class DataLoader:
    """Iterate over arrays (or a ``TensorDataset``) in batches of ``batch_size`` samples, each batch a tuple of
    Tensors (one per array, in order). ``shuffle`` draws a new permutation each epoch from a generator seeded once;
    ``drop_last`` drops a final batch smaller than ``batch_size``."""

    def __init__(self, *arrays, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None):
        if len(arrays) == 1 and isinstance(arrays[0], TensorDataset):
            self.arrays = arrays[0].arrays
        else:
            self.arrays = _arrays(arrays, "DataLoader")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ArgumentError(f"DataLoader(): batch_size must be an int >= 1, got {describe(batch_size)}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if seed is None and self.shuffle:  # from opforge's generator, so of.manual_seed fixes the order too
            seed = int(CPU.generator().integers(2**63))
        self.generator = np.random.default_rng(seed)

    def __len__(self) -> int:
        """The number of batches per epoch."""
        n = len(self.arrays[0])
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple]:
        n = len(self.arrays[0])
        order = self.generator.permutation(n) if self.shuffle else np.arange(n)
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield tuple(wrap(a[index]) for a in self.arrays)  # indexing by an array copies


__all__ = ["DataLoader", "TensorDataset"]
