"""Find and read PyTorch profiler (Kineto / Chrome JSON) trace files.

Accepted inputs: a directory (searched recursively), a ``.tar.gz``/``.tgz``/``.tar``
archive, or one ``.json`` / ``.json.gz`` file. Trace files are the members whose
names end in ``.json`` or ``.json.gz`` (``*.pt.trace.json`` by convention).
A file that cannot be read or is not a trace is *skipped with a reason* naming the
file; only an input with no usable trace at all is an error.
"""

from __future__ import annotations

import gzip
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ...schemas.errors import PerftrackerError

MAX_TRACE_BYTES = 2 << 30  # one uncompressed trace; larger is refused, not read
TRACE_SUFFIXES = (".json", ".json.gz")


class TraceError(PerftrackerError):
    """A trace input that cannot be imported (message names the file and the problem)."""


@dataclass(frozen=True)
class RawTrace:
    """One decoded trace file: where it came from and its top-level JSON object."""

    source: str  # path, or archive path + "!" + member name
    data: dict  # the top-level fields the importer reads; traceEvents as raw JSON per event (or dicts)


@dataclass(frozen=True)
class Skip:
    """A file (or part of one) left out, and why."""

    source: str
    reason: str


def is_trace_name(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base.startswith(".") and base.endswith(TRACE_SUFFIXES)


def _is_archive(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz", ".tar"))


class _Trace(msgspec.Struct):
    """The top-level fields of a trace the importer reads; everything else is skipped unread."""

    traceEvents: list[msgspec.Raw] | None = None  # noqa: N815 (the JSON key); each event decoded later
    distributedInfo: Any = msgspec.UNSET  # noqa: N815
    hostname: Any = msgspec.UNSET
    host_name: Any = msgspec.UNSET
    baseTimeNanoseconds: Any = msgspec.UNSET  # noqa: N815


_TRACE = msgspec.json.Decoder(_Trace)


def _typed(raw: bytes) -> dict | None:
    """The fast path: the events stay raw JSON slices of ``raw`` (a small object each), decoded
    one at a time by the table; None when the JSON is not shaped like a trace or not strict JSON
    (the generic path below then says why, or reads it)."""
    try:
        t = _TRACE.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if t.traceEvents is None:
        return None
    data: dict[str, Any] = {"traceEvents": t.traceEvents}
    for name in ("distributedInfo", "hostname", "host_name", "baseTimeNanoseconds"):
        value = getattr(t, name)
        if value is not msgspec.UNSET:
            data[name] = value
    return data


def decode_trace(source: str, raw: bytes) -> RawTrace | Skip:
    """Bytes (gzip'd or not) -> RawTrace, or Skip with the reason."""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            return Skip(source, f"not valid gzip: {exc}")
    if len(raw) > MAX_TRACE_BYTES:
        return Skip(source, f"larger than {MAX_TRACE_BYTES >> 20} MiB uncompressed")
    fast = _typed(raw)
    if fast is not None:
        return RawTrace(source, fast)
    try:
        data = json.loads(raw)  # also reads what strict JSON forbids (NaN, Infinity)
    except (UnicodeDecodeError, ValueError) as exc:
        return Skip(source, f"not JSON: {str(exc)[:120]}")
    if not isinstance(data, dict):
        return Skip(source, f"top level is a JSON {type(data).__name__}, expected an object")
    if not isinstance(data.get("traceEvents"), list):
        return Skip(source, "no traceEvents list (not a PyTorch profiler / Chrome trace)")
    return RawTrace(source, data)


def _read_file(path: Path) -> RawTrace | Skip:
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            return Skip(str(path), f"larger than {MAX_TRACE_BYTES >> 20} MiB")
        return decode_trace(str(path), path.read_bytes())
    except OSError as exc:
        return Skip(str(path), f"cannot read: {exc.strerror or exc}")


def _read_archive(path: Path) -> Iterator[RawTrace | Skip]:
    try:
        with tarfile.open(path) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and is_trace_name(m.name)),
                             key=lambda m: m.name)
            for m in members:
                source = f"{path}!{m.name}"
                if m.size > MAX_TRACE_BYTES:
                    yield Skip(source, f"larger than {MAX_TRACE_BYTES >> 20} MiB")
                    continue
                fh = tar.extractfile(m)
                yield decode_trace(source, fh.read()) if fh else Skip(source, "unreadable member")
    except (tarfile.TarError, OSError, EOFError) as exc:
        yield Skip(str(path), f"not a readable tar archive: {exc}")


def read_traces(path: Path) -> Iterator[RawTrace | Skip]:
    """Yield every trace under ``path`` (sorted by name), or a Skip for each bad file.

    Raises :class:`TraceError` when ``path`` does not exist or is not a kind of input
    this reader accepts."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and (is_trace_name(p.name) or _is_archive(p)))
        for p in files:
            yield from (_read_archive(p) if _is_archive(p) else [_read_file(p)])
        return
    if _is_archive(path):
        yield from _read_archive(path)
        return
    if is_trace_name(path.name) or path.suffix == ".gz":
        yield _read_file(path)
        return
    raise TraceError(f"{path}: expected a directory, a .tar.gz archive or a .json/.json.gz trace")
