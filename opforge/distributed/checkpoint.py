"""Sharded checkpoints: each rank writes the blocks it holds, with the global layout; loading reshards them onto
another number of ranks or other layouts (what PyTorch's distributed checkpoint does).

A checkpoint is a directory. Each rank writes one ``.npz`` of its blocks (a split value's block; a broadcast value
is written by rank 0 alone) under a name no other save uses, then rank 0 writes ``manifest.json``: for every value
its whole shape, dtype and layout, and which file holds which block (its index range in the whole value). The
manifest is written last, atomically (``of.save``'s temporary file, fsync and rename), so it is the commit: a save
that fails or dies on any rank leaves the previous manifest, which names the previous files, untouched; the files
the previous manifest named are removed only after the new one is in place.

Loading reads the manifest and, for the layout each value is asked for on the current communicator (by default the
saved one: ``S(k)`` split among however many ranks there are now, ``B`` whole), copies into each rank's block the
parts of the saved blocks that overlap it, reading only the files that hold them. Every rank must see the
directory: a shared file system, or the files copied to each host (rank 0 checks it sees every rank's file).
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib

import numpy as np

from ..core import dtypes as D
from ..core.errors import ArgumentError, OpforgeError, describe
from ..core.files import NpzReader, atomic_write, write_npz, write_uniquely_named
from ..core.sbp import B, as_layout, normalized
from ..program.desc import Program
from ..tensor import Tensor
from .comm import Communicator, current_communicator

FORMAT = "opforge.sharded_checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
NAME_BYTES = 128  # a rank's file name, as the ranks exchange it (rank<r>.<16 hex digits>.npz)


class ShardedCheckpointError(OpforgeError, ValueError):
    """A sharded checkpoint that cannot be written or read as asked."""


def save_sharded(values, path, layouts: dict | None = None, comm: Communicator | None = None) -> None:
    """Write a sharded checkpoint to directory ``path``; every rank of ``comm`` (the current communicator) calls it.

    ``values``: {name: this rank's part (a Tensor or array)} with ``layouts`` {name: layout} (``B`` where not
    given: the same whole value on every rank; ``S(k)``: this rank's block along axis k), or a ``Program`` that
    ``shard()`` made, whose persistable values and their layouts are taken. Partial values are refused."""
    comm = current_communicator() if comm is None else comm
    values, layouts = _parts(values, layouts)
    path = os.fspath(path)
    n, rank = comm.size, comm.rank
    entries, mine = {}, {}
    for i, (name, value) in enumerate(sorted(values.items())):
        layout = layouts[name]
        whole = list(value.shape)
        if layout.split:
            whole[layout.axis] *= n
        entries[name] = {"shape": whole, "dtype": value.dtype.name,
                         "layout": str(layout), "member": f"v{i}"}
        if layout.split or rank == 0:
            mine[f"v{i}"] = value
    _same_on_every_rank(comm, entries)
    error, name = None, ""
    if rank == 0:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            error = e
    comm.barrier()  # the directory exists (or rank 0 says below that it does not)
    if error is None:
        try:
            name, _ = write_uniquely_named(path, f"rank{rank}", ".npz", lambda f: write_npz(f, mine))
        except Exception as e:  # the others must not wait for ever: say so, then raise
            error = e
    names = _exchange_names(comm, name, error)
    if rank == 0 and None not in names:
        try:
            _commit(path, names, entries, n)
        except Exception as e:
            error = e
    committed = comm.broadcast(np.array(rank != 0 or (error is None and None not in names)), 0)
    if not committed:
        with contextlib.suppress(OSError):
            if name:
                os.unlink(os.path.join(path, name))
        if error is not None:
            raise error
        failed = [r for r, got in enumerate(names) if got is None] or [0]
        raise ShardedCheckpointError(f"save_sharded(): rank(s) {failed} could not write their part of {path!r}; "
                                     "the previous checkpoint there is unchanged")


def _parts(values, layouts) -> tuple:
    """({name: host array}, {name: Layout}) of what ``save_sharded`` is given."""
    if isinstance(values, Program):
        program = values
        layouts = dict(getattr(program, "layouts", {})) if layouts is None else layouts
        values = {k: program.device.to_host(v) for k, v in program.values.items()
                  if program.block.vars[k].persistable}
    if not isinstance(values, dict):
        raise ArgumentError(f"save_sharded(): expected a dict of arrays or a Program, got {describe(values)}")
    out, laid = {}, {}
    for name, value in values.items():
        if not isinstance(name, str):
            raise ArgumentError(f"save_sharded(): names must be str, got {describe(name)}")
        array = value._device.to_host(value._data) if isinstance(value, Tensor) else np.asarray(value)
        if array.dtype.hasobject:
            raise ArgumentError(f"save_sharded(): {name!r} holds Python objects (dtype object)")
        layout = normalized(as_layout((layouts or {}).get(name, B), f"save_sharded(): layout of {name!r}"),
                            max(array.ndim, 1))
        if layout.partial:
            raise ArgumentError(f"save_sharded(): {name!r} is partial ({layout}): reduce it first (its whole value "
                                "is the sum over the ranks)")
        if layout.split and array.ndim == 0:
            raise ArgumentError(f"save_sharded(): {name!r} is a scalar and cannot be split ({layout})")
        out[name], laid[name] = array, layout
    return out, laid


def _same_on_every_rank(comm: Communicator, entries: dict) -> None:
    described = json.dumps(entries, sort_keys=True).encode()
    everyone = comm.all_gather(np.array([zlib.crc32(described)], np.int64), 0)
    if (everyone != everyone[0]).any():
        raise ShardedCheckpointError(
            "save_sharded(): the ranks describe different values (names, layouts, whole shapes or dtypes differ): "
            "every rank passes its part of the same values, blocks of one size")


def _exchange_names(comm: Communicator, name: str, error) -> list:
    """Every rank's file name, None for a rank that failed."""
    mine = np.zeros(NAME_BYTES, np.uint8)
    if error is None:
        encoded = name.encode()
        mine[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    everyone = comm.all_gather(mine[None], 0)
    return [bytes(row).rstrip(b"\0").decode() or None for row in everyone]


def _commit(path: str, names: list, entries: dict, n: int) -> None:
    """Rank 0: check every rank's file is here, write the manifest (the commit), then remove what the previous one
    named."""
    missing = [r for r, name in enumerate(names) if not os.path.exists(os.path.join(path, name))]
    if missing:
        raise ShardedCheckpointError(
            f"save_sharded(): rank 0 does not see the file(s) rank(s) {missing} wrote in {path!r}: a sharded "
            "checkpoint needs a directory every rank shares (a shared file system); without one, copy the ranks' "
            "files into one directory, or write a whole checkpoint with of.distributed.save")
    previous = []
    with contextlib.suppress(OSError, ValueError, ShardedCheckpointError):
        previous = _manifest(path)["files"]
    for entry in entries.values():
        layout = as_layout(entry["layout"], "")
        blocks = []
        for r in range(n) if layout.split else [0]:
            starts, stops = [0] * len(entry["shape"]), list(entry["shape"])
            if layout.split:
                size = entry["shape"][layout.axis] // n
                starts[layout.axis], stops[layout.axis] = r * size, (r + 1) * size
            blocks.append({"file": r, "starts": starts, "stops": stops})
        entry["blocks"] = blocks
    doc = {"format": FORMAT, "version": VERSION, "ranks": n, "files": names, "values": entries}
    atomic_write(os.path.join(path, MANIFEST), lambda f: f.write(json.dumps(doc, indent=1).encode()))
    for old in set(previous) - set(names):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, os.path.basename(old)))


def _manifest(path: str) -> dict:
    where = os.path.join(path, MANIFEST)
    try:
        with open(where, "rb") as f:
            doc = json.loads(f.read().decode())
    except FileNotFoundError:
        raise ShardedCheckpointError(f"load_sharded(): no sharded checkpoint at {path!r} (no {MANIFEST})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("values"), dict):
        raise ShardedCheckpointError(f"load_sharded(): {where!r} is not a sharded checkpoint's manifest")
    if doc.get("version") != VERSION:
        raise ShardedCheckpointError(f"load_sharded(): {where!r} has version {doc.get('version')!r}; this opforge "
                                     f"reads version {VERSION}")
    return doc


def load_sharded(path, layouts: dict | None = None, comm: Communicator | None = None, into=None) -> dict:
    """{name: this rank's part} of every value in the sharded checkpoint at ``path``, laid out over ``comm`` (the
    current communicator) as ``layouts`` says, by default as saved (``S(k)`` split among the ranks there are now,
    whatever their number when it was written; ``B`` whole). ``into``: a ``Program`` that ``shard()`` made, whose
    persistable values are replaced by their parts, each in the program's layout for it."""
    comm = current_communicator() if comm is None else comm
    path = os.fspath(path)
    doc = _manifest(path)
    saved = doc["values"]
    wanted = dict(layouts or {})
    if into is not None:
        if not isinstance(into, Program):
            raise ArgumentError(f"load_sharded(): into= takes a Program, got {describe(into)}")
        names = [k for k in into.values if into.block.vars[k].persistable]
        missing = [k for k in names if k not in saved]
        if missing:
            raise ShardedCheckpointError(f"load_sharded(): the checkpoint {path!r} has no {missing}")
        wanted = {k: getattr(into, "layouts", {}).get(k, B) for k in names} | wanted
    unknown = sorted(set(wanted) - set(saved))
    if unknown:
        raise ShardedCheckpointError(f"load_sharded(): the checkpoint {path!r} has no {unknown}")
    readers: dict = {}
    out = {}
    try:
        for name in wanted if into is not None else saved:
            entry = saved[name]
            layout = as_layout(wanted.get(name, entry["layout"]), f"load_sharded(): layout of {name!r}")
            out[name] = _block(path, doc, name, entry, layout, comm, readers)
    finally:
        for reader in readers.values():
            reader.close()
    if into is not None:
        for name, value in out.items():
            spec = into.block.vars[name].spec
            if tuple(value.shape) != tuple(spec.shape):
                raise ShardedCheckpointError(f"load_sharded(): {name!r} of the checkpoint gives this rank a block of "
                                             f"shape {value.shape}, the program holds {tuple(spec.shape)}")
            into.values[name] = into.device.from_host(value.astype(spec.dtype, copy=False))
    return out


def _block(path, doc, name, entry, layout, comm, readers) -> np.ndarray:
    """This rank's part of value ``name`` under ``layout``: the overlaps of the saved blocks with it."""
    shape = [int(d) for d in entry["shape"]]
    layout = normalized(layout, max(len(shape), 1))
    if layout.partial:
        raise ArgumentError(f"load_sharded(): {name!r} cannot be loaded as a partial value ({layout})")
    starts, stops = [0] * len(shape), list(shape)
    if layout.split:
        d = shape[layout.axis]
        if d % comm.size:
            raise ShardedCheckpointError(f"load_sharded(): {name!r} of shape {tuple(shape)} does not split into "
                                         f"{comm.size} equal blocks along axis {layout.axis}: load it with another "
                                         f"layout (layouts={{{name!r}: B}})")
        size = d // comm.size
        starts[layout.axis], stops[layout.axis] = comm.rank * size, (comm.rank + 1) * size
    dtype = _dtype(entry["dtype"])
    out = np.empty([b - a for a, b in zip(starts, stops)], dtype)
    filled = 0
    for block in entry["blocks"]:
        lo = [max(a, b) for a, b in zip(starts, block["starts"])]
        hi = [min(a, b) for a, b in zip(stops, block["stops"])]
        if any(a >= b for a, b in zip(lo, hi)) and shape:
            continue
        file = doc["files"][block["file"]]
        if file not in readers:
            readers[file] = NpzReader(os.path.join(path, os.path.basename(file)))
        part = readers[file].read(entry["member"])
        if list(part.shape) != [b - a for a, b in zip(block["starts"], block["stops"])]:
            raise ShardedCheckpointError(f"load_sharded(): {file!r} holds {name!r} as shape {part.shape}, the "
                                         "manifest says otherwise")
        source = tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, block["starts"]))
        target = tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, starts))
        out[target] = part[source]
        filled += int(np.prod([b - a for a, b in zip(lo, hi)]))
    if filled != out.size:
        raise ShardedCheckpointError(f"load_sharded(): the blocks of {name!r} in {path!r} do not cover it")
    return out


def _dtype(text: str):
    return D.bfloat16 if text == "bfloat16" else np.dtype(text)


__all__ = ["ShardedCheckpointError", "load_sharded", "save_sharded"]
