"""Checkpoints: ``save(obj, path)`` and ``load(path, like=None)`` for (nested) state dicts.

What can be saved: dicts (str or int keys), lists and tuples of Tensors, NumPy arrays and scalars, Python numbers,
bools, strings and None — a model's ``state_dict()``, an optimizer's, or a dict holding both and an epoch count.

The format is an ordinary ``.npz`` (a zip of ``.npy`` files, NumPy's own format): one member per array, plus a
JSON manifest (stored as a uint8 array, member ``__opforge_manifest__``) that holds the nesting and the non-array
values. Nothing is pickled: saving an object array is refused, and loading refuses members that would need pickle,
so a checkpoint from elsewhere cannot run code. Nor is anything else in the file trusted: the manifest is checked
entry by entry, and each array's header against the bytes the file really holds before anything is allocated.
``np.load(path)`` reads the arrays without opforge.

A save is atomic: the file is written under a temporary name in the same directory, flushed and fsync'ed, then
renamed over ``path`` (``os.replace``, atomic on POSIX and Windows), and the directory is fsync'ed so the rename
itself survives a power cut. A save that dies half-way (an exception, a kill, a crash) leaves the previous
checkpoint at ``path`` as it was; at worst a ``.<name>.*.tmp`` file remains beside it.

``load(path, like=expected)`` checks the saved structure against an expected one (say ``model.state_dict()``) and
raises ``StateDictError`` listing every missing, unexpected and mis-shaped or mis-typed entry by name.

**File objects and safetensors.** ``path`` may be an open binary file (``io.BytesIO``, ``open(p, "wb")``) instead of a
name, as torch's ``save``/``load`` take. A path ending in ``.safetensors`` (or ``format="safetensors"``) is written
in the safetensors format (the ``safetensors`` package), which model hubs publish weights in, for a flat dict of
names to tensors (a state dict); ``load`` reads one whatever its name, so a state dict published by PyTorch code
(``safetensors.torch.save_file``) loads without torch. Like the checkpoint format, safetensors holds arrays and a
JSON header only: loading executes nothing. A PyTorch pickle checkpoint (``torch.save``'s ``.pt``/``.pth``) is
refused, naming why: reading it means running pickle.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from .core import dtypes as D
from .core.errors import ArgumentError, OpforgeError, describe
from .core.files import NpzReader, atomic_write, write_npz
from .tensor import Tensor, wrap

FORMAT = "opforge.checkpoint"
VERSION = 1
MANIFEST = "__opforge_manifest__"
MAX_DEPTH = 100  # nesting of containers a checkpoint may hold (a state dict has a handful)


class CheckpointError(OpforgeError, ValueError):
    """A file that is not a readable opforge checkpoint (missing, truncated, foreign, or holding pickled data)."""


class StateDictError(OpforgeError, ValueError):
    """A state dict that does not fit what it is loaded into; the message lists each entry that does not."""


# -- save -------------------------------------------------------------------------------------------------------------

def save(obj, path, format: str | None = None) -> None:
    """Write ``obj`` (a nested state dict) to ``path`` (a file name, written atomically, or an open binary file);
    ``format`` "safetensors" (the default for a name ending in ``.safetensors``) writes a flat dict of tensors in
    that format. See the module docstring."""
    if not hasattr(path, "write"):
        path = os.fspath(path)
    if format is None:
        format = "safetensors" if isinstance(path, str) and path.endswith(".safetensors") else "opforge"
    if format not in ("opforge", "safetensors"):
        raise ArgumentError(f"save(): format must be 'opforge' or 'safetensors', got {format!r}")
    if format == "safetensors":
        data = _safetensors_bytes(obj)
        if hasattr(path, "write"):
            path.write(data)
        else:
            atomic_write(path, lambda f: f.write(data))
        return
    arrays: dict = {}
    tree = _encode(obj, "", arrays, 0)
    manifest = json.dumps({"format": FORMAT, "version": VERSION, "tree": tree}).encode()
    arrays[MANIFEST] = np.frombuffer(manifest, dtype=np.uint8)
    if hasattr(path, "write"):
        write_npz(path, arrays)
    else:
        atomic_write(path, lambda f: write_npz(f, arrays))


def _safetensors_bytes(obj) -> bytes:
    """A flat {name: Tensor or array} dict in the safetensors format."""
    from safetensors.numpy import save as save_safetensors

    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, (Tensor, np.ndarray))
                                            for k, v in obj.items()):
        raise ArgumentError(f"save(): the safetensors format holds a flat dict of names to tensors (a state dict), "
                            f"got {describe(obj)}")
    return save_safetensors({k: np.ascontiguousarray(v._device.to_host(v._data) if isinstance(v, Tensor) else v)
                             for k, v in obj.items()})


def _join(path: str, key) -> str:
    return f"{path}/{key}" if path else str(key)


def _encode(obj, path: str, arrays: dict, depth: int):
    """The JSON form of ``obj``: containers become one-key dicts ({"dict": ...}, {"list": ...}, ...), arrays become
    references to npz members, and numbers, bools, strings and None stay as they are."""
    if isinstance(obj, (Tensor, np.ndarray, np.generic)):
        array = obj._device.to_host(obj._data) if isinstance(obj, Tensor) else np.asarray(obj)
        if array.dtype.hasobject:
            raise ArgumentError(f"save(): the array at {path or 'the top'!r} holds Python objects (dtype object); "
                                "only numeric, bool and string arrays can be saved without pickle")
        key = f"a{len(arrays)}"
        arrays[key] = array
        kind = "tensor" if isinstance(obj, Tensor) else "array" if isinstance(obj, np.ndarray) else "scalar"
        return {kind: key}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (dict, list, tuple)) and depth > MAX_DEPTH:
        raise ArgumentError(f"save(): containers nest deeper than {MAX_DEPTH} levels at {path[:80]!r}... "
                            "(a container holding itself?)")
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise ArgumentError(f"save(): dict keys must be str or int, got {describe(k)} at {path or 'the top'!r}")
            items.append([k, _encode(v, _join(path, k), arrays, depth + 1)])
        return {"dict": items}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {kind: [_encode(v, _join(path, i), arrays, depth + 1) for i, v in enumerate(obj)]}
    raise ArgumentError(f"save(): cannot save {describe(obj)} at {path or 'the top'!r}: a checkpoint holds dicts, "
                        "lists, tuples, Tensors, arrays, numbers, bools, strings and None")


# -- load -------------------------------------------------------------------------------------------------------------

def load(path, like=None, *, map_location=None, weights_only=None, mmap=None):
    """Read a checkpoint written by ``save``, or a safetensors file, from a file name or an open binary file. Arrays
    come back as they went in (Tensors as Tensors, arrays as arrays), as do tuples, int keys and non-array values;
    a safetensors file gives a dict of Tensors. ``map_location`` (a device) puts the Tensors there; torch's
    ``weights_only`` and ``mmap`` are accepted (nothing here ever runs code or maps memory).

    With ``like`` (an expected structure, e.g. ``model.state_dict()``), every name, shape and dtype is checked
    first, and a ``StateDictError`` lists each entry that is missing, unexpected or different.

    The file is not trusted: the manifest's structure is checked entry by entry, each array's header is checked
    against the bytes the file really holds before anything is allocated (see ``NpzReader``), and every
    failure is a ``CheckpointError`` saying what is wrong.
    """
    source = path
    if hasattr(path, "read"):
        source, path = io.BytesIO(path.read()), getattr(path, "name", "<file object>")
        if not isinstance(path, str):
            path = "<file object>"
    else:
        path = source = os.fspath(path)
    try:
        if isinstance(source, str):
            with open(source, "rb") as f:
                head = f.read(9)
        else:
            head = source.getvalue()[:9]
        if _is_safetensors(head):
            obj = _load_safetensors(source, path)
            return _placed(_checked(obj, like, path), map_location)
        head = head[:6]
        if not head.startswith((b"PK", b"\x93NUMPY")):  # neither a zip (.npz) nor a .npy
            what = "JSON (a program saved with Program.save is read with of.Program.load)" \
                if head.lstrip()[:1] == b"{" else f"a file starting with {head!r}"
            raise CheckpointError(f"load(): {path!r} is not an opforge checkpoint (a .npz archive written by "
                                  f"of.save): it is {what}")
        if head == b"\x93NUMPY":
            raise CheckpointError(f"load(): {path!r} is a single .npy array, not an opforge checkpoint")
        _refuse_pickle(source, path)
        with NpzReader(source) as archive:
            if MANIFEST not in archive:
                raise CheckpointError(f"load(): {path!r} is not an opforge checkpoint (it has no manifest)")
            shape, dtype = archive.header(MANIFEST)
            if dtype != np.uint8 or len(shape) != 1:
                raise CheckpointError(f"load(): {path!r} has a manifest of shape {shape} and dtype {dtype}, "
                                      "not a 1-d uint8 array")
            doc = json.loads(archive.read(MANIFEST).tobytes().decode())
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise CheckpointError(f"load(): {path!r} is not an opforge checkpoint (format tag "
                                      f"{describe(doc.get('format') if isinstance(doc, dict) else doc)})")
            version = doc.get("version")
            if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
                shown = version if isinstance(version, int) else describe(version)
                raise CheckpointError(f"load(): {path!r} has format version {shown}; this opforge reads versions "
                                      f"up to {VERSION}")
            obj = _decode(doc.get("tree"), archive, path, 0)
    except FileNotFoundError:
        raise CheckpointError(f"load(): no checkpoint at {path!r}") from None
    except OpforgeError as e:
        if isinstance(e, (CheckpointError, StateDictError)):
            raise
        raise CheckpointError(f"load(): {path!r} is not a readable checkpoint: {e}") from None
    except RecursionError:
        raise CheckpointError(f"load(): {path!r} has a manifest nested too deeply to read") from None
    except (OSError, ValueError) as e:  # an unreadable file; JSON or UTF-8 that does not decode
        raise CheckpointError(f"load(): {path!r} is not a readable checkpoint: {type(e).__name__}: {e}") from None
    return _placed(_checked(obj, like, path), map_location)


def _checked(obj, like, path):
    if like is not None:
        problems = diff_structure(like, obj)
        if problems:
            raise StateDictError(f"load(): the checkpoint {path!r} does not match the expected structure:\n  "
                                 + "\n  ".join(problems))
    return obj


def _placed(obj, device):
    """The Tensors of ``obj`` on ``device`` (torch's ``map_location``): a device or its name."""
    if device is None:
        return obj
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _placed(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_placed(v, device) for v in obj)
    return obj


def _is_safetensors(head: bytes) -> bool:
    """The safetensors layout: a little-endian u64 header length, then the JSON header."""
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < 100_000_000


def _load_safetensors(source, path: str) -> dict:
    from safetensors import SafetensorError
    from safetensors.numpy import load as load_safetensors

    if isinstance(source, io.BytesIO):
        data = source.getvalue()
    else:
        with open(source, "rb") as f:
            data = f.read()
    try:
        arrays = load_safetensors(data)
    except (SafetensorError, ValueError, TypeError) as e:  # a header the format refuses
        raise CheckpointError(f"load(): {path!r} is not a readable safetensors file: {e}") from None
    out = {}
    for name, array in arrays.items():
        D.as_dtype(array.dtype, op="load", arg=name)  # a dtype Tensors support
        out[name] = wrap(np.array(array))  # a copy that owns its memory (the loader's may be read-only)
    return out


def _refuse_pickle(source, path: str) -> None:
    """A zip holding ``data.pkl`` is torch.save's checkpoint: say why it is not read rather than which member."""
    import zipfile

    try:
        with zipfile.ZipFile(source) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, NotImplementedError, ValueError, EOFError):
        return  # NpzReader says what is wrong (a damaged zip: a bad header, an unknown zip version, a short file)
    finally:
        if not isinstance(source, str):
            source.seek(0)
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        raise CheckpointError(f"load(): {path!r} is a PyTorch pickle checkpoint (torch.save): reading it would run "
                              "pickle, which can execute code, so opforge does not; save the state dict with "
                              "safetensors (safetensors.torch.save_file) and load that")


def _decode(node, archive, path: str, depth: int):
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    where = f"load(): {path!r} has a malformed manifest entry {describe(node)}"
    if depth > MAX_DEPTH:
        raise CheckpointError(f"load(): {path!r} has a manifest nested deeper than {MAX_DEPTH} levels")
    if not isinstance(node, dict) or len(node) != 1:
        raise CheckpointError(f"{where}: expected a value or a one-key dict")
    ((kind, payload),) = node.items()
    if kind in ("tensor", "array", "scalar"):
        if not isinstance(payload, str) or payload == MANIFEST or payload not in archive:
            raise CheckpointError(f"{where}: {describe(payload)} names no array of the file")
        array = archive.read(payload)
        if kind == "array":
            return array
        if kind == "scalar":
            if array.ndim:
                raise CheckpointError(f"{where}: a scalar of shape {array.shape}")
            return array[()]
        D.as_dtype(array.dtype, op="load", arg=payload)  # a dtype Tensors support
        return wrap(array)
    if kind == "dict":
        if not isinstance(payload, list) or not all(isinstance(item, list) and len(item) == 2 for item in payload):
            raise CheckpointError(f"{where}: a dict must hold a list of [key, value] pairs")
        out = {}
        for key, value in payload:
            if isinstance(key, bool) or not isinstance(key, (str, int)) or key in out:
                raise CheckpointError(f"{where}: key {describe(key)} is not a str or int, or is repeated")
            out[key] = _decode(value, archive, path, depth + 1)
        return out
    if kind in ("list", "tuple"):
        if not isinstance(payload, list):
            raise CheckpointError(f"{where}: a {kind} must hold a list")
        items = [_decode(v, archive, path, depth + 1) for v in payload]
        return items if kind == "list" else tuple(items)
    raise CheckpointError(f"load(): {path!r} has a manifest entry of unknown kind {describe(kind)}")


# -- comparing structures ---------------------------------------------------------------------------------------------

def _kind(value) -> str:
    if isinstance(value, (Tensor, np.ndarray, np.generic)):
        return "array"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _describe_leaf(value) -> str:
    if _kind(value) == "array":
        return f"shape {tuple(value.shape)} and dtype {value.dtype}"  # (.shape: a device's Tensor has no host copy)
    return _kind(value)


def diff_structure(expected, actual, path: str = "") -> list[str]:
    """Every difference between two nested state dicts, one line each, by name: entries ``expected`` has and
    ``actual`` lacks (missing), the reverse (unexpected), and arrays of another shape or dtype, or values of
    another kind. Values themselves are not compared. An empty list means ``actual`` fits."""
    where = path or "the top level"
    ke, ka = _kind(expected), _kind(actual)
    if ke != ka:
        return [f"{where}: expected {_describe_leaf(expected)}, got {_describe_leaf(actual)}"]
    if ke == "array":
        se, sa = tuple(expected.shape), tuple(actual.shape)
        problems = []
        if se != sa:
            problems.append(f"{where}: expected shape {se}, got {sa}")
        if expected.dtype != actual.dtype:
            problems.append(f"{where}: expected dtype {expected.dtype}, got {actual.dtype}")
        return problems
    if ke == "dict":
        problems = [f"missing: {_join(path, k)}" for k in expected if k not in actual]
        problems += [f"unexpected: {_join(path, k)}" for k in actual if k not in expected]
        for k in expected:
            if k in actual:
                problems += diff_structure(expected[k], actual[k], _join(path, k))
        return problems
    if ke == "sequence":
        problems = [f"missing: {_join(path, i)}" for i in range(len(actual), len(expected))]
        problems += [f"unexpected: {_join(path, i)}" for i in range(len(expected), len(actual))]
        for i, (e, a) in enumerate(zip(expected, actual)):
            problems += diff_structure(e, a, _join(path, i))
        return problems
    return []


__all__ = ["CheckpointError", "StateDictError", "atomic_write", "diff_structure", "load", "save"]
