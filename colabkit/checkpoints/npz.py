"""``arrays.npz`` written and read in one pass: hashed on the way, no intermediate copies.

The file is an ordinary uncompressed ``.npz`` (a zip of ``.npy`` members, as ``np.savez`` writes; ``np.load``
reads it), written so that saving and restoring touch every byte as few times as possible:

* writing streams each array's memory straight to the file (no ``tobytes`` chunk copies), computes the zip
  CRC-32 on the way and the file's hash (the manifest's, see digest.py) in a second thread, and syncs the data to disk
  while it writes, so that the final fsync has little left to do: the file is hashed and durable when
  ``write`` returns, without being read back;
* every member's data starts at a multiple of 64 bytes in the file (padding in the zip extra field, as
  Android's zipalign does), so arrays read into an aligned buffer are aligned views that frameworks take
  without another copy;
* reading reads the file once into one buffer, hashing it in a second thread as it arrives, and returns the
  arrays as views into that buffer (after the hash matched the manifest, which makes the zip CRCs
  redundant); arrays under 1 MB are copied out, so that keeping one does not keep the buffer. Compressed or
  encrypted members (``np.savez_compressed``'s) are refused: colabkit never writes them, and a deflated
  member from someone else can expand without bound.

Only numeric/string dtypes: an object array (which would need pickle) is refused when reading and writing.
"""
from __future__ import annotations

import io
import math
import os
import queue
import struct
import threading
import time
import zipfile
import zlib

import numpy as np

from . import digest, memory

CHUNK = 8 << 20            # write/read/hash granularity
SYNC_EVERY = 32 << 20      # start writing back to disk after this many bytes, while writing goes on
ALIGN = 64
SMALL = 1 << 20            # arrays read back below this size are copies, not views of the file's buffer
_PAD_ID = 0xD935           # extra field id for alignment padding (the one zipalign uses)
_ZIP64_LIMIT = 0xFFFFFFFF


class _InThread:
    """Feeds a stream of buffers to ``state.update`` in a thread of its own, so that the work overlaps the
    caller's reads or writes (hashlib, blake3 and zlib.crc32 release the GIL on large buffers)."""

    def __init__(self, state, name: str):
        self.state = state
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            while (item := self._queue.get()) is not None:
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                self.state.update(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread  # pragma: no cover
            self._error = exc

    def update(self, data) -> None:
        self._queue.put(data)

    def caught_up(self) -> None:
        """Return once every buffer fed so far went into the state (the caller may then reuse them)."""
        done = threading.Event()
        self._queue.put(done)
        while not done.wait(1.0):
            if not self._thread.is_alive():  # pragma: no cover - it failed: finish() raises its error
                return

    def finish(self):
        """The state, once every buffer fed so far went into it."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:  # pragma: no cover
            raise self._error
        return self.state

    def abandon(self) -> None:
        self._queue.put(None)


def _hasher(name: str = digest.HASH) -> _InThread:
    return _InThread(digest.hasher(name), "colabkit-hash")


class _Crc32:
    """A zip member's CRC-32, updated buffer by buffer."""

    def __init__(self, value: int = 0):
        self.value = value

    def update(self, data) -> None:
        self.value = zlib.crc32(data, self.value)


_datasync = getattr(os, "fdatasync", os.fsync)   # macOS and Windows have no fdatasync


class _Syncer:
    """Asks the kernel to write the file's data back while the writer goes on (fdatasync in a thread), so
    the final fsync only waits for the tail."""

    def __init__(self, fd: int):
        self._fd, self._wanted, self._done = fd, 0, 0
        self._cond = threading.Condition()
        self._closed, self.error = False, None
        self._thread = threading.Thread(target=self._run, name="colabkit-sync", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            with self._cond:
                while self._wanted == self._done and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                wanted = self._wanted
            try:
                _datasync(self._fd)
            except OSError as exc:   # reported by the final fsync, which runs whatever happens here
                self.error = exc
            with self._cond:
                self._done = wanted

    def written(self, offset: int) -> None:
        with self._cond:
            self._wanted = offset
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()


class Deferred:
    """An array that ``write`` asks for (``produce(caught_up)``) only when it writes it, and lets go before it
    asks for the next: a state streamed variable by variable (streaming.py) holds little in host memory at a time.
    ``produce`` may reuse the memory of arrays it returned before once it has called ``caught_up()``, which
    returns when every byte written so far is hashed (waiting on the hashing thread once per variable would cost
    more than writing many small ones)."""

    def __init__(self, shape, dtype, produce):
        self.shape, self.dtype, self.produce = tuple(shape), np.dtype(dtype), produce

    def header_data(self) -> dict:
        return {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}


def _npy_header(array) -> bytes:
    header = array.header_data() if isinstance(array, Deferred) else np.lib.format.header_data_from_array_1_0(array)
    out = io.BytesIO()
    writer = getattr(np.lib.format, "_write_array_header", None)
    if writer is not None:
        writer(out, header, None)   # picks format 1.0, or 2.0/3.0 for very long headers
    else:  # pragma: no cover - numpy without the private helper
        np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def _dos_time(now: float) -> tuple[int, int]:
    t = time.localtime(now)
    day = ((max(t.tm_year, 1980) - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday
    return (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2), day


def _raw_bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.reshape(-1).view(np.uint8))


def write(path, arrays: dict, *, durable: bool = True) -> tuple[str, int]:
    """Write ``arrays`` (name -> ndarray) as an uncompressed .npz at ``path``; returns (digest.HASH hex, size).
    With ``durable`` the data is on stable storage when this returns (fsync). Raises OSError as is."""
    prepared = []
    for key, array in arrays.items():
        if isinstance(array, Deferred):
            if array.dtype.hasobject:
                raise ValueError(f"array {key!r} has an object dtype, which cannot be stored without pickle")
            name = f"{key}.npy"
            prepared.append((name.encode("utf-8"), 0x0008 | (0 if name.isascii() else 0x0800), _npy_header(array),
                             array))
            continue
        array = np.asarray(array)
        if array.dtype.hasobject:
            raise ValueError(f"array {key!r} has an object dtype, which cannot be stored without pickle")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        name = f"{key}.npy"
        prepared.append((name.encode("utf-8"), 0x0008 | (0 if name.isascii() else 0x0800), _npy_header(array), array))
    mtime, mdate = _dos_time(time.time())
    hasher, summing = _hasher(), None
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags, 0o644)
    syncer = _Syncer(fd) if durable else None
    offset, synced, entries = 0, 0, []

    def emit(data) -> None:
        nonlocal offset, synced
        view = memoryview(data)
        while view.nbytes:
            n = os.write(fd, view)
            hasher.update(view[:n])
            view = view[n:]
            offset += n
        if syncer is not None and offset - synced >= SYNC_EVERY:
            synced = offset
            syncer.written(offset)

    try:
        for name, flags, header, array in prepared:
            deferred = isinstance(array, Deferred)
            if deferred:
                array = _produced(array, name, hasher.caught_up)
            size = len(header) + array.nbytes
            start = offset
            fixed = 30 + len(name) + 20 + 4   # local header + zip64 extra + the padding field's own header
            pad = -(start + fixed) % ALIGN
            # sizes and CRC follow the data (data descriptor), as zipfile writes them to a stream
            extra = struct.pack("<HHQQ", 1, 16, 0, 0) + struct.pack("<HH", _PAD_ID, pad) + b"\0" * pad
            emit(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, flags, 0, mtime, mdate, 0, _ZIP64_LIMIT,
                             _ZIP64_LIMIT, len(name), len(extra)) + name + extra)
            emit(header)
            raw = _raw_bytes(array)
            # a big array's CRC in a thread of its own, beside the write: on the writing thread it would take
            # about as long as writing to a fast disk
            crc = _Crc32(zlib.crc32(header))
            summing = _InThread(crc, "colabkit-crc32") if raw.nbytes > CHUNK else None
            for at in range(0, raw.nbytes, CHUNK):
                chunk = raw[at:at + CHUNK]
                (summing or crc).update(chunk)
                emit(chunk)
            if summing is not None:
                summing.finish()
                summing = None
            if deferred:   # let go: its producer reuses the memory once the hash has caught up
                array = raw = chunk = None
            emit(struct.pack("<IIQQ", 0x08074B50, crc.value, size, size))
            entries.append((name, flags, crc.value, size, start))
        cd_start = offset
        central = bytearray()
        for name, flags, crc, size, start in entries:
            extra = struct.pack("<HHQQQ", 1, 24, size, size, start)
            central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 | (3 << 8), 45, flags, 0, mtime, mdate,
                                   crc, _ZIP64_LIMIT, _ZIP64_LIMIT, len(name), len(extra), 0, 0, 0, 0o100644 << 16,
                                   _ZIP64_LIMIT) + name + extra
        cd_size = len(central)
        eocd64_at = cd_start + cd_size
        n = len(entries)
        central += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_start)
        central += struct.pack("<IIQI", 0x07064B50, 0, eocd64_at, 1)
        central += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                               min(cd_size, _ZIP64_LIMIT), _ZIP64_LIMIT, 0)
        emit(central)
        file_digest = hasher.finish().hexdigest()
        if syncer is not None:
            syncer.close()
            if syncer.error is not None:   # an error seen by one fdatasync is not reported to the next
                raise syncer.error
            os.fsync(fd)
    except BaseException:
        hasher.abandon()
        if summing is not None:
            summing.abandon()
        if syncer is not None:
            syncer.close()
        os.close(fd)
        raise
    os.close(fd)
    return file_digest, offset


def _produced(deferred: Deferred, name: bytes, caught_up) -> np.ndarray:
    array = deferred.produce(caught_up)
    if tuple(array.shape) != deferred.shape or array.dtype != deferred.dtype or not array.flags.c_contiguous:
        raise ValueError(f"{name.decode()}: the array produced is {array.dtype}{tuple(array.shape)}"
                         f"{'' if array.flags.c_contiguous else ' (not contiguous)'}, not the "
                         f"{deferred.dtype}{deferred.shape} announced")
    return array


def read_into_memory(source, *, expected_size: int | None = None, hash_name: str = digest.HASH
                     ) -> tuple[memoryview, str]:
    """The file's bytes (in a 64-byte aligned, writable buffer) and their hash (``hash_name``: the one the
    manifest records), read once. ``source``: a
    path, or a raw binary file open for reading. With ``expected_size``, a file of another size raises
    EOFError, before anything is allocated for it when the size can be seen (a manifest can lie about it)."""
    if hasattr(source, "readinto"):
        return _read_all(source, expected_size, getattr(source, "name", "file"), hash_name)
    with open(source, "rb", buffering=0) as fh:
        return _read_all(fh, expected_size, source, hash_name)


def _read_all(fh, expected_size, where, hash_name) -> tuple[memoryview, str]:
    actual = os.fstat(fh.fileno()).st_size
    size = actual if expected_size is None else expected_size
    if actual != size:   # a growing file is caught below; this one is not read into a buffer of a lie's size
        raise EOFError(f"{where} has {actual} bytes, not {size}")
    backing = memory.new_bytes(size + ALIGN)
    skip = -backing.ctypes.data % ALIGN
    view = memoryview(backing)[skip:skip + size]
    hasher = _hasher(hash_name)
    got = 0
    try:
        while got < size:
            n = fh.readinto(view[got:got + CHUNK])
            if not n:
                break
            hasher.update(view[got:got + n])
            got += n
        extra = fh.read(1) if got == size else b""
    except BaseException:
        hasher.abandon()
        raise
    file_digest = hasher.finish().hexdigest()
    if got != size or extra:
        raise EOFError(f"{where} is {'shorter' if got < size else 'longer'} than {size} bytes")
    return view, file_digest


def load(buffer, *, where: str = "arrays.npz") -> dict:
    """Arrays of an .npz held in memory (``buffer``), as views into it where the members are stored
    uncompressed and not small (copies otherwise). No pickles: object arrays raise ValueError."""
    with zipfile.ZipFile(_BufferFile(buffer)) as archive:
        infos = archive.infolist()
        arrays = {}
        view = memoryview(buffer)
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                # colabkit never writes these; a deflated member can expand a thousandfold (a zip bomb)
                raise ValueError(f"{where}: {info.filename} is compressed or encrypted, which colabkit never "
                                 f"writes; the checkpoint is not used")
            local = bytes(view[info.header_offset:info.header_offset + 30]) if info.header_offset >= 0 else b""
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"{where}: bad local header for {info.filename}")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            member = view[start:start + info.file_size]
            if member.nbytes != info.file_size:
                raise zipfile.BadZipFile(f"{where}: {info.filename} is truncated")
            array = _npy_view(member, f"{where}:{info.filename}")
            # small arrays are copied out, so that keeping one does not keep the whole file's buffer alive
            arrays[key] = array.copy() if array.nbytes < SMALL else array
    return arrays


def _npy_view(member: memoryview, where: str) -> np.ndarray:
    head = io.BytesIO(bytes(member[:min(member.nbytes, 1 << 20)]))
    version = np.lib.format.read_magic(head)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(head)
    else:  # 3.0 (utf-8 field names) or newer: let numpy read it, as a copy
        return np.lib.format.read_array(io.BytesIO(bytes(member)), allow_pickle=False)
    if dtype.hasobject:
        raise ValueError(f"{where} holds an object array, which cannot be loaded without pickle")
    count = math.prod(shape)   # Python ints: a shape whose product overflows int64 cannot match the size
    offset = head.tell()
    if member.nbytes - offset != count * dtype.itemsize:
        raise ValueError(f"{where}: {member.nbytes - offset} data bytes for shape {shape} of {dtype}")
    flat = np.frombuffer(member, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape[::-1]).transpose() if fortran else flat.reshape(shape)


class _BufferFile(io.RawIOBase):
    """A read-only file over a buffer, without copying it (io.BytesIO would); zipfile reads only the
    directory and headers through it."""

    def __init__(self, buffer):
        super().__init__()
        self._view, self._pos = memoryview(buffer), 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=0):
        base = {0: 0, 1: self._pos, 2: self._view.nbytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b):
        data = self._view[self._pos:self._pos + len(b)]
        n = data.nbytes
        memoryview(b).cast("B")[:n] = data
        self._pos += n
        return n

    def read(self, size=-1):
        end = self._view.nbytes if size is None or size < 0 else min(self._view.nbytes, self._pos + size)
        data = bytes(self._view[self._pos:end])
        self._pos = end
        return data
