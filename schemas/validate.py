"""Content validation: the bounds a record must meet beyond its Avro types.

A record that decodes can still be absurd: rank 10⁹ or −5, world size 0, a
−2⁶² duration, a name index past the name table, ragged columns, a 100 KB
job id. :func:`validate` checks one decoded record of any topic against the
rules below and returns the first problem as ``"field = value: why"``, or
None; it never raises. Workers and the sink call it where records enter and
dead-letter what fails, so nothing downstream (detection, the store) sees
such a record.

Bounds (:class:`Limits`, defaults documented in docs/schemas.md):

* ranks in ``[0, world_size)``, world size in ``[1, 2**22]`` (worker outputs
  carry 0 while a rank has sent only hardware samples); GPU index ``[-1, 2**16)``;
* durations (``*_ns``) in ``[0, max_duration]`` (one hour, as
  ``DetectionPolicy.max_duration_s``; a collective's negative ``dur_ns`` marks a
  call still in flight, so comms allow ``[-max_duration, max_duration]``); a
  total at most ``max(count, 1) * max_duration``; floats finite;
* indexes into ``names`` / ``groups`` within those tables; the columns of one
  block of equal length; at most 2**20 entries per array;
* strings: ids (job, host, GPU UUID, signature, incident id) <= 256 bytes,
  names (functions, ops, group ids) <= 4 KB, collectives' ``comm:op:group``
  twice that, free text (summary, evidence) <= 64 KB; job ids not empty;
* wall-clock times between 2000-01-01 and 2100-01-01 (0 where a field may be unset);
  counters, sequence numbers, bytes >= 0.

The rules are data (:data:`RULES`), so the sink renders the same rules as
ClickHouse constraints for the records it lets ClickHouse decode
(:mod:`perftracker.sinks.checks`). Checks are ``min``/``max``/``sum`` over
whole columns (C loops over the decoded lists, no per-element Python); see
docs/schemas.md for the measured cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class Limits:
    max_world_size: int = 1 << 22
    max_gpu: int = (1 << 16) - 1
    max_duration_ns: int = 3600 * 10**9
    max_id_bytes: int = 256
    max_name_bytes: int = 4096
    max_text_bytes: int = 64 << 10
    max_items: int = 1 << 20
    max_kind: int = (1 << 15) - 1  # stored as Int16
    max_count: int = INT64_MAX  # counters, sequence numbers, bytes: only non-negative
    max_float: float = 1e15
    min_time_ms: int = 946_684_800_000  # 2000-01-01
    max_time_ms: int = 4_102_444_800_000  # 2100-01-01

    @property
    def max_rank(self) -> int:
        return self.max_world_size - 1

    @property
    def max_function_bytes(self) -> int:
        return 2 * self.max_name_bytes + 64

    @property
    def min_duration_ns(self) -> int:
        return -self.max_duration_ns

    @property
    def min_time_ns(self) -> int:
        return self.min_time_ms * 1_000_000

    @property
    def max_time_ns(self) -> int:
        return self.max_time_ms * 1_000_000


DEFAULT_LIMITS = Limits()


@lru_cache(maxsize=8)
def limits_for(max_duration_s: float) -> Limits:
    """Default limits with the detection policy's longest plausible duration."""
    return Limits(max_duration_ns=int(max_duration_s * 1e9))


@dataclass(frozen=True)
class Lim:
    """A bound that is an attribute of :class:`Limits`."""

    name: str


@dataclass(frozen=True)
class LastIndexOf:
    """A bound that is the last index of an array field of the whole record."""

    field: str


@dataclass(frozen=True)
class Below:
    """A bound just below an int field of the whole record (e.g. ranks below world_size)."""

    field: str


Bound = int | float | Lim | LastIndexOf | Below
Fields = tuple[str, ...]


Check = Callable[[dict, dict, str], "str | None"]  # (record, whole record, path) -> reason


def resolve(bound: Bound, limits: Limits) -> Callable[[dict], Any]:
    """The bound as a function of the whole record (constant for literals and limits)."""
    if isinstance(bound, LastIndexOf):
        return lambda root, f=bound.field: len(root[f]) - 1
    if isinstance(bound, Below):
        return lambda root, f=bound.field: int(root[f]) - 1
    value = getattr(limits, bound.name) if isinstance(bound, Lim) else bound
    return lambda root: value


def static(bound: Bound, limits: Limits) -> Any:
    """A bound that does not depend on the record (what SQL constraints need)."""
    if isinstance(bound, (LastIndexOf, Below)):
        raise ValueError(f"{bound} depends on the record")
    return getattr(limits, bound.name) if isinstance(bound, Lim) else bound


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _nbytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _too_long(s: str, max_bytes: int) -> bool:
    return len(s) > max_bytes or (len(s) * 4 > max_bytes and _nbytes(s) > max_bytes)


def epoch_ms(value: Any) -> int:
    """A timestamp-millis field: epoch ms, or a ``datetime`` after Avro decoding."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return int(value.timestamp() * 1000)
    return int(value)


class Rule:
    """One check; subclasses are frozen dataclasses (data: the sink also renders them as SQL)."""

    def bind(self, limits: Limits) -> Check:
        """A function that applies the rule with ``limits`` (built once per limits)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Ints(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo_of, hi_of, fields = resolve(self.lo, limits), resolve(self.hi, limits), self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            lo, hi = lo_of(root), hi_of(root)
            for f in fields:
                v = rec[f]
                if not lo <= v <= hi:
                    return f"{path}{f} = {_show(v)}: outside [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class Floats(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo, hi, fields = static(self.lo, limits), static(self.hi, limits), self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                v = rec[f]
                if not (math.isfinite(v) and lo <= v <= hi):
                    return f"{path}{f} = {v!r}: not a finite number in [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class Strs(Rule):
    fields: Fields
    max_bytes: Bound
    required: bool = False

    def bind(self, limits: Limits) -> Check:
        n, fields, required = static(self.max_bytes, limits), self.fields, self.required

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                s = rec[f]
                if _too_long(s, n):
                    return f"{path}{f}: {_nbytes(s)} bytes, more than {n}"
                if required and not s:
                    return f"{path}{f} is empty"
            return None
        return check


@dataclass(frozen=True)
class Times(Rule):
    """Wall-clock times in epoch ms (``timestamp-millis``); 0 allowed when ``unset_ok``."""

    fields: Fields
    unset_ok: bool = False

    def bind(self, limits: Limits) -> Check:
        lo, hi, fields, unset_ok = limits.min_time_ms, limits.max_time_ms, self.fields, self.unset_ok

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                ms = epoch_ms(rec[f])
                if not (lo <= ms <= hi or (unset_ok and ms == 0)):
                    return f"{path}{f} = {ms} ms: not a wall-clock time between 2000 and 2100"
            return None
        return check


@dataclass(frozen=True)
class IntArrays(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo_of, hi_of, fields, most = resolve(self.lo, limits), resolve(self.hi, limits), self.fields, limits.max_items
        # Avro longs cannot pass INT64_MAX: skip that pass over the column
        open_top = not isinstance(self.hi, (LastIndexOf, Below)) and hi_of({}) >= INT64_MAX

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                a = rec[f]
                if len(a) > most:
                    return f"{path}{f}: {len(a)} entries, more than {most}"
                if a:
                    lo, hi = lo_of(root), hi_of(root)
                    if min(a) < lo or (not open_top and max(a) > hi):
                        i = next(i for i, v in enumerate(a) if not lo <= v <= hi)
                        return f"{path}{f}[{i}] = {a[i]}: outside [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class FloatArrays(Rule):
    fields: Fields
    lo: Bound
    hi: Bound

    def bind(self, limits: Limits) -> Check:
        lo, hi, fields, most = static(self.lo, limits), static(self.hi, limits), self.fields, limits.max_items

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                a = rec[f]
                if len(a) > most:
                    return f"{path}{f}: {len(a)} entries, more than {most}"
                # a NaN or inf anywhere makes the sum non-finite (min/max skip NaN)
                if a and not (math.isfinite(sum(a)) and min(a) >= lo and max(a) <= hi):
                    i = next(i for i, v in enumerate(a) if not (math.isfinite(v) and lo <= v <= hi))
                    return f"{path}{f}[{i}] = {a[i]!r}: not a finite number in [{lo}, {hi}]"
            return None
        return check


@dataclass(frozen=True)
class StrArrays(Rule):
    fields: Fields
    max_bytes: Bound

    def bind(self, limits: Limits) -> Check:
        n, fields, most = static(self.max_bytes, limits), self.fields, limits.max_items

        def check(rec: dict, root: dict, path: str) -> str | None:
            for f in fields:
                a = rec[f]
                if len(a) > most:
                    return f"{path}{f}: {len(a)} entries, more than {most}"
                if a and max(map(len, a)) * 4 > n:
                    for i, s in enumerate(a):
                        if _too_long(s, n):
                            return f"{path}{f}[{i}]: {_nbytes(s)} bytes, more than {n}"
            return None
        return check


@dataclass(frozen=True)
class SameLength(Rule):
    """Columnar block: every array of equal length."""

    fields: Fields

    def bind(self, limits: Limits) -> Check:
        fields = self.fields

        def check(rec: dict, root: dict, path: str) -> str | None:
            lengths = [len(rec[f]) for f in fields]
            if min(lengths) != max(lengths):
                shown = ", ".join(f"{f}={n}" for f, n in zip(fields, lengths, strict=True))
                return f"{path}columns of unequal length ({shown})"
            return None
        return check


@dataclass(frozen=True)
class RankInWorld(Rule):
    """``rank < world_size``; with ``unknown_ok`` a world size of 0 means not known yet."""

    rank: str
    world: str
    unknown_ok: bool = False

    def bind(self, limits: Limits) -> Check:
        rank_f, world_f, unknown_ok = self.rank, self.world, self.unknown_ok

        def check(rec: dict, root: dict, path: str) -> str | None:
            rank, world = rec[rank_f], rec[world_f]
            if rank >= world and not (unknown_ok and world == 0):
                return f"{path}{rank_f} = {rank}: not below {world_f} = {world}"
            return None
        return check


@dataclass(frozen=True)
class TotalWithin(Rule):
    """A summed duration is at most ``max(count, 1)`` times the longest plausible one."""

    total: str
    count: str

    def bind(self, limits: Limits) -> Check:
        total_f, count_f, longest = self.total, self.count, limits.max_duration_ns

        def check(rec: dict, root: dict, path: str) -> str | None:
            total, count = rec[total_f], rec[count_f]
            if total > max(count, 1) * longest:
                return f"{path}{total_f} = {total}: more than {count_f} = {count} times {longest}"
            return None
        return check


@dataclass(frozen=True)
class Block(Rule):
    """A nested record (e.g. EventBatch.spans)."""

    field: str
    rules: tuple[Rule, ...]

    def bind(self, limits: Limits) -> Check:
        checks, field = bind_all(self.rules, limits), self.field

        def check(rec: dict, root: dict, path: str) -> str | None:
            return run(checks, rec[field], root, f"{path}{field}.")
        return check


@dataclass(frozen=True)
class Items(Rule):
    """An array of records, each checked with ``rules``."""

    field: str
    rules: tuple[Rule, ...]

    def bind(self, limits: Limits) -> Check:
        checks, field, most = bind_all(self.rules, limits), self.field, limits.max_items

        def check(rec: dict, root: dict, path: str) -> str | None:
            items = rec[field]
            if len(items) > most:
                return f"{path}{field}: {len(items)} entries, more than {most}"
            for i, item in enumerate(items):
                reason = run(checks, item, root, f"{path}{field}[{i}].")
                if reason:
                    return reason
            return None
        return check


def bind_all(rules: tuple[Rule, ...], limits: Limits) -> tuple[Check, ...]:
    return tuple(rule.bind(limits) for rule in rules)


def run(checks: tuple[Check, ...], rec: dict, root: dict, path: str = "") -> str | None:
    for check in checks:
        reason = check(rec, root, path)
        if reason:
            return reason
    return None


@lru_cache(maxsize=64)
def _checks(name: str, limits: Limits) -> tuple[Check, ...] | None:
    rules = RULES.get(name)
    return None if rules is None else bind_all(rules, limits)


def validate(name: str, record: Any, limits: Limits = DEFAULT_LIMITS) -> str | None:
    """The first content problem of a decoded ``name`` record as ``"field = value: why"``, or None.

    Never raises: a record not shaped like its schema is reported as malformed.
    """
    checks = _checks(name, limits)
    if checks is None:
        return f"no content rules for a {name} record"
    if not isinstance(record, dict):
        return f"malformed {name}: a {type(record).__name__}, not a record"
    try:
        reason = run(checks, record, record)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        return f"malformed {name}: {type(exc).__name__}: {_show(str(exc))}"
    return f"{name}.{reason}" if reason else None


# ---- the rules of each record type -------------------------------------------------------------
ID, NAME, FUNCTION, TEXT = Lim("max_id_bytes"), Lim("max_name_bytes"), Lim("max_function_bytes"), Lim("max_text_bytes")
COUNT, RANK, DURATION = Lim("max_count"), Lim("max_rank"), Lim("max_duration_ns")
FLOAT = Lim("max_float")

_EVENT_BATCH: tuple[Rule, ...] = (
    Strs(("job",), ID, required=True), Strs(("host", "gpu_uuid"), ID),
    Ints(("world_size",), 1, Lim("max_world_size")), Ints(("rank", "local_rank"), 0, Below("world_size")),
    Ints(("gpu",), -1, Lim("max_gpu")), Ints(("pid", "seq", "dropped_events", "mono_ns"), 0, COUNT),
    Ints(("wall_ns",), Lim("min_time_ns"), Lim("max_time_ns")),
    StrArrays(("names",), NAME),
    Items("groups", (Strs(("group_id",), NAME, required=True), IntArrays(("ranks",), -1, Below("world_size")))),
    Block("iterations", (
        SameLength(("step", "start_ns", "dur_ns")), IntArrays(("step",), -1, COUNT),
        IntArrays(("start_ns",), 0, COUNT), IntArrays(("dur_ns",), 0, DURATION))),
    Block("spans", (
        SameLength(("kind", "name", "path", "step", "start_ns", "dur_ns")),
        IntArrays(("kind",), 0, Lim("max_kind")), IntArrays(("name",), 0, LastIndexOf("names")),
        IntArrays(("path",), -1, LastIndexOf("names")), IntArrays(("step",), -1, COUNT),
        IntArrays(("start_ns",), 0, COUNT), IntArrays(("dur_ns",), 0, DURATION))),
    Block("comms", (
        SameLength(("op", "group", "seq", "bytes", "step", "start_ns", "dur_ns")),
        IntArrays(("op",), 0, LastIndexOf("names")), IntArrays(("group",), 0, LastIndexOf("groups")),
        IntArrays(("seq", "bytes", "start_ns"), 0, COUNT), IntArrays(("step",), -1, COUNT),
        IntArrays(("dur_ns",), Lim("min_duration_ns"), DURATION))),
    Items("kernels", (
        Ints(("kind",), 0, Lim("max_kind")), Ints(("name",), 0, LastIndexOf("names")),
        Strs(("profile_id",), ID), Ints(("count", "bytes"), 0, COUNT),
        Ints(("p50_ns", "p99_ns", "max_ns"), 0, DURATION), Ints(("total_ns",), 0, COUNT),
        TotalWithin("total_ns", "count"))),
)

_HW_INTS = ("sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "util_gpu_pct", "util_mem_pct", "temp_c",
            "throttle_reasons", "pcie_gen", "pcie_width", "pcie_tx_kbps", "pcie_rx_kbps",
            "nvlink_tx_kbps", "nvlink_rx_kbps", "nvlink_errors", "ecc_uncorrected", "xid")

_HARDWARE_BATCH: tuple[Rule, ...] = (
    Strs(("job",), ID, required=True), Strs(("host", "gpu_uuid"), ID),
    Ints(("rank",), 0, RANK), Ints(("gpu",), -1, Lim("max_gpu")), Ints(("seq",), 0, COUNT),
    SameLength(("wall_ns", *_HW_INTS, "power_w", "power_limit_w")),
    IntArrays(("wall_ns",), Lim("min_time_ns"), Lim("max_time_ns")),
    IntArrays(_HW_INTS, -1, COUNT),  # -1: NVML could not give the reading
    FloatArrays(("power_w", "power_limit_w"), -1, FLOAT),
)

_WINDOW: tuple[Rule, ...] = (
    Strs(("job",), ID, required=True), Ints(("window_id",), 0, COUNT), Floats(("window_s",), 0, 86400),
)
_RANK: tuple[Rule, ...] = (
    Ints(("rank",), 0, RANK), Ints(("world_size",), 0, Lim("max_world_size")),
    RankInWorld("rank", "world_size", unknown_ok=True), Strs(("host", "signature"), ID),
    Ints(("gpu",), -1, Lim("max_gpu")), Ints(("steps",), 0, COUNT),
)

_FUNCTION_PATTERN: tuple[Rule, ...] = _WINDOW + (Times(("window_start_ms",)),) + _RANK + (
    Strs(("function",), FUNCTION, required=True), Ints(("kind",), 0, Lim("max_kind")),
    Ints(("count", "bytes"), 0, COUNT), Ints(("p50_ns", "p90_ns", "p99_ns", "max_ns"), 0, DURATION),
    Ints(("total_ns",), 0, COUNT), TotalWithin("total_ns", "count"),
    IntArrays(("hist", "seqs"), 0, COUNT), IntArrays(("group_ranks",), -1, RANK),
    IntArrays(("seq_dur_ns",), 0, DURATION), SameLength(("seqs", "seq_dur_ns")),
)

_RANK_WINDOW: tuple[Rule, ...] = _WINDOW + (Times(("window_start_ms",)),) + _RANK + (
    StrArrays(("functions",), FUNCTION), Ints(("last_step", "pending_seq"), -1, COUNT),
    IntArrays(("step_time_ns",), 0, DURATION), Times(("last_event_ms",), unset_ok=True),
    Strs(("last_function",), FUNCTION), Strs(("pending_group",), NAME),
    Ints(("dropped_events", "lost_batches", "bytes_received", "hw_samples", "nvlink_errors",
          "ecc_uncorrected", "xid", "batches"), 0, COUNT),
    Ints(("throttle_reasons",), -1, COUNT), Ints(("pcie_gen_min", "pcie_width_min"), -1, Lim("max_kind")),
    Floats(("sm_clock_mhz", "sm_clock_max_mhz", "temp_c_max", "power_w_mean", "util_gpu_pct"), -1, FLOAT),
)

_PEER = (Ints(("rank",), 0, RANK), Strs(("host",), ID), Ints(("gpu",), -1, Lim("max_gpu")))

_FUNCTION_COMPARISON: tuple[Rule, ...] = _WINDOW + (
    Times(("window_start_ms",), unset_ok=True), Strs(("function",), FUNCTION, required=True),
    Ints(("kind",), 0, Lim("max_kind")), Ints(("ranks_seen", "ranks_scored", "peer_groups", "seqs_compared"), 0, COUNT),
    Floats(("median_ms_per_step", "transfer_ms_median", "transfer_ms_per_step", "wait_ms_per_step",
            "bytes_per_call"), 0, FLOAT),
    Items("groups", (Strs(("key",), NAME), Ints(("size",), 0, COUNT),
                     Floats(("median_ms_per_step", "median_calls_per_step"), 0, FLOAT),
                     IntArrays(("ranks",), 0, RANK))),
    Items("outliers", _PEER + (
        Strs(("peer_group",), NAME),
        Floats(("value_ms_per_step", "peer_median_ms_per_step", "ratio", "calls_ratio", "per_call_ratio"), 0, FLOAT),
        Floats(("robust_z", "cost_ms_per_step"), -1e15, FLOAT))),
    IntArrays(("members",), 0, RANK), IntArrays(("member_max_seq",), -1, COUNT),
    FloatArrays(("member_wait_ms_per_step",), 0, FLOAT),
    Items("stragglers", _PEER + (
        Ints(("late_seqs",), 0, COUNT), Floats(("late_fraction", "p_value"), 0, 1),
        Floats(("caused_ms_per_step",), 0, FLOAT))),
)

_ANOMALY: tuple[Rule, ...] = (
    Strs(("job", "incident_id"), ID, required=True), Strs(("kind", "cause"), ID),
    IntArrays(("ranks",), 0, RANK), StrArrays(("hosts",), ID), IntArrays(("gpus",), -1, Lim("max_gpu")),
    Strs(("function",), FUNCTION), Floats(("score", "impact_ms_per_step"), -1e15, FLOAT),
    Floats(("step_time_ms",), 0, FLOAT), Times(("first_seen_ms", "last_seen_ms")),
    Ints(("windows",), 0, COUNT), Strs(("summary", "evidence_json"), TEXT),
)

_CONTROL: tuple[Rule, ...] = (
    Strs(("job", "request_id"), ID, required=True), Ints(("start_step",), -1, COUNT),
    Floats(("duration_s",), 0, 86400), Strs(("reason",), TEXT), Times(("issued_ms",)),
)

RULES: dict[str, tuple[Rule, ...]] = {
    "EventBatch": _EVENT_BATCH, "HardwareBatch": _HARDWARE_BATCH, "FunctionPattern": _FUNCTION_PATTERN,
    "RankWindow": _RANK_WINDOW, "FunctionComparison": _FUNCTION_COMPARISON, "Anomaly": _ANOMALY,
    "Control": _CONTROL,
}
