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
(:mod:`perftracker_ml.sinks.checks`). Checks are ``min``/``max``/``sum`` over
whole columns (C loops over the decoded lists, no per-element Python); see
docs/schemas.md for the measured cost.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from .rules import (
    DEFAULT_LIMITS,
    Below,
    Block,
    Check,
    FloatArrays,
    Floats,
    IntArrays,
    Ints,
    Items,
    LastIndexOf,
    Lim,
    Limits,
    MembersRange,
    Packed,
    RankInWorld,
    Rule,
    SameLength,
    StrArrays,
    Strs,
    Times,
    TotalWithin,
    bind_all,
    run,
    show,
)


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
        return f"malformed {name}: {type(exc).__name__}: {show(str(exc))}"
    return f"{name}.{reason}" if reason else None


# ---- the rules of each record type -------------------------------------------------------------
ID, NAME, FUNCTION, TEXT = Lim("max_id_bytes"), Lim("max_name_bytes"), Lim("max_function_bytes"), Lim("max_text_bytes")
COUNT, RANK, DURATION = Lim("max_count"), Lim("max_rank"), Lim("max_duration_ns")
FLOAT = Lim("max_float")

_FLIGHT_RECORD: tuple[Rule, ...] = (  # EventBatch v6 ``flight_records`` items
    Strs(("process_group", "pg_desc", "op", "state"), NAME), Ints(("seq",), 0, COUNT),
    Ints(("age_ms", "timeout_ms", "last_completed_seq", "last_enqueued_seq"), -1, COUNT),
)

_NET_SAMPLE: tuple[Rule, ...] = (  # EventBatch v7 ``net`` items
    Ints(("interval_ns",), 0, COUNT), Strs(("local_addr",), NAME),
    Ints(("retrans_segs", "out_segs", "rx_bytes", "tx_bytes", "ib_xmit_wait", "ib_errors"), -1, COUNT),
    Items("backlog", (Strs(("remote",), NAME), Ints(("bytes",), 0, COUNT))),
)

_EVENT_BATCH: tuple[Rule, ...] = (
    Strs(("job",), ID, required=True), Strs(("host", "gpu_uuid"), ID),
    Ints(("world_size",), 1, Lim("max_world_size")), Ints(("rank", "local_rank"), 0, Below("world_size")),
    Ints(("gpu",), -1, Lim("max_gpu")), Ints(("pid", "seq", "dropped_events", "mono_ns"), 0, COUNT),
    Ints(("wall_ns",), Lim("min_time_ns"), Lim("max_time_ns")),
    StrArrays(("names",), NAME),
    Items("groups", (Strs(("group_id",), NAME, required=True), IntArrays(("ranks",), -1, Below("world_size")),
                     MembersRange("ranks", Below("world_size")))),  # v9
    Block("iterations", (
        Packed("iterations"), SameLength(("step", "start_ns", "dur_ns")), IntArrays(("step",), -1, COUNT),
        IntArrays(("start_ns",), 0, COUNT), IntArrays(("dur_ns",), 0, DURATION))),
    Block("spans", (
        Packed("spans"), SameLength(("kind", "name", "path", "step", "start_ns", "dur_ns")),
        IntArrays(("kind",), 0, Lim("max_kind")), IntArrays(("name",), 0, LastIndexOf("names")),
        IntArrays(("path",), -1, LastIndexOf("names")), IntArrays(("step",), -1, COUNT),
        IntArrays(("start_ns",), 0, COUNT), IntArrays(("dur_ns",), 0, DURATION))),
    Block("comms", (
        Packed("comms"), SameLength(("op", "group", "seq", "bytes", "step", "start_ns", "dur_ns")),
        IntArrays(("op",), 0, LastIndexOf("names")), IntArrays(("group",), 0, LastIndexOf("groups")),
        IntArrays(("seq", "bytes", "start_ns"), 0, COUNT), IntArrays(("step",), -1, COUNT),
        IntArrays(("dur_ns",), Lim("min_duration_ns"), DURATION))),
    Items("kernels", (
        Ints(("kind",), 0, Lim("max_kind")), Ints(("name",), 0, LastIndexOf("names")),
        Strs(("profile_id",), ID), Ints(("count", "bytes"), 0, COUNT),
        Ints(("p50_ns", "p99_ns", "max_ns"), 0, DURATION), Ints(("total_ns",), 0, COUNT),
        TotalWithin("total_ns", "count"))),
    Block("stacks", (Packed("stacks"),), optional=True),  # v3; packed from v8 (as the other frames' rules, the
    # folder counts a ragged or out-of-range stack row and skips it: the batch's events still count)
    Items("flight_records", _FLIGHT_RECORD, optional=True),  # v6
    Items("net", _NET_SAMPLE, optional=True),  # v7
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
    IntArrays(("hist", "seqs", "hist_counts"), 0, COUNT), IntArrays(("group_ranks",), -1, RANK),
    MembersRange("group_ranks", RANK),  # v3
    IntArrays(("seq_dur_ns",), 0, DURATION), SameLength(("seqs", "seq_dur_ns")),
    Ints(("hist_first",), 0, Lim("max_hist_bucket")),  # v3
)

_RANK_WINDOW: tuple[Rule, ...] = _WINDOW + (Times(("window_start_ms",)),) + _RANK + (
    StrArrays(("functions",), FUNCTION), Ints(("last_step", "pending_seq"), -1, COUNT),
    IntArrays(("step_time_ns",), 0, DURATION), Times(("last_event_ms",), unset_ok=True),
    Strs(("last_function",), FUNCTION), Strs(("pending_group",), NAME),
    Ints(("dropped_events", "lost_batches", "bytes_received", "hw_samples", "nvlink_errors",
          "ecc_uncorrected", "xid", "batches", "restarts"), 0, COUNT),
    Ints(("throttle_reasons",), -1, COUNT), Ints(("pcie_gen_min", "pcie_width_min"), -1, Lim("max_kind")),
    Floats(("sm_clock_mhz", "sm_clock_max_mhz", "temp_c_max", "power_w_mean", "util_gpu_pct"), -1, FLOAT),
)

# records closed together, as columns (schemas/record_sets.py): the set's own fields here;
# record_sets.read checks the columns' lengths and positions, and each record by its own rules
_RANK_WINDOW_SET: tuple[Rule, ...] = _WINDOW + (
    Times(("window_start_ms",)), Ints(("ranks",), 1, Lim("max_world_size")),
)
_FUNCTION_PATTERN_SET: tuple[Rule, ...] = _RANK_WINDOW_SET + (Strs(("function",), FUNCTION, required=True),)

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
    Items("stalls", _PEER + (Ints(("seq",), 0, COUNT), Floats(("wait_ms", "seqs_per_step"), 0, FLOAT)),
          optional=True),  # v3
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
    "Control": _CONTROL, "RankWindowSet": _RANK_WINDOW_SET, "FunctionPatternSet": _FUNCTION_PATTERN_SET,
}
