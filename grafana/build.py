"""Builds the dashboard JSON files in ``dashboards/`` (run ``python -m perftracker_ml.grafana.build``).

The JSON is committed (Grafana provisioning reads files); this module is its
source, and a test checks the files are up to date. Every panel names the
columns it shows (field overrides and transformations ``byName``), so the
dashboard tests can check each one against the columns its SQL returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DS = {"type": "grafana-clickhouse-datasource", "uid": "perftracker-clickhouse"}
HERE = Path(__file__).parent / "dashboards"
JOB = "job = ${job:sqlstring}"
HOST_RANK = "host IN (${host:sqlstring}) AND rank IN (${rank:csv})"


def target(sql: str, fmt: str = "table") -> dict[str, Any]:
    return {"refId": "A", "datasource": DS, "editorType": "sql", "queryType": fmt,
            "format": 0 if fmt == "timeseries" else 1, "rawSql": " ".join(sql.split())}


def overrides(units: dict[str, str]) -> list[dict]:
    return [{"matcher": {"id": "byName", "options": col},
             "properties": [{"id": "unit", "value": unit}]} for col, unit in units.items()]


def panel(pid: int, title: str, kind: str, sql: str, grid: tuple[int, int, int, int],
          units: dict[str, str] | None = None, description: str = "", **extra: Any) -> dict:
    x, y, w, h = grid
    p: dict[str, Any] = {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(sql, "timeseries" if kind == "timeseries" else "table")],
        "fieldConfig": {"defaults": {}, "overrides": overrides(units or {})},
        "options": {},
    }
    if extra.pop("links", False):  # first column links to the job dashboard
        p["fieldConfig"]["overrides"][0]["properties"].append({"id": "links", "value": [{
            "title": "open job view", "url": "/d/perftracker-job/perftracker-job?var-job=${__value.text}&${__url_time_range}"}]})
    p.update(extra)
    return p


def matrix(row: str, col: str, value: str) -> list[dict]:
    """Long rows -> a row x column matrix (the heatmap-like tables)."""
    return [{"id": "groupingToMatrix", "options": {
        "rowField": row, "columnField": col, "valueField": value, "emptyValue": "null"}}]


def variable(name: str, sql: str, multi: bool, label: str) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": " ".join(sql.split()), "definition": " ".join(sql.split()), "refresh": 2,
            "includeAll": multi, "multi": multi, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {}}


def dashboard(uid: str, title: str, panels: list[dict], variables: list[dict], desc: str) -> dict:
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["perftracker"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "utc",
        "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables}, "annotations": {"list": []}, "panels": panels,
        "links": [{"title": "perftracker", "type": "dashboards", "tags": ["perftracker"],
                   "asDropdown": True}],
    }


def fleet() -> dict:
    since = "last_seen >= $__fromTime"
    panels = [
        panel(1, "Open incidents", "stat",
              "SELECT count() AS open_incidents FROM incidents FINAL WHERE status != 'RESOLVED'",
              (0, 0, 6, 4), {"open_incidents": "none"}),
        panel(2, "Jobs reporting", "stat",
              "SELECT uniqExact(job) AS jobs FROM rank_windows WHERE $__timeFilter(window_start)",
              (6, 0, 6, 4), {"jobs": "none"}),
        panel(3, "Step time lost to open incidents", "stat",
              "SELECT sum(impact_ms_per_step) AS lost_ms_per_step FROM incidents FINAL"
              " WHERE status != 'RESOLVED'", (12, 0, 12, 4), {"lost_ms_per_step": "ms"},
              "sum over open incidents of the step time each would give back if fixed"),
        panel(4, "Jobs", "table", """
            SELECT w.job AS job, w.ranks AS ranks, w.step_time_ms AS step_time_ms,
                   ifNull(i.open_incidents, 0) AS open_incidents, ifNull(i.lost_ms, 0) AS lost_ms_per_step
            FROM (SELECT job, uniqExact(rank) AS ranks, median(step_time_ms_p50) AS step_time_ms
                  FROM rank_windows WHERE $__timeFilter(window_start) GROUP BY job) AS w
            LEFT JOIN (SELECT job, count() AS open_incidents, sum(impact_ms_per_step) AS lost_ms
                       FROM incidents FINAL WHERE status != 'RESOLVED' GROUP BY job) AS i ON w.job = i.job
            ORDER BY lost_ms_per_step DESC, job""", (0, 4, 24, 8),
              {"job": "string", "ranks": "none", "step_time_ms": "ms", "open_incidents": "none",
               "lost_ms_per_step": "ms"}, "jobs seen in the time range; click a job for its view",
              links=True),
        panel(5, "Active incidents", "table", """
            SELECT job, cause, kind, arrayStringConcat(arrayMap(x -> toString(x), ranks), ',') AS ranks,
                   arrayStringConcat(hosts, ',') AS hosts, function, impact_ms_per_step,
                   first_seen, last_seen, summary
            FROM incidents FINAL WHERE status != 'RESOLVED' ORDER BY impact_ms_per_step DESC LIMIT 200""",
              (0, 12, 24, 9), {"impact_ms_per_step": "ms", "first_seen": "dateTimeAsIso",
                               "last_seen": "dateTimeAsIso", "summary": "string"}),
        panel(6, "Incidents opened, by cause", "timeseries", f"""
            SELECT $__timeInterval(first_seen) AS time, cause, uniqExact(incident_id) AS incidents
            FROM anomalies WHERE {since} AND $__timeFilter(first_seen)
            GROUP BY time, cause ORDER BY time""", (0, 21, 24, 8), {"incidents": "none"}),
    ]
    return dashboard("perftracker-fleet", "perftracker / fleet", panels, [],
                     "All jobs: who is slow, what it costs, what is open.")


TF = "$__timeFilter(window_start)"


def _job_rank_panels() -> list[dict]:
    """Step time, rank x function slowdown, collective late arrivals: who is slow, where."""
    return [
        panel(1, "Step time per rank", "timeseries", f"""
            SELECT window_start AS time, concat('rank ', toString(rank)) AS series,
                   median(step_time_ms) AS step_time_median_ms
            FROM iterations WHERE {JOB} AND {HOST_RANK} AND {TF}
            GROUP BY time, series ORDER BY time""", (0, 0, 24, 8), {"step_time_median_ms": "ms"}),
        panel(2, "Slowdown vs peer median (rank x function)", "table", f"""
            SELECT function, concat('rank ', toString(rank)) AS rank_name,
                   round(if(peer_ms > 0, ms_per_step / peer_ms, 0), 2) AS slowdown
            FROM (SELECT rank, function, ms_per_step,
                         quantileExact(0.5)(ms_per_step) OVER (PARTITION BY function) AS peer_ms
                  FROM (SELECT rank, function, sum(total_ns) / greatest(sum(steps), 1) / 1e6 AS ms_per_step
                        FROM function_stats WHERE {JOB} AND {HOST_RANK} AND {TF}
                        GROUP BY rank, function))
            ORDER BY function, rank""", (0, 8, 12, 10), {"slowdown": "x"},
              "time per step of a function on a rank / its median over ranks; >1 is slower",
              transformations=matrix("function", "rank_name", "slowdown")),
        panel(3, "Collective late arrivals (who made the others wait)", "table", f"""
            SELECT function, concat('rank ', toString(rank)) AS rank_name, sum(late_arrivals) AS late_arrivals
            FROM collectives WHERE {JOB} AND {HOST_RANK} AND {TF}
            GROUP BY function, rank_name ORDER BY function, rank_name""", (12, 8, 12, 10),
              {"late_arrivals": "none"},
              "times each rank arrived last at each collective: the culprit, not the victims",
              transformations=matrix("function", "rank_name", "late_arrivals")),
        panel(4, "Waits caused per step, by rank", "timeseries", f"""
            SELECT window_start AS time, concat('rank ', toString(rank)) AS series,
                   sum(wait_caused_ms_per_step) AS wait_caused_ms_per_step_total
            FROM collectives WHERE {JOB} AND {HOST_RANK} AND {TF}
            GROUP BY time, series ORDER BY time""", (0, 18, 12, 8), {"wait_caused_ms_per_step_total": "ms"}),
    ]


def _job_health_panels() -> list[dict]:
    """GPU health, incidents with evidence, collector health: why, and can we trust it."""
    return [
        panel(5, "GPU SM clock", "timeseries", f"""
            SELECT window_start AS time, concat('rank ', toString(rank)) AS series,
                   avg(sm_clock_mhz) AS sm_clock_avg_mhz
            FROM gpu_health WHERE {JOB} AND {HOST_RANK} AND {TF} AND sm_clock_mhz >= 0
            GROUP BY time, series ORDER BY time""", (12, 18, 12, 8), {"sm_clock_avg_mhz": "rotmhz"}),
        panel(6, "GPU temperature", "timeseries", f"""
            SELECT window_start AS time, concat('rank ', toString(rank)) AS series,
                   max(temp_c_max) AS temp_c_peak
            FROM gpu_health WHERE {JOB} AND {HOST_RANK} AND {TF} AND temp_c_max >= 0
            GROUP BY time, series ORDER BY time""", (0, 26, 12, 8), {"temp_c_peak": "celsius"}),
        panel(7, "GPU throttling and errors", "table", f"""
            SELECT rank, any(host) AS host_name, any(gpu) AS gpu_index,
                   countIf(throttle_reasons > 0) AS throttled_windows,
                   groupBitOr(throttle_reasons) AS throttle_mask, max(ecc_uncorrected) AS ecc_errors,
                   max(xid) AS last_xid, min(pcie_width_min) AS pcie_width
            FROM gpu_health WHERE {JOB} AND {HOST_RANK} AND {TF}
            GROUP BY rank ORDER BY throttled_windows DESC, rank""", (12, 26, 12, 8),
              {"throttled_windows": "none", "throttle_mask": "hex", "ecc_errors": "none"}),
        panel(8, "Incidents and evidence", "table", f"""
            SELECT status, cause, kind, arrayStringConcat(arrayMap(x -> toString(x), ranks), ',') AS ranks,
                   arrayStringConcat(hosts, ',') AS hosts, function, score, impact_ms_per_step,
                   first_seen, last_seen, summary, evidence_json AS evidence
            FROM incidents FINAL WHERE {JOB} ORDER BY status = 'RESOLVED', impact_ms_per_step DESC""",
              (0, 34, 24, 9), {"impact_ms_per_step": "ms", "score": "none",
                               "first_seen": "dateTimeAsIso", "evidence": "string"}),
        panel(9, "Collector health", "table", f"""
            SELECT rank, any(host) AS host_name, max(last_event) AS last_event, max(last_step) AS last_step,
                   max(dropped_events) AS dropped, max(lost_batches) AS lost
            FROM rank_windows WHERE {JOB} AND {HOST_RANK} AND {TF}
            GROUP BY rank ORDER BY rank""", (0, 43, 24, 8),
              {"last_event": "dateTimeAsIso", "dropped": "none", "lost": "none"}),
    ]


def job_view() -> dict:
    panels = _job_rank_panels() + _job_health_panels()
    variables = [
        variable("job", "SELECT DISTINCT job FROM rank_windows WHERE $__timeFilter(window_start)"
                 " ORDER BY job", False, "Job"),
        variable("host", f"SELECT DISTINCT host FROM rank_windows WHERE {JOB} ORDER BY host", True, "Host"),
        variable("rank", f"SELECT DISTINCT rank FROM rank_windows WHERE {JOB} AND host IN (${{host:sqlstring}})"
                 " ORDER BY rank", True, "Rank"),
    ]
    return dashboard("perftracker-job", "perftracker / job", panels, variables,
                     "One job: which rank and function, why, and how much it costs.")


PROM = {"type": "prometheus", "uid": "perftracker-prometheus"}
RATE = "[$__rate_interval]"


def prom_panel(pid: int, title: str, grid: tuple[int, int, int, int], unit: str,
               queries: dict[str, str], description: str = "", kind: str = "timeseries") -> dict:
    """A panel over the perftracker-prometheus datasource: ``queries`` maps legend -> PromQL."""
    x, y, w, h = grid
    table = kind == "table"
    targets = [{"refId": chr(ord("A") + i), "datasource": PROM, "expr": " ".join(expr.split()),
                "legendFormat": legend, "range": not table, "instant": table,
                **({"format": "table"} if table else {})}
               for i, (legend, expr) in enumerate(queries.items())]
    return {"id": pid, "type": kind, "title": title, "description": description, "datasource": PROM,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {},
            **({"transformations": [{"id": "merge", "options": {}}]} if table else {})}


def quantiles(metric: str, by: str = "") -> dict[str, str]:
    """p50 and p95 of a histogram over the rate interval (``by``: extra grouping labels)."""
    group = f"le{', ' + by if by else ''}"
    tag = f" {{{{{by}}}}}" if by else ""
    return {f"p{q}{tag}": f"histogram_quantile(0.{q}, sum by ({group}) (rate({metric}_bucket{RATE})))"
            for q in (50, 95)}


def _health_pipeline_panels() -> list[dict]:
    """In, out, lag and what was lost on the way: is everything processed?"""
    s = "perftracker_stream_"
    return [
        prom_panel(1, "Events and batches in", (0, 0, 12, 8), "ops", {
            "events/s": f"sum(rate({s}events_in_total{RATE}))",
            "{{record}}/s": f"sum by (record) (rate({s}records_in_total{RATE}))"},
            "what the workers decoded and processed, per second"),
        prom_panel(2, "Consumer lag per partition", (12, 0, 12, 8), "none", {
            "worker {{topic}}/{{partition}}": f"max by (topic, partition) ({s}consumer_lag)",
            "sink {{topic}}/{{partition}}": "max by (topic, partition) (perftracker_sink_consumer_lag)"},
            "messages not yet processed: high watermark seen in fetches minus the next offset, at least 0"),
        prom_panel(3, "Decode errors and dead letters", (0, 8, 12, 8), "ops", {
            "decode errors {{source}}": f"sum by (source) (rate({s}decode_errors_total{RATE}))",
            "dead-lettered {{source}}": f"sum by (source) (rate({s}dead_lettered_total{RATE}))",
            "sink dead-lettered": f"sum(rate(perftracker_sink_dead_lettered_total{RATE}))",
            "worker errors {{source}}": f"sum by (source) (rate({s}errors_total{RATE}))"},
            "bad messages parked on pt.deadletter with their reason; errors skip one message"),
        prom_panel(4, "Batches lost and events dropped, by job", (12, 8, 12, 8), "none", {
            "lost batches": f"topk(20, sum by (training_job) (increase({s}batches_lost_total[$__range])))",
            "dropped events": f"topk(20, sum by (training_job) (increase({s}events_dropped_total[$__range])))",
            "worst rank's lost batches": f"topk(20, max by (training_job, rank) ({s}worst_rank_batches_lost))"},
            "gaps in the ranks' batch sequence numbers, drops the collectors reported; the worst rank "
            "of each job (per-rank detail: the job dashboard)", kind="table"),
    ]


def _health_latency_panels() -> list[dict]:
    """How late: windows, detections, the store; and what reached people."""
    return [
        prom_panel(5, "Window close delay", (0, 16, 12, 8), "s",
                   quantiles("perftracker_stream_window_close_delay_seconds"),
                   "from a window's end to its RankWindow being sent"),
        prom_panel(6, "Detection latency", (12, 16, 12, 8), "s",
                   quantiles("perftracker_stream_detection_latency_seconds", "status"),
                   "from the end of the window that raised (or updated) an incident to the Anomaly"),
        prom_panel(7, "Sink flush latency", (0, 24, 8, 8), "s", quantiles("perftracker_sink_flush_seconds"),
                   "from a batch handed to the store to it being written, retries included"),
        prom_panel(8, "Sink backlog and rows written", (8, 24, 8, 8), "none", {
            "backlog rows": "sum(perftracker_sink_backlog_rows)",
            "rows written/s": f"sum(rate(perftracker_sink_rows_written_total{RATE}))",
            "rows dropped/s": f"sum(rate(perftracker_sink_rows_dropped_total{RATE}))"},
            "rows not yet in the store; dropped: past store.max_backlog_rows while the store was down"),
        prom_panel(9, "Alert deliveries and failures", (16, 24, 8, 8), "ops", {
            "delivered {{channel}}": f"sum by (channel) (rate(perftracker_alerts_delivered_total{RATE}))",
            "failed {{channel}}": f"sum by (channel) (rate(perftracker_alerts_failed_total{RATE}))",
            "dropped {{channel}}": f"sum by (channel) (rate(perftracker_alerts_dropped_total{RATE}))"}),
        prom_panel(10, "Collectors (opt-in endpoint)", (0, 32, 24, 8), "ops", {
            "sent {{training_job}}":
                f"sum by (training_job) (rate(perftracker_collector_events_sent_total{RATE}))",
            "dropped {{training_job}} {{reason}}":
                f"sum by (training_job, reason) (rate(perftracker_collector_events_dropped_total{RATE}))",
            "failed batches {{training_job}}":
                f"sum by (training_job) (rate(perftracker_collector_batches_failed_total{RATE}))"},
            "training processes started with PERFTRACKER_COLLECTOR_METRICS_PORT"),
    ]


def health() -> dict:
    d = dashboard("perftracker-health", "perftracker / health", _health_pipeline_panels()
                  + _health_latency_panels(), [],
                  "perftracker's own health from its Prometheus metrics: is every event processed, "
                  "how late are findings, do alerts get out.")
    d["refresh"] = "10s"
    return d


DASHBOARDS = {"fleet.json": fleet, "job.json": job_view, "health.json": health}


def render_all() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


def main() -> None:
    for name, text in render_all().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
