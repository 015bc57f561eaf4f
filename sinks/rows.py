"""Decoded records -> rows of the store's tables (pure functions, no I/O).

Each ``*_rows`` function returns ``[(table, [row, ...]), ...]``, each row's
values in the order of :data:`perftracker_ml.sinks.schema.TABLES`
``[table].column_names`` (lists per table, not a row at a time: this is the
sink's hot path).
Strings are stored verbatim (they travel as query parameters, never as SQL).
Timestamps become epoch milliseconds, the raw tick of ``DateTime64(3)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from ..schemas.records import full_histogram, group_members
from ..schemas.vocabulary import ANOMALY, FUNCTION_COMPARISON, FUNCTION_PATTERN, RANK_WINDOW, Status

Row = tuple[Any, ...]
Batches = list[tuple[str, list[Row]]]

_STATUS_ORDER: dict[str, int] = {Status.OPEN.value: 0, Status.UPDATED.value: 1, Status.RESOLVED.value: 2}


def _ms(value: Any) -> int:
    """Epoch milliseconds (the DateTime64(3) tick) from a datetime or from epoch ms."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return int(value.timestamp() * 1000)
    return int(value)


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def pattern_rows(r: dict) -> Batches:
    return [("function_stats", [(
        r["job"], r["window_id"], _ms(r["window_start_ms"]), r["window_s"], r["rank"], r["host"],
        r["gpu"], r["world_size"], r["signature"], r["function"], r["kind"], r["steps"], r["count"],
        r["total_ns"], r["p50_ns"], r["p90_ns"], r["p99_ns"], r["max_ns"], full_histogram(r),
        group_members(r, "group_ranks"), r.get("bytes", 0))])]


def rank_window_rows(r: dict) -> Batches:
    start = _ms(r["window_start_ms"])
    steps_ms = [ns / 1e6 for ns in r["step_time_ns"]]
    first_step = r["last_step"] - len(steps_ms) + 1
    job, rank, window_id, host = r["job"], r["rank"], r["window_id"], r["host"]
    iterations = [(job, rank, first_step + i, window_id, start, host, ms) for i, ms in enumerate(steps_ms)]
    rank_window = (
        r["job"], r["window_id"], start, r["window_s"], r["rank"], r["host"], r["gpu"],
        r["world_size"], r["signature"], len(r["functions"]), r["steps"], r["last_step"],
        _median(steps_ms), max(steps_ms, default=0.0),
        _ms(r["last_event_ms"]), r["last_function"], r["pending_group"], r["pending_seq"],
        r["dropped_events"], r["lost_batches"], r["bytes_received"], int(bool(r.get("ended_cleanly", False))),
        int(r.get("restarts", 0)), dict(r.get("mesh_coords") or {}))
    gpu = (
        r["job"], r["window_id"], start, r["rank"], r["host"], r["gpu"], r["hw_samples"],
        r["sm_clock_mhz"], r["sm_clock_max_mhz"], r["temp_c_max"], r["power_w_mean"],
        r["util_gpu_pct"], r["throttle_reasons"], r["pcie_gen_min"], r["pcie_width_min"],
        r["nvlink_errors"], r["ecc_uncorrected"], r["xid"])
    return [("iterations", iterations), ("rank_windows", [rank_window]), ("gpu_health", [gpu])]


def comparison_rows(r: dict) -> Batches:
    """FunctionComparison -> ``function_outliers`` rows, and for a collective one
    ``collectives`` row per member (zeros for members that were never last)."""
    start = _ms(r["window_start_ms"])
    job, window_id, function = r["job"], r["window_id"], r["function"]
    out: Batches = []
    if r["outliers"]:
        out.append(("function_outliers", [(
            job, window_id, start, function, o["rank"], o["host"], o["gpu"], o["peer_group"],
            o["value_ms_per_step"], o["peer_median_ms_per_step"], o["ratio"], o["robust_z"],
            o["cost_ms_per_step"], o["calls_ratio"], o["per_call_ratio"]) for o in r["outliers"]]))
    if r["members"]:
        late = {s["rank"]: s for s in r["stragglers"]}
        mixed = int(bool(r["mixed_signatures"]))
        out.append(("collectives", [_member_row(r, start, rank, late.get(rank), mixed)
                                    for rank in r["members"]]))
    return out


def _member_row(r: dict, start: int, rank: int, s: dict | None, mixed: int) -> Row:
    return (r["job"], r["window_id"], start, r["function"], rank,
            s["host"] if s else "", s["gpu"] if s else -1, r["seqs_compared"],
            s["late_seqs"] if s else 0, s["late_fraction"] if s else 0.0,
            s["caused_ms_per_step"] if s else 0.0, s["p_value"] if s else 1.0,
            r["wait_ms_per_step"], r["transfer_ms_per_step"], mixed)


def incident_version(status: str, last_seen_ms: int) -> int:
    """Monotonic per incident: later last_seen wins; at the same time RESOLVED > UPDATED > OPEN."""
    return int(last_seen_ms) * 4 + _STATUS_ORDER.get(status, 0)


def anomaly_row(r: dict) -> Row:
    last_seen = _ms(r["last_seen_ms"])
    status = str(r["status"])
    return (
        r["job"], r["incident_id"], status, r["kind"], r["cause"], r["ranks"], r["hosts"],
        r.get("gpus") or [], r["function"], r["score"], r["impact_ms_per_step"],
        r.get("step_time_ms", 0.0), _ms(r["first_seen_ms"]), last_seen, r["windows"],
        r["summary"], r["evidence_json"], incident_version(status, last_seen), r.get("resolved_reason", ""))


def anomaly_rows(r: dict) -> Batches:
    row = anomaly_row(r)
    return [("anomalies", [row]), ("incidents", [row])]


def flat_rows(name: str, record: dict) -> Iterator[tuple[str, Row]]:
    """``(table, row)`` pairs of one record (for tests and tools; the sink uses the batches)."""
    for table, rows in ROW_BUILDERS[name](record):
        for row in rows:
            yield table, row


ROW_BUILDERS = {
    FUNCTION_PATTERN: pattern_rows,
    RANK_WINDOW: rank_window_rows,
    FUNCTION_COMPARISON: comparison_rows,
    ANOMALY: anomaly_rows,
}
