"""The flight recorder's ring file: a fixed-size file of self-checking records that survives a power loss.

Layout: a 4 KiB header (magic, format version, data capacity, then a JSON object about the writer: host, boot id,
pid, start time, state "recording"/"stopped"), then ``capacity`` bytes of records written one after another; a
record that does not fit at the end goes to the start of the data area again (the ring wraps, the oldest records
are overwritten, the file never grows).

A record: ``MAGIC`` (2 bytes), payload length (u32), sequence number (u64), CRC-32 of the length, sequence and
payload (u32), then the payload (compact JSON, ASCII only). The magic has bytes above 0x7f, so it never occurs
inside an ASCII payload: a reader finds every record by searching for it, checks the CRC and orders what
passed by sequence number. A record torn by a power loss or a SIGKILL mid-write, or half overwritten by the
wrap, fails its CRC and is skipped; nothing in the file can make the reader fail.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

FORMAT_VERSION = 1
FILE_MAGIC = b"CKFLIGHT"
HEADER_SIZE = 4096
RECORD_MAGIC = b"\xf1\x1e"
_RECORD_HEAD = struct.Struct("<IQI")      # length, sequence, crc
_FILE_HEAD = struct.Struct("<8sHQI")      # magic, version, capacity, header JSON length
HEAD_SIZE = len(RECORD_MAGIC) + _RECORD_HEAD.size
MIN_CAPACITY = 64 * 1024


class RingFormatError(ValueError):
    """The file is not a flight-recorder ring (another file at the ring's path, or an unknown version)."""


def encode(seq: int, payload: dict) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    crc = zlib.crc32(body, zlib.crc32(struct.pack("<IQ", len(body), seq)))
    return RECORD_MAGIC + _RECORD_HEAD.pack(len(body), seq, crc) + body


def decode_all(data: bytes, limit: int | None = None) -> list[tuple[int, int, dict]]:
    """[(sequence, end offset in ``data``, payload)] of every intact record in ``data``, in sequence order."""
    found = []
    at = data.find(RECORD_MAGIC)
    while at >= 0:
        head_end = at + HEAD_SIZE
        nxt = at + 1
        if head_end <= len(data):
            length, seq, crc = _RECORD_HEAD.unpack_from(data, at + len(RECORD_MAGIC))
            end = head_end + length
            if (limit is None or length <= limit) and end <= len(data):
                body = data[head_end:end]
                if zlib.crc32(body, zlib.crc32(struct.pack("<IQ", length, seq))) == crc:
                    try:
                        found.append((seq, end, json.loads(body)))
                        nxt = end
                    except ValueError:
                        pass
        at = data.find(RECORD_MAGIC, nxt)
    found.sort(key=lambda item: item[0])
    return found


def read_header(fh) -> tuple[int, dict]:
    """(capacity, writer info) from an open ring file. Raises RingFormatError."""
    fh.seek(0)
    raw = fh.read(HEADER_SIZE)
    if len(raw) < _FILE_HEAD.size:
        raise RingFormatError("too short for a flight-recorder header")
    magic, version, capacity, size = _FILE_HEAD.unpack_from(raw)
    if magic != FILE_MAGIC:
        raise RingFormatError("not a colabkit flight-recorder file")
    if version != FORMAT_VERSION:
        raise RingFormatError(f"flight-recorder format {version}, this colabkit reads {FORMAT_VERSION}")
    try:
        info = json.loads(raw[_FILE_HEAD.size:_FILE_HEAD.size + size])
    except ValueError:
        info = {}     # a header torn mid-rewrite: the records still tell everything
    return capacity, info if isinstance(info, dict) else {}


def header_bytes(capacity: int, info: dict) -> bytes:
    body = json.dumps(info, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    head = _FILE_HEAD.pack(FILE_MAGIC, FORMAT_VERSION, capacity, len(body)) + body
    if len(head) > HEADER_SIZE:
        raise ValueError("flight-recorder header info too long")
    return head.ljust(HEADER_SIZE, b"\0")


def read_records(path: Path) -> tuple[dict, list[dict]]:
    """(writer info from the header, every intact record's payload oldest first). Raises OSError,
    RingFormatError."""
    with open(path, "rb") as fh:
        capacity, info = read_header(fh)
        fh.seek(HEADER_SIZE)
        data = fh.read(capacity)
    return info, [payload for _, _, payload in decode_all(data, limit=capacity)]


class RingWriter:
    """Appends records to a ring file (created at ``capacity`` bytes of data, or continued after its newest
    record). The caller holds the file's lock; ``fd`` is the open file."""

    def __init__(self, fd: int, capacity: int):
        self.fd = fd
        self.bytes_written = 0
        size = os.fstat(fd).st_size
        existing = None
        if size >= _FILE_HEAD.size:
            try:
                with os.fdopen(os.dup(fd), "rb") as fh:
                    existing = read_header(fh)[0]
            except RingFormatError:
                existing = None
        if existing == capacity and size == HEADER_SIZE + capacity:
            data = os.pread(fd, capacity, HEADER_SIZE)
            records = decode_all(data, limit=capacity)
            self.seq = records[-1][0] + 1 if records else 0
            self.pos = records[-1][1] if records else 0
        else:   # new, another size setting, or not ours: start a fresh ring of the set size
            os.ftruncate(fd, 0)
            os.ftruncate(fd, HEADER_SIZE + capacity)
            os.pwrite(fd, header_bytes(capacity, {}), 0)
            self.seq, self.pos = 0, 0
        self.capacity = capacity

    def set_info(self, info: dict) -> None:
        os.pwrite(self.fd, header_bytes(self.capacity, info), 0)

    def append(self, payload: dict) -> None:
        record = encode(self.seq, payload)
        if len(record) > self.capacity:
            raise ValueError("flight-recorder record larger than the ring")
        if self.pos + len(record) > self.capacity:
            self.pos = 0
        os.pwrite(self.fd, record, HEADER_SIZE + self.pos)
        self.pos += len(record)
        self.seq += 1
        self.bytes_written += len(record)

    def sync(self) -> None:
        os.fdatasync(self.fd) if hasattr(os, "fdatasync") else os.fsync(self.fd)
