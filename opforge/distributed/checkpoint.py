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
import math
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


def save_sharded(values, path, layouts: dict | None = None, comm=None) -> None:
    """Write a sharded checkpoint to directory ``path``; every rank of ``comm`` calls it.

    ``values``: {name: this rank's part (a Tensor or array)} with ``layouts`` {name: layout} (``B`` where not
    given: the same whole value on every rank; ``S(k)``: this rank's block along axis k; on an n-D mesh, a tuple
    with a layout per axis), or a ``Program`` that ``shard()`` made, whose persistable values and their layouts are
    taken. ``comm``: the communicator (the current one by default), or the n-D ``Mesh``. Partial values are
    refused."""
    world, groups = _groups(comm)
    program = values if isinstance(values, Program) else None
    if program is not None and getattr(program, "mesh_groups", None):
        world, groups = world, list(program.mesh_groups)
    values, layouts = _parts(values, layouts, len(groups))
    path = os.fspath(path)
    rank = world.rank
    names = sorted(values)
    ranges = [_range(values[k].shape, layouts[k], groups) for k in names]
    everyone = world.all_gather(np.array([[v for a, b in ranges for v in (*a, *b)]], np.int64), 0)
    entries, mine = {}, {}
    for i, (name, (starts, _)) in enumerate(zip(names, ranges)):
        offset = sum(2 * len(a) for a, _ in ranges[:i])
        theirs = [tuple(row[offset:offset + 2 * len(starts)]) for row in everyone]  # every rank's range of it
        writers = [r for r, got in enumerate(theirs) if got not in theirs[:r]]  # one rank per distinct block
        ndim = len(starts)
        entries[name] = {"shape": [int(max(t[ndim + d] for t in theirs)) for d in range(ndim)],
                         "dtype": values[name].dtype.name, "layout": _text(layouts[name]), "member": f"v{i}",
                         "blocks": [{"file": r, "starts": [int(v) for v in theirs[r][:ndim]],
                                     "stops": [int(v) for v in theirs[r][ndim:]]} for r in writers]}
        if rank in writers:
            mine[f"v{i}"] = values[name]
    _same_on_every_rank(world, entries)
    error, name = None, ""
    if rank == 0:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            error = e
    world.barrier()  # the directory exists (or rank 0 says below that it does not)
    if error is None:
        try:
            name, _ = write_uniquely_named(path, f"rank{rank}", ".npz", lambda f: write_npz(f, mine))
        except Exception as e:  # the others must not wait for ever: say so, then raise
            error = e
    files = _exchange_names(world, name, error)
    if rank == 0 and None not in files:
        try:
            _commit(path, files, entries, world.size)
        except Exception as e:
            error = e
    committed = world.broadcast(np.array(rank != 0 or (error is None and None not in files)), 0)
    if not committed:
        with contextlib.suppress(OSError):
            if name:
                os.unlink(os.path.join(path, name))
        if error is not None:
            raise error
        failed = [r for r, got in enumerate(files) if got is None] or [0]
        raise ShardedCheckpointError(f"save_sharded(): rank(s) {failed} could not write their part of {path!r}; "
                                     "the previous checkpoint there is unchanged")


def _groups(comm) -> tuple:
    """(the communicator of every rank, the communicator of each mesh axis) for ``comm``: a Communicator (one axis),
    a Mesh, or None (the current communicator)."""
    from .sharding import Mesh

    if isinstance(comm, Mesh):
        return comm.comm, [axis.comm for axis in comm.axes]
    comm = current_communicator() if comm is None else comm
    if not isinstance(comm, Communicator):
        raise ArgumentError(f"expected a Communicator or a Mesh, got {describe(comm)}")
    return comm, [comm]


def _range(shape: tuple, layouts: tuple, groups: list) -> tuple:
    """(starts, stops) of this rank's block, of shape ``shape``, in the whole value: the passes split the last mesh
    axis first (see ``shard()``), so the block of axis k is taken within that of the axes after it."""
    starts, stops = [0] * len(shape), list(shape)
    for layout, group in zip(layouts, groups):  # the whole's dims: the block's times each split
        if layout.split:
            stops[layout.axis] *= group.size
    for layout, group in reversed(list(zip(layouts, groups))):
        if layout.split:
            size = (stops[layout.axis] - starts[layout.axis]) // group.size
            starts[layout.axis] += group.rank * size
            stops[layout.axis] = starts[layout.axis] + size
    return starts, stops


def _text(layouts: tuple) -> str:
    return str(layouts[0]) if len(layouts) == 1 else f"({', '.join(map(str, layouts))})"


def _parts(values, layouts, axes: int) -> tuple:
    """({name: host array}, {name: a Layout per mesh axis}) of what ``save_sharded`` is given."""
    if isinstance(values, Program):
        program = values
        if layouts is None:
            layouts = dict(getattr(program, "nd_layouts", None) or getattr(program, "layouts", {}))
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
        out[name] = array
        laid[name] = _layouts((layouts or {}).get(name, (B,) * axes), axes, array.ndim, f"save_sharded(): {name!r}")
    return out, laid


def _layouts(given, axes: int, ndim: int, who: str) -> tuple:
    """A layout per mesh axis, each checked against a value of ``ndim`` dims."""
    given = tuple(given) if isinstance(given, (tuple, list)) else (given,)
    if len(given) != axes:
        raise ArgumentError(f"{who}: give a layout per mesh axis ({axes}), got {given}")
    out = []
    for layout in given:
        layout = as_layout(layout, f"{who}: layout")
        if layout.partial:
            raise ArgumentError(f"{who} is partial ({layout}): reduce it first (its whole value is the sum over "
                                "the ranks)")
        if layout.split and ndim == 0:
            raise ArgumentError(f"{who} is a scalar and cannot be split ({layout})")
        out.append(normalized(layout, max(ndim, 1)))
    return tuple(out)


def _same_on_every_rank(comm: Communicator, entries: dict) -> None:
    described = json.dumps({k: {f: v for f, v in e.items() if f != "blocks"} for k, e in entries.items()},
                           sort_keys=True).encode()
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


def load_sharded(path, layouts: dict | None = None, comm=None, into=None) -> dict:
    """{name: this rank's part} of every value in the sharded checkpoint at ``path`` (of those ``layouts`` names, if
    given), laid out over ``comm`` (the current communicator, or an n-D ``Mesh``) as ``layouts`` says (a layout per
    value, a tuple per value on an n-D mesh), by default as saved (``S(k)`` split among the ranks there are now,
    whatever their number when it was written; ``B`` whole). ``into``: a ``Program`` that ``shard()`` made, whose
    persistable values are replaced by their parts, each in the program's layout for it (its mesh's, for an n-D
    one)."""
    _, groups = _groups(comm)
    path = os.fspath(path)
    doc = _manifest(path)
    saved = doc["values"]
    wanted = dict(layouts or {})
    if into is not None:
        if not isinstance(into, Program):
            raise ArgumentError(f"load_sharded(): into= takes a Program, got {describe(into)}")
        if getattr(into, "mesh_groups", None):
            groups = list(into.mesh_groups)
        laid = getattr(into, "nd_layouts", None) or getattr(into, "layouts", {})
        names = [k for k in into.values if into.block.vars[k].persistable]
        missing = [k for k in names if k not in saved]
        if missing:
            raise ShardedCheckpointError(f"load_sharded(): the checkpoint {path!r} has no {missing}")
        wanted = {k: laid.get(k, (B,) * len(groups)) for k in names} | wanted
    unknown = sorted(set(wanted) - set(saved))
    if unknown:
        raise ShardedCheckpointError(f"load_sharded(): the checkpoint {path!r} has no {unknown}")
    readers: dict = {}
    out = {}
    try:
        for name in wanted if into is not None or layouts else saved:
            entry = saved[name]
            given = wanted.get(name)
            if given is None:
                if entry["layout"].startswith("(") and set(entry["layout"][1:-1].split(", ")) == {"B"}:
                    given = "B"
                elif entry["layout"].startswith("("):
                    raise ShardedCheckpointError(f"load_sharded(): {name!r} was saved over an n-D mesh, "
                                                 f"{entry['layout']}: say how to lay it out here (layouts= or into=)")
                else:
                    given = entry["layout"]
            shape = [int(d) for d in entry["shape"]]
            laid_out = _layouts(given, len(groups), len(shape), f"load_sharded(): {name!r}")
            out[name] = _block(path, doc, name, entry, _target(name, shape, laid_out, groups), readers)
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


def _target(name: str, shape: list, layouts: tuple, groups: list) -> tuple:
    """(starts, stops) of this rank's block of a whole value of ``shape`` laid out as ``layouts``."""
    block = list(shape)
    for layout, group in zip(layouts, groups):
        if layout.split:
            if block[layout.axis] % group.size:
                raise ShardedCheckpointError(
                    f"load_sharded(): {name!r} of shape {tuple(shape)} does not split into {group.size} equal blocks "
                    f"along axis {layout.axis}: load it with another layout (layouts={{{name!r}: B}})")
            block[layout.axis] //= group.size
    return _range(tuple(block), layouts, groups)


def _block(path, doc, name, entry, where, readers) -> np.ndarray:
    """The part ``where`` (starts, stops) of value ``name``: the overlaps of the saved blocks with it."""
    starts, stops = where
    out = np.empty([b - a for a, b in zip(starts, stops)], _dtype(entry["dtype"]))
    filled = 0
    for block in entry["blocks"]:
        lo = [max(a, b) for a, b in zip(starts, block["starts"])]
        hi = [min(a, b) for a, b in zip(stops, block["stops"])]
        if any(a >= b for a, b in zip(lo, hi)):
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
        filled += math.prod(b - a for a, b in zip(lo, hi))
    if filled != out.size:
        raise ShardedCheckpointError(f"load_sharded(): the blocks of {name!r} in {path!r} do not cover it")
    return out


def _dtype(text: str):
    return D.bfloat16 if text == "bfloat16" else np.dtype(text)


__all__ = ["ShardedCheckpointError", "load_sharded", "save_sharded"]
