"""Named, parameterized read queries: the only SQL callers outside the sink may run.

Values are bound by the driver (``{name:Type}`` placeholders), never pasted
into the SQL. The time range of per-job queries is the last ``minutes`` up to
the job's newest data (so the report of a finished or imported job works).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import UnknownQuery
from .identifiers import ident
from .store import QueryResult, Store

_SINCE = ("(SELECT max(window_start) FROM {table} WHERE job = {{job:String}})"
          " - toIntervalMinute({{minutes:UInt32}})")


def _since(table: str) -> str:
    return _SINCE.format(table=ident(table))


@dataclass(frozen=True)
class NamedQuery:
    sql: str
    params: dict[str, tuple[type, Any]] = field(default_factory=dict)  # name -> (type, default)
    doc: str = ""

    def bind(self, given: dict[str, Any]) -> dict[str, Any]:
        unknown = set(given) - set(self.params)
        if unknown:
            raise UnknownQuery(f"unknown parameters {sorted(unknown)}; expected {sorted(self.params)}")
        bound = {}
        for name, (typ, default) in self.params.items():
            value = given.get(name, default)
            if value is None:
                raise UnknownQuery(f"parameter {name!r} is required")
            bound[name] = _coerce(value, typ, name)
        return bound


def _coerce(value: Any, typ: type, name: str) -> Any:
    try:
        if typ is bool:
            if isinstance(value, str):
                return int(value.lower() in ("1", "true", "yes"))
            return int(bool(value))
        return typ(value)
    except (TypeError, ValueError):
        raise UnknownQuery(f"parameter {name!r} must be {typ.__name__}") from None


JOB = {"job": (str, None)}
WINDOW = {**JOB, "minutes": (int, 60)}

QUERIES: dict[str, NamedQuery] = {
    "incidents": NamedQuery(
        "SELECT incident_id, job, status, kind, cause, ranks, hosts, gpus, function, score,"
        " impact_ms_per_step, step_time_ms, first_seen, last_seen, windows, summary, evidence_json,"
        " resolved_reason FROM incidents FINAL WHERE job = {job:String}"
        " AND ({include_resolved:UInt8} = 1 OR status != 'RESOLVED'"
        " OR resolved_reason IN ('job finished', 'job died'))"  # still there when the job ended
        " ORDER BY impact_ms_per_step DESC, last_seen DESC LIMIT {limit:UInt32}",
        {**JOB, "include_resolved": (bool, False), "limit": (int, 100)},
        "incidents of a job, most costly first: open ones and those the job's end resolved "
        "(include_resolved: the cleared ones too)"),
    "active_incidents": NamedQuery(
        "SELECT job, incident_id, status, cause, ranks, hosts, function, impact_ms_per_step,"
        " first_seen, last_seen, summary FROM incidents FINAL WHERE status != 'RESOLVED'"
        " ORDER BY impact_ms_per_step DESC LIMIT {limit:UInt32}",
        {"limit": (int, 100)}, "open incidents of every job"),
    "jobs": NamedQuery(
        "SELECT job, max(window_start) AS last_seen, uniqExact(rank) AS ranks,"
        " median(step_time_ms_p50) AS step_time_ms FROM rank_windows"
        " WHERE window_start >= now64(3) - toIntervalMinute({minutes:UInt32})"
        " GROUP BY job ORDER BY last_seen DESC",
        {"minutes": (int, 60)}, "jobs seen recently"),
    "step_times": NamedQuery(
        "SELECT window_start, rank, median(step_time_ms) AS step_time_ms, count() AS steps"
        " FROM iterations FINAL WHERE job = {job:String} AND window_start >= " + _since("iterations") +
        " GROUP BY window_start, rank ORDER BY window_start, rank",
        WINDOW, "median step time per rank and window"),
    "rank_function_slowdown": NamedQuery(
        "SELECT rank, function, ms_per_step, peer_median_ms,"
        " if(peer_median_ms > 0, ms_per_step / peer_median_ms, 0) AS slowdown FROM ("
        "  SELECT rank, function, ms_per_step,"
        "   quantileExact(0.5)(ms_per_step) OVER (PARTITION BY function) AS peer_median_ms FROM ("
        "    SELECT rank, function, sum(total_ns) / greatest(sum(steps), 1) / 1e6 AS ms_per_step"
        "    FROM function_stats FINAL WHERE job = {job:String}"
        "    AND window_start >= " + _since("function_stats") +
        "    GROUP BY rank, function))"
        " ORDER BY function, rank",
        WINDOW, "time per step of each function on each rank vs the median rank"),
    "collective_late_arrivals": NamedQuery(
        "SELECT function, rank, sum(late_arrivals) AS late_arrivals, sum(collectives) AS collectives,"
        " avgIf(wait_caused_ms_per_step, late_fraction > 0) AS wait_caused_ms_per_step,"
        " countIf(late_fraction > 0) AS late_windows, any(host) AS host_name"
        " FROM collectives FINAL WHERE job = {job:String} AND window_start >= " + _since("collectives") +
        " GROUP BY function, rank ORDER BY function, rank",
        WINDOW, "per collective and rank: times it arrived last, and the wait it caused per step"
                " (mean over the windows it was a late arriver in: the figure its incident reports)"),
    "incident_opened": NamedQuery(
        "SELECT incident_id, min(last_seen) AS opened FROM anomalies"
        " WHERE job = {job:String} AND status = 'OPEN' GROUP BY incident_id",
        {**JOB}, "per incident: the end of the window that opened it (the earliest it was detected)"),
    "remediations": NamedQuery(
        "SELECT incident_id, at, node, mode, action, outcome, reason, command, patch"
        " FROM remediations FINAL WHERE job = {job:String} ORDER BY incident_id, at",
        {**JOB}, "per incident: what the remediation hook did about its node (drained, dry run, "
                 "refused and why, failed), oldest first"),
    "function_outliers": NamedQuery(
        "SELECT function, rank, any(host) AS host_name, count() AS windows, avg(ratio) AS ratio,"
        " avg(robust_z) AS robust_z, avg(cost_ms_per_step) AS cost_ms_per_step"
        " FROM function_outliers FINAL WHERE job = {job:String}"
        " AND window_start >= " + _since("function_outliers") +
        " GROUP BY function, rank ORDER BY cost_ms_per_step DESC",
        WINDOW, "ranks whose functions were far from their peers, and what it cost"),
    "gpu_health": NamedQuery(
        "SELECT window_start, rank, host, gpu, sm_clock_mhz, sm_clock_max_mhz, temp_c_max,"
        " power_w_mean, util_gpu_pct, throttle_reasons, ecc_uncorrected, xid"
        " FROM gpu_health FINAL WHERE job = {job:String} AND window_start >= " + _since("gpu_health") +
        " ORDER BY window_start, rank",
        WINDOW, "GPU clocks, temperature, power and throttling per rank and window"),
    "rank_health": NamedQuery(
        "SELECT rank, any(host) AS host, max(last_event) AS last_event, max(last_step) AS last_step,"
        " max(dropped_events) AS dropped_events, max(lost_batches) AS lost_batches,"
        " toInt64(max(window_id) - min(window_id) + 1 - count()) AS missing_windows,"
        " max(restarts) AS restarts"
        " FROM rank_windows FINAL WHERE job = {job:String} AND window_start >= " + _since("rank_windows") +
        " GROUP BY rank ORDER BY rank",
        WINDOW, "liveness and collector health per rank (drop and loss counters are cumulative: max)"),
    "rank_reporting": NamedQuery(
        "SELECT rank, argMax(host, window_start) AS host, max(world_size) AS world_size,"
        " toInt64(toUnixTimestamp64Milli(max(last_event))) AS last_event_ms,"
        " toInt64(toUnixTimestamp64Milli(max(window_start))) AS last_window_ms,"
        " toInt64(toUnixTimestamp64Milli(now64(3))) AS now_ms"
        " FROM rank_windows FINAL WHERE job = {job:String} AND window_start >= " + _since("rank_windows") +
        " GROUP BY rank ORDER BY rank",
        WINDOW, "per rank that sent anything: the world size it reported, its last event and window "
                "(`perftracker status --job`: expected vs reporting ranks)"),
}


def run_query(store: Store, name: str, params: dict[str, Any]) -> QueryResult:
    try:
        q = QUERIES[name]
    except KeyError:
        raise UnknownQuery(f"no query named {name!r}; known: {sorted(QUERIES)}") from None
    return store.query(q.sql, q.bind(params))
