"""Checkpoints: nested state dicts round-trip exactly; a save killed or failing half-way leaves the previous
checkpoint intact; loading against an expected structure names every mismatch; nothing is ever pickled."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import opforge as of
import opforge.optim as optim
from opforge.checkpoint import MANIFEST, CheckpointError, StateDictError, diff_structure, load, save

ROOT = Path(__file__).resolve().parents[1]


def assert_same(a, b, path="top"):
    """Equal values of exactly the same types (Tensors stay Tensors, tuples tuples, int keys ints...)."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, of.Tensor):
        a, b = a.numpy(), b.numpy()
    if isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.shape(a) == np.shape(b), path
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert type(k) is type(next(x for x in b if x == k)), (path, k)
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b), path
    else:
        assert a == b, path


def sample_state():
    rng = np.random.default_rng(0)
    return {
        "model": {
            "fc.weight": of.tensor(rng.standard_normal((3, 4)).astype(np.float32)),
            "fc.bias": of.tensor(rng.standard_normal(4)),
            "bn.num_batches_tracked": of.tensor(np.array(12)),
            "mask": of.tensor(np.array([True, False, True])),
            "scalar": of.tensor(np.array(2.5)),
            "empty": of.tensor(np.zeros((0, 3))),
        },
        "optimizer": {
            "state": {0: {"step": of.tensor(np.array(3)), "exp_avg": of.tensor(rng.standard_normal((3, 4)))}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "nesterov": False, "params": [0, 1],
                              "name": "main", "extra": None}],
        },
        "epoch": 7,
        "big": 2 ** 70,
        "nan": float("nan"),
        "inf": float("-inf"),
        "text": "héllo ✓",
        "array": np.arange(6, dtype=np.int32).reshape(2, 3).T,  # not contiguous
        "fortran": np.asfortranarray(rng.standard_normal((2, 3))),
        "npscalar": np.float32(1.5),
        "nested": [[1, (2, "a")], {}, []],
    }


def test_round_trip_keeps_values_types_and_nesting(tmp_path):
    obj = sample_state()
    save(obj, tmp_path / "ckpt.npz")
    back = load(tmp_path / "ckpt.npz")
    assert_same(obj, back)
    assert load(str(tmp_path / "ckpt.npz"), like=obj) is not None  # str paths work; the structure fits itself


def test_the_file_is_a_plain_npz_of_npy_members_without_objects(tmp_path):
    save(sample_state(), tmp_path / "ckpt")  # no suffix is added
    with zipfile.ZipFile(tmp_path / "ckpt") as archive:
        names = archive.namelist()
        assert f"{MANIFEST}.npy" in names and all(n.endswith(".npy") for n in names)
        for name in names:
            with archive.open(name) as member:
                assert not np.lib.format.read_array(member, allow_pickle=False).dtype.hasobject, name
    with np.load(tmp_path / "ckpt", allow_pickle=False) as arrays:  # readable without opforge
        assert MANIFEST in arrays.files and len(arrays.files) == 12  # 11 arrays and the manifest


def test_model_and_optimizer_state_dicts_round_trip(tmp_path):
    params = [of.tensor(np.ones((2, 3)), requires_grad=True), of.tensor(np.ones(3), requires_grad=True)]
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = of.tensor(np.full(p.shape, 0.5))
    opt.step()
    save({"params": params, "optimizer": opt.state_dict()}, tmp_path / "ckpt.npz")
    back = load(tmp_path / "ckpt.npz", like={"params": params, "optimizer": opt.state_dict()})
    assert_same(back["optimizer"], opt.state_dict())
    for p, q in zip(params, back["params"]):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


# -- atomicity ----------------------------------------------------------------------------------------------------

KILLED_SAVE = textwrap.dedent("""
    import sys, time
    import numpy as np
    from opforge import checkpoint

    write_array, written = np.lib.format.write_array, []

    def write_then_hang(fp, array, *args, **kwargs):  # the save stops dead after its first (large) array
        write_array(fp, array, *args, **kwargs)
        written.append(array.nbytes)
        if len(written) == 1:
            print("half written", flush=True)
            time.sleep(600)

    np.lib.format.write_array = write_then_hang
    checkpoint.save({"w": np.full((1000, 1000), 2.0), "b": np.full(10, 2.0)}, sys.argv[1])
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_save_killed_mid_write_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "ckpt.npz"
    save({"w": np.full((1000, 1000), 1.0), "b": np.full(10, 1.0)}, path)
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 300)  # never hang the suite on a stuck child
        line = proc.stdout.readline() if ready else "(no line within 300 s)"
        # the child is now inside the save: 8 MB written, the file not finished
        assert line == "half written\n", proc.stderr.read() if proc.poll() is not None else line
        partial = list(tmp_path.glob(".ckpt.npz.*.tmp"))
        assert len(partial) == 1 and partial[0].stat().st_size > 0
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert path.read_bytes() == before  # the previous checkpoint, byte for byte
    old = load(path)
    np.testing.assert_array_equal(old["w"], np.full((1000, 1000), 1.0))
    # What a save writing straight to `path` would have left there: a truncated, unreadable file.
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load(partial[0])


def test_a_save_failing_half_way_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    save({"w": np.ones(3)}, path)
    before = path.read_bytes()
    write_array = np.lib.format.write_array

    def fail_on_second(fp, array, *args, **kwargs):
        if fail_on_second.calls:
            raise OSError("disk full")
        fail_on_second.calls += 1
        write_array(fp, array, *args, **kwargs)

    fail_on_second.calls = 0
    monkeypatch.setattr(np.lib.format, "write_array", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        save({"w": np.zeros(3), "b": np.zeros(2)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.npz"]
    np.testing.assert_array_equal(load(path)["w"], np.ones(3))


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="names file descriptors through /proc")
def test_save_fsyncs_the_file_then_renames_then_fsyncs_the_directory(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def record_replace(src, dst):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    path = tmp_path / "ckpt.npz"
    save({"w": np.ones(3)}, path)
    (_, synced), (_, src, dst), (_, directory) = events
    assert synced == src and Path(src).parent == tmp_path and Path(src).name.startswith(".ckpt.npz.")
    assert dst == str(path) and directory == str(tmp_path)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_the_checkpoint_gets_the_usual_file_permissions(tmp_path):
    save({"w": np.ones(3)}, tmp_path / "ckpt.npz")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "ckpt.npz").stat().st_mode & 0o777 == 0o666 & ~umask


# -- checking against an expected structure ---------------------------------------------------------------------------

def test_load_like_names_every_missing_unexpected_and_mismatched_entry(tmp_path):
    saved = {"fc.weight": np.ones((3, 4), np.float32), "fc.bias": np.ones(4, np.float32), "old": np.ones(2),
             "opt": {"state": {0: {"step": np.array(1)}}, "lr": 0.1}}
    save(saved, tmp_path / "ckpt.npz")
    like = {"fc.weight": of.tensor(np.ones((4, 3), np.float32)), "fc.bias": np.ones(4, np.float64),
            "head.weight": np.ones(2),
            "opt": {"state": {0: {"step": np.array(1), "exp_avg": np.ones(2)}, 1: {}}, "lr": np.array(0.1)}}
    with pytest.raises(StateDictError) as info:
        load(tmp_path / "ckpt.npz", like=like)
    lines = str(info.value).splitlines()
    assert "does not match the expected structure" in lines[0] and "ckpt.npz" in lines[0]
    assert sorted(line.strip() for line in lines[1:]) == sorted([
        "missing: head.weight",
        "unexpected: old",
        "fc.weight: expected shape (4, 3), got (3, 4)",
        "fc.bias: expected dtype float64, got float32",
        "missing: opt/state/1",
        "missing: opt/state/0/exp_avg",
        "opt/lr: expected shape () and dtype float64, got number",
    ])


def test_diff_structure_compares_sequences_and_kinds():
    assert diff_structure({"a": [1, 2]}, {"a": [1, 2]}) == []
    assert diff_structure({"a": [1, 2]}, {"a": (5, 6, 7)}) == ["unexpected: a/2"]
    assert diff_structure([np.ones(2)], []) == ["missing: 0"]
    assert diff_structure({"x": "s"}, {"x": 3}) == ["x: expected str, got number"]
    assert diff_structure(np.ones(2), {"x": 1}) == ["the top level: expected shape (2,) and dtype float64, got dict"]


# -- nothing is pickled -----------------------------------------------------------------------------------------------

def test_objects_that_would_need_pickle_are_refused_naming_where_they_are(tmp_path):
    with pytest.raises(of.ArgumentError, match=r"'model/bad' holds Python objects \(dtype object\)"):
        save({"model": {"bad": np.array([{"a": 1}], dtype=object)}}, tmp_path / "x.npz")
    with pytest.raises(of.ArgumentError, match=r"cannot save set .* at 'opt/0'"):
        save({"opt": [{1, 2}]}, tmp_path / "x.npz")
    with pytest.raises(of.ArgumentError, match=r"dict keys must be str or int, got tuple"):
        save({(1, 2): 3}, tmp_path / "x.npz")
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary file


class _Payload:
    """Unpickling this runs code: what a malicious checkpoint would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def test_a_checkpoint_holding_a_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "marker"
    manifest = b'{"format": "opforge.checkpoint", "version": 1, "tree": {"dict": [["x", {"array": "a0"}]]}}'
    np.savez(tmp_path / "evil.npz", **{MANIFEST: np.frombuffer(manifest, np.uint8),
                                       "a0": np.array([_Payload(str(marker))], dtype=object)})
    with pytest.raises(CheckpointError, match="allow_pickle"):
        load(tmp_path / "evil.npz")
    assert not marker.exists()


def test_files_that_are_not_checkpoints_are_refused_clearly(tmp_path):
    np.savez(tmp_path / "plain.npz", w=np.ones(2))
    np.save(tmp_path / "single.npy", np.ones(2))
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not really a zip")
    save({"w": np.ones(1000)}, tmp_path / "good.npz")
    (tmp_path / "cut.npz").write_bytes((tmp_path / "good.npz").read_bytes()[:3000])
    for name, message in [("plain.npz", "it has no manifest"), ("single.npy", "a single .npy array"),
                          ("junk.npz", "not a readable checkpoint"), ("cut.npz", "not a readable checkpoint"),
                          ("absent.npz", "no checkpoint at")]:
        with pytest.raises(CheckpointError, match=message):
            load(tmp_path / name)
