"""Eager data parallelism: each rank trains a copy of the model on its shard of every batch.

``DistributedDataParallel(model)`` starts every rank from rank 0's parameters and, during ``backward()``, averages
the gradients over the ranks in *buckets*: as soon as every gradient of a bucket is final (the engine's
post-accumulate hooks say so), the bucket is flattened into one buffer and its all-reduce started without
blocking, while the backward pass goes on with the layers below. The last gradient to arrive waits for the
buckets still in flight and hands each parameter its averaged gradient (a view into its bucket's buffer).
Buckets follow the parameters in reverse order — the order backward finalises them.

``DistributedSampler`` gives each rank its part of every batch of a seeded shuffle, so that the ranks' batches
together are exactly the batches one process would take with ``size`` times the batch size. ``save`` writes a
checkpoint once (rank 0, atomically) and ``load`` reads it on every rank after that write.
"""

from __future__ import annotations

import numpy as np

from .. import checkpoint
from ..core.errors import ArgumentError, OpforgeError, describe
from ..core.interpreters import current_interpreter
from ..nn import Module
from ..program.compile import TraceAgain
from ..program.trace import Tracer
from ..tensor import Tensor, wrap
from .comm import Communicator, current_communicator
from .sharding import Mesh, ShardingTracer


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training over ``comm`` (the world by default): call it as the module;
    after ``loss.backward()`` every parameter's ``.grad`` is the mean of the ranks' gradients.

    ``bucket_bytes`` bounds a bucket's size (a parameter larger than it has a bucket of its own). The default is
    PyTorch's (``bucket_cap_mb=25``): each bucket's all-reduce is a meeting of the ranks in the middle of backward,
    so small buckets cost more meetings than they win in overlap unless a core is free to move the data (medians of
    bench/distributed.py runs on 2 cores: a 2.7 MB MLP scaled 1.74x in 1 MiB buckets, 1.83x in one); a model larger
    than a bucket still overlaps. ``overlap=False`` all-reduces every bucket at the end of backward instead,
    blocking (to measure what the overlap saves).
    Every parameter must get a gradient in each backward pass.
    """

    def __init__(self, module: Module, comm: Communicator | None = None, bucket_bytes: int = 25 << 20,
                 overlap: bool = True):
        super().__init__()
        if not isinstance(module, Module):
            raise ArgumentError(f"DistributedDataParallel(): expected a Module, got {describe(module)}")
        self.module = module
        object.__setattr__(self, "comm", current_communicator() if comm is None else comm)
        object.__setattr__(self, "overlap", bool(overlap))
        params = [p for p in module.parameters()]
        for t in [*params, *(b for b in module.buffers() if b is not None)]:  # every rank starts as rank 0
            t._device.copy_into(t._data, self.comm.broadcast(t._data, 0))
        buckets, current, size = [], [], 0
        for p in reversed(params):  # backward finalises the last layers first
            if current and size + p._data.nbytes > bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p._data.nbytes
        if current:
            buckets.append(current)
        object.__setattr__(self, "buckets", [_Bucket(b) for b in buckets])
        object.__setattr__(self, "_bucket_of", {id(p): b for b in self.buckets for p in b.params})
        object.__setattr__(self, "_pending", [])  # started all-reduces, in order
        object.__setattr__(self, "_waiting", 0)  # parameters whose gradient is not final yet in this backward
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)
        self._reset()

    def forward(self, *args, **kwargs):
        interpreter = current_interpreter()
        if self.comm.size > 1 and isinstance(interpreter, Tracer) and not isinstance(interpreter, ShardingTracer):
            # traced outside a mesh, the step would run no collective: each rank would train on its own batch
            comm = self.comm
            raise TraceAgain(
                "DistributedDataParallel: called while a program is traced outside a distribution mesh, where the "
                "program would run no collective and each rank would train on its own batch alone. of.compile traces "
                "it under the model's communicator by itself; to trace by hand, trace under "
                "`with of.distributed.Mesh(model.comm):`, or shard() the traced program",
                lambda: Mesh(comm))
        return self.module(*args, **kwargs)

    def _reset(self) -> None:
        for b in self.buckets:
            b.ready = 0
        self._pending.clear()
        object.__setattr__(self, "_waiting", sum(len(b.params) for b in self.buckets))

    def _ready(self, p: Tensor) -> None:
        bucket = self._bucket_of[id(p)]
        bucket.ready += 1
        object.__setattr__(self, "_waiting", self._waiting - 1)
        if self.overlap and bucket.ready == len(bucket.params):
            self._pending.append((bucket, self.comm.start_all_reduce(bucket.flatten(), "mean")))
        elif self.overlap:
            for _, request in self._pending:  # MPI moves a started collective on when it is called: poke it
                request.poke()
        if self._waiting == 0:
            self.synchronize()

    def synchronize(self) -> None:
        """Finish this backward's all-reduces and give each parameter its averaged gradient (backward calls it
        when the last gradient is final)."""
        if not self.overlap:
            self._pending.extend((b, self.comm.start_all_reduce(b.flatten(), "mean")) for b in self.buckets)
        for bucket, request in self._pending:
            bucket.unflatten(request.wait())
        if self._waiting:
            missing = [tuple(p.shape) for b in self.buckets for p in b.params if p.grad is None]
            self._reset()
            raise OpforgeError(f"DistributedDataParallel: {len(missing)} parameter(s) got no gradient in this "
                               f"backward pass (shapes {missing[:4]}): every parameter must be used")
        self._reset()


class _Bucket:
    def __init__(self, params: list):
        self.params = params
        self.ready = 0
        sizes = [p._data.size for p in params]
        self.offsets = np.cumsum([0, *sizes])
        self.buffer = None

    def flatten(self):
        """The parameters' gradients, one after the other in one new buffer (the next step's backward may still
        read this step's gradients)."""
        grads = [p.grad._data for p in self.params]
        self.buffer = np.empty(int(self.offsets[-1]), dtype=np.result_type(*grads))
        for g, start, stop in zip(grads, self.offsets[:-1], self.offsets[1:]):
            self.buffer[start:stop] = g.reshape(-1)
        return self.buffer

    def unflatten(self, buffer) -> None:
        for p, start, stop in zip(self.params, self.offsets[:-1], self.offsets[1:]):
            p.grad = wrap(buffer[start:stop].reshape(p.shape), p._device)


class DistributedSampler:
    """Indices of this rank's samples, batch by batch: each epoch draws one permutation of ``num_samples`` from
    ``seed`` and the epoch number (the same on every rank), cuts it into global batches of ``batch_size × size``,
    and rank r takes block r of each. The ranks' batches together are one process's batches of that global size;
    a last incomplete global batch is dropped, so every rank takes as many steps.

        sampler = DistributedSampler(len(x), batch_size=32, seed=0)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for index in sampler:
                step(of.tensor(x[index]), of.tensor(y[index]))
    """

    def __init__(self, num_samples: int, batch_size: int, comm: Communicator | None = None, shuffle: bool = True,
                 seed: int = 0):
        for name, value in (("num_samples", num_samples), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ArgumentError(f"DistributedSampler(): {name} must be an int >= 1, got {describe(value)}")
        self.comm = current_communicator() if comm is None else comm
        self.num_samples, self.batch_size = int(num_samples), int(batch_size)
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples // (self.batch_size * self.comm.size)

    def __iter__(self):
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples) if self.shuffle
                 else np.arange(self.num_samples))
        size, rank, b = self.comm.size, self.comm.rank, self.batch_size
        for step in range(len(self)):
            start = (step * size + rank) * b
            yield order[start:start + b]


def save(obj, path, comm: Communicator | None = None) -> None:
    """``of.save`` on rank 0 only (atomically: a crash leaves the previous checkpoint), then every rank waits for
    it, so a ``load`` right after reads the new file."""
    comm = current_communicator() if comm is None else comm
    error = None
    if comm.rank == 0:
        try:
            checkpoint.save(obj, path)
        except Exception as e:  # the others must not wait for ever: tell them, then raise
            error = e
    failed = comm.broadcast(np.array(error is not None), 0)
    if error is not None:
        raise error
    if failed:
        raise OpforgeError(f"distributed.save(): rank 0 could not write {path}")


def load(path, like=None):
    """``of.load`` on every rank (after the ``save`` that wrote the file, which every rank waited for)."""
    return checkpoint.load(path, like=like)


__all__ = ["DistributedDataParallel", "DistributedSampler", "load", "save"]
