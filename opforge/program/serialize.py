"""Saving and loading programs: versioned JSON for the ops, an ``.npz`` beside it for the values.

A save is one atomic unit. The values go first, to a file of a name no other save uses (``model.<16 random hex
digits>.npz``), and then the JSON, which names that file and records its SHA-256, replaces the old JSON in one
rename. Killed at any moment, a save leaves the old JSON with the old values file it names, or the new JSON with the
new one. After the rename the save removes the values file that the JSON it replaced named (read right before the
rename), and nothing else; a save whose JSON could not be written removes its own. Saves of one path may run at
once (threads, processes): a values file is named by one save's JSON only, which is renamed into place once, so
once that JSON is replaced no JSON names the file again and it can go; no JSON ever names a removed file. (Names
made of the content could not promise it: two saves of the same values share a name, and one removed the file that
the other's JSON had just named again.) Where another save's rename falls between that read and the rename, its
values stay behind, as a save killed between its two steps leaves its values file, and a killed ``of.save`` its
``.tmp`` file.

Nothing in the files is trusted. Nothing is executed: the JSON is data, and arrays holding Python objects are
refused. Loading checks the whole program before returning it: every field's type; every variable declared once;
every op registered, with the inputs, outputs and attrs of its schema, its attr checks passed and its shape rule
agreeing with the declared shapes; every variable written before it is read; values only for the persistable
variables and the constants the JSON declares, each fitting its variable, and each array's header checked against
the bytes the file holds before anything is allocated. Every failure is a ``ProgramFormatError`` naming the file
and what is wrong in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import numpy as np

from ..core import dtypes as D
from ..core.errors import OpforgeError, describe
from ..core.files import NpzReader, atomic_write, sha256_of, shortened, write_npz, write_uniquely_named
from ..core.opdef import registry
from ..core.schema import Param, check_attr
from ..core.spec import Dim, Elem, Spec, undim
from .desc import FORMAT_VERSION, OpDesc, Program

FORMAT = "opforge.program"
MAX_DIM = 2**62  # no array can have more elements than this along one axis
_DTYPES = {str(dt): dt for dt in D.SUPPORTED}
_MISSING = object()


class ProgramFormatError(OpforgeError, ValueError):
    """A saved program that cannot be loaded: damaged, tampered with, or from a newer opforge."""


# -- save ---------------------------------------------------------------------------------------------------------

def _encode(value):
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, np.dtype):
        return {"dtype": str(value)}
    if isinstance(value, Elem):
        return {"elem": [value.var, value.axis, value.sign]}
    if isinstance(value, Dim):
        return {"dim": [value.var, value.axis]}
    return value


def _old_values(path: Path) -> str | None:
    """The values file the JSON at ``path`` names, if the file is one a save of ``path`` writes (or wrote before:
    ``<stem>.npz``, the hex digits of a hash, a long stem kept whole): never another file a damaged JSON might name."""
    try:
        name = json.loads(path.read_text(encoding="utf-8")).get("values")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    stems = "|".join(re.escape(stem) for stem in {path.stem, shortened(path.stem)})
    ours = re.fullmatch(f"({stems})" + r"(\.[0-9a-f]{16})?\.npz", name) if isinstance(name, str) else None
    return name if ours else None


def save(program: Program, path) -> None:
    """Write ``path`` (JSON) and, beside it, the values it names (``<stem>.<16 hex>.npz``); see the module
    docstring."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    directory, stem = str(path.parent), path.stem
    values = {k: program.device.to_host(v) for k, v in program.values.items()}
    values_name, digest = write_uniquely_named(directory, stem, ".npz", lambda f: write_npz(f, values))
    block = program.block
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "values": values_name,
        "values_sha256": digest,
        "feeds": program.feeds,
        "feed_dtypes": {name: dtype.name for name, dtype in program.feed_dtypes.items()},
        "outputs": program.outputs,
        "grad_names": program.grad_names,
        "updates": program.updates,
        "backward_requests": [[loss, list(wrt), list(blocked), grads]
                              for loss, wrt, blocked, grads in program.backward_requests],
        "vars": [{"name": v.name, "shape": list(v.spec.shape), "dtype": str(v.spec.dtype),
                  "persistable": v.persistable, "stop_gradient": v.stop_gradient} for v in block.vars.values()],
        "ops": [{"type": op.type, "inputs": op.inputs, "outputs": op.outputs, "role": op.role,
                 "attrs": {k: _encode(v) for k, v in op.attrs.items()}} for op in block.ops],
    }
    replaced = []  # the values file the JSON about to be replaced names (see the module docstring)
    try:
        atomic_write(str(path), lambda f: f.write(json.dumps(doc, indent=1).encode()),
                     before_rename=lambda: replaced.append(_old_values(path)))
    except BaseException:  # no JSON names the values (their name is this save's alone): they would stay for good
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, values_name))
        raise
    old = replaced[0]
    if old is not None and old != values_name:
        with contextlib.suppress(OSError):  # gone already (removed by a concurrent save)
            os.unlink(os.path.join(directory, old))


# -- load: the JSON -----------------------------------------------------------------------------------------------

# Ops renamed since programs were first saved (the name became torch's function over the op): a file naming the old
# op loads as the new one, whose schema is the old one's but for the attrs listed, each with the only value that means
# what the new op does. An old name that is an op again is not renamed.
RENAMED = {
    **{f"dropout{d}": (f"dropout{d}_with_mask", {}) for d in ("", "1d", "2d", "3d")},
    "batch_norm": ("batch_norm_with_stats", {}),
    "instance_norm": ("instance_norm_affine", {}),
    **{f"max_pool{n}d": (f"max_pool{n}d_values", {}) for n in (1, 2, 3)},
    **{f"adaptive_max_pool{n}d": (f"adaptive_max_pool{n}d_values", {}) for n in (1, 2, 3)},
    **{f"adaptive_avg_pool{n}d": (f"adaptive_avg_pool{n}d_sized", {}) for n in (1, 2, 3)},
    "scaled_dot_product_attention": ("dot_product_attention", {"dropout_p": 0.0}),
}


def load(path) -> Program:
    """Read a program saved by ``save``, validating everything (see the module docstring)."""
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProgramFormatError(f"{where}: no program file there") from None
    except (OSError, ValueError) as e:
        raise ProgramFormatError(f"{where}: not a readable program file: {e}") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ProgramFormatError(f"{where}: not a readable program file: JSON nested too deeply") from None
    except ValueError as e:
        raise ProgramFormatError(f"{where}: not a readable program file: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        tag = doc.get("format") if isinstance(doc, dict) else None
        raise ProgramFormatError(f"{where}: not an opforge program (format tag {describe(tag)}, top level "
                                 f"{type(doc).__name__})")
    version = doc.get("version")
    if not _is(version, int):
        raise ProgramFormatError(f"{where}: format version {describe(version)} is not a version number")
    if version > FORMAT_VERSION:
        raise ProgramFormatError(f"{where}: format version {version} is newer than this opforge reads "
                                 f"({FORMAT_VERSION}); upgrade opforge")
    loader = _Loader(doc, where)
    _load_values(loader.program, loader.sources, path, doc, where)
    return loader.program


def _is(value, kind) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _field(obj: dict, key: str, kind, where: str, default=_MISSING):
    if key not in obj:
        if default is _MISSING:
            raise ProgramFormatError(f"{where} lacks {key!r}")
        return default
    value = obj[key]
    if not _is(value, kind):
        raise ProgramFormatError(f"{where}: {key!r} must be a {kind.__name__}, got {describe(value)}")
    return value


class _Loader:
    """Builds the Program from the JSON document, refusing the first thing that is wrong."""

    def __init__(self, doc: dict, where: str):
        self.where = where
        self.program = program = Program()
        self.vars = program.block.vars
        for i, raw in enumerate(_field(doc, "vars", list, where)):
            self._add_var(raw, f"{where}: var #{i}")
        program.feeds = self._names(_field(doc, "feeds", list, where), f"{where}: feeds")
        if len(set(program.feeds)) != len(program.feeds):
            raise ProgramFormatError(f"{where}: a feed is named twice in {program.feeds}")
        for n in program.feeds:
            if self.vars[n].persistable:
                raise ProgramFormatError(f"{where}: feed {n!r} is marked persistable; a feed is given at each run")
        for n, dtype in _field(doc, "feed_dtypes", dict, where, {}).items():
            if n not in program.feeds:
                raise ProgramFormatError(f"{where}: feed_dtypes names {n!r}, which is not a feed")
            program.feed_dtypes[n] = _dtype_named(dtype, f"{where}: feed_dtypes[{n!r}]")
        program.outputs = self._name_map(doc, "outputs", required=True)
        program.grad_names = self._name_map(doc, "grad_names")
        program.updates = self._name_map(doc, "updates")
        program.backward_requests = self._backward_requests(_field(doc, "backward_requests", list, where, []))
        ops = _field(doc, "ops", list, where)
        self.writer = {}  # variable -> index of the op writing it
        self.renamed = {}  # op index -> its definition under the op's present name (RENAMED)
        heads = [self._op_head(raw, i) for i, raw in enumerate(ops)]
        for i, (_, _, outputs) in enumerate(heads):
            for name in (n for names in outputs.values() for n in names):
                if name in self.writer:
                    raise ProgramFormatError(f"{where}: op #{i} writes {name!r}, which op #{self.writer[name]} "
                                             "writes already")
                if name in program.feeds or self.vars[name].persistable:
                    raise ProgramFormatError(f"{where}: op #{i} writes {name!r}, a feed or persistable variable "
                                             "(persistable variables change through 'updates' only)")
                self.writer[name] = i
        for i, (raw, head) in enumerate(zip(ops, heads)):
            program.block.ops.append(self._op(self.renamed.get(i, raw), i, *head))
        for target, new in program.updates.items():
            old, value = self.vars[target], self.vars[new]
            if not old.persistable:
                raise ProgramFormatError(f"{where}: 'updates' gives a new value to {target!r}, which is not "
                                         "persistable")
            if not old.spec.matches(value.spec):
                raise ProgramFormatError(f"{where}: 'updates' gives {target!r} {old.spec} the value {new!r} "
                                         f"{value.spec}")
        # no name a program reads stays undefined: "source" variables (neither fed nor written) need a value
        self.sources = {n for n in self.vars if n not in self.writer and n not in program.feeds}
        # new names (append_backward on the loaded program) must not meet old ones: count on from the highest
        program._counter = max((int(m.group(1)) for n in self.vars if (m := re.search(r"\.(\d{1,18})$", n))),
                               default=0)

    def _add_var(self, raw, where: str) -> None:
        if not isinstance(raw, dict):
            raise ProgramFormatError(f"{where} must be an object, got {describe(raw)}")
        name = _field(raw, "name", str, where)
        if name in self.vars:
            raise ProgramFormatError(f"{where}: variable {name!r} is declared twice")
        shape = _field(raw, "shape", list, where)
        if not all(d is None or (_is(d, int) and 0 <= d <= MAX_DIM) for d in shape) or len(shape) > 64:
            raise ProgramFormatError(f"{where}: variable {name!r} has shape {describe(shape)}; a shape is a list "
                                     f"of at most 64 sizes, each null (known at run time) or an int in [0, 2**62]")
        dtype = _field(raw, "dtype", str, where)
        if dtype not in _DTYPES:
            raise ProgramFormatError(f"{where}: variable {name!r} has dtype {describe(dtype)}; supported are "
                                     f"{', '.join(_DTYPES)}")
        self.program.add_var(name, Spec(tuple(shape), _DTYPES[dtype]), _field(raw, "persistable", bool, where),
                             _field(raw, "stop_gradient", bool, where))

    def _names(self, value, what: str) -> list:
        """``value``, a list of declared variable names; ``what`` says where it sits, for the error."""
        if not isinstance(value, list):
            raise ProgramFormatError(f"{what} must be a list of variable names, got {describe(value)}")
        for n in value:
            if not isinstance(n, str):
                raise ProgramFormatError(f"{what} holds {describe(n)}, not a variable name")
            if n not in self.vars:
                raise ProgramFormatError(f"{what} refers to undeclared variable {n!r}")
        return list(value)

    def _name_map(self, doc: dict, key: str, required: bool = False) -> dict:
        value = _field(doc, key, dict, self.where) if required else _field(doc, key, dict, self.where, {})
        for k, n in value.items():
            if not isinstance(n, str) or n not in self.vars or (key != "outputs" and k not in self.vars):
                raise ProgramFormatError(f"{self.where}: {key} maps {k!r} to {describe(n)}: "
                                         f"{'the value' if key == 'outputs' else 'both'} must be declared variables")
        return dict(value)

    def _backward_requests(self, raw: list) -> list:
        requests = []
        for r in raw:
            # (files written before the gradients were kept with their request have three items)
            if not (isinstance(r, list) and len(r) in (3, 4) and isinstance(r[0], str)
                    and (len(r) == 3 or isinstance(r[3], dict))):
                raise ProgramFormatError(f"{self.where}: a backward request must be [loss, [wrt...], [blocked...], "
                                         f"{{wrt: gradient}}], got {describe(r)}")
            at = f"{self.where}: backward request {describe(r)}"
            loss, wrt, blocked = self._names([r[0]], at)[0], *(self._names(names, at) for names in r[1:3])
            grads = r[3] if len(r) == 4 else {}
            self._names([*grads, *grads.values()], at)
            requests.append((loss, tuple(wrt), tuple(blocked), dict(grads)))
        return requests

    def _slots(self, raw: dict, key: str, params, at: str) -> dict:
        slots = _field(raw, key, dict, at)
        names = [p.name for p in params]
        if set(slots) != set(names):
            raise ProgramFormatError(f"{at} has {key} {sorted(slots)}, its schema {sorted(names)}")
        out = {}
        for p in params:
            got = self._names(slots[p.name], f"{at} ({key[:-1]} {p.name!r})")
            optional = isinstance(p, Param) and p.optional  # a missing Tensor? input: no name
            if not p.is_list and not (len(got) == 1 or (optional and not got)):
                raise ProgramFormatError(f"{at} ({key[:-1]} {p.name!r}) names {len(got)} variables, its schema "
                                         f"{'0 or 1' if optional else 'exactly 1'}")
            out[p.name] = got
        return out

    def _op_head(self, raw, i: int):
        """Op #i's definition, its place for errors, and its outputs: what the order check needs first."""
        at = f"{self.where}: op #{i}"
        if not isinstance(raw, dict):
            raise ProgramFormatError(f"{at} must be an object, got {describe(raw)}")
        kind = _field(raw, "type", str, at)
        if kind in RENAMED and kind not in registry:  # a file saved before the op took its present name
            kind, dropped = RENAMED[kind]
            attrs = raw.get("attrs")
            for name, meaning in dropped.items():  # an attr the op no longer has: only its default means the same
                if isinstance(attrs, dict) and name in attrs:
                    if attrs[name] != meaning:
                        raise ProgramFormatError(
                            f"{at} ({raw['type']}, now {kind}) has {name}={attrs[name]!r}, which {kind} no longer "
                            f"takes (only {name}={meaning!r} means the same): rebuild the program from its code")
                    attrs = {k: v for k, v in attrs.items() if k != name}
            raw = {**raw, "type": kind, "attrs": attrs}
            self.renamed[i] = raw
        if kind not in registry:
            raise ProgramFormatError(f"{at} has unknown type {kind!r} (is the module defining it imported?)")
        opdef, at = registry.get(kind), f"{at} {kind}"
        return opdef, at, self._slots(raw, "outputs", opdef.outputs, at)

    def _available(self, name: str, i: int) -> bool:
        """Whether op #i may read ``name``: a feed, a value, or the output of an earlier op."""
        return self.writer.get(name, -1) < i

    def _op(self, raw: dict, i: int, opdef, at: str, outputs: dict) -> OpDesc:
        inputs = self._slots(raw, "inputs", opdef.inputs, at)
        for n in (n for names in inputs.values() for n in names):
            if not self._available(n, i):
                raise ProgramFormatError(f"{at} reads {n!r} before op #{self.writer[n]} writes it")
        given = _field(raw, "attrs", dict, at)
        unknown = set(given) - {p.name for p in opdef.attrs}
        if unknown:
            raise ProgramFormatError(f"{at} has unknown attrs {sorted(unknown)}")
        attrs = {}
        for p in opdef.attrs:
            if p.name not in given:
                raise ProgramFormatError(f"{at} lacks attr {p.name!r}")
            try:
                attrs[p.name] = check_attr(p, self._decode(given[p.name], i, f"{at} attr {p.name!r}"), opdef.name)
            except OpforgeError as e:
                raise ProgramFormatError(f"{at}: {e}") from None
        role = _field(raw, "role", str, at, "forward")
        if role not in ("forward", "backward"):
            raise ProgramFormatError(f"{at} has role {role!r}, not 'forward' or 'backward'")
        self._check_op(opdef, inputs, outputs, attrs, at)
        return OpDesc(opdef.name, inputs, outputs, attrs, role)

    def _decode(self, value, i: int, at: str, nested: bool = False):
        """An attr value from its JSON form: a number, bool, string or null; ``{"dtype": name}``; ``{"dim":
        [variable, axis]}`` (a size known at run time); or a list of those (not of lists)."""
        if isinstance(value, list) and not nested:
            return tuple(self._decode(v, i, at, nested=True) for v in value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        dtype = value.get("dtype") if isinstance(value, dict) and set(value) == {"dtype"} else None
        if isinstance(dtype, str) and dtype in _DTYPES:
            return _DTYPES[dtype]
        if isinstance(value, dict) and set(value) == {"dim"}:
            ref = value["dim"]
            if isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], str) and _is(ref[1], int):
                var, axis = ref
                if var in self.vars and 0 <= axis < len(self.vars[var].spec.shape) and self._available(var, i):
                    return Dim(var, axis)
            raise ProgramFormatError(f"{at}: {describe(value)} is not the size of an axis of a variable known "
                                     "before this op")
        if isinstance(value, dict) and set(value) == {"elem"}:
            ref = value["elem"]
            if isinstance(ref, list) and len(ref) == 3 and isinstance(ref[0], str) and _is(ref[1], int) and \
                    ref[2] in (1, -1) and _is(ref[2], int):
                var, index, sign = ref
                spec = self.vars[var].spec if var in self.vars else None
                if spec is not None and spec.dtype.kind in "iu" and len(spec.shape) <= 1 and \
                        0 <= index < (spec.shape[0] if spec.shape and spec.shape[0] is not None else 1) and \
                        self._available(var, i):
                    return Elem(var, index, sign)
            raise ProgramFormatError(f"{at}: {describe(value)} is not an element of an integer vector known before "
                                     "this op")
        raise ProgramFormatError(f"{at}: unknown attr value {describe(value)}")

    def _check_op(self, opdef, inputs: dict, outputs: dict, attrs: dict, at: str) -> None:
        """The op's own attr checks, then its shape rule on the declared input Specs, which must give the
        declared output Specs: what a traced program satisfies by construction."""
        try:
            if opdef.validate is not None:
                opdef.validate(attrs)
            ins = [[self.vars[n].spec for n in inputs[p.name]] if p.is_list else
                   (self.vars[inputs[p.name][0]].spec if inputs[p.name] else None) for p in opdef.inputs]
            outs = opdef.infer_specs(ins, {k: undim(v) for k, v in attrs.items()})
        except Exception as e:  # an attr or a shape the op refuses; a shape rule failing on a shape it cannot take
            if isinstance(e, RecursionError | MemoryError):
                raise
            raise ProgramFormatError(f"{at}: {type(e).__name__}: {e}") from None
        for o, spec in zip(opdef.outputs, outs):
            names = outputs[o.name]
            specs = list(spec) if o.is_list else [spec]
            if len(names) != len(specs) or not all(self.vars[n].spec.matches(s) for n, s in zip(names, specs)):
                declared = [self.vars[n].spec for n in names]
                raise ProgramFormatError(f"{at} output {o.name!r}: declared {declared}, but its shape rule gives "
                                         f"{specs}")


# -- load: the values ---------------------------------------------------------------------------------------------

def _load_values(program: Program, sources: set, path: Path, doc: dict, where: str) -> None:
    """Read the values file the JSON names: only values for persistable variables and constants (``sources``:
    variables neither fed nor written by an op), each fitting its variable, and one for each that needs it."""
    name = _field(doc, "values", str, where)
    if not name.endswith(".npz") or name.startswith(".") or Path(name).name != name or "\\" in name:
        raise ProgramFormatError(f"{where}: the values file must sit beside the program, got {describe(name)}")
    values_path = path.with_name(name)
    digest = _field(doc, "values_sha256", str, where, None)  # older saves record none
    try:
        if digest is not None and sha256_of(str(values_path)) != digest:
            raise ProgramFormatError(f"{values_path}: its SHA-256 is not the one the program records: the file "
                                     "is damaged or was changed after the save")
        reader = NpzReader(values_path)
    except FileNotFoundError:
        raise ProgramFormatError(f"{where}: its values file {name!r} is missing") from None
    except OSError as e:
        raise ProgramFormatError(f"{values_path}: cannot read the values: {e}") from None
    except OpforgeError as e:
        if isinstance(e, ProgramFormatError):
            raise
        raise ProgramFormatError(f"cannot read the values: {e}") from None
    block = program.block
    with reader:
        for key in reader.files:  # every name and header first: nothing is read for a program refused anyway
            var = block.vars.get(key)
            if var is None or not (var.persistable or key in sources):
                raise ProgramFormatError(f"{values_path}: holds a value for {key!r}, which the program does not "
                                         "declare as a persistable variable or a constant (a feed, an op's output "
                                         "or an unknown name)")
            try:
                shape, dtype = reader.header(key)
            except OpforgeError as e:
                raise ProgramFormatError(f"cannot read the values: {e}") from None
            if dtype != var.spec.dtype or not var.spec.matches(Spec(shape, var.spec.dtype)):
                raise ProgramFormatError(f"{values_path}: value {key!r} of shape {shape} and dtype {dtype} does "
                                         f"not fit its variable {var}")
        try:
            program.values = {key: reader.read(key) for key in reader.files}
        except OpforgeError as e:
            raise ProgramFormatError(f"cannot read the values: {e}") from None
    read = {n for op in block.ops for n in op.input_names()}
    fetched = {*program.outputs.values(), *program.grad_names.values(), *program.updates.values()}
    needed = {n for n in block.vars if block.vars[n].persistable} | ((read | fetched) & sources)
    missing = needed - set(program.values)
    if missing:
        raise ProgramFormatError(f"{where}: variables {sorted(missing)} are persistable, or are read but have neither "
                                 "a value nor an op that writes them")


def _dtype_named(name, where: str) -> np.dtype:
    """A dtype by its name: NumPy's, or ml_dtypes' narrow ones (int4, float8_e4m3fn...)."""
    import ml_dtypes

    if isinstance(name, str) and re.fullmatch(r"[a-z0-9_]{1,24}", name):
        dtype = getattr(ml_dtypes, name, None)
        if dtype is not None:
            return np.dtype(dtype)
        if name in np.sctypeDict:
            return np.dtype(name)
    raise ProgramFormatError(f"{where}: {describe(name)} names no dtype")
