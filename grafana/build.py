"""Builds the dashboard JSON files in ``dashboards/`` (run ``python -m perftracker_ml.grafana.build``).

The JSON is committed (Grafana provisioning reads files); this module is its
source, and a test checks the files are up to date. The dashboards are written
with the Grafana Foundation SDK (``grafana-foundation-sdk``, the build for Grafana
11.2, the version the stack runs): its dashboard, panel (stat, table, time series,
state timeline), variable, annotation and Prometheus query builders. What the SDK
has no builder for (a ClickHouse query, an annotation whose target is one, the
import envelope) is in :mod:`.sdk`. Every panel names the columns it shows (field
overrides and transformations ``byName``), so the dashboard tests can check each
one against the columns its SQL returns.

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
from typing import Any, Protocol, TypeVar

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from ..schemas.causes import CAUSES, Cause
from .sdk import ClickHouse, ClickHouseAnnotation, QueryFormat, to_json, with_import_envelope

HERE = Path(__file__).parent / "dashboards"
GRAFANA_REQUIRED = "10.4.0"  # the oldest Grafana these dashboards need (__requires)
CH_TYPE = "grafana-clickhouse-datasource"
CH_UID = "perftracker-clickhouse"  # provisioning/datasources/clickhouse.yaml
PROM_TYPE = "prometheus"
PROM_UID = "perftracker-prometheus"  # provisioning/datasources/prometheus.yaml
DS = model.DataSourceRef(type_val=CH_TYPE, uid="${datasource}")
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
JOB_VIEW_LINK = {"title": "open job view",
                 "url": "/d/perftracker-job/perftracker-job?var-job=${__value.text}&${__url_time_range}"}

Grid = tuple[int, int, int, int]  # x, y, w, h
PanelList = list[cogbuilder.Builder[model.Panel]]
VariableList = list[cogbuilder.Builder[model.VariableModel]]


class PanelBuilder(Protocol):
    """What every panel builder of the SDK has (``stat.Panel``, ``table.Panel``, ...); each
    returns its builder, called one at a time here, so only the methods are named."""

    def id(self, id_val: int) -> object: ...
    def title(self, title: str) -> object: ...
    def description(self, description: str) -> object: ...
    def datasource(self, datasource: model.DataSourceRef) -> object: ...
    def grid_pos(self, grid_pos: model.GridPos) -> object: ...
    def with_target(self, target: cogbuilder.Builder[cogvariants.Dataquery]) -> object: ...
    def override_by_name(self, name: str, properties: list[model.DynamicConfigValue]) -> object: ...


P = TypeVar("P", bound=PanelBuilder)


def setting(name: str, value: object) -> model.DynamicConfigValue:
    """One property of a field override (``unit``, ``color``, ``custom.lineWidth``...)."""
    return model.DynamicConfigValue(id_val=name, value=value)


def placed(p: P, pid: int, title: str, grid: Grid, ds: model.DataSourceRef, description: str) -> P:
    x, y, w, h = grid
    p.id(pid)
    p.title(title)
    p.description(description)
    p.datasource(ds)
    p.grid_pos(model.GridPos(x=x, y=y, w=w, h=h))
    return p


def with_units(p: P, units: dict[str, str]) -> P:
    """A unit for each column named (by name, as the dashboard tests read them)."""
    for column, unit in units.items():
        p.override_by_name(column, [setting("unit", unit)])
    return p


def clickhouse_panel(p: P, pid: int, title: str, sql: str | list[str], grid: Grid,
                     units: dict[str, str], description: str = "") -> P:
    """A ClickHouse panel; ``sql``: one query, or several (refIds A, B, ...). Time series and
    state timelines ask for the time-series format (long rows pivoted on their string
    columns), the others for a table."""
    series = isinstance(p, (timeseries.Panel, statetimeline.Panel))
    fmt: QueryFormat = "timeseries" if series else "table"
    for i, query in enumerate([sql] if isinstance(sql, str) else sql):
        p.with_target(ClickHouse(query, DS, fmt, chr(ord("A") + i)))
    return with_units(placed(p, pid, title, grid, DS, description), units)


def links_to_job_view(p: table.Panel, column: str) -> table.Panel:
    """``column`` (a job name, shown as text) links to that job's dashboard."""
    return p.override_by_name(column, [setting("unit", "string"), setting("links", [JOB_VIEW_LINK])])


def thresholds(*steps: tuple[float | None, str]) -> builders.ThresholdsConfig:
    return (builders.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(value=v, color=c) for v, c in steps]))


def band(p: timeseries.Panel, low: str, high: str, color: str = "blue") -> timeseries.Panel:
    """``low`` and ``high`` one colour, the area between them filled; the other series (the k
    worst ranks) get the palette."""
    fixed = setting("color", model.FieldColor(mode=model.FieldColorModeId.FIXED, fixed_color=color))
    dashed = common.LineStyle(fill="dash", dash=[10, 10])
    return (p.line_width(1).fill_opacity(0).show_points(common.VisibilityMode.NEVER)
            .color_scheme(builders.FieldColor().mode(model.FieldColorModeId.PALETTE_CLASSIC))
            .override_by_name(low, [fixed, setting("custom.lineWidth", 2)])
            .override_by_name(high, [fixed, setting("custom.fillBelowTo", low),
                                     setting("custom.fillOpacity", 20), setting("custom.lineStyle", dashed)])
            .legend(common_builders.VizLegendOptions().show_legend(True)
                    .display_mode(common.LegendDisplayMode.TABLE)
                    .placement(common.LegendPlacement.RIGHT).calcs(["mean", "max"]))
            .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                     .sort(common.SortOrder.DESCENDING)))


def stacked_bars(p: timeseries.Panel) -> timeseries.Panel:
    return (p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
            .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL).group("A")))


def matrix(p: table.Panel, row: str, col: str, value: str) -> table.Panel:
    """Long rows -> a row x column table (one row per rank, one column per function)."""
    return p.with_transformation(model.DataTransformerConfig(id_val="groupingToMatrix", options={
        "rowField": row, "columnField": col, "valueField": value, "emptyValue": "null"}))


def coloured_cells(p: table.Panel, unit: str, steps: builders.ThresholdsConfig | None) -> table.Panel:
    """Every value cell coloured (thresholds, or a green-red gradient over the column), the
    rank names left plain."""
    mode = model.FieldColorModeId.THRESHOLDS if steps else model.FieldColorModeId.CONTINUOUS_GR_YL_RD
    if steps:
        p.thresholds(steps)
    background = common.TableColoredBackgroundCellOptions(mode=common.TableCellBackgroundDisplayMode.BASIC)
    return (p.unit(unit).color_scheme(builders.FieldColor().mode(mode))
            .align(common.FieldTextAlignment.CENTER).cell_options(background)
            .override_by_field_type("string", [setting("custom.cellOptions", common.TableAutoCellOptions()),
                                               setting("custom.align", "left")])
            .show_header(True).cell_height(common.TableCellHeight.SM))


def culprit_states(p: statetimeline.Panel) -> statetimeline.Panel:
    """One colour and name per cause (the query's ``cause`` is the cause's index, from 1),
    nothing drawn while no incident is open."""
    names = {str(i): model.ValueMappingResult(text=CAUSES[c].title, color=CAUSE_COLORS[(i - 1) % len(CAUSE_COLORS)],
                                              index=i - 1) for i, c in enumerate(Cause, start=1)}
    return (p.mappings([model.ValueMap(options=names)])
            .color_scheme(builders.FieldColor().mode(model.FieldColorModeId.FIXED).fixed_color("transparent"))
            .fill_opacity(80).line_width(0).merge_values(True).show_value(common.VisibilityMode.AUTO)
            .row_height(0.8).align_value(common.TimelineValueAlignment.LEFT)
            .legend(common_builders.VizLegendOptions().show_legend(False))
            .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE)
                     .sort(common.SortOrder.NONE)))


def datasource_variable(name: str, plugin: str, uid: str, label: str) -> builders.DatasourceVariable:
    """Starts at the provisioned datasource; on another Grafana, at the first of its type."""
    return (builders.DatasourceVariable(name).label(label).type(plugin).regex("")
            .hide(model.VariableHide.DONT_HIDE).current(model.VariableOption(selected=False, text=uid, value=uid)))


def variable(name: str, sql: str, multi: bool, label: str) -> builders.QueryVariable:
    v = (builders.QueryVariable(name).label(label).datasource(DS).query(" ".join(sql.split()))
         .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(multi).multi(multi)
         .sort(model.VariableSort.ALPHABETICAL_ASC))
    if multi:
        v.current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
    if name in ALL_VALUES:
        v.all_value(ALL_VALUES[name])
    return v


def k_variable() -> builders.CustomVariable:
    options = ["3", "5", "10", "20"]
    return (builders.CustomVariable("k").label("Worst ranks shown (k)").values(",".join(options))
            .multi(False).include_all(False).hide(model.VariableHide.DONT_HIDE)
            .description("how many of the slowest ranks the time series show beside the p50/p99 band")
            .current(model.VariableOption(selected=True, text="5", value="5"))
            .options([model.VariableOption(selected=o == "5", text=o, value=o) for o in options]))


def incident_annotation(job_filter: bool, ds: model.DataSourceRef = DS) -> builders.AnnotationQuery:
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
    return (builders.AnnotationQuery().name("Incidents").datasource(ds).enable(True).hide(False)
            .icon_color("red").target(ClickHouseAnnotation(ClickHouse(sql, ds, "table", "Anno"))))


def dashboards_menu() -> builders.DashboardLink:
    """The top bar's drop-down of every perftracker dashboard."""
    return (builders.DashboardLink("perftracker").type(model.DashboardLinkType.DASHBOARDS)
            .tags(["perftracker"]).as_dropdown(True).icon("external link").tooltip("").url("")
            .target_blank(False).include_vars(False).keep_time(True))


def dashboard(uid: str, title: str, desc: str, panels: PanelList, variables: VariableList,
              annotations: list[cogbuilder.Builder[model.AnnotationQuery]], inputs: list[tuple[str, str, str]],
              refresh: str = "30s") -> dict[str, Any]:
    """The dashboard's JSON; ``inputs``: (input name, plugin id, plugin name) of the
    datasources an import asks for."""
    d = (builders.Dashboard(title).uid(uid).description(desc).tags(["perftracker"]).version(1)
         .editable().timezone("utc").tooltip(model.DashboardCursorSync.CROSSHAIR).refresh(refresh)
         .time("now-1h", "now").variables(variables).annotations(annotations).link(dashboards_menu()))
    for p in panels:  # each at its own gridPos (the SDK places only a panel left at 0, 0)
        d.with_panel(p)
    return with_import_envelope(to_json(d.build()), inputs, GRAFANA_REQUIRED)


CH_INPUT = ("DS_CLICKHOUSE", CH_TYPE, "ClickHouse")
PROM_INPUT = ("DS_PROMETHEUS", PROM_TYPE, "Prometheus")

# ---------------------------------------------------------------------------------------- fleet

FLEET_CAUSES_TOP = """cause IN (SELECT cause FROM anomalies WHERE last_seen >= $__fromTime
                        AND $__timeFilter(first_seen) GROUP BY cause
                        ORDER BY uniqExact(incident_id) DESC, cause LIMIT """ + K + ")"


def _fleet_panels() -> PanelList:
    """Open incidents, jobs and their cost, incidents by cause."""
    since = "last_seen >= $__fromTime"
    return [
        clickhouse_panel(stat.Panel(), 1, "Open incidents",
                         "SELECT count() AS open_incidents FROM incidents FINAL WHERE status != 'RESOLVED'",
                         (0, 0, 6, 4), {"open_incidents": "none"}),
        clickhouse_panel(stat.Panel(), 2, "Jobs reporting",
                         "SELECT uniqExact(job) AS jobs FROM rank_windows WHERE $__timeFilter(window_start)",
                         (6, 0, 6, 4), {"jobs": "none"}),
        clickhouse_panel(stat.Panel(), 3, "Step time lost to open incidents",
                         "SELECT sum(impact_ms_per_step) AS lost_ms_per_step FROM incidents FINAL"
                         " WHERE status != 'RESOLVED'", (12, 0, 12, 4), {"lost_ms_per_step": "ms"},
                         "sum over open incidents of the step time each would give back if fixed"),
        links_to_job_view(clickhouse_panel(table.Panel(), 4, "Jobs", """
            SELECT w.job AS job, w.ranks AS ranks, w.step_time_ms AS step_time_ms,
                   ifNull(i.open_incidents, 0) AS open_incidents, ifNull(i.lost_ms, 0) AS lost_ms_per_step
            FROM (SELECT job, uniqExact(rank) AS ranks, median(step_time_ms_p50) AS step_time_ms
                  FROM rank_windows WHERE $__timeFilter(window_start) GROUP BY job) AS w
            LEFT JOIN (SELECT job, count() AS open_incidents, sum(impact_ms_per_step) AS lost_ms
                       FROM incidents FINAL WHERE status != 'RESOLVED' GROUP BY job) AS i ON w.job = i.job
            ORDER BY lost_ms_per_step DESC, job""", (0, 4, 24, 8),
            {"ranks": "none", "step_time_ms": "ms", "open_incidents": "none", "lost_ms_per_step": "ms"},
            "jobs seen in the time range; click a job for its view"), "job"),
        clickhouse_panel(table.Panel(), 5, "Active incidents", """
            SELECT job, cause, kind, arrayStringConcat(arrayMap(x -> toString(x), ranks), ',') AS ranks,
                   arrayStringConcat(hosts, ',') AS hosts, function, impact_ms_per_step,
                   first_seen, last_seen, summary
            FROM incidents FINAL WHERE status != 'RESOLVED' ORDER BY impact_ms_per_step DESC LIMIT 200""",
                         (0, 12, 24, 9), {"impact_ms_per_step": "ms", "first_seen": "dateTimeAsIso",
                                          "last_seen": "dateTimeAsIso", "summary": "string"}),
        stacked_bars(clickhouse_panel(
            timeseries.Panel(), 6, "Incidents opened, by cause (the k most frequent causes)", f"""
            SELECT $__timeInterval(first_seen) AS time,
                   if({FLEET_CAUSES_TOP}, cause, 'other causes') AS series,
                   uniqExact(incident_id) AS incidents
            FROM anomalies WHERE {since} AND $__timeFilter(first_seen)
            GROUP BY time, series ORDER BY time""", (0, 21, 24, 8), {"incidents": "none"},
            "incidents first seen per interval, per cause; causes past the k most frequent "
            "are summed as 'other causes'")),
    ]


def fleet() -> dict[str, Any]:
    return dashboard("perftracker-fleet", "perftracker / fleet",
                     "All jobs: who is slow, what it costs, what is open.", _fleet_panels(),
                     [datasource_variable("datasource", CH_TYPE, CH_UID, "ClickHouse"), k_variable()],
                     [incident_annotation(job_filter=False)], [CH_INPUT])


# ------------------------------------------------------------------------------------------ job

# `rank IN (the k ranks of the job with the highest, or lowest, score)`
_WORST = ("rank IN (SELECT rank FROM @table WHERE " + WHERE + " GROUP BY rank ORDER BY @score, rank LIMIT "
          + K + ")")
STEP_WORST = _WORST.replace("@table", "rank_windows").replace("@score", "avg(step_time_ms_p50) DESC")
WAITS_WORST = _WORST.replace("@table", "collectives").replace("@score", "sum(wait_caused_ms_per_step) DESC")
CLOCK_WORST = _WORST.replace("@table", "gpu_health").replace("@score", "avgIf(sm_clock_mhz, sm_clock_mhz >= 0) ASC")
TEMP_WORST = _WORST.replace("@table", "gpu_health").replace("@score", "max(temp_c_max) DESC")


def _step_time_panel() -> timeseries.Panel:
    return band(clickhouse_panel(
        timeseries.Panel(), 1, "Step time: p50-p99 band over ranks and the k slowest ranks", [f"""
            SELECT {BUCKET} AS time, quantile(0.5)(step_time_ms_p50) AS p50,
                   quantile(0.99)(step_time_ms_p50) AS p99
            FROM rank_windows WHERE {WHERE} GROUP BY time ORDER BY time""", f"""
            SELECT {BUCKET} AS time, concat('rank ', toString(rank)) AS series,
                   avg(step_time_ms_p50) AS step_time_ms
            FROM rank_windows WHERE {WHERE} AND {STEP_WORST}
            GROUP BY time, series ORDER BY time"""], (0, 0, 24, 9),
        {"p50": "ms", "p99": "ms", "step_time_ms": "ms"},
        "each rank's median step time per window: the band is its p50 and p99 over the ranks, "
        "the lines are the k ranks slowest over the time range (k: the variable)"), "p50", "p99")


def _culprits_panel() -> statetimeline.Panel:
    return culprit_states(clickhouse_panel(
        statetimeline.Panel(), 10, "Culprits: ranks named by an incident, and the cause", f"""
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
        "while the incident is open"))


def _slowdown_matrix_panel() -> table.Panel:
    p = clickhouse_panel(table.Panel(), 2, "Slowdown vs peer median (rank x function, the 20 worst ranks)", f"""
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
                         "time per step of a function on a rank / its median over ranks; "
                         ">1 is slower. Rows: the ranks with the largest slowdown, worst first")
    steps = thresholds((None, "green"), (1.1, "yellow"), (1.25, "orange"), (1.5, "red"))
    return coloured_cells(matrix(p, "rank_name", "function", "slowdown"), "x", steps)


def _late_arrivals_matrix_panel() -> table.Panel:
    p = clickhouse_panel(
        table.Panel(), 3, "Collective late arrivals (who made the others wait, the 20 worst ranks)", f"""
            SELECT function, rank_name, late AS late_arrivals FROM (
              SELECT function, concat('rank ', toString(rank)) AS rank_name, rank, sum(late_arrivals) AS late,
                     sum(sum(late_arrivals)) OVER (PARTITION BY rank) AS rank_total
              FROM collectives WHERE {WHERE} GROUP BY function, rank)
            WHERE rank IN (SELECT rank FROM collectives WHERE {WHERE} GROUP BY rank
                           ORDER BY sum(late_arrivals) DESC, rank LIMIT {MATRIX_RANKS})
            ORDER BY rank_total DESC, rank, function""", (12, 15, 12, 10), {"late_arrivals": "none"},
        "times each rank arrived last at each collective: the culprit, not the "
        "victims. Rows: the ranks that arrived last most often")
    return coloured_cells(matrix(p, "rank_name", "function", "late_arrivals"), "none", None)


def _job_rank_panels() -> PanelList:
    """Step time, culprits, rank x function slowdown, collective late arrivals: who is slow, where."""
    return [
        _step_time_panel(),
        _culprits_panel(),
        _slowdown_matrix_panel(),
        _late_arrivals_matrix_panel(),
        clickhouse_panel(timeseries.Panel(), 4, "Waits caused per step: the k worst ranks and all others", f"""
            SELECT {BUCKET} AS time,
                   if({WAITS_WORST}, concat('rank ', toString(rank)), 'all other ranks') AS series,
                   sum(wait_caused_ms_per_step) / greatest(uniqExact(window_id), 1)
                   AS wait_caused_ms_per_step_total
            FROM collectives WHERE {WHERE}
            GROUP BY time, series ORDER BY time""", (0, 25, 12, 8), {"wait_caused_ms_per_step_total": "ms"},
                         "time per step the other ranks waited at collectives for these ranks to arrive"),
    ]


def _gpu_band_panels() -> PanelList:
    """SM clock and temperature: a band over the ranks and the k worst."""
    return [
        band(clickhouse_panel(timeseries.Panel(), 5, "GPU SM clock: p1-p50 band and the k slowest-clocked ranks", [f"""
            SELECT {BUCKET} AS time, quantile(0.01)(sm_clock_mhz) AS p1, quantile(0.5)(sm_clock_mhz) AS p50
            FROM gpu_health WHERE {WHERE} AND sm_clock_mhz >= 0 GROUP BY time ORDER BY time""", f"""
            SELECT {BUCKET} AS time, concat('rank ', toString(rank)) AS series, avg(sm_clock_mhz) AS sm_clock_avg_mhz
            FROM gpu_health WHERE {WHERE} AND sm_clock_mhz >= 0 AND {CLOCK_WORST}
            GROUP BY time, series ORDER BY time"""], (12, 25, 12, 8),
            {"p1": "rotmhz", "p50": "rotmhz", "sm_clock_avg_mhz": "rotmhz"},
            "SM clock per GPU: the band is the p1 and p50 over the ranks, the lines the k lowest"),
            "p1", "p50", "green"),
        band(clickhouse_panel(timeseries.Panel(), 6, "GPU temperature: p50-p99 band and the k hottest ranks", [f"""
            SELECT {BUCKET} AS time, quantile(0.5)(temp_c_max) AS p50, quantile(0.99)(temp_c_max) AS p99
            FROM gpu_health WHERE {WHERE} AND temp_c_max >= 0 GROUP BY time ORDER BY time""", f"""
            SELECT {BUCKET} AS time, concat('rank ', toString(rank)) AS series, max(temp_c_max) AS temp_c_peak
            FROM gpu_health WHERE {WHERE} AND temp_c_max >= 0 AND {TEMP_WORST}
            GROUP BY time, series ORDER BY time"""], (0, 33, 12, 8),
            {"p50": "celsius", "p99": "celsius", "temp_c_peak": "celsius"},
            "peak GPU temperature per window: the band is the p50 and p99 over the ranks, the lines "
            "the k hottest"), "p50", "p99", "orange"),
    ]


def _job_health_panels() -> PanelList:
    """GPU health, incidents with evidence, collector health: why, and can we trust it."""
    return _gpu_band_panels() + [
        clickhouse_panel(table.Panel(), 7, "GPU throttling and errors", f"""
            SELECT rank, any(host) AS host_name, any(gpu) AS gpu_index,
                   countIf(throttle_reasons > 0) AS throttled_windows,
                   groupBitOr(throttle_reasons) AS throttle_mask, max(ecc_uncorrected) AS ecc_errors,
                   max(xid) AS last_xid, min(pcie_width_min) AS pcie_width
            FROM gpu_health WHERE {WHERE}
            GROUP BY rank ORDER BY throttled_windows DESC, ecc_errors DESC, rank LIMIT 500""", (12, 33, 12, 8),
                         {"throttled_windows": "none", "throttle_mask": "hex", "ecc_errors": "none"},
                         "per rank, the worst first (500 at most)"),
        clickhouse_panel(table.Panel(), 8, "Incidents and evidence", f"""
            SELECT status, cause, kind, arrayStringConcat(arrayMap(x -> toString(x), ranks), ',') AS ranks,
                   arrayStringConcat(hosts, ',') AS hosts, function, score, impact_ms_per_step,
                   first_seen, last_seen, summary, evidence_json AS evidence
            FROM incidents FINAL WHERE {JOB} ORDER BY status = 'RESOLVED', impact_ms_per_step DESC""",
                         (0, 41, 24, 9), {"impact_ms_per_step": "ms", "score": "none",
                                          "first_seen": "dateTimeAsIso", "evidence": "string"}),
        clickhouse_panel(table.Panel(), 9, "Collector health", f"""
            SELECT rank, any(host) AS host_name, max(last_event) AS last_event, max(last_step) AS last_step,
                   max(dropped_events) AS dropped, max(lost_batches) AS lost
            FROM rank_windows WHERE {WHERE}
            GROUP BY rank ORDER BY lost DESC, dropped DESC, rank LIMIT 500""", (0, 50, 24, 8),
                         {"last_event": "dateTimeAsIso", "dropped": "none", "lost": "none"},
                         "per rank, those that lost batches or dropped events first (500 at most)"),
    ]


def job_view() -> dict[str, Any]:
    variables: VariableList = [
        datasource_variable("datasource", CH_TYPE, CH_UID, "ClickHouse"),
        variable("job", "SELECT DISTINCT job FROM rank_windows WHERE $__timeFilter(window_start)"
                 " ORDER BY job", False, "Job"),
        variable("host", f"SELECT DISTINCT host FROM rank_windows WHERE {JOB} ORDER BY host", True, "Host"),
        variable("rank", f"SELECT DISTINCT rank FROM rank_windows WHERE {JOB} AND {HOSTS} ORDER BY rank",
                 True, "Rank"),
        k_variable(),
    ]
    return dashboard("perftracker-job", "perftracker / job",
                     "One job: which rank and function, why, and how much it costs.",
                     _job_rank_panels() + _job_health_panels(), variables,
                     [incident_annotation(job_filter=True)], [CH_INPUT])


# --------------------------------------------------------------------------------------- health

PROM = model.DataSourceRef(type_val=PROM_TYPE, uid="${datasource}")
HEALTH_CH = model.DataSourceRef(type_val=CH_TYPE, uid="${clickhouse}")
RATE = "[$__rate_interval]"


def prom_query(ref_id: str, legend: str, expr: str, instant: bool) -> prometheus.Dataquery:
    q = prometheus.Dataquery().ref_id(ref_id).datasource(PROM).expr(" ".join(expr.split())).legend_format(legend)
    return q.instant().format(PromQueryFormat.TABLE) if instant else q.range()


def prom_panel(pid: int, title: str, grid: Grid, unit: str, queries: dict[str, str],
               description: str = "", kind: str = "timeseries") -> cogbuilder.Builder[model.Panel]:
    """A panel over the Prometheus datasource: ``queries`` maps legend -> PromQL; a table
    (instant queries, merged) or a time series (range queries)."""
    is_table = kind == "table"
    p = placed(table.Panel() if is_table else timeseries.Panel(), pid, title, grid, PROM, description)
    for i, (legend, expr) in enumerate(queries.items()):
        p.with_target(prom_query(chr(ord("A") + i), legend, expr, is_table))
    p.unit(unit)
    if is_table:
        p.with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
    return p


def quantiles(metric: str, by: str = "") -> dict[str, str]:
    """p50 and p95 of a histogram over the rate interval (``by``: extra grouping labels)."""
    group = f"le{', ' + by if by else ''}"
    tag = f" {{{{{by}}}}}" if by else ""
    return {f"p{q}{tag}": f"histogram_quantile(0.{q}, sum by ({group}) (rate({metric}_bucket{RATE})))"
            for q in (50, 95)}


def _health_pipeline_panels() -> PanelList:
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


def _health_latency_panels() -> PanelList:
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


def health() -> dict[str, Any]:
    variables: VariableList = [datasource_variable("datasource", PROM_TYPE, PROM_UID, "Prometheus"),
                               datasource_variable("clickhouse", CH_TYPE, CH_UID, "ClickHouse (incidents)")]
    return dashboard("perftracker-health", "perftracker / health",
                     "perftracker's own health from its Prometheus metrics: is every event processed, "
                     "how late are findings, do alerts get out.",
                     _health_pipeline_panels() + _health_latency_panels(), variables,
                     [incident_annotation(job_filter=False, ds=HEALTH_CH)], [PROM_INPUT, CH_INPUT],
                     refresh="10s")


DASHBOARDS = {"fleet.json": fleet, "job.json": job_view, "health.json": health}


def render_all() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


def main() -> None:
    for name, text in render_all().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
