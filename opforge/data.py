"""Batches for training: ``DataLoader(x, y, batch_size=32, shuffle=True, seed=0)`` yields ``(xb, yb)`` Tensors from
arrays, and ``DataLoader(dataset, batch_size=32, collate_fn=...)`` batches any map-style dataset — an object with
``__len__`` and ``__getitem__`` (PyTorch's protocol): the indices come from ``len(dataset)``, each batch is
``collate_fn([dataset[i] for i in indices])``, by default ``default_collate`` (samples stacked field by field).

Shuffling is reproducible: the loader owns a generator seeded once (from ``seed``, or else with a draw from opforge's
generator when a shuffling loader is made, so ``of.manual_seed`` fixes it), and each pass over the data draws the next
permutation from it. Two loaders made the same way give the same batches, epoch after epoch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from .core import dtypes as D
from .core.devices import CPU
from .core.errors import ArgumentError, describe
from .tensor import Tensor, wrap


def _arrays(arrays: tuple, who: str) -> tuple:
    """The arrays of supported dtypes sharing their first dim, each with its device: a Tensor's array stays on the
    Tensor's device (its batches are made there, as torch's), other data becomes a host array. Errors name them by
    position."""
    if not arrays:
        raise ArgumentError(f"{who}(): give at least one array")
    out, devices = [], []
    for i, value in enumerate(arrays):
        array = value._data if isinstance(value, Tensor) else np.asarray(value)
        devices.append(value._device if isinstance(value, Tensor) else CPU)
        if array.ndim == 0:
            raise ArgumentError(f"{who}(): array {i} is 0-d; each array needs a first dim that indexes samples")
        D.as_dtype(array.dtype, op=who, arg=f"array {i}")  # unsupported dtypes (uint8 images...) fail here
        out.append(array)
    if len({len(a) for a in out}) > 1:
        sizes = ", ".join(f"array {i} has {len(a)} (shape {a.shape})" for i, a in enumerate(out))
        raise ArgumentError(f"{who}(): the arrays must have the same number of samples (first dim): {sizes}")
    return tuple(out), tuple(devices)


class Dataset:
    """The base of a map-style dataset (torch's ``Dataset``): subclasses define ``__getitem__`` and ``__len__``."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} has no __getitem__(): define it (and __len__)")


class TensorDataset(Dataset):
    """Arrays (or Tensors) that share their first dim: ``ds[i]`` is the tuple of their i-th samples, as Tensors."""

    def __init__(self, *arrays):
        self.arrays, self.devices = _arrays(arrays, "TensorDataset")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index) -> tuple:
        return tuple(wrap(d.array(a[index]), d) for a, d in zip(self.arrays, self.devices))


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order (torch's ``Subset``)."""

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]


def random_split(dataset, lengths, generator=None) -> list:
    """``dataset`` cut into random non-overlapping ``Subset``s of ``lengths`` (counts, or fractions adding up to 1,
    the remainder spread one by one as torch's), drawn from opforge's generator (``of.manual_seed``): the same
    sizes as torch's, not the same samples."""
    if generator is not None:
        raise ArgumentError("random_split(): generator= (a torch.Generator) is not supported; seed with "
                            "of.manual_seed")
    n = len(dataset)
    if all(isinstance(x, float) for x in lengths) and math.isclose(sum(lengths), 1.0):
        counts = [math.floor(n * f) for f in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if sum(lengths) != n:
        raise ArgumentError(f"random_split(): lengths {list(lengths)} do not add up to the dataset's {n} samples")
    order = CPU.generator().permutation(n).tolist()
    starts = np.cumsum([0, *lengths]).tolist()
    return [Subset(dataset, order[a:b]) for a, b in itertools.pairwise(starts)]


class Sampler:
    """torch's ``Sampler``: an iterable of dataset indices (with ``__len__``), what a ``DataLoader(sampler=...)``
    batches in order."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """The indices 0 … len(data_source) − 1 in order."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self) -> Iterator:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """torch's ``RandomSampler``: a random permutation of the indices each pass, or with ``replacement``
    ``num_samples`` indices drawn uniformly (made as they are read, so ``num_samples`` may be huge, as minGPT's
    1e10). Drawn from opforge's generator (``of.manual_seed``): torch's order, not its samples."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None):
        if generator is not None:
            raise ArgumentError("RandomSampler(): generator= (a torch.Generator) is not supported; seed with "
                                "of.manual_seed")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                        or num_samples <= 0):
            raise ArgumentError(f"RandomSampler(): num_samples must be a positive int, got {describe(num_samples)}")
        self.data_source, self.replacement, self._num_samples = data_source, bool(replacement), num_samples

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator:
        n, rng = len(self.data_source), np.random.default_rng(int(CPU.generator().integers(2**63)))
        if self.replacement:
            for start in range(0, self.num_samples, 32):  # in chunks of 32, as torch draws them
                yield from rng.integers(0, n, min(32, self.num_samples - start)).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from rng.permutation(n).tolist()
            yield from rng.permutation(n)[:self.num_samples % n].tolist()

    def __len__(self) -> int:
        return self.num_samples


def _is_dataset(value) -> bool:
    return (not isinstance(value, (np.ndarray, Tensor)) and hasattr(value, "__len__")
            and hasattr(value, "__getitem__"))


def default_collate(samples: list):
    """A list of samples -> one batch, PyTorch's way: arrays, Tensors and numbers are stacked into a Tensor (Python
    floats as float64, ints as int64), tuples and lists are batched position by position and dicts key by key;
    strings stay a list."""
    first = samples[0]
    if isinstance(first, (Tensor, np.ndarray, np.generic, bool, int, float)):
        device = first._device if isinstance(first, Tensor) else CPU
        if isinstance(first, Tensor):  # stacked on their device (as torch's), which must be one
            if any(s._device is not device for s in samples if isinstance(s, Tensor)):
                raise ArgumentError("default_collate(): samples on different devices cannot be stacked")
            arrays = [s._data if isinstance(s, Tensor) else device.from_host(np.asarray(s)) for s in samples]
        else:
            arrays = [np.asarray(s, dtype=np.float64 if type(s) is float else np.int64 if type(s) is int else None)
                      for s in samples]
        try:
            batch = np.stack(arrays)
        except ValueError as e:
            raise ArgumentError(f"default_collate(): samples of different shapes cannot be stacked ({e}); give the "
                                "DataLoader a collate_fn") from None
        D.as_dtype(batch.dtype, op="default_collate", arg="samples")  # unsupported dtypes (uint8 images...) fail here
        return wrap(batch, device)
    if isinstance(first, str):
        return list(samples)
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in samples):
            raise ArgumentError("default_collate(): samples hold different numbers of fields")
        fields = [default_collate([s[i] for s in samples]) for i in range(len(first))]
        if hasattr(first, "_fields"):  # a named tuple
            return type(first)(*fields)
        return tuple(fields) if isinstance(first, tuple) else fields
    raise ArgumentError(f"default_collate(): cannot batch samples of type {type(first).__name__}; give the "
                        "DataLoader a collate_fn")


# torch's DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
# drop_last, timeout, worker_init_fn): the settings opforge has, and the others with the value each must have here
_TORCH_POSITIONAL = ("batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn", "pin_memory",
                     "drop_last", "timeout", "worker_init_fn")
_TORCH_ONLY = {"batch_sampler": None, "timeout": 0, "worker_init_fn": None, "generator": None,
               "prefetch_factor": None, "persistent_workers": False, "multiprocessing_context": None}


def _check_torch_args(args: dict) -> None:
    """torch's settings that change nothing here (num_workers, pin_memory: how batches are made, not which) are
    accepted; those that would (a sampler, a generator...) only at torch's default."""
    for name, value in args.items():
        if name in ("num_workers", "pin_memory", "pin_memory_device", "in_order"):
            continue
        if name not in _TORCH_ONLY:
            raise ArgumentError(f"DataLoader(): unexpected argument '{name}'")
        if value != _TORCH_ONLY[name]:
            raise ArgumentError(f"DataLoader(): {name}={value!r} is not supported (only torch's default, "
                                f"{_TORCH_ONLY[name]!r})")


class DataLoader:
    """Iterate over arrays (or a ``TensorDataset``), or over any map-style dataset, in batches of ``batch_size``
    samples. From arrays each batch is a tuple of Tensors (one per array, in order); from a dataset it is what
    ``collate_fn`` makes of the list of samples. ``shuffle`` draws a new permutation each epoch from a generator
    seeded once; ``drop_last`` drops a final batch smaller than ``batch_size``."""

    def __init__(self, *data, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None, collate_fn=None, sampler=None, **torch_args):
        if data and _is_dataset(data[0]):  # a TensorDataset, or any map-style dataset
            if len(data) > 1:  # torch's positional order after the dataset
                given = dict(zip(_TORCH_POSITIONAL, data[1:]))
                if len(data) - 1 > len(_TORCH_POSITIONAL):
                    raise ArgumentError(f"DataLoader(): {len(data)} positional arguments, torch's take at most "
                                        f"{len(_TORCH_POSITIONAL) + 1}")
                batch_size, shuffle = given.pop("batch_size", batch_size), given.pop("shuffle", shuffle)
                collate_fn, drop_last = given.pop("collate_fn", collate_fn), given.pop("drop_last", drop_last)
                sampler = given.pop("sampler", sampler)
                torch_args.update(given)
            _check_torch_args(torch_args)
            self.dataset = data[0]
        elif torch_args:
            raise ArgumentError(f"DataLoader(): unexpected arguments {sorted(torch_args)}")
        else:
            self.dataset = TensorDataset(*data)
        if collate_fn is not None and not callable(collate_fn):
            raise ArgumentError(f"DataLoader(): collate_fn must be callable, got {describe(collate_fn)}")
        self.collate_fn = collate_fn
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ArgumentError(f"DataLoader(): batch_size must be an int >= 1, got {describe(batch_size)}")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        if sampler is not None and self.shuffle:
            raise ArgumentError("DataLoader(): sampler= and shuffle=True exclude each other (as in torch)")
        if sampler is not None and not hasattr(sampler, "__iter__"):
            raise ArgumentError(f"DataLoader(): sampler must be an iterable of indices, got {describe(sampler)}")
        self.sampler = sampler  # the indices, in order (by default 0 … n − 1, or a permutation with shuffle)
        self.drop_last = bool(drop_last)
        if seed is None and self.shuffle:  # from opforge's generator, so of.manual_seed fixes the order too
            seed = int(CPU.generator().integers(2**63))
        self.generator = np.random.default_rng(seed)

    @property
    def arrays(self) -> tuple:
        """The arrays, when the loader batches arrays (a ``TensorDataset``)."""
        return self.dataset.arrays

    def __len__(self) -> int:
        """The number of batches per epoch."""
        n = len(self.dataset) if self.sampler is None else len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator:
        if self.sampler is None:
            n = len(self.dataset)
            order = iter((self.generator.permutation(n) if self.shuffle else np.arange(n)).tolist())
        else:  # read as batches are made: a sampler may be long (minGPT's draws 1e10 indices)
            order = iter(self.sampler)
        arrays = type(self.dataset) is TensorDataset and self.collate_fn is None
        collate = self.collate_fn or default_collate
        while index := list(itertools.islice(order, self.batch_size)):
            if self.drop_last and len(index) < self.batch_size:
                return
            if arrays:  # a whole batch in one indexing per array (which copies), on the array's device
                index = np.asarray(index, dtype=np.int64)
                yield tuple(wrap(a[index], d) for a, d in zip(self.dataset.arrays, self.dataset.devices))
            else:
                yield collate([self.dataset[int(i)] for i in index])


__all__ = ["DataLoader", "Dataset", "RandomSampler", "Sampler", "SequentialSampler", "Subset", "TensorDataset",
           "default_collate", "random_split"]
