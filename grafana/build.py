"""Builds the dashboard JSON files in ``dashboards/`` (run ``python -m perftracker_ml.grafana.build``).

The JSON is committed (Grafana provisioning reads files); this module is its
source, and a test checks the files are up to date. Every panel names the
columns it shows (field overrides and transformations ``byName``), so the
dashboard tests can check each one against the columns its SQL returns.

Readable at 10,000 ranks: no time-series query returns one series per rank.
Each aggregates in SQL to a band over all ranks (p50/p99) plus the ``k`` worst
ranks (``k`` a dashboard variable, default 5), so at most k + 2 series come
back whatever the world size; the rank x function tables show the worst ranks
only. Incidents (the ``incidents`` table) are annotations on every time
series, and a state timeline shows which ranks were the culprit, and why.

Datasources are variables (``datasource``: ClickHouse; the health view's
``datasource`` is Prometheus and ``clickhouse`` feeds its incident
annotations) that start at the provisioned uids; ``__inputs`` and
``__requires`` let Grafana's import ask for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..schemas.causes import CAUSES, Cause

HERE = Path(__file__).parent / "dashboards"
CH_TYPE = "grafana-clickhouse-datasource"
CH_UID = "perftracker-clickhouse"  # provisioning/datasources/clickhouse.yaml
PROM_TYPE = "prometheus"
PROM_UID = "perftracker-prometheus"  # provisioning/datasources/prometheus.yaml
DS = {"type": CH_TYPE, "uid": "${datasource}"}
JOB = "job = ${job:sqlstring}"
# host and rank filters that "All" turns off: their custom all values ('*', -1) reach the SQL
# unformatted, so "All" of 10,000 ranks is not a list of 10,000 numbers in every query
HOSTS = "('*' IN (${host:sqlstring}) OR host IN (${host:sqlstring}))"
HOST_RANK = HOSTS + " AND (-1 IN (${rank:csv}) OR rank IN (${rank:csv}))"
ALL_VALUES = {"host": "'*'", "rank": "-1"}
TF = "$__timeFilter(window_start)"
WHERE = f"{JOB} AND {HOST_RANK} AND {TF}"
BUCKET = "$__timeInterval(window_start)"
# the k of "the k slowest ranks": a number from the `k` variable, whatever is typed in a URL
K = "least(greatest(toUInt32OrZero(${k:sqlstring}), 1), 50)"
MATRIX_RANKS = 20  # rows of the rank x function tables: the worst ranks
CAUSE_IDS = "[" + ", ".join(f"'{c.value}'" for c in Cause) + "]"
NOT_ADVICE = "kind != 'advice'"  # advice is stored and listed, never an incident on a chart
RANKS_TEXT = "arrayStringConcat(arrayMap(x -> toString(x), ranks), ',')"
# Grafana named colours, one per cause (the culprit timeline's states)
CAUSE_COLORS = ("red", "orange", "purple", "yellow", "blue", "light-blue", "dark-purple",
                "light-purple", "semi-dark-yellow", "dark-red", "dark-orange", "light-red")


def target(sql: str, fmt: str = "table", ref: str = "A", ds: dict | None = None) -> dict[str, Any]:
    """A ClickHouse plugin query (format 0: time series, long rows pivoted on their string
    columns; 1: table)."""
    return {"refId": ref, "datasource": ds or DS, "editorType": "sql", "queryType": fmt,
            "format": 0 if fmt == "timeseries" else 1, "rawSql": " ".join(sql.split())}


def overrides(units: dict[str, str]) -> list[dict]:
    return [{"matcher": {"id": "byName", "options": col},
             "properties": [{"id": "unit", "value": unit}]} for col, unit in units.items()]


def thresholds(*steps: tuple[float | None, str]) -> dict:
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def panel(pid: int, title: str, kind: str, sql: str | list[str], grid: tuple[int, int, int, int],
          units: dict[str, str] | None = None, description: str = "", **extra: Any) -> dict:
    """A ClickHouse panel; ``sql``: one query, or several (refIds A, B, ...)."""
    x, y, w, h = grid
    fmt = "timeseries" if kind in ("timeseries", "state-timeline") else "table"
    sqls = [sql] if isinstance(sql, str) else sql
    p: dict[str, Any] = {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(s, fmt, chr(ord("A") + i)) for i, s in enumerate(sqls)],
        "fieldConfig": {"defaults": extra.pop("defaults", {}),
                        "overrides": overrides(units or {}) + extra.pop("more_overrides", [])},
        "options": extra.pop("options", {}),
    }
    if extra.pop("links", False):  # first column links to the job dashboard
        p["fieldConfig"]["overrides"][0]["properties"].append({"id": "links", "value": [{
            "title": "open job view",
            "url": "/d/perftracker-job/perftracker-job?var-job=${__value.text}&${__url_time_range}"}]})
    p.update(extra)
    return p


def band(low: str, high: str, color: str = "blue") -> dict[str, Any]:
    """Time-series field config: ``low`` and ``high`` one colour, the area between them filled;
    the other series (the k worst ranks) get the palette."""
    fixed = {"id": "color", "value": {"mode": "fixed", "fixedColor": color}}
    return {
        "defaults": {"custom": {"lineWidth": 1, "fillOpacity": 0, "showPoints": "never"},
                     "color": {"mode": "palette-classic"}},
        "more_overrides": [
            {"matcher": {"id": "byName", "options": low},
             "properties": [fixed, {"id": "custom.lineWidth", "value": 2}]},
            {"matcher": {"id": "byName", "options": high},
             "properties": [fixed, {"id": "custom.fillBelowTo", "value": low},
                            {"id": "custom.fillOpacity", "value": 20},
                            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}],
        "options": {"legend": {"showLegend": True, "displayMode": "table", "placement": "right",
                               "calcs": ["mean", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def matrix(row: str, col: str, value: str) -> list[dict]:
    """Long rows -> a row x column table (one row per rank, one column per function)."""
    return [{"id": "groupingToMatrix", "options": {
        "rowField": row, "columnField": col, "valueField": value, "emptyValue": "null"}}]


def coloured_cells(unit: str, steps: dict | None, description: str) -> dict[str, Any]:
    """Table field config: every value cell coloured (thresholds, or a green-red gradient over
    the column), the rank names left plain."""
    color = {"mode": "thresholds"} if steps else {"mode": "continuous-GrYlRd"}
    defaults: dict[str, Any] = {"unit": unit, "color": color, "custom": {
        "align": "center", "cellOptions": {"type": "color-background", "mode": "basic"}}}
    if steps:
        defaults["thresholds"] = steps
    return {"defaults": defaults, "description": description,
            "more_overrides": [{"matcher": {"id": "byType", "options": "string"},
                                "properties": [{"id": "custom.cellOptions", "value": {"type": "auto"}},
                                               {"id": "custom.align", "value": "left"}]}],
            "options": {"showHeader": True, "cellHeight": "sm"}}


def datasource_variable(name: str, plugin: str, uid: str, label: str) -> dict:
    """Starts at the provisioned datasource; on another Grafana, at the first of its type."""
    return {"name": name, "label": label, "type": "datasource", "query": plugin,
            "regex": "", "hide": 0, "current": {"selected": False, "text": uid, "value": uid}}


def variable(name: str, sql: str, multi: bool, label: str) -> dict:
    v = {"name": name, "label": label, "type": "query", "datasource": DS,
         "query": " ".join(sql.split()), "definition": " ".join(sql.split()), "refresh": 2,
         "includeAll": multi, "multi": multi, "sort": 1,
         "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {}}
    if name in ALL_VALUES:
        v["allValue"] = ALL_VALUES[name]
    return v


def k_variable() -> dict:
    options = ["3", "5", "10", "20"]
    return {"name": "k", "label": "Worst ranks shown (k)", "type": "custom", "query": ",".join(options),
            "multi": False, "includeAll": False, "hide": 0,
            "description": "how many of the slowest ranks the time series show beside the p50/p99 band",
            "current": {"selected": True, "text": "5", "value": "5"},
            "options": [{"selected": o == "5", "text": o, "value": o} for o in options]}


def incident_annotation(job_filter: bool, ds: dict | None = None) -> dict:
    """Every incident (not advice) as a region from first to last seen, on every time series."""
    where = f"{JOB} AND " if job_filter else ""
    who = "" if job_filter else "job, ': ', "
    sql = f"""
        SELECT first_seen AS time, last_seen AS timeEnd,
               concat({who}cause, ' on rank ', {RANKS_TEXT}, ' (', status, '): ', summary) AS text,
               arrayStringConcat([cause, kind, status], ',') AS tags
        FROM incidents FINAL
        WHERE {where}{NOT_ADVICE} AND last_seen >= $__fromTime AND first_seen <= $__toTime
        ORDER BY time"""
    return {"name": "Incidents", "datasource": ds or DS, "enable": True, "hide": False,
            "iconColor": "red", "target": target(sql, "table", "Anno", ds)}


def dashboard(uid: str, title: str, panels: list[dict], variables: list[dict], desc: str,
              annotations: list[dict], inputs: list[tuple[str, str, str]]) -> dict:
    """``inputs``: (input name, plugin id, plugin name) of the datasources an import asks for."""
    return {
        "uid": uid, "title": title, "description": desc, "tags": ["perftracker"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "utc", "graphTooltip": 1,
        "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables}, "annotations": {"list": annotations}, "panels": panels,
        "links": [{"title": "perftracker", "type": "dashboards", "tags": ["perftracker"],
                   "asDropdown": True, "icon": "external link", "tooltip": "", "url": "",
                   "targetBlank": False, "includeVars": False, "keepTime": True}],
        "__inputs": [{"name": name, "label": plugin_name, "description": f"the {plugin_name} datasource",
                      "type": "datasource", "pluginId": plugin, "pluginName": plugin_name}
                     for name, plugin, plugin_name in inputs],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"}]
        + [{"type": "datasource", "id": plugin, "name": plugin_name, "version": ""}
           for _, plugin, plugin_name in inputs]
        + [{"type": "panel", "id": kind, "name": kind, "version": ""}
           for kind in sorted({p["type"] for p in panels})],
    }


CH_INPUT = ("DS_CLICKHOUSE", CH_TYPE, "ClickHouse")
PROM_INPUT = ("DS_PROMETHEUS", PROM_TYPE, "Prometheus")

# ---------------------------------------------------------------------------------------- fleet

FLEET_CAUSES_TOP = """cause IN (SELECT cause FROM anomalies WHERE last_seen >= $__fromTime
                        AND $__timeFilter(first_seen) GROUP BY cause
                        ORDER BY uniqExact(incident_id) DESC, cause LIMIT """ + K + ")"


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
        panel(6, "Incidents opened, by cause (the k most frequent causes)", "timeseries", f"""
            SELECT $__timeInterval(first_seen) AS time,
                   if({FLEET_CAUSES_TOP}, cause, 'other causes') AS series,
                   uniqExact(incident_id) AS incidents
            FROM anomalies WHERE {since} AND $__timeFilter(first_seen)
            GROUP BY time, series ORDER BY time""", (0, 21, 24, 8), {"incidents": "none"},
              "incidents first seen per interval, per cause; causes past the k most frequent "
              "are summed as 'other causes'",
              defaults={"custom": {"drawStyle": "bars", "stacking": {"mode": "normal", "group": "A"},
                                   "fillOpacity": 60}}),
    ]
    return dashboard("perftracker-fleet", "perftracker / fleet", panels,
                     [datasource_variable("datasource", CH_TYPE, CH_UID, "ClickHouse"), k_variable()],
                     "All jobs: who is slow, what it costs, what is open.",
                     [incident_annotation(job_filter=False)], [CH_INPUT])


# ------------------------------------------------------------------------------------------ job

# `rank IN (the k ranks of the job with the highest, or lowest, score)`
_WORST = ("rank IN (SELECT rank FROM @table WHERE " + WHERE + " GROUP BY rank ORDER BY @score, rank LIMIT "
          + K + ")")
STEP_WORST = _WORST.replace("@table", "rank_windows").replace("@score", "avg(step_time_ms_p50) DESC")
WAITS_WORST = _WORST.replace("@table", "collectives").replace("@score", "sum(wait_caused_ms_per_step) DESC")
CLOCK_WORST = _WORST.replace("@table", "gpu_health").replace("@score", "avgIf(sm_clock_mhz, sm_clock_mhz >= 0) ASC")
TEMP_WORST = _WORST.replace("@table", "gpu_health").replace("@score", "max(temp_c_max) DESC")


def _job_rank_panels() -> list[dict]:
    """Step time, culprits, rank x function slowdown, collective late arrivals: who is slow, where."""
    return [
        panel(1, "Step time: p50-p99 band over ranks and the k slowest ranks", "timeseries", [f"""
            SELECT {BUCKET} AS time, quantile(0.5)(step_time_ms_p50) AS p50,
                   quantile(0.99)(step_time_ms_p50) AS p99
            FROM rank_windows WHERE {WHERE} GROUP BY time ORDER BY time""", f"""
            SELECT {BUCKET} AS time, concat('rank ', toString(rank)) AS series,
                   avg(step_time_ms_p50) AS step_time_ms
            FROM rank_windows WHERE {WHERE} AND {STEP_WORST}
            GROUP BY time, series ORDER BY time"""], (0, 0, 24, 9),
              {"p50": "ms", "p99": "ms", "step_time_ms": "ms"},
              "each rank's median step time per window: the band is its p50 and p99 over the ranks, "
              "the lines are the k ranks slowest over the time range (k: the variable)",
              **band("p50", "p99")),
        panel(10, "Culprits: ranks named by an incident, and the cause", "state-timeline", f"""
            SELECT g.time AS time, i.culprit AS series,
                   nullIf(maxIf(i.cause_id, i.first_seen < g.time + $__interval_s AND i.last_seen >= g.time), 0)
                   AS cause
            FROM (SELECT DISTINCT {BUCKET} AS time FROM rank_windows WHERE {JOB} AND {TF}) AS g
            CROSS JOIN (SELECT concat('rank ', {RANKS_TEXT}) AS culprit, first_seen, last_seen,
                               indexOf({CAUSE_IDS}, cause) AS cause_id
                        FROM incidents FINAL
                        WHERE {JOB} AND {NOT_ADVICE} AND last_seen >= $__fromTime AND first_seen <= $__toTime
                        ORDER BY impact_ms_per_step DESC LIMIT {K}) AS i
            GROUP BY time, series ORDER BY time""", (0, 9, 24, 6), {},
              "one row per culprit (the k costliest incidents in the range), coloured by cause "
              "while the incident is open",
              defaults={"mappings": [{"type": "value", "options": {
                  str(i): {"text": CAUSES[c].title, "color": CAUSE_COLORS[(i - 1) % len(CAUSE_COLORS)],
                           "index": i - 1} for i, c in enumerate(Cause, start=1)}}],
                  "color": {"mode": "fixed", "fixedColor": "transparent"},
                  "custom": {"fillOpacity": 80, "lineWidth": 0}},
              options={"mergeValues": True, "showValue": "auto", "rowHeight": 0.8,
                       "alignValue": "left", "legend": {"showLegend": False}}),
        panel(2, "Slowdown vs peer median (rank x function, the 20 worst ranks)", "table", f"""
            SELECT function, rank_name, slowdown FROM (
              SELECT function, concat('rank ', toString(rank)) AS rank_name, round(slowdown, 2) AS slowdown,
                     dense_rank() OVER (ORDER BY worst DESC, rank) AS pos
              FROM (SELECT rank, function, slowdown, max(slowdown) OVER (PARTITION BY rank) AS worst
                    FROM (SELECT rank, function, if(peer_ms > 0, ms_per_step / peer_ms, 0) AS slowdown
                          FROM (SELECT rank, function, ms_per_step,
                                       quantileExact(0.5)(ms_per_step) OVER (PARTITION BY function) AS peer_ms
                                FROM (SELECT rank, function,
                                             sum(total_ns) / greatest(sum(steps), 1) / 1e6 AS ms_per_step
                                      FROM function_stats WHERE {WHERE} GROUP BY rank, function)))))
            WHERE pos <= {MATRIX_RANKS} ORDER BY pos, function""", (0, 15, 12, 10), {"slowdown": "x"},
              transformations=matrix("rank_name", "function", "slowdown"),
              **coloured_cells("x", thresholds((None, "green"), (1.1, "yellow"), (1.25, "orange"),
                                               (1.5, "red")),
                               "time per step of a function on a rank / its median over ranks; "
                               ">1 is slower. Rows: the ranks with the largest slowdown, worst first")),
        panel(3, "Collective late arrivals (who made the others wait, the 20 worst ranks)", "table", f"""
            SELECT function, rank_name, late AS late_arrivals FROM (
              SELECT function, concat('rank ', toString(rank)) AS rank_name, rank, sum(late_arrivals) AS late,
                     sum(sum(late_arrivals)) OVER (PARTITION BY rank) AS rank_total
              FROM collectives WHERE {WHERE} GROUP BY function, rank)
            WHERE rank IN (SELECT rank FROM collectives WHERE {WHERE} GROUP BY rank
                           ORDER BY sum(late_arrivals) DESC, rank LIMIT {MATRIX_RANKS})
            ORDER BY rank_total DESC, rank, function""", (12, 15, 12, 10),
              {"late_arrivals": "none"},
              transformations=matrix("rank_name", "function", "late_arrivals"),
              **coloured_cells("none", None,
                               "times each rank arrived last at each collective: the culprit, not the "
                               "victims. Rows: the ranks that arrived last most often")),
        panel(4, "Waits caused per step: the k worst ranks and all others", "timeseries", f"""
            SELECT {BUCKET} AS time,
                   if({WAITS_WORST}, concat('rank ', toString(rank)), 'all other ranks') AS series,
                   sum(wait_caused_ms_per_step) / greatest(uniqExact(window_id), 1)
                   AS wait_caused_ms_per_step_total
            FROM collectives WHERE {WHERE}
            GROUP BY time, series ORDER BY time""", (0, 25, 12, 8), {"wait_caused_ms_per_step_total": "ms"},
              "time per step the other ranks waited at collectives for these ranks to arrive"),
    ]


def _job_health_panels() -> list[dict]:
    """GPU health, incidents with evidence, collector health: why, and can we trust it."""
    return [
        panel(5, "GPU SM clock: p1-p50 band and the k slowest-clocked ranks", "timeseries", [f"""
            SELECT {BUCKET} AS time, quantile(0.01)(sm_clock_mhz) AS p1, quantile(0.5)(sm_clock_mhz) AS p50
            FROM gpu_health WHERE {WHERE} AND sm_clock_mhz >= 0 GROUP BY time ORDER BY time""", f"""
            SELECT {BUCKET} AS time, concat('rank ', toString(rank)) AS series, avg(sm_clock_mhz) AS sm_clock_avg_mhz
            FROM gpu_health WHERE {WHERE} AND sm_clock_mhz >= 0 AND {CLOCK_WORST}
            GROUP BY time, series ORDER BY time"""], (12, 25, 12, 8),
              {"p1": "rotmhz", "p50": "rotmhz", "sm_clock_avg_mhz": "rotmhz"},
              "SM clock per GPU: the band is the p1 and p50 over the ranks, the lines the k lowest",
              **band("p1", "p50", "green")),
        panel(6, "GPU temperature: p50-p99 band and the k hottest ranks", "timeseries", [f"""
            SELECT {BUCKET} AS time, quantile(0.5)(temp_c_max) AS p50, quantile(0.99)(temp_c_max) AS p99
            FROM gpu_health WHERE {WHERE} AND temp_c_max >= 0 GROUP BY time ORDER BY time""", f"""
            SELECT {BUCKET} AS time, concat('rank ', toString(rank)) AS series, max(temp_c_max) AS temp_c_peak
            FROM gpu_health WHERE {WHERE} AND temp_c_max >= 0 AND {TEMP_WORST}
            GROUP BY time, series ORDER BY time"""], (0, 33, 12, 8),
              {"p50": "celsius", "p99": "celsius", "temp_c_peak": "celsius"},
              "peak GPU temperature per window: the band is the p50 and p99 over the ranks, the lines "
              "the k hottest", **band("p50", "p99", "orange")),
        panel(7, "GPU throttling and errors", "table", f"""
            SELECT rank, any(host) AS host_name, any(gpu) AS gpu_index,
                   countIf(throttle_reasons > 0) AS throttled_windows,
                   groupBitOr(throttle_reasons) AS throttle_mask, max(ecc_uncorrected) AS ecc_errors,
                   max(xid) AS last_xid, min(pcie_width_min) AS pcie_width
            FROM gpu_health WHERE {WHERE}
            GROUP BY rank ORDER BY throttled_windows DESC, ecc_errors DESC, rank LIMIT 500""", (12, 33, 12, 8),
              {"throttled_windows": "none", "throttle_mask": "hex", "ecc_errors": "none"},
              "per rank, the worst first (500 at most)"),
        panel(8, "Incidents and evidence", "table", f"""
            SELECT status, cause, kind, arrayStringConcat(arrayMap(x -> toString(x), ranks), ',') AS ranks,
                   arrayStringConcat(hosts, ',') AS hosts, function, score, impact_ms_per_step,
                   first_seen, last_seen, summary, evidence_json AS evidence
            FROM incidents FINAL WHERE {JOB} ORDER BY status = 'RESOLVED', impact_ms_per_step DESC""",
              (0, 41, 24, 9), {"impact_ms_per_step": "ms", "score": "none",
                               "first_seen": "dateTimeAsIso", "evidence": "string"}),
        panel(9, "Collector health", "table", f"""
            SELECT rank, any(host) AS host_name, max(last_event) AS last_event, max(last_step) AS last_step,
                   max(dropped_events) AS dropped, max(lost_batches) AS lost
            FROM rank_windows WHERE {WHERE}
            GROUP BY rank ORDER BY lost DESC, dropped DESC, rank LIMIT 500""", (0, 50, 24, 8),
              {"last_event": "dateTimeAsIso", "dropped": "none", "lost": "none"},
              "per rank, those that lost batches or dropped events first (500 at most)"),
    ]


def job_view() -> dict:
    panels = _job_rank_panels() + _job_health_panels()
    variables = [
        datasource_variable("datasource", CH_TYPE, CH_UID, "ClickHouse"),
        variable("job", "SELECT DISTINCT job FROM rank_windows WHERE $__timeFilter(window_start)"
                 " ORDER BY job", False, "Job"),
        variable("host", f"SELECT DISTINCT host FROM rank_windows WHERE {JOB} ORDER BY host", True, "Host"),
        variable("rank", f"SELECT DISTINCT rank FROM rank_windows WHERE {JOB} AND {HOSTS} ORDER BY rank",
                 True, "Rank"),
        k_variable(),
    ]
    return dashboard("perftracker-job", "perftracker / job", panels, variables,
                     "One job: which rank and function, why, and how much it costs.",
                     [incident_annotation(job_filter=True)], [CH_INPUT])


# --------------------------------------------------------------------------------------- health

PROM = {"type": PROM_TYPE, "uid": "${datasource}"}
HEALTH_CH = {"type": CH_TYPE, "uid": "${clickhouse}"}
RATE = "[$__rate_interval]"


def prom_panel(pid: int, title: str, grid: tuple[int, int, int, int], unit: str,
               queries: dict[str, str], description: str = "", kind: str = "timeseries") -> dict:
    """A panel over the Prometheus datasource: ``queries`` maps legend -> PromQL."""
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
    variables = [datasource_variable("datasource", PROM_TYPE, PROM_UID, "Prometheus"),
                 datasource_variable("clickhouse", CH_TYPE, CH_UID, "ClickHouse (incidents)")]
    d = dashboard("perftracker-health", "perftracker / health", _health_pipeline_panels()
                  + _health_latency_panels(), variables,
                  "perftracker's own health from its Prometheus metrics: is every event processed, "
                  "how late are findings, do alerts get out.",
                  [incident_annotation(job_filter=False, ds=HEALTH_CH)], [PROM_INPUT, CH_INPUT])
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
