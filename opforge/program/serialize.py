"""Saving and loading programs: versioned JSON for the ops, an ``.npz`` beside it for the values.

Nothing here executes code from the files: the JSON is data, the arrays load with ``allow_pickle=False``, and
every op name, argument and attr is checked against the registered schemas before a program is returned.
Files are written atomically (temporary file, fsync, rename), so a crash mid-save keeps the previous files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..core import dtypes as D
from ..core.errors import ArgumentError, OpforgeError
from ..core.files import atomic_write
from ..core.opdef import registry
from ..core.schema import check_attr
from ..core.spec import Dim, Spec
from .desc import FORMAT_VERSION, OpDesc, Program

FORMAT = "opforge.program"


class ProgramFormatError(OpforgeError, ValueError):
    """A saved program that cannot be loaded: damaged, tampered with, or from a newer opforge."""


def _encode(value):
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, np.dtype):
        return {"dtype": str(value)}
    if isinstance(value, Dim):
        return {"dim": [value.var, value.axis]}
    return value


def _decode(value):
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict):
        if set(value) == {"dtype"}:
            return D.as_dtype(value["dtype"])
        if set(value) == {"dim"} and len(value["dim"]) == 2:
            return Dim(str(value["dim"][0]), int(value["dim"][1]))
        raise ProgramFormatError(f"unknown attr value {value!r}")
    return value


def save(program: Program, path) -> None:
    """Write ``path`` (JSON) and ``path`` with suffix ``.npz`` (parameter and constant values)."""
    path = Path(path)
    values_path = path.with_suffix(".npz")
    block = program.block
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "values": values_path.name,
        "feeds": program.feeds,
        "outputs": program.outputs,
        "grad_names": program.grad_names,
        "updates": program.updates,
        "backward_requests": [[loss, list(wrt), list(blocked)] for loss, wrt, blocked in program.backward_requests],
        "vars": [{"name": v.name, "shape": list(v.spec.shape), "dtype": str(v.spec.dtype),
                  "persistable": v.persistable, "stop_gradient": v.stop_gradient} for v in block.vars.values()],
        "ops": [{"type": op.type, "inputs": op.inputs, "outputs": op.outputs, "role": op.role,
                 "attrs": {k: _encode(v) for k, v in op.attrs.items()}} for op in block.ops],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(str(values_path), lambda f: np.savez(f, **program.values))
    atomic_write(str(path), lambda f: f.write(json.dumps(doc, indent=1).encode()))


def load(path) -> Program:
    """Read a program saved by ``save``, validating everything against the registered ops."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ProgramFormatError(f"{path}: not a readable program file: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProgramFormatError(f"{path}: not an opforge program (format tag {doc.get('format')!r})")
    version = doc.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ProgramFormatError(f"{path}: format version {version!r} is newer than this opforge reads "
                                 f"({FORMAT_VERSION}); upgrade opforge")
    program = Program()
    where = f"{path}"
    try:
        for v in doc["vars"]:
            program.add_var(str(v["name"]), Spec.of(v["shape"], v["dtype"]), bool(v["persistable"]),
                            bool(v["stop_gradient"]))
        block = program.block
        program.feeds = [str(n) for n in doc["feeds"]]
        program.outputs = {str(k): str(n) for k, n in doc["outputs"].items()}
        program.grad_names = {str(k): str(n) for k, n in doc.get("grad_names", {}).items()}
        program.updates = {str(k): str(n) for k, n in doc.get("updates", {}).items()}
        program.backward_requests = [(r[0], tuple(r[1]), tuple(r[2])) for r in doc.get("backward_requests", [])]
        for n in [*program.feeds, *program.outputs.values(), *program.grad_names, *program.grad_names.values(),
                  *program.updates, *program.updates.values()]:
            if n not in block.vars:
                raise ProgramFormatError(f"{where}: variable {n!r} is named but never declared")
        for i, raw in enumerate(doc["ops"]):
            block.ops.append(_load_op(raw, i, where, block))
    except (KeyError, TypeError, AttributeError) as e:
        raise ProgramFormatError(f"{where}: malformed program file ({type(e).__name__}: {e})") from None
    values_path = path.with_name(str(doc["values"]))
    if values_path.name != doc["values"] or "/" in str(doc["values"]):
        raise ProgramFormatError(f"{where}: the values file must sit beside the program")
    try:
        with np.load(values_path, allow_pickle=False) as values:
            program.values = {k: values[k] for k in values.files}
    except (OSError, ValueError) as e:
        raise ProgramFormatError(f"{values_path}: cannot read the values: {e}") from None
    for name, array in program.values.items():
        var = program.block.vars.get(name)
        if var is None or not var.spec.matches(Spec(array.shape, array.dtype)):
            raise ProgramFormatError(f"{values_path}: value {name!r} {Spec(array.shape, array.dtype)} does not fit "
                                     f"its variable {var}")
    written = {n for op in program.block.ops for n in op.output_names()}
    needed = {n for op in program.block.ops for n in op.input_names()} - written - set(program.feeds)
    missing = needed - set(program.values)
    if missing:
        raise ProgramFormatError(f"{where}: variables {sorted(missing)} are read but have neither a value nor "
                                 "an op that writes them")
    return program


def _load_op(raw: dict, i: int, where: str, block) -> OpDesc:
    kind = raw["type"]
    if kind not in registry:
        raise ProgramFormatError(f"{where}: op #{i} has unknown type {kind!r} (is the module defining it imported?)")
    opdef = registry.get(kind)
    inputs = {str(k): [str(n) for n in v] for k, v in raw["inputs"].items()}
    outputs = {str(k): [str(n) for n in v] for k, v in raw["outputs"].items()}
    if set(inputs) != set(opdef.input_names):
        raise ProgramFormatError(f"{where}: op #{i} {kind} has inputs {sorted(inputs)}, its schema "
                                 f"{sorted(opdef.input_names)}")
    if set(outputs) != set(opdef.output_names):
        raise ProgramFormatError(f"{where}: op #{i} {kind} has outputs {sorted(outputs)}, its schema "
                                 f"{sorted(opdef.output_names)}")
    for n in [*(n for v in inputs.values() for n in v), *(n for v in outputs.values() for n in v)]:
        if n not in block.vars:
            raise ProgramFormatError(f"{where}: op #{i} {kind} refers to undeclared variable {n!r}")
    attrs = {}
    given = raw.get("attrs", {})
    unknown = set(given) - {p.name for p in opdef.attrs}
    if unknown:
        raise ProgramFormatError(f"{where}: op #{i} {kind} has unknown attrs {sorted(unknown)}")
    for p in opdef.attrs:
        if p.name not in given:
            raise ProgramFormatError(f"{where}: op #{i} {kind} lacks attr {p.name!r}")
        try:
            attrs[p.name] = check_attr(p, _decode(given[p.name]), kind)
        except ArgumentError as e:
            raise ProgramFormatError(f"{where}: op #{i}: {e}") from None
    return OpDesc(kind, inputs, outputs, attrs, str(raw.get("role", "forward")))
