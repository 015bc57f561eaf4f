"""A spool: the collectors' messages written to local files instead of Kafka.

For a machine with no broker (a lent GPU node, an air-gapped cluster, a quick try):
with ``PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=spool:DIR`` every rank's collector appends the
messages it would have produced (the same bytes, key and topic) to a file of its own in
``DIR``; ``perftracker record --spool DIR`` turns the files into a recording
(:mod:`.recording`) that ``perftracker replay`` diagnoses exactly as a stream worker
would have.

One file per process (``<pid>-<start ns>.spool``), written by the collector's sender
thread only. A file is a magic line, then frames::

    >H I I q   topic length, key length (0xFFFFFFFF: no key), value length, timestamp (ms)
    topic, key, value

A frame cut short (the process was killed mid-write) ends the file's reading and is
counted, never guessed. Partitions are not known without a broker: each file is read
as one partition (one process, one writer), its frames numbered as offsets.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import PerftrackerError

SCHEME = "spool:"
MAGIC = b"PTSPOOL1\n"
SUFFIX = ".spool"
_FRAME = struct.Struct(">HIIq")
_NO_KEY = 0xFFFFFFFF


class SpoolError(PerftrackerError):
    """A spool directory or file that cannot be read (missing, not a spool)."""


def spool_dir(bootstrap: str) -> Path | None:
    """The directory of a ``spool:DIR`` bootstrap setting; None for a Kafka bootstrap."""
    if not bootstrap.startswith(SCHEME):
        return None
    return Path(bootstrap[len(SCHEME):]).expanduser()


class SpoolWriter:
    """Appends frames to this process's file in ``directory`` (one writer thread).

    ``max_bytes`` bounds the file: a frame that would pass it is refused (False), and the
    caller counts it as lost."""

    def __init__(self, directory: Path, max_bytes: int = 1 << 30):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}-{time.time_ns()}{SUFFIX}"
        self.max_bytes = max_bytes
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._f.write(MAGIC)
        self.size = len(MAGIC)

    def append(self, topic: str, key: bytes | None, value: bytes, timestamp_ms: int | None = None) -> bool:
        t = topic.encode()
        k = b"" if key is None else key
        frame = _FRAME.pack(len(t), _NO_KEY if key is None else len(k), len(value),
                            time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms)
        n = len(frame) + len(t) + len(k) + len(value)
        if self.size + n > self.max_bytes:
            return False
        self._f.write(frame + t + k + value)
        self.size += n
        return True

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        try:
            self._f.flush()
        finally:
            self._f.close()


@dataclass(frozen=True)
class SpooledMessage:
    file: str
    index: int  # the frame's place in its file
    topic: str
    key: bytes | None
    value: bytes
    timestamp_ms: int


@dataclass
class SpoolReading:
    files: int = 0
    frames: int = 0
    cut: int = 0  # files whose last frame was cut short


def read_spool(directory: Path, reading: SpoolReading | None = None) -> Iterator[SpooledMessage]:
    """Every frame of every spool file in ``directory`` (files in name order)."""
    if not directory.is_dir():
        raise SpoolError(f"{directory}: no such spool directory")
    reading = reading if reading is not None else SpoolReading()
    for path in sorted(directory.glob("*" + SUFFIX)):
        reading.files += 1
        for msg in _read_file(path, reading):
            reading.frames += 1
            yield msg


def _read_file(path: Path, reading: SpoolReading) -> Iterator[SpooledMessage]:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise SpoolError(f"{path}: not a perftracker spool file (no {MAGIC!r} header)")
        index = 0
        while True:
            head = f.read(_FRAME.size)
            if not head:
                return
            if len(head) < _FRAME.size:
                reading.cut += 1
                return
            tlen, klen, vlen, ts = _FRAME.unpack(head)
            want = tlen + (0 if klen == _NO_KEY else klen) + vlen
            body = f.read(want)
            if len(body) < want:
                reading.cut += 1
                return
            topic = body[:tlen].decode()
            key = None if klen == _NO_KEY else body[tlen:tlen + klen]
            value = body[tlen + (0 if key is None else klen):]
            yield SpooledMessage(path.name, index, topic, key, value, ts)
            index += 1
