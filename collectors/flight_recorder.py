"""torch's Flight Recorder, read when a collective has been pending long (a suspected hang).

c10d keeps a ring buffer of the last collectives of every process group when
``TORCH_FR_BUFFER_SIZE`` (or NCCL's older ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is set above 0:
each entry's group, per-group sequence id, op, state (scheduled, started, completed, as
the backend tracks it) and when it was issued, and per group the last collective enqueued,
started and completed. NCCL's watchdog dumps it when it times a collective out and kills
the job; perftracker reads it earlier, when the job can still be looked at: on the sender
thread, once an entered collective (an entry marker) is older than ``after_s``, at most
every ``every_s``, and sends the entries not yet retired (the pending ones) with the next
batch (EventBatch v6 ``flight_records``). The hang incident carries them per rank.

The dump (``torch._C._distributed_c10d._dump_fr_trace_json``) walks the buffer under c10d's
lock: milliseconds for the default buffer, never on the training thread. Off (nothing
read, nothing sent) when the buffer is off, which is torch's default.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from .safety import ErrorBudget

BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
AFTER_S = 10.0  # an entry marker this old makes the sender read the recorder
EVERY_S = 10.0  # at most this often
MAX_ENTRIES = 16  # per batch: the oldest pending ones


def buffer_enabled(env: Mapping[str, str] = os.environ) -> bool:
    for name in BUFFER_ENV:
        try:
            if int(env.get(name, "0") or 0) > 0:
                return True
        except ValueError:
            continue
    return False


def pending_entries(dump: str | bytes, now_ns: int, limit: int = MAX_ENTRIES) -> list[dict[str, Any]]:
    """The entries of a Flight Recorder JSON dump still pending (not retired), oldest first, as
    FlightRecord dicts (schemas: EventBatch v6)."""
    raw = json.loads(dump)
    status = raw.get("pg_status") or {}
    out: list[dict[str, Any]] = []
    for e in raw.get("entries") or []:
        if e.get("retired") or e.get("state") == "completed":
            continue
        pg = e.get("process_group") or ["", ""]
        st = status.get(str(e.get("pg_id", pg[0]))) or status.get(str(pg[0])) or {}
        created = int(e.get("time_created_ns") or 0)
        out.append({"process_group": str(pg[0]), "pg_desc": str(pg[1]) if len(pg) > 1 else "",
                    "seq": int(e.get("collective_seq_id") or e.get("p2p_seq_id") or 0),
                    "op": str(e.get("profiling_name", "")), "state": str(e.get("state", "")),
                    "age_ms": max(0, (now_ns - created) // 1_000_000) if created else -1,
                    "timeout_ms": int(e.get("timeout_ms", -1) or -1),
                    "last_completed_seq": _int(st.get("last_completed_collective")),
                    "last_enqueued_seq": _int(st.get("last_enqueued_collective"))})
    out.sort(key=lambda r: -int(r["age_ms"]))
    return out[:limit]


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


class FlightRecorder:
    """Reads the recorder for the sender when an entry marker is old (module docstring)."""

    def __init__(self, dump: Callable[[], str | bytes], errors: ErrorBudget, after_s: float = AFTER_S,
                 every_s: float = EVERY_S):
        self._dump = dump
        self._errors = errors
        self.after_ns = int(after_s * 1e9)
        self.every_s = every_s
        self._last = 0.0
        self.reads = 0

    @classmethod
    def from_torch(cls, errors: ErrorBudget, env: Mapping[str, str] = os.environ) -> FlightRecorder | None:
        """The reader when the buffer is on and this torch has the dump, else None."""
        if not buffer_enabled(env):
            return None
        try:
            from torch._C import _distributed_c10d as c10d_c
            dump = getattr(c10d_c, "_dump_fr_trace_json")  # noqa: B009 - absent from the stubs
        except Exception:  # noqa: BLE001 - an older torch, or no distributed
            return None
        return cls(lambda: dump(True, True), errors)

    def read(self, markers: list[tuple], now_perf_ns: int) -> list[dict[str, Any]]:
        """Pending entries when a marker (``(COMM, op, group, seq, bytes, step, t0, -1)``) is older
        than ``after_s`` and the last read is ``every_s`` old; [] otherwise. Never raises."""
        if not markers or max(now_perf_ns - m[6] for m in markers) < self.after_ns:
            return []
        now = time.monotonic()
        if now - self._last < self.every_s:
            return []
        self._last = now
        try:
            entries = pending_entries(self._dump(), time.time_ns())
            self.reads += 1
            return entries
        except Exception as exc:  # noqa: BLE001 - never into training
            self._errors.caught("flight recorder", exc)
            return []
