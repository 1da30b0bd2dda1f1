"""Writing files so that nothing a user saved is ever lost: a complete new file or the old one, never a part."""

import contextlib
import os
import secrets


def atomic_write(path: str, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, rename it to ``path`` and fsync the
    directory: ``path`` holds either its old content or the complete new one, never a part."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):  # else open() would name the temporary file, which the caller never chose
        raise FileNotFoundError(f"cannot write {path!r}: the folder {directory!r} does not exist (create it first)")
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # created with the usual permissions (umask), unlike tempfile's 0600
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


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
