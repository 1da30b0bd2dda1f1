"""Writing files so that nothing a user saved is ever lost (a complete new file or the old one, never a part), and
reading ``.npz`` archives that nobody vouches for without trusting the sizes they claim."""

import contextlib
import os

import numpy as np

from . import dtypes as D
from .errors import OpforgeError


def atomic_write(path: str, write, before_rename=None) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, rename it to ``path`` and fsync the
    directory: ``path`` holds either its old content or the complete new one, never a part. ``before_rename()``,
    if given, runs right before the rename (to read what is about to be replaced)."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = _write_temporary(directory, os.path.basename(path), write)
    if before_rename is not None:
        try:
            before_rename()
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _rename(tmp, path)


def write_uniquely_named(directory: str, stem: str, suffix: str, write) -> tuple[str, str]:
    """Write a file as ``atomic_write`` does, named ``<stem>.<16 random hex digits><suffix>`` in ``directory`` (the
    stem cut to ``NAME_PART`` bytes): a name no other writer uses. Return that name and the file's SHA-256. A file
    that names it (a program's JSON naming its values) can then be replaced by one atomic rename, the old pair and
    the new one both complete meanwhile, and the file be removed by whoever replaces that one name, without
    pulling it from under another writer (a name made of the content would be shared by two writers of the same
    content)."""
    tmp = _write_temporary(directory, stem + suffix, write)
    try:
        digest = sha256_of(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    name = f"{shortened(stem)}.{os.urandom(8).hex()}{suffix}"
    _rename(tmp, os.path.join(directory, name))
    return name, digest


NAME_PART = 64  # bytes of a given name that a made-up name (a temporary file, a values file) keeps


def shortened(name: str, limit: int = NAME_PART) -> str:
    """``name`` cut to at most ``limit`` bytes as the file system stores it (at a character boundary): a name made
    from a valid one plus a few characters must stay valid, and file systems allow 255 bytes (eCryptfs 143)."""
    name = name[:limit]
    while len(os.fsencode(name)) > limit:
        name = name[:-1]
    return name


# zipfile and hashlib are imported where they are used: zipfile brings lzma, bz2 and shutil with it, and these
# took 4.9 MB of every process's memory at ``import opforge`` (bench/run.py's memory group), saving or not.


def sha256_of(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_temporary(directory: str, name: str, write) -> str:
    if not os.path.isdir(directory):  # else open() would name the temporary file, which the caller never chose
        raise FileNotFoundError(f"cannot write {os.path.join(directory, name)!r}: the folder {directory!r} does not "
                                "exist (create it first)")
    tmp = os.path.join(directory, f".{shortened(name)}.{os.urandom(4).hex()}.tmp")  # valid where name is
    try:
        with open(tmp, "xb") as f:  # created with the usual permissions (umask), unlike tempfile's 0600
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _rename(tmp: str, path: str) -> None:
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(os.path.dirname(os.path.abspath(path)))


def write_npz(f, arrays: dict) -> None:
    """What ``np.savez`` writes (uncompressed .npy members in a zip), with pickling refused for every member."""
    import zipfile

    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)


def _fsync_directory(directory: str) -> None:
    """Make the rename durable. Not every platform can open a directory (Windows cannot): there it is skipped."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)


# -- reading .npz archives from untrusted files ------------------------------------------------------------------

_DEFLATE_MAX_RATIO = 1032  # deflate cannot expand data by more than about this factor
_CHUNK = 1 << 24


class ArchiveError(OpforgeError, ValueError):
    """An ``.npz`` file that cannot be read safely: damaged, truncated, or claiming sizes its bytes do not hold."""


class NpzReader:
    """The ``.npy`` members of an ``.npz`` (a zip), read one at a time with every size checked first.

    ``np.load`` trusts each member's header: one declaring 10**12 elements makes it allocate terabytes before it
    notices the data is missing. Here a member's header must agree, byte for byte, with the member's size in the
    zip directory, and that size with the archive's own size (a stored member can be no larger than the file, a
    deflated one no more than deflate can expand), so nothing is allocated that the file does not hold. Object
    arrays (which need pickle) and structured dtypes are refused. Every failure is an ``ArchiveError``.
    """

    def __init__(self, path):
        import zipfile

        if hasattr(path, "read"):  # an open binary file (io.BytesIO), read from its start
            self.path = getattr(path, "name", None) if isinstance(getattr(path, "name", None), str) else "<file>"
            with _as_archive_error(self.path):
                size = path.seek(0, os.SEEK_END)
                path.seek(0)
                self._zip = zipfile.ZipFile(path)
        else:
            self.path = os.fspath(path)
            with _as_archive_error(self.path):
                size = os.path.getsize(self.path)
                self._zip = zipfile.ZipFile(self.path)
        try:
            self._members, self._headers = {}, {}
            for info in self._zip.infolist():
                name = info.filename
                if not name.endswith(".npy"):
                    raise ArchiveError(f"{self.path}: member {name!r} is not a .npy array")
                if name[:-4] in self._members:
                    raise ArchiveError(f"{self.path}: member {name!r} appears twice")
                if info.compress_type == zipfile.ZIP_STORED:
                    fits = info.file_size == info.compress_size <= size
                elif info.compress_type == zipfile.ZIP_DEFLATED:
                    fits = info.compress_size <= size and info.file_size <= _DEFLATE_MAX_RATIO * info.compress_size
                else:
                    raise ArchiveError(f"{self.path}: member {name!r} uses an unsupported compression")
                if not fits:
                    raise ArchiveError(f"{self.path}: member {name!r} claims {info.file_size} bytes, more than the "
                                       f"file ({size} bytes) can hold")
                self._members[name[:-4]] = info
        except BaseException:
            self._zip.close()
            raise

    @property
    def files(self) -> list:
        """Member names without ``.npy``, as ``np.load(...).files`` gives them."""
        return list(self._members)

    def __contains__(self, key) -> bool:
        return isinstance(key, str) and key in self._members

    def header(self, key: str):
        """``(shape, dtype)`` of member ``key``, from its header alone, checked against the member's size."""
        if key not in self._headers:
            with self._open(key) as f:
                self._headers[key] = self._header(f, key)
        shape, dtype, _, _ = self._headers[key]
        return shape, dtype

    def read(self, key: str) -> np.ndarray:
        """Member ``key`` as a new writable array."""
        with self._open(key) as f:
            if key in self._headers:  # read already: skip it
                shape, dtype, fortran, offset = self._headers[key]
                with _as_archive_error(self.path, key):
                    f.seek(offset)
            else:
                shape, dtype, fortran, _ = self._header(f, key)
            with _as_archive_error(self.path, key):
                buffer = np.empty(_nbytes(shape, dtype), np.uint8)
                done = 0
                while done < buffer.size:
                    chunk = f.read(min(_CHUNK, buffer.size - done))
                    if not chunk:
                        raise ArchiveError(f"{self.path}: member {key!r} ends early")
                    buffer[done:done + len(chunk)] = np.frombuffer(chunk, np.uint8)
                    done += len(chunk)
        return buffer.view(dtype).reshape(shape, order="F" if fortran else "C")

    @contextlib.contextmanager
    def _open(self, key):
        info = self._members.get(key) if isinstance(key, str) else None
        if info is None:
            raise ArchiveError(f"{self.path}: has no member {key!r}")
        with _as_archive_error(self.path, key):
            f = self._zip.open(info)
        with f:
            yield f

    def _header(self, f, key: str):
        with _as_archive_error(self.path, key):
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ArchiveError(f"{self.path}: member {key!r} has .npy format version {version}, not 1.0 or 2.0")
            offset = f.tell()
        if dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None and dtype.subdtype is None:
            dtype = D.bfloat16  # NumPy's format has no name for bfloat16: its arrays are written as 2-byte voids
        if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
            raise ArchiveError(f"{self.path}: member {key!r} has dtype {dtype}: only plain numeric, bool and string "
                               "arrays are read (Python objects would need pickle; opforge never reads with "
                               "allow_pickle)")
        if any(d < 0 for d in shape) or len(shape) > 64:
            raise ArchiveError(f"{self.path}: member {key!r} declares an impossible shape {shape}")
        nbytes, held = _nbytes(shape, dtype), self._members[key].file_size - offset
        if dtype.itemsize == 0 and 0 not in shape:
            raise ArchiveError(f"{self.path}: member {key!r} has elements of size 0 ({dtype})")
        if nbytes != held:
            raise ArchiveError(f"{self.path}: member {key!r} declares shape {shape} of {dtype} ({nbytes} bytes), "
                               f"but holds {held} bytes")
        return shape, dtype, fortran, offset

    def close(self) -> None:
        self._zip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _nbytes(shape: tuple, dtype: np.dtype) -> int:
    count = 1
    for d in shape:
        count *= d  # Python ints: no overflow, whatever the header claims
    return count * dtype.itemsize


@contextlib.contextmanager
def _as_archive_error(path: str, key=None):
    """Whatever a damaged zip or .npy makes zipfile, zlib or NumPy raise becomes an ArchiveError saying so."""
    try:
        yield
    except (OpforgeError, MemoryError, FileNotFoundError):
        raise
    except Exception as e:
        where = f"{path}: member {key!r}" if key is not None else path
        raise ArchiveError(f"{where} is not a readable .npz ({type(e).__name__}: {e})") from None
