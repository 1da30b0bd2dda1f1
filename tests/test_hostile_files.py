"""Hostile and unlucky files: saves killed at any moment, and damaged or tampered programs and checkpoints.

Every file that does not hold what it should must end in a clear ``OpforgeError`` subclass, raised at load and
naming what is wrong — never a raw KeyError from deep inside the executor, never a silently different result.
(``test_fuzz_files.py`` throws thousands of random mutations at the same loaders.)
"""

import json
import os
import signal
import sys
import time
import zipfile

import numpy as np
import pytest
from fuzzing import small_program

import opforge as of
from opforge import ops as F
from opforge.checkpoint import MANIFEST, CheckpointError
from opforge.core.files import sha256_of
from opforge.program.serialize import ProgramFormatError

FEED = {"x": np.random.default_rng(1).standard_normal((4, 3)), "y": np.array([0, 1, 4, 2])}


def run(prog):
    return of.Executor(prog).run(**FEED)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "p.json"
    small_program().save(path)
    return path


def doc_of(path):
    return json.loads(path.read_text())


def write_doc(path, doc):
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)


def replace_values(path, arrays: dict, *, raw: bytes | None = None):
    """Give the program at ``path`` a new values file (its digest recorded, so only its content is tested)."""
    doc = doc_of(path)
    values = path.with_name("forged.npz")
    if raw is None:
        np.savez(values, **arrays)
    else:
        values.write_bytes(raw)
    doc["values"], doc["values_sha256"] = values.name, sha256_of(str(values))
    write_doc(path, doc)


def values_of(path):
    with np.load(path.with_name(doc_of(path)["values"])) as npz:
        return {k: npz[k] for k in npz.files}


def op_index(doc, kind):
    return next(i for i, op in enumerate(doc["ops"]) if op["type"] == kind)


# -- Program.save is one atomic unit -----------------------------------------------------------------------------

def test_save_names_its_values_uniquely_and_removes_the_old_ones_only(tmp_path):
    path = tmp_path / "p.json"
    small_program(seed=0).save(path)
    first = doc_of(path)["values"]
    assert first.startswith("p.") and first.endswith(".npz") and len(first) == len("p..npz") + 16
    small_program(seed=0).save(path)  # the same values again: another name (a name is one save's alone)
    assert doc_of(path)["values"] != first and not (tmp_path / first).exists()
    first = doc_of(path)["values"]
    (tmp_path / "p.0123456789abcdef.npz").write_bytes(b"a concurrent save's values, its JSON not written yet")
    (tmp_path / "p.npz").write_bytes(b"someone else's file")
    small_program(seed=1).save(path)
    second = doc_of(path)["values"]
    assert second != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["p.json", "p.npz", "p.0123456789abcdef.npz", second])
    (tmp_path / "other.npz").write_bytes(b"a checkpoint")
    doc = doc_of(path)
    doc["values"] = "other.npz"  # a damaged JSON naming a file a save of p.json never writes: not removed
    write_doc(path, doc)
    small_program(seed=2).save(path)
    assert (tmp_path / "other.npz").read_bytes() == b"a checkpoint"


def _same_program(a, b):
    return str(a) == str(b) and a.values.keys() == b.values.keys() and all(
        np.array_equal(a.values[k], b.values[k]) for k in a.values)


def _die_at_call(k):
    """A profile function that SIGKILLs this process at the k-th call or return it sees."""
    calls = iter(range(k))

    def profile(frame, event, arg):
        if next(calls, None) is None:
            os.kill(os.getpid(), signal.SIGKILL)

    return profile


@pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(signal, "SIGKILL"), reason="needs fork and SIGKILL")
def test_a_program_save_killed_at_any_point_leaves_the_old_program_or_the_new(tmp_path):
    """A child process saves the new program over the old one and SIGKILLs itself at the k-th Python or C call
    of the save, for k spread over the whole save and right before and after each rename, fsync and unlink (about
    50 points).
    Whenever it died, the path must load, as the old program or the new one — never neither."""
    old, new = small_program(seed=0), small_program(seed=1, extra_op=True)
    events = []
    dry = tmp_path / "dry" / "p.json"
    old.save(dry)
    sys.setprofile(lambda frame, event, arg: events.append(getattr(arg, "__name__", "") if "c_" in event else ""))
    try:
        new.save(dry)
    finally:
        sys.setprofile(None)
    n = len(events)
    points = set(range(0, n, max(1, n // 24)))
    for i, name in enumerate(events):  # (each C call shows twice: its call and its return)
        if name in ("replace", "fsync", "unlink"):
            points |= {i, i + 1}
    outcomes = {"old": 0, "new": 0}
    for k in sorted(points):
        path = tmp_path / f"k{k}" / "p.json"
        old.save(path)
        pid = os.fork()
        if pid == 0:  # the child: count the calls of the save, die at call k
            try:
                sys.setprofile(_die_at_call(k))
                new.save(path)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 60
        while os.waitpid(pid, os.WNOHANG)[0] == 0:  # never hang the suite on a stuck child
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the child saving with a kill at call {k} hung")
            time.sleep(0.001)
        loaded = of.Program.load(path)
        if _same_program(loaded, old):
            outcomes["old"] += 1
        else:
            assert _same_program(loaded, new), f"killed at call {k} of {n}: neither the old program nor the new"
            outcomes["new"] += 1
    assert outcomes["old"] >= 5 and outcomes["new"] >= 1, outcomes  # the kills landed before and after the switch
    new.save(path)  # a later complete save leaves the new program and its values (and a killed save's .tmp)
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(".tmp")) == \
        sorted(["p.json", doc_of(path)["values"]])


def test_a_save_between_its_two_steps_survives_a_concurrent_save_of_the_same_path(saved, monkeypatch):
    from opforge.program import serialize

    a, b = small_program(seed=1), small_program(seed=2, extra_op=True)
    write_json = serialize.atomic_write

    def b_saves_first(path, write, before_rename=None):  # A has written its values, not yet its JSON: B saves,
        monkeypatch.setattr(serialize, "atomic_write", write_json)  # then A goes on
        b.save(saved)
        write_json(path, write, before_rename)

    monkeypatch.setattr(serialize, "atomic_write", b_saves_first)
    a.save(saved)
    assert _same_program(of.Program.load(saved), a)  # the last rename wins, its values intact


def test_a_save_between_the_json_and_the_removal_of_the_old_values_leaves_a_program_that_loads(saved, monkeypatch):
    # A saves p over q: its JSON is in place, the old values (q's) not yet removed, when B saves q again. With
    # values named by their content B's values file had q's name again, and A then removed it: the JSON named a
    # file that was gone.
    from opforge.program import serialize

    q = small_program()
    write_json = serialize.atomic_write

    def then_b_saves(path, write, before_rename=None):
        write_json(path, write, before_rename)
        monkeypatch.setattr(serialize, "atomic_write", write_json)
        q.save(saved)

    monkeypatch.setattr(serialize, "atomic_write", then_b_saves)
    small_program(seed=1).save(saved)
    assert _same_program(of.Program.load(saved), q)
    assert sorted(p.name for p in saved.parent.iterdir()) == sorted(["p.json", doc_of(saved)["values"]])


def _save_in_turn(path, seeds, rounds):
    programs = [small_program(seed=s) for s in seeds]
    for i in range(rounds):
        programs[i % len(programs)].save(path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks two savers")
def test_processes_saving_one_path_at_once_leave_a_program_that_loads(tmp_path):
    import multiprocessing

    path = tmp_path / "p.json"
    small_program().save(path)
    context = multiprocessing.get_context("fork")
    savers = [context.Process(target=_save_in_turn, args=(path, seeds, 60)) for seeds in ([0, 1], [1, 0])]
    for p in savers:
        p.start()
    for p in savers:
        p.join(timeout=120)
        assert p.exitcode == 0
    loaded = of.Program.load(path)
    assert _same_program(loaded, small_program(seed=0)) or _same_program(loaded, small_program(seed=1))
    # what the race may leave besides: values files of saves whose JSON another replaced unread (no .tmp file)
    assert all(p.name.startswith("p.") and p.suffix in (".json", ".npz") for p in tmp_path.iterdir())


def test_a_save_whose_json_cannot_be_written_removes_its_values(saved, monkeypatch):
    from opforge.program import serialize

    before = sorted(p.name for p in saved.parent.iterdir())

    def disk_full(path, write, before_rename=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serialize, "atomic_write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        small_program(seed=1).save(saved)
    assert sorted(p.name for p in saved.parent.iterdir()) == before
    assert _same_program(of.Program.load(saved), small_program())


@pytest.mark.parametrize("stem", ["p" * 250, "é" * 125], ids=["ascii", "two-byte"])
def test_saves_to_names_of_255_bytes(tmp_path, stem):
    # The temporary file's name added 14 bytes to the name, and the values file's 21: past the 255 bytes file
    # systems allow. Both now keep at most 64 bytes of it.
    assert len(os.fsencode(stem + ".json")) == 255
    path = tmp_path / (stem + ".json")
    small_program().save(path)
    assert _same_program(of.Program.load(path), small_program())
    small_program(seed=1).save(path)  # over it: the old values file is recognised as this path's, and removed
    assert len(list(tmp_path.iterdir())) == 2
    of.save({"w": np.arange(3.0)}, tmp_path / (stem + ".npz"))
    np.testing.assert_array_equal(of.load(tmp_path / (stem + ".npz"))["w"], np.arange(3.0))


# -- a values file holds values for persistable variables and constants, and nothing else ------------------------

@pytest.mark.parametrize("name", ["x", "y", "tanh.5", "cross_entropy.9", "nobody"])
def test_a_values_file_holding_a_feed_an_op_output_or_an_unknown_name_is_refused(saved, name):
    values = values_of(saved)
    values[name] = np.zeros((4, 5)) if name not in ("x", "y") else FEED[name]
    replace_values(saved, values)
    with pytest.raises(ProgramFormatError, match=f"holds a value for '{name}', which the program does not declare"):
        of.Program.load(saved)


def test_missing_or_misfit_values_are_refused(saved):
    values = values_of(saved)
    param = next(k for k in values if k.startswith("param"))
    replace_values(saved, {k: v for k, v in values.items() if k != param})
    with pytest.raises(ProgramFormatError, match=f"variables \\['{param}'\\] are persistable"):
        of.Program.load(saved)
    replace_values(saved, {**values, param: values[param].astype(np.float32)})
    with pytest.raises(ProgramFormatError, match=f"value '{param}' of shape .* float32 does not fit"):
        of.Program.load(saved)


def test_a_values_file_changed_after_the_save_is_refused(saved):
    values = saved.with_name(doc_of(saved)["values"])
    data = bytearray(values.read_bytes())
    data[-100] ^= 1
    values.write_bytes(bytes(data))
    with pytest.raises(ProgramFormatError, match="SHA-256 is not the one the program records"):
        of.Program.load(saved)


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "empty", "huge header"])
def test_a_damaged_values_file_is_refused_without_allocating_what_it_claims(saved, damage):
    good = saved.with_name(doc_of(saved)["values"]).read_bytes()
    param = next(k for k in values_of(saved) if k.startswith("param"))
    if damage == "huge header":  # a parameter of 10**12 float64 elements, 8 TB, in a file of a few hundred bytes
        header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': ({10**12},), }}".encode()
        header += b" " * (127 - 10 - len(header)) + b"\n"
        raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(64)
        forged = saved.with_name("member.zip")
        with zipfile.ZipFile(forged, "w") as z:
            z.writestr(param + ".npy", raw)
        data = forged.read_bytes()
    else:
        data = {"truncated": good[: len(good) // 2], "not a zip": b"PK\x03\x04 and nothing", "empty": b""}[damage]
    replace_values(saved, {}, raw=data)
    with pytest.raises(ProgramFormatError, match="declares shape \\(1000000000000,\\)" if damage == "huge header"
                       else "not a readable .npz"):
        of.Program.load(saved)


# -- the JSON: everything checked at load, nothing left to fail inside the executor --------------------------------

def _del(key):
    return lambda d: d.pop(key)


def _set(key, value):
    return lambda d: d.update({key: value})


def _var(name, **changes):
    return lambda d: next(v for v in d["vars"] if v["name"] == name).update(changes)


def _op(kind, **changes):
    return lambda d: d["ops"][op_index(d, kind)].update(changes)


def _attr(kind, **changes):
    return lambda d: d["ops"][op_index(d, kind)]["attrs"].update(changes)


def _swap_first_ops(d):
    d["ops"][0], d["ops"][1] = d["ops"][1], d["ops"][0]


def _input(kind, slot, names):
    return lambda d: d["ops"][op_index(d, kind)]["inputs"].update({slot: names})


@pytest.mark.parametrize("change, message", [
    ("[1, 2, 3]", "not an opforge program .*top level list"),
    ('"text"', "not an opforge program"),
    ("{" * 5 + "}" * 5, "not a readable program file"),
    ('{"format": "opforge.program", "version": 1, "vars": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "JSON nested too deeply"),
    ("\xff\xfe not utf-8", "not a readable program file"),
    (_del("values"), "lacks 'values'"),
    (_del("vars"), "lacks 'vars'"),
    (_set("version", "1"), "format version str '1' is not a version number"),
    (_set("version", True), "is not a version number"),
    (_set("values", "../elsewhere.npz"), "the values file must sit beside the program"),
    (_set("values", None), "'values' must be a str"),
    (_set("backward_requests", [[]]), "a backward request must be \\[loss"),
    (_set("backward_requests", [["x"]]), "a backward request must be \\[loss"),
    (_set("backward_requests", [[1, 2, 3]]), "a backward request must be \\[loss"),
    (_set("backward_requests", [["x", ["ghost"], []]]), "refers to undeclared variable 'ghost'"),
    (_set("feeds", "x"), "'feeds' must be a list"),
    (_set("feeds", ["x", "x"]), "a feed is named twice"),
    (_set("outputs", {"loss": 3}), "outputs maps 'loss' to int 3"),
    (_set("updates", {"x": "tanh.5"}), "'updates' gives a new value to 'x', which is not persistable"),
    (_var("x", shape=[float("nan"), 3]), "has shape list \\[nan, 3\\]"),
    (_var("x", shape=["a", 3]), "has shape"),
    (_var("x", shape=[-1, 3]), "has shape"),
    (_var("x", shape=[2**70, 3]), "has shape"),
    (_var("x", shape="3"), "'shape' must be a list"),
    (_var("x", dtype={"a": 1}), "'dtype' must be a str"),
    (_var("x", dtype="complex128"), "has dtype str 'complex128'"),
    (_var("x", dtype="(2,)f8"), "has dtype"),
    (_var("x", persistable=True), "feed 'x' is marked persistable"),
    (_var("x", persistable="yes"), "'persistable' must be a bool"),
    (lambda d: d["vars"].append(dict(d["vars"][0])), "variable 'x' is declared twice"),
    (lambda d: d["vars"].append(5), "var #.* must be an object"),
    (_attr("reshape", shape=[{"dim": ["ghost", 0]}, 5]), "is not the size of an axis of a variable known before"),
    (_attr("reshape", shape=[{"dim": ["x", 5]}, 5]), "is not the size of an axis"),
    (_attr("reshape", shape=[{"dim": ["x"]}, 5]), "is not the size of an axis"),
    (_attr("reshape", shape=[{"dim": [1, 0]}, 5]), "is not the size of an axis"),
    (_attr("reshape", shape=[{"dim": ["cross_entropy.9", 0]}, 5]), "is not the size of an axis"),
    (_attr("reshape", shape=[[1, 2], 5]), "unknown attr value list"),
    (_attr("reshape", shape={"dtype": "float64"}), "argument 'shape' expected int\\[\\]"),
    (_attr("ones_like", dtype={"dtype": {"a": 1}}), "unknown attr value dict"),
    (_attr("cross_entropy", reduction="x"), "op #\\d+ cross_entropy: .*reduction"),
    (_attr("cross_entropy_grad", reduction="x"), "op #\\d+ cross_entropy_grad: .*reduction"),
    (_attr("cross_entropy", label_smoothing=10**400), "label_smoothing.* int too large for a float"),
    (_attr("transpose", perm=[0, 0]), "op #\\d+ transpose"),
    (_swap_first_ops, "op #0 add reads 'matmul.2' before op #1 writes it"),
    (lambda d: d["ops"].reverse(), "reads .* before op #\\d+ writes it"),
    (_input("tanh", "x", []), "op #\\d+ tanh \\(input 'x'\\) names 0 variables, its schema exactly 1"),
    (_input("tanh", "x", ["x", "x"]), "names 2 variables"),
    (_input("tanh", "x", "add.4"), "must be a list of variable names"),
    (_input("tanh", "x", ["y"]), "op #\\d+ tanh: .*"),
    (_input("matmul", "x", ["param.1"]), "op #\\d+ matmul: .*"),
    (_op("tanh", inputs={}), "has inputs \\[\\], its schema \\['x'\\]"),
    (_op("tanh", outputs={"out": ["tanh.5"]}), "has outputs \\['out'\\], its schema \\['y'\\]"),
    (_op("tanh", outputs={"y": ["x"]}), "writes 'x', a feed or persistable variable"),
    (_op("tanh", outputs={"y": ["add.4"]}), "writes 'add.4', which op #\\d+ writes already"),
    (_op("tanh", role=3), "'role' must be a str"),
    (_op("tanh", type=["tanh"]), "'type' must be a str"),
    (_op("tanh", attrs=[]), "'attrs' must be a dict"),
    (_set("ops", []), "are persistable, or are read but have neither a value nor an op"),
    (_set("ops", {}), "'ops' must be a list"),
    (lambda d: d["ops"].append(3), "op #\\d+ must be an object"),
])
def test_a_damaged_or_tampered_program_fails_clearly_at_load(saved, change, message):
    if isinstance(change, str):
        write_doc(saved, change)
    else:
        doc = doc_of(saved)
        change(doc)
        write_doc(saved, doc)
    with pytest.raises(ProgramFormatError, match=message):
        of.Program.load(saved)


def test_a_program_saved_by_an_older_opforge_still_loads(saved):
    """Before the values file was named by its hash: ``<stem>.npz``, and no digest in the JSON."""
    doc = doc_of(saved)
    saved.with_name(doc["values"]).rename(saved.with_name("p.npz"))
    doc["values"] = "p.npz"
    del doc["values_sha256"]
    write_doc(saved, doc)
    a, b = run(small_program()), run(of.Program.load(saved))
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_fixture_program_loads_and_runs_as_traced(saved):
    prog = small_program()
    loaded = of.Program.load(saved)
    assert str(loaded) == str(prog)
    a, b = run(prog), run(loaded)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_a_loaded_program_names_new_variables_apart_from_its_own(saved):
    """append_backward on a loaded program (second order) must not reuse a name the file holds."""
    prog = of.Program.load(saved)
    n_vars, n_ops = len(prog.block.vars), len(prog.block.ops)
    of.append_backward(prog, prog.outputs["loss"])  # once more: new ops writing new variables
    new = [n for op in prog.block.ops[n_ops:] for n in op.output_names()]
    assert new and len(prog.block.vars) == n_vars + len(new)
    run(prog)


# -- checkpoints -------------------------------------------------------------------------------------------------

def _checkpoint(tmp_path, manifest, **arrays):
    text = manifest if isinstance(manifest, str) else json.dumps(
        {"format": "opforge.checkpoint", "version": 1, "tree": manifest})
    path = tmp_path / "c.npz"
    np.savez(path, **{MANIFEST: np.frombuffer(text.encode(), np.uint8)}, **arrays)
    return path


def _nested(depth):
    tree = {"list": []}
    for _ in range(depth):
        tree = {"list": [tree]}
    return tree


@pytest.mark.parametrize("manifest, message", [
    ({"dict": [[["k"], 1]]}, "key list \\['k'\\] is not a str or int"),
    ({"dict": [["k", 1], ["k", 2]]}, "key str 'k' is not a str or int, or is repeated"),
    ({"dict": 5}, "a dict must hold a list of \\[key, value\\] pairs"),
    ({"dict": [["k"]]}, "a dict must hold a list of \\[key, value\\] pairs"),
    ({"list": 5}, "a list must hold a list"),
    ({"tensor": ["k"]}, "list \\['k'\\] names no array of the file"),
    ({"tensor": "nothing"}, "names no array of the file"),
    ({"tensor": MANIFEST}, "names no array of the file"),
    ({"scalar": "a0"}, "a scalar of shape \\(3,\\)"),
    ({"tensor": "s0"}, "dtype <U1 is not supported"),
    ({"what": 1}, "manifest entry of unknown kind str 'what'"),
    ({"a": 1, "b": 2}, "expected a value or a one-key dict"),
    (_nested(150), "nested deeper than 100 levels"),
    ('{"format": "opforge.checkpoint", "version": 1, "tree": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "nested too deeply"),
    ('{"format": "opforge.checkpoint", "version": 1.5, "tree": 1}', "format version float 1.5"),
    ("[]", "not an opforge checkpoint"),
    ("\xff", "not a readable checkpoint"),
])
def test_a_malformed_checkpoint_manifest_is_refused_clearly(tmp_path, manifest, message):
    path = _checkpoint(tmp_path, manifest, a0=np.ones(3), s0=np.array(["x"]))
    with pytest.raises(CheckpointError, match=message):
        of.load(path)


def test_a_checkpoint_member_claiming_terabytes_is_refused_before_allocating(tmp_path):
    of.save({"w": np.ones(3)}, tmp_path / "c.npz")
    with zipfile.ZipFile(tmp_path / "c.npz") as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': ({10**12},), }}".encode()
    header += b" " * (127 - 10 - len(header)) + b"\n"
    members["a0.npy"] = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(24)
    with zipfile.ZipFile(tmp_path / "c.npz", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(CheckpointError, match="declares shape \\(1000000000000,\\) of float64 \\(8000000000000 bytes"):
        of.load(tmp_path / "c.npz")


def test_saving_a_container_that_holds_itself_is_refused(tmp_path):
    loop = []
    loop.append(loop)
    with pytest.raises(of.ArgumentError, match="nest deeper than 100 levels"):
        of.save({"x": loop}, tmp_path / "c.npz")


def test_an_optimizer_state_dict_with_a_hyper_parameter_no_float_holds_is_refused():
    p = of.tensor(np.ones(3), requires_grad=True)
    opt = of.optim.Adam([p])
    state = opt.state_dict()
    state["param_groups"][0]["eps"] = 10**400
    with pytest.raises(of.ArgumentError, match="Adam\\(\\): hyper-parameter eps must be a finite number"):
        opt.load_state_dict(state)
    assert opt.param_groups[0]["eps"] == 1e-8


def test_half_precision_values_round_trip_through_checkpoints_and_programs(tmp_path):
    """NumPy's .npy format has no name for bfloat16 (it writes 2-byte voids): the loaders read those back."""
    from opforge.core import dtypes as D

    values = {"b": of.tensor(np.arange(3, dtype=np.float32)).bfloat16(), "h": of.tensor(np.ones(3)).half()}
    of.save(values, tmp_path / "c.npz")
    back = of.load(tmp_path / "c.npz")
    assert {k: (v.dtype, v.numpy().tolist()) for k, v in back.items()} == \
        {k: (v.dtype, v.numpy().tolist()) for k, v in values.items()}
    w = of.tensor(np.full((3, 2), 0.5, np.float32)).bfloat16().detach()
    w.requires_grad = True
    prog = of.trace(lambda x: {"loss": F.sum(x @ w)}, x=of.Spec((None, 3), D.bfloat16))
    prog.save(tmp_path / "p.json")
    x = np.ones((2, 3), D.bfloat16)
    assert of.Executor(of.Program.load(tmp_path / "p.json")).run(x=x)["loss"] == of.Executor(prog).run(x=x)["loss"]


def test_a_zip_of_an_unknown_version_is_a_clear_error(tmp_path):
    """Found by the long file fuzz: a member whose header asks for zip version 10.9 made zipfile raise a raw
    NotImplementedError from of.load."""
    path = tmp_path / "weights.ckpt"
    of.save({"w": of.ones(3)}, str(path))
    data = bytearray(path.read_bytes())
    central = data.rfind(b"PK\x01\x02")  # the last central directory entry: its "version needed to extract"
    data[central + 6:central + 8] = (109).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(of.OpforgeError, match=r"weights.ckpt"):
        of.load(str(path))
