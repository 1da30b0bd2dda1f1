"""Eager data parallelism: each rank trains a copy of the model on its shard of every batch.

``DistributedDataParallel(model)`` starts every rank from rank 0's parameters and, during ``backward()``, averages
the gradients over the ranks in *buckets*: as soon as every gradient of a bucket is final (the engine's
post-accumulate hooks say so), the bucket is flattened into one buffer and its all-reduce started without
blocking, while the backward pass goes on with the layers below; buckets start in one order on every rank. When
the backward pass ends (a callback the autograd engine runs then), the buckets still in flight are waited for and
each parameter gets its averaged gradient (a view into its bucket's buffer); a parameter that got no gradient is
an error naming it, or, with ``find_unused_parameters=True``, a zero gradient on that rank. Buckets follow the
parameters in reverse order — the order backward finalises them.

``DistributedSampler`` gives each rank its part of every batch of a seeded shuffle, so that the ranks' batches
together are exactly the batches one process would take with ``size`` times the batch size. ``save`` writes a
checkpoint once (rank 0, atomically) and ``load`` reads it on every rank after that write.
"""

from __future__ import annotations

import numpy as np

from .. import checkpoint
from ..autodiff.engine import queue_callback
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
    blocking (to measure what the overlap saves). Buckets are all-reduced in one order on every rank, whatever
    order their gradients arrive in.

    A parameter that gets no gradient in a backward pass (the forward did not use it) is an error at the end of
    that pass, naming it, as in PyTorch; with ``find_unused_parameters=True`` it counts as a zero gradient on that
    rank, so its gradient is the mean of the ranks that used it, and stays as it was (None after ``zero_grad()``)
    where no rank did — what one process would have. That costs one small all-reduce more per backward pass.
    """

    def __init__(self, module: Module, comm: Communicator | None = None, bucket_bytes: int = 25 << 20,
                 overlap: bool = True, find_unused_parameters: bool = False):
        super().__init__()
        if not isinstance(module, Module):
            raise ArgumentError(f"DistributedDataParallel(): expected a Module, got {describe(module)}")
        self.module = module
        object.__setattr__(self, "comm", current_communicator() if comm is None else comm)
        object.__setattr__(self, "overlap", bool(overlap))
        object.__setattr__(self, "find_unused_parameters", bool(find_unused_parameters))
        named = list(module.named_parameters())
        params = [p for _, p in named]
        object.__setattr__(self, "_names", {id(p): name for name, p in named})
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
        object.__setattr__(self, "_pending", [])  # started all-reduces, in bucket order
        object.__setattr__(self, "_got", set())  # id of each parameter whose gradient is final in this backward
        object.__setattr__(self, "_in_backward", False)  # whether this backward's end is awaited (queue_callback)
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
                lambda: Mesh(comm, batch_norm="local"))
        out = self.module(*args, **kwargs)
        if self.training and self.comm.size > 1 and not isinstance(interpreter, Tracer):
            self._average_buffers()
        return out

    def _average_buffers(self) -> None:
        """Batch normalisation computes each rank's statistics (as PyTorch's DistributedDataParallel); its running
        statistics are then made the mean of the ranks', one all-reduce for all of them, so that every rank keeps
        the same ones (PyTorch keeps rank 0's), as a step compiled under the model's mesh does."""
        buffers = [b for b in self.module.buffers() if b is not None and b._data.dtype.kind == "f"]
        if not buffers:
            return
        flat = self.comm.all_reduce(np.concatenate([b._data.reshape(-1) for b in buffers]), "mean")
        for b, start in zip(buffers, np.cumsum([0, *[b._data.size for b in buffers]])):
            b._device.copy_into(b._data, flat[start:start + b._data.size].reshape(b.shape))

    def _reset(self) -> None:
        for b in self.buckets:
            b.ready = 0
        self._pending.clear()
        self._got.clear()
        object.__setattr__(self, "_next", 0)  # the next bucket to start: buckets start in order
        object.__setattr__(self, "_in_backward", False)

    def _ready(self, p: Tensor) -> None:
        if not self._in_backward:  # the first gradient of this backward: look again when it ends
            object.__setattr__(self, "_in_backward", True)
            queue_callback(self._backward_ended)
        self._got.add(id(p))
        self._bucket_of[id(p)].ready += 1
        if self.overlap:
            self._start_ready_buckets()
            for _, request in self._pending:  # MPI moves a started collective on when it is called: poke it
                request.poke()

    def _start_ready_buckets(self) -> None:
        """Start the all-reduce of every complete bucket whose turn it is (a later bucket that completes first
        waits: ranks whose gradients arrive in other orders must still meet in the same collectives)."""
        while self._next < len(self.buckets) and self.buckets[self._next].complete:
            bucket = self.buckets[self._next]
            self._pending.append((bucket, self.comm.start_all_reduce(bucket.flatten(), "mean")))
            object.__setattr__(self, "_next", self._next + 1)

    def _backward_ended(self) -> None:
        missing = [p for b in self.buckets for p in b.params if id(p) not in self._got]
        if missing and not self.find_unused_parameters:
            for _, request in self._pending:  # the started ones, the same on every rank: leave MPI in order
                request.wait()
            self._reset()
            names = ", ".join(repr(self._names.get(id(p), tuple(p.shape))) for p in missing[:8])
            raise OpforgeError(
                f"DistributedDataParallel: {len(missing)} parameter(s) got no gradient in this backward pass: "
                f"{names}{' ...' if len(missing) > 8 else ''}. The forward did not use them, and their buckets would "
                "never be averaged: pass find_unused_parameters=True to average what each rank has (as PyTorch's "
                "DistributedDataParallel), or leave them out of the model")
        self.synchronize(missing)

    def synchronize(self, missing: list = ()) -> None:
        """Finish this backward's all-reduces and give each parameter its averaged gradient (run when the backward
        pass ends). ``missing``: parameters that got no gradient on this rank, counted as zeros."""
        for p in missing:
            self._bucket_of[id(p)].ready += 1
        if self.find_unused_parameters:
            before = {id(p): p._grad for p in missing}
        self._start_ready_buckets()
        if self.find_unused_parameters:  # which parameters some rank used: one flag each
            used = self.comm.all_reduce(np.array([id(p) in self._got for b in self.buckets for p in b.params],
                                                 dtype=np.int32))
        for bucket, request in self._pending:
            bucket.unflatten(request.wait())
        if self.find_unused_parameters:
            for p, count in zip((p for b in self.buckets for p in b.params), used):
                if not count:  # no rank used it: its gradient is what it was, as in one process
                    p._grad = before[id(p)]
        self._reset()


class _Bucket:
    def __init__(self, params: list):
        self.params = params
        self.ready = 0
        sizes = [p._data.size for p in params]
        self.offsets = np.cumsum([0, *sizes])
        self.buffer = None

    @property
    def complete(self) -> bool:
        return self.ready == len(self.params)

    def flatten(self):
        """The parameters' gradients, one after the other in one new buffer (the next step's backward may still
        read this step's gradients); zeros for a parameter that has none (unused on this rank)."""
        grads = [None if p.grad is None else p.grad._data for p in self.params]
        dtype = np.result_type(*[p._data.dtype if g is None else g.dtype for p, g in zip(self.params, grads)])
        self.buffer = np.empty(int(self.offsets[-1]), dtype=dtype)
        for g, start, stop in zip(grads, self.offsets[:-1], self.offsets[1:]):
            self.buffer[start:stop] = 0 if g is None else g.reshape(-1)
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
