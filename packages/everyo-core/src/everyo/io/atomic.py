"""``atomic_write``: replace a file so that readers never see half of it.

Shared by checkpoints and the ONNX exporter. The new content goes to a
temporary file beside the target, is flushed to disk, then renamed over it;
the folder is flushed too, so the rename survives a power cut. A path that
exists and is not a regular file (``/dev/null``, a FIFO, a device, or a
symlink to one) cannot be replaced that way without destroying it, so it is
written through directly, exactly like ``open(path, "wb")``.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import stat
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import BinaryIO

_TMP_INFIX = ".everyo-tmp-"


def _temporary_name(name):
    return f".{name}{_TMP_INFIX}{os.getpid()}-{secrets.token_hex(4)}"


def _pid_is_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's live process, or we cannot tell: keep its file
    return True


def remove_stale_temporaries(folder, name):
    """Delete ``.<name>.everyo-tmp-<pid>-<hex>`` files in ``folder`` whose writer
    process no longer exists (a ``kill -9`` or a power cut during a save).

    Only names of exactly that pattern are touched, and never one whose pid is
    alive or is this process (another thread may be saving right now). Pids are
    only meaningful on this machine: on a folder shared by several hosts, a
    save on one host may remove another host's in-flight temporary (that save
    then fails with an error; no finished file is ever lost).
    """
    pattern = re.compile(re.escape(f".{name}{_TMP_INFIX}") + r"([0-9]{1,10})-[0-9a-f]{8}")
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or _pid_is_alive(pid):
            continue
        try:
            os.unlink(os.path.join(folder, entry))
        except OSError:
            pass


class _StreamOnly:
    """A write-only view of an open file, with no ``tell``/``seek``.

    ``/dev/null`` claims to be seekable and always says position 0, which
    makes zipfile (``np.savez``) write a broken directory or fail; without
    ``tell`` zipfile streams, as a FIFO or a device needs.
    """

    def __init__(self, f):
        self._f = f

    def write(self, data):
        return self._f.write(data)

    def flush(self):
        self._f.flush()

    def read(self, size=-1):  # np.savez only accepts objects that have one
        raise io.UnsupportedOperation(f"{self._f.name} is opened for writing only")

    def writable(self):
        return True

    def seekable(self):
        return False


def _fsync_folder(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # e.g. Windows cannot open folders; the rename itself is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(file)`` with a binary file object, then publish it at ``path``.

    For a regular file (or a new path): ``write`` fills a temporary file
    ``.<name>.everyo-tmp-<pid>-<random>`` beside the target, which is flushed
    to disk and renamed over ``path``. Readers see the old file or the
    complete new one, never a partial one; any exception (including
    ``KeyboardInterrupt``) removes the temporary and leaves the old file as it
    was. Temporaries left by a killed process are removed by the next write to
    the same path. A new file gets mode ``0o666 & ~umask``, as ``open`` gives;
    an overwritten file keeps its mode (and, where permitted, its owner). A
    symlink to a regular file is followed: the file it points to is replaced.

    For a path that exists and is not a regular file (``/dev/null``, a FIFO,
    a character device, or a symlink to one): written through directly, as
    ``open(path, "wb")`` would, with no temporary and no rename.

    Args:
        path: the target (str or path-like).
        write: a callable taking the open binary file; its return value is ignored.

    Examples:
        >>> atomic_write("weights.bin", lambda f: f.write(b"..."))  # doctest: +SKIP
    """
    path = os.fspath(path)
    try:
        info = os.stat(path)  # follows symlinks: what matters is what the path leads to
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(f"cannot write {path!r}: it is a folder; give a file name inside it")
    if info is not None and not stat.S_ISREG(info.st_mode):
        with open(path, "wb") as f:
            write(cast("BinaryIO", _StreamOnly(f)))
        return
    target = os.path.realpath(path) if os.path.islink(path) else path
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write {path!r}: folder {folder!r} does not exist")
    name = os.path.basename(target)
    remove_stale_temporaries(folder, name)
    tmp = os.path.join(folder, _temporary_name(name))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    # A new file: the kernel applies the umask to 0o666, as open() would.
    fd: int | None = os.open(tmp, flags, 0o666 if info is None else 0o600)
    try:
        if info is not None:
            _keep_mode_and_owner(fd, tmp, info)
        assert fd is not None
        with os.fdopen(fd, "wb") as f:
            fd = None
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_folder(folder)


def _keep_mode_and_owner(fd, tmp, info):
    # Owner first: chown clears set-uid/set-gid bits, which the chmod then restores.
    if hasattr(os, "fchown"):
        try:
            os.fchown(fd, info.st_uid, info.st_gid)
        except OSError:
            pass  # not root: the file becomes ours, as any editor's save would make it
    if hasattr(os, "fchmod"):
        os.fchmod(fd, stat.S_IMODE(info.st_mode))
    else:  # Windows: only the read-only bit exists
        os.chmod(tmp, stat.S_IMODE(info.st_mode))
