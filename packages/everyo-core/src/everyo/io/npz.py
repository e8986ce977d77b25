"""EveryO's own checkpoint format: a NumPy ``.npz`` (zip) archive.

Every array is a member ``a<i>.npy``; the manifest (:mod:`everyo.io.manifest`)
is the uint8 member ``__everyo_manifest__.npy``. The writer is ``np.savez``;
the reader is our own, because a file to load is untrusted input: it reads
the zip's directory, checks every member's name, compression and declared
size against the manifest *before* reading it, parses each ``.npy`` header
with size limits, and never unpickles. So a file either loads to exactly what
was saved or raises :class:`~everyo.errors.EveryOSerializationError`.
Members must be stored uncompressed (``np.savez`` writes them so), which
bounds every allocation by the file's own size: a zip bomb is refused
before anything is inflated.
"""

import ast
import math
import struct
import zipfile
import zlib

import numpy as np

from everyo.errors import EveryOSerializationError
from everyo.io import manifest
from everyo.io.atomic import atomic_write

MANIFEST_MEMBER = "__everyo_manifest__.npy"
_NPY_MAGIC = b"\x93NUMPY"
_MAX_NPY_HEADER = 1 << 16  # NumPy writes < 200 bytes for every shape it allows
_MAX_MANIFEST_BYTES = 1 << 28
_CHUNK = 1 << 24
# What zipfile and zlib raise on malformed archives (zipfile has no single error class).
_MALFORMED = (
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
    EOFError,
    ValueError,
    OSError,
    NotImplementedError,
    RuntimeError,
    OverflowError,
    UnicodeError,
)


def write(state, path):
    arrays = []
    tree = manifest.encode(state, arrays, "state")
    payload = {f"a{i}": a for i, a in enumerate(arrays)}
    payload[MANIFEST_MEMBER[:-4]] = np.frombuffer(manifest.dumps(tree), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **payload))


def read(path):
    def fail(what):
        raise EveryOSerializationError(f"cannot load checkpoint {path}: {what}")

    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise EveryOSerializationError(f"checkpoint {path} does not exist") from None
    except OSError as exc:
        raise EveryOSerializationError(f"cannot open checkpoint {path}: {exc}") from None
    with f:
        try:
            return _read(f, path, fail)
        except EveryOSerializationError:
            raise
        except _MALFORMED as exc:
            raise EveryOSerializationError(
                f"cannot load checkpoint {path}: the file is truncated, corrupt or not an EveryO "
                f"checkpoint ({type(exc).__name__}: {exc})"
            ) from None


def _read(f, path, fail):
    f.seek(0, 2)
    file_size = f.tell()
    f.seek(0)
    head = f.read(8)
    f.seek(0)
    if head.startswith(_NPY_MAGIC):
        fail("it is a plain NumPy .npy file, not an EveryO checkpoint; read it with np.load(path, allow_pickle=False)")
    if head[:1] != b"P" and f.read(9)[8:9] == b"{":  # safetensors: 8-byte length, then a JSON header
        fail("it looks like a safetensors file; give it a .safetensors name so eo.load reads it as one")
    f.seek(0)
    if not zipfile.is_zipfile(f):
        fail("the file is truncated, corrupt or not an EveryO checkpoint (it is not a zip archive)")
    f.seek(0)
    with zipfile.ZipFile(f) as archive:
        members = {}
        for info in archive.infolist():
            if info.filename in members:
                fail(f"the archive holds two members named {info.filename!r}")
            members[info.filename] = info
        stored_bytes = sum(info.compress_size for info in members.values())
        if stored_bytes > file_size:
            # Members sharing bytes: each would pass its own checks, together they multiply the file.
            fail(f"its members declare {stored_bytes} bytes in a {file_size}-byte file (overlapping members?)")
        if MANIFEST_MEMBER not in members:
            hint = (
                " (it looks like a PyTorch checkpoint; export it with safetensors)"
                if any(n.endswith("data.pkl") for n in members)
                else "; was it written by eo.save?"
            )
            fail(f"it is a zip archive but not an EveryO checkpoint (no manifest){hint}")
        raw = _read_member(
            archive,
            members[MANIFEST_MEMBER],
            "|u1",
            None,
            file_size,
            fail,
            "the manifest",
            max_bytes=_MAX_MANIFEST_BYTES,
        )
        version, tree, specs = manifest.parse(raw.tobytes(), fail)
        expected = {MANIFEST_MEMBER} | {f"a{s.index}.npy" for s in specs}
        if set(members) != expected:
            odd = sorted(set(members) - expected)
            gone = sorted(expected - set(members))
            fail(
                "the archive's members do not match its manifest"
                + (f"; unexpected members {odd}" if odd else "")
                + (f"; missing members {gone}" if gone else "")
            )
        for spec in specs:
            where = f"array {spec.index}"
            stored = None if spec.dtype is None else manifest.storage_dtype(spec.dtype).str
            spec.value = _read_member(
                archive, members[f"a{spec.index}.npy"], stored, spec.shape, file_size, fail, where
            )
            if spec.dtype is None:  # version 1: the header is all we know; it has been checked
                spec.dtype = spec.value.dtype.str
            if spec.scalar and spec.value.shape != ():
                fail(f"{where} is marked as a scalar but has shape {spec.value.shape}")
            if spec.dtype == manifest.BFLOAT16:
                spec.value = _as_bfloat16(spec.value, path)
        return manifest.decode(tree, specs)


def _check_declared_size(info, declared_min, declared_max, file_size, fail, where):
    """Refuse a member whose directory entry disagrees with what it must hold, before reading it."""
    if info.flag_bits & 0x1:
        fail(f"{where} ({info.filename}) is encrypted")
    if info.compress_type != zipfile.ZIP_STORED:
        # eo.save never compresses; refusing compression bounds every allocation by the file's size.
        fail(
            f"{where} ({info.filename}) is compressed (zip method {info.compress_type}); "
            f"eo.save writes uncompressed members, and a compressed one could be a zip bomb"
        )
    if info.compress_size != info.file_size:
        fail(
            f"{where} ({info.filename}) is stored uncompressed but declares {info.file_size} bytes "
            f"in {info.compress_size}"
        )
    if info.header_offset + info.compress_size > file_size:
        fail(
            f"{where} ({info.filename}) declares {info.compress_size} bytes at offset {info.header_offset}, "
            f"past the end of the {file_size}-byte file (truncated?)"
        )
    if not declared_min <= info.file_size <= declared_max:
        fail(
            f"{where} ({info.filename}) declares {info.file_size} bytes, but the manifest's dtype and shape "
            f"need {declared_min} to {declared_max}"
        )


def _read_member(archive, info, dtype, shape, file_size, fail, where, max_bytes=manifest.MAX_ARRAY_BYTES):
    """The array in ``.npy`` member ``info``; its header must give ``dtype`` and ``shape``
    (either may be None: then the header decides, within ``max_bytes``)."""
    if dtype is not None and shape is not None:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        _check_declared_size(info, nbytes + 10, nbytes + 12 + _MAX_NPY_HEADER, file_size, fail, where)
    else:
        _check_declared_size(info, 10, max_bytes + 12 + _MAX_NPY_HEADER, file_size, fail, where)
    with archive.open(info) as member:
        header_dtype, fortran, header_shape, header_len = _read_npy_header(member, fail, where)
        if dtype is not None and header_dtype.str != dtype:
            fail(f"{where} is stored as {header_dtype.str} but the manifest says {dtype}")
        if shape is not None and header_shape != shape:
            fail(f"{where} is stored with shape {header_shape} but the manifest says {shape}")
        nbytes = math.prod(header_shape) * header_dtype.itemsize
        if header_len + nbytes != info.file_size:
            fail(
                f"{where} ({info.filename}) holds {info.file_size - header_len} data bytes; "
                f"shape {header_shape} of {header_dtype.str} needs {nbytes}"
            )
        buffer = np.empty(nbytes, dtype=np.uint8)
        view = memoryview(buffer)
        done = 0
        while done < nbytes:
            got = member.readinto(view[done : done + _CHUNK])
            if not got:
                fail(f"{where} ({info.filename}) ends after {done} of {nbytes} bytes (truncated)")
            done += got
        if member.read(1):  # also makes zipfile check the CRC at the end of the member
            fail(f"{where} ({info.filename}) is longer than its header says")
    return buffer.view(header_dtype).reshape(header_shape, order="F" if fortran else "C")


def _read_npy_header(member, fail, where):
    """(dtype, fortran_order, shape, total header length) of an ``.npy`` stream, checked."""
    prefix = member.read(8)
    if len(prefix) != 8 or not prefix.startswith(_NPY_MAGIC):
        fail(f"{where} is not a NumPy array")
    major = prefix[6]
    if major == 1:
        size_bytes, fmt = member.read(2), "<H"
    elif major in (2, 3):
        size_bytes, fmt = member.read(4), "<I"
    else:
        fail(f"{where} uses .npy format version {major}.{prefix[7]}, which this EveryO does not read")
    if len(size_bytes) != struct.calcsize(fmt):
        fail(f"{where} ends inside its header (truncated)")
    (length,) = struct.unpack(fmt, size_bytes)
    if length > _MAX_NPY_HEADER:
        fail(f"{where} declares a {length}-byte .npy header; NumPy writes a few hundred at most")
    text = member.read(length)
    if len(text) != length:
        fail(f"{where} ends inside its header (truncated)")
    try:
        header = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin1"))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, UnicodeDecodeError):
        fail(f"{where} has an unreadable .npy header")
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        fail(f"{where} has a malformed .npy header")
    descr, fortran = header["descr"], header["fortran_order"]
    shape = manifest.check_shape(header["shape"], fail, where)
    if type(fortran) is not bool:
        fail(f"{where} has a malformed .npy header (fortran_order {fortran!r})")
    if not isinstance(descr, str) or descr == manifest.BFLOAT16:
        fail(f"{where} has dtype {descr!r} in its .npy header, which checkpoints do not hold")
    manifest.check_dtype_string(descr, fail, where)
    return np.dtype(descr), fortran, shape, len(prefix) + len(size_bytes) + length


def _as_bfloat16(bits, path):
    try:
        import ml_dtypes
    except ImportError:
        raise EveryOSerializationError(
            f"checkpoint {path} holds bfloat16 arrays, which need the ml_dtypes package to load; "
            f"install it with: pip install everyo-core[amp]"
        ) from None
    return bits.view(ml_dtypes.bfloat16)
