"""Fuzzing the loaders: saved programs (JSON and values) and checkpoints, mutated at random.

Each case writes a damaged or tampered file and loads it. Loading must end in the loaded thing or in the loader's
``OpforgeError`` subclass naming the file; what loads must then run (a program) or load into the model and the
optimizer it came from (a checkpoint), ending in a result or an ``OpforgeError``. Every case runs under a watchdog
and a memory ceiling, so a file claiming terabytes fails the case instead of the machine. ``make test`` runs a
seeded sample; ``OPFORGE_FUZZ=long`` thirty times as many.
"""

from __future__ import annotations

import ast
import contextlib
import json
import zipfile

import numpy as np
import pytest
from fuzzing import (
    LONG,
    SEED,
    count,
    dumps,
    hard_deadline,
    memory_ceiling,
    mutate,
    mutate_bytes,
    quiet,
    run_case,
    small_program,
)

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.checkpoint import MANIFEST, CheckpointError
from opforge.core.files import sha256_of
from opforge.program.serialize import ProgramFormatError

FEED = {"x": np.random.default_rng(1).standard_normal((4, 3)), "y": np.array([0, 1, 4, 2])}


def training_program():
    """A compiled Adam step: persistable state, updates, a learning-rate tensor."""
    of.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 5))
    opt = of.optim.Adam(model.parameters(), lr=1e-2)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step = of.compile(step)
    x, y = of.tensor(FEED["x"].astype(np.float32)), of.tensor(FEED["y"])
    step(x, y)
    return step.program(x, y), {"x": x.numpy(), "y": y.numpy()}


class Files:
    """One saved program or checkpoint and the ways to write damaged copies of it beside the original."""

    def __init__(self, directory):
        self.directory = directory

    def write_json(self, path, doc):
        path.write_text(doc if isinstance(doc, str) else dumps(doc))

    def write_values(self, path, doc, data: bytes):
        """``data`` as the values file of the program at ``path``, its digest recorded (so the content is what
        the loader meets, not a digest mismatch) unless the document is not a dict any more."""
        values = path.with_name("forged.npz")
        values.write_bytes(data)
        if isinstance(doc, dict):
            doc = {**doc, "values": values.name, "values_sha256": sha256_of(str(values))}
        self.write_json(path, doc)


def npz_bytes(arrays: dict, directory) -> bytes:
    path = directory / "scratch.npz"
    np.savez(path, **arrays)  # object arrays pickled: what the loaders must refuse
    return path.read_bytes()


CLAIMS = [(10**12,), (-1,), (2, 2), (2**63,), (0,), (1,) * 40, (10**30,), (3, 10**12, 0), (), (1,) * 70]


def with_header(npz: bytes, rng, directory) -> bytes:
    """``npz`` with one member's .npy header rewritten to claim another shape."""
    src = directory / "src.npz"
    src.write_bytes(npz)
    with zipfile.ZipFile(src) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    name = sorted(members)[rng.integers(len(members))]
    data = members[name]
    length = int.from_bytes(data[8:10], "little")
    header = ast.literal_eval(data[10:10 + length].decode("latin1"))
    header["shape"] = CLAIMS[rng.integers(len(CLAIMS))]
    text = (repr(header) + "\n").encode("latin1")
    members[name] = data[:8] + len(text).to_bytes(2, "little") + text + data[10 + length:]
    out = directory / "out.npz"
    with zipfile.ZipFile(out, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    return out.read_bytes()


def _array_variants(array: np.ndarray, rng):
    return [array.astype(np.float32) if array.dtype != np.float32 else array.astype(np.float64),
            np.stack([array, array]), np.asarray(array.reshape(-1)[:1].sum() if array.size else 0, array.dtype),
            np.zeros((0, *array.shape[1:]), array.dtype), np.full(array.shape, np.nan),
            np.array(["text"] * max(array.size, 1)), np.array([{"a": 1}], dtype=object),
            array.astype(">f8") if array.dtype.kind == "f" else array.astype(">i8"),
            np.ones(array.shape, np.complex128), np.asfortranarray(np.ones((2, *array.shape)))]


def mutate_arrays(arrays: dict, names: list, rng) -> dict:
    """The values (or checkpoint arrays) with one entry renamed, changed, dropped or added."""
    arrays = dict(arrays)
    key = sorted(arrays)[rng.integers(len(arrays))]
    kind = rng.integers(4)
    if kind == 0:  # renamed: to a feed, an op's output, another value's name, or nothing we know
        arrays[names[rng.integers(len(names))]] = arrays.pop(key)
    elif kind == 1:
        variants = _array_variants(arrays[key], rng)
        arrays[key] = variants[rng.integers(len(variants))]
    elif kind == 2:
        del arrays[key]
    else:
        arrays[names[rng.integers(len(names))]] = arrays[key]
    return arrays


def gentle(doc: dict, rng) -> dict:
    """``doc`` changed in a way a program often survives: an attr number nudged, a flag flipped, an output or a
    gradient pointed at another variable, the ops' roles swapped."""
    doc = json.loads(json.dumps(doc))
    kind = rng.integers(4)
    if kind == 0:
        numbers = [(op["attrs"], k) for op in doc["ops"] for k, v in op["attrs"].items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers:
            attrs, k = numbers[rng.integers(len(numbers))]
            attrs[k] = [attrs[k] + 1, attrs[k] - 1, -attrs[k], 0, attrs[k] * 1000][rng.integers(5)]
    elif kind == 1:
        var = doc["vars"][rng.integers(len(doc["vars"]))]
        var["stop_gradient"] = not var["stop_gradient"]
    elif kind == 2:
        table = doc["outputs"] if rng.integers(2) or not doc["grad_names"] else doc["grad_names"]
        key = sorted(table)[rng.integers(len(table))]
        table[key] = doc["vars"][rng.integers(len(doc["vars"]))]["name"]
    else:
        for op in doc["ops"]:
            op["role"] = "backward" if op["role"] == "forward" else "forward"
    return doc


# -- programs -------------------------------------------------------------------------------------------------------

def _load_and_run(path, feeds, outcomes: dict):
    """Load the program at ``path``: a ProgramFormatError naming the file is fine; what loads must run."""
    try:
        program = of.Program.load(path)
    except ProgramFormatError as e:
        if path.name not in str(e) and ".npz" not in str(e):
            raise AssertionError(f"the error does not name the file: {e}") from None
        outcomes["refused"] += 1
        return
    try:
        of.Executor(program).run(**feeds)
        outcomes["ran"] += 1
    except of.OpforgeError:
        outcomes["failed at run"] += 1
        raise


def fuzz_programs(tmp_path, n: int, seed: int):
    """``n`` cases: JSON mutated as a tree or as bytes, values arrays renamed or changed, values bytes damaged,
    .npy headers claiming other shapes. Returns the count, the problems, and how the cases ended."""
    rng = np.random.default_rng(seed)
    tmp_path.mkdir(parents=True, exist_ok=True)
    sources = []
    for i, (program, feeds) in enumerate([(small_program(), FEED), training_program()]):
        path = tmp_path / f"source{i}" / "p.json"
        program.save(path)
        doc = json.loads(path.read_text())
        with np.load(path.with_name(doc["values"])) as npz:
            values = {key: npz[key] for key in npz.files}
        sources.append((doc, values, npz_bytes(values, tmp_path), feeds))
    problems, ran = [], 0
    outcomes = {"refused": 0, "ran": 0, "failed at run": 0}
    with memory_ceiling(), quiet(), hard_deadline(count(300, 3000)):
        for k in range(n):
            doc, values, values_npz, feeds = sources[k % len(sources)]
            path = tmp_path / "p.json"
            files = Files(tmp_path)
            names = [v["name"] for v in doc["vars"]] + ["ghost", ""]
            kind = ["json", "json", "gentle", "json bytes", "values", "values bytes", "values header"][k % 7]
            if kind == "gentle":
                files.write_values(path, gentle(doc, rng), values_npz)
            elif kind == "json":
                files.write_values(path, mutate(doc, rng, int(rng.integers(1, 4))), values_npz)
            elif kind == "json bytes":
                files.write_values(path, doc, values_npz)
                files.write_json(path, mutate_bytes(path.read_bytes(), rng).decode("latin1"))
            elif kind == "values":
                files.write_values(path, doc, npz_bytes(mutate_arrays(values, names, rng), tmp_path))
            elif kind == "values bytes":
                files.write_values(path, doc, mutate_bytes(values_npz, rng))
            else:
                files.write_values(path, doc, with_header(values_npz, rng, tmp_path))
            ran += 1
            problem = run_case(20, lambda k=k, kind=kind: f"#{k} ({kind})",
                               lambda p=path, f=feeds: _load_and_run(p, f, outcomes))
            if problem:
                problems.append(f"program case #{k} ({kind}): {problem}")
    return ran, problems, outcomes


def test_fuzz_saved_programs(tmp_path):
    ran, problems, outcomes = fuzz_programs(tmp_path, count(210, 8400), SEED)
    assert not problems, f"{len(problems)} of {ran} cases failed:\n" + "\n".join(problems[:40])
    assert outcomes["ran"] > ran // 10, outcomes  # enough mutations are harmless for the runs to be tested too


# -- checkpoints ----------------------------------------------------------------------------------------------------

def _model_and_optimizer():
    of.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt


def _load_checkpoint(path, model, opt, pristine, outcomes: dict):
    """Load the checkpoint at ``path``: a CheckpointError naming the file is fine; what loads must load into the
    model and the optimizer (or be refused by them with an OpforgeError)."""
    try:
        obj = of.load(path)
    except CheckpointError as e:
        if str(path) not in str(e):
            raise AssertionError(f"the error does not name the file: {e}") from None
        outcomes["refused"] += 1
        return
    outcomes["loaded"] += 1
    model.load_state_dict(pristine["model"])
    opt.load_state_dict(pristine["optimizer"])
    with contextlib.suppress(of.OpforgeError):
        of.load(path, like=pristine)
    if isinstance(obj, dict):
        for key, target in (("model", model), ("optimizer", opt)):
            if key in obj:
                with contextlib.suppress(of.OpforgeError):
                    target.load_state_dict(obj[key])
                    outcomes[f"loaded into the {key}"] += 1


def fuzz_checkpoints(tmp_path, n: int, seed: int):
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    model, opt = _model_and_optimizer()
    model(of.randn(5, 3)).sum().backward()
    opt.step()  # momentum buffers in the state
    pristine = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
                "meta": {"name": "run", 7: (1.5, None, True)}, "arrays": [np.arange(3), np.float32(2.5)]}
    good = tmp_path / "good.npz"
    of.save(pristine, good)
    with zipfile.ZipFile(good) as z:
        members = {i.filename[:-4]: np.load(z.open(i)) for i in z.infolist()}
    manifest = json.loads(members[MANIFEST].tobytes().decode())
    names = [*sorted(members), "ghost"]
    problems, ran = [], 0
    outcomes = {"refused": 0, "loaded": 0, "loaded into the model": 0, "loaded into the optimizer": 0}
    with memory_ceiling(), quiet(), hard_deadline(count(300, 3000)):
        for k in range(n):
            path = tmp_path / "c.npz"
            kind = ["manifest", "manifest", "manifest", "bytes", "members", "header"][k % 6]
            if kind == "manifest":
                text = dumps(mutate(manifest, rng, int(rng.integers(1, 4))))
                path.write_bytes(npz_bytes({**members, MANIFEST: np.frombuffer(text.encode(), np.uint8)}, tmp_path))
            elif kind == "bytes":
                path.write_bytes(mutate_bytes(good.read_bytes(), rng))
            elif kind == "members":
                path.write_bytes(npz_bytes(mutate_arrays(members, names, rng), tmp_path))
            else:
                path.write_bytes(with_header(good.read_bytes(), rng, tmp_path))
            ran += 1
            problem = run_case(20, lambda k=k, kind=kind: f"#{k} ({kind})",
                               lambda p=path: _load_checkpoint(p, model, opt, pristine, outcomes))
            if problem:
                problems.append(f"checkpoint case #{k} ({kind}): {problem}")
    return ran, problems, outcomes


def test_fuzz_checkpoints(tmp_path):
    ran, problems, outcomes = fuzz_checkpoints(tmp_path, count(240, 7200), SEED)
    assert not problems, f"{len(problems)} of {ran} cases failed:\n" + "\n".join(problems[:40])
    assert outcomes["loaded into the model"] > ran // 20, outcomes


@pytest.mark.skipif(not LONG, reason="a longer fuzz run: OPFORGE_FUZZ=long")
@pytest.mark.parametrize("seed", range(2))
def test_fuzz_files_with_other_seeds(tmp_path, seed):
    ran_p, problems_p, _ = fuzz_programs(tmp_path / "programs", 4200, SEED + 100 + seed)
    ran_c, problems_c, _ = fuzz_checkpoints(tmp_path / "checkpoints", 3600, SEED + 100 + seed)
    problems = problems_p + problems_c
    assert not problems, f"{len(problems)} of {ran_p + ran_c} cases failed:\n" + "\n".join(problems[:40])
