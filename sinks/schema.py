"""ClickHouse tables, created and migrated by code on every start.

Migrations are numbered and append-only; ``perftracker_schema_migrations``
records the ones applied, so running :func:`migrate` again is a no-op. Every
statement is also idempotent on its own (``IF NOT EXISTS``), so a migration
interrupted half-way is safe to re-run.

Idempotent writes: the sink is at-least-once (Kafka offsets are committed
after the flush, and tansu has no transactions), so every table is a
``ReplacingMergeTree`` ordered by the record's natural key. A replayed batch
lands on the same key and collapses at merge time; readers that must be exact
before merges use ``FINAL`` or ``argMax``. Retention is a TTL on the event
time, re-applied from settings on every start (``ALTER ... MODIFY TTL`` only
when it changed).

ClickHouse cluster: ``migrate(..., cluster="name")`` runs every statement
``ON CLUSTER name`` and makes each MergeTree table ``Replicated*`` (Keeper path
``/clickhouse/tables/{shard}/{database}/{table}``, replica ``{replica}``: the
server's macros). That is one shard with any number of replicas, each holding
every row; several shards would also need ``Distributed`` tables, which are not
created here. With ``cluster=""`` (the default) the statements are the
single-node ones.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..schemas.errors import ConfigError
from .identifiers import ident
from .store import Store

log = logging.getLogger(__name__)

MIGRATIONS_TABLE = "perftracker_schema_migrations"
DT = "DateTime64(3, 'UTC')"
LC = "LowCardinality(String)"
REPLICA_PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
_CLUSTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_DDL_TARGET = re.compile(r"^((?:CREATE (?:TABLE|MATERIALIZED VIEW)|DROP TABLE|ALTER TABLE)"
                         r"(?: IF (?:NOT )?EXISTS)? \w+)")


def on_cluster(cluster: str) -> str:
    """`` ON CLUSTER `name` `` for a cluster name, '' for a single node."""
    if not cluster:
        return ""
    if not _CLUSTER_NAME.fullmatch(cluster):
        raise ConfigError(f"ClickHouse cluster name {cluster!r} is not an identifier (letters, digits, _ . -)")
    return f" ON CLUSTER `{cluster}`"


def replicated(engine: str) -> str:
    """``ReplacingMergeTree(version)`` -> ``ReplicatedReplacingMergeTree(<path>, <replica>, version)``."""
    name, _, args = engine.partition("(")
    args = args.removesuffix(")")
    return f"Replicated{name}({REPLICA_PATH}{', ' + args if args else ''})"


def cluster_statement(sql: str, cluster: str) -> str:
    """A migration's ``CREATE``/``DROP``/``ALTER`` statement run ``ON CLUSTER`` (unchanged for one node)."""
    if not cluster:
        return sql
    if not _DDL_TARGET.match(sql):
        raise ValueError(f"cannot run on a cluster (not CREATE/DROP/ALTER TABLE name): {sql[:80]}")
    return _DDL_TARGET.sub(lambda m: m.group(1) + on_cluster(cluster), sql, count=1)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]
    engine: str
    order_by: str
    partition_by: str = ""
    ttl_column: str = ""  # DateTime64 column the retention TTL counts from
    incident_retention: bool = False  # use incident_retention_days instead of retention_days
    doc: str = ""

    def __post_init__(self) -> None:
        for name in (self.name, *self.column_names, *([self.ttl_column] if self.ttl_column else [])):
            ident(name)

    @property
    def column_names(self) -> list[str]:
        return [c for c, _ in self.columns]

    def ttl_expr(self, days: int) -> str:
        return f"toDateTime({self.ttl_column}) + toIntervalDay({int(days)})"

    def create_sql(self, days: int, cluster: str = "") -> str:
        cols = ",\n  ".join(f"`{c}` {t}" for c, t in self.columns)
        engine = replicated(self.engine) if cluster else self.engine
        parts = [f"CREATE TABLE IF NOT EXISTS {self.name}{on_cluster(cluster)} (\n  {cols}\n) ENGINE = {engine}"]
        if self.partition_by:
            parts.append(f"PARTITION BY {self.partition_by}")
        parts.append(f"ORDER BY {self.order_by}")
        if self.ttl_column:
            parts.append(f"TTL {self.ttl_expr(days)}")
        if self.partition_by and self.ttl_column:
            parts.append("SETTINGS ttl_only_drop_parts = 1")
        return "\n".join(parts)


_WINDOW = (("job", LC), ("window_id", "Int64"), ("window_start", DT))
_RANK = (("rank", "UInt32"), ("host", LC), ("gpu", "Int32"))
_INCIDENT_COLS = (
    ("job", LC), ("incident_id", "String"), ("status", LC), ("kind", LC), ("cause", LC),
    ("ranks", "Array(Int32)"), ("hosts", "Array(String)"), ("gpus", "Array(Int32)"),
    ("function", "String"), ("score", "Float64"), ("impact_ms_per_step", "Float64"),
    ("step_time_ms", "Float64"), ("first_seen", DT), ("last_seen", DT), ("windows", "UInt32"),
    ("summary", "String"), ("evidence_json", "String"), ("version", "UInt64"),
    ("resolved_reason", LC),  # RESOLVED only: "cleared", "job finished", "job died" (migration 4)
)

TABLES: dict[str, Table] = {t.name: t for t in (
    Table("function_stats", _WINDOW + (("window_s", "Float32"),) + _RANK + (
        ("world_size", "UInt32"), ("signature", LC), ("function", LC), ("kind", "Int16"),
        ("steps", "UInt32"), ("count", "UInt64"), ("total_ns", "Int64"), ("p50_ns", "Int64"),
        ("p90_ns", "Int64"), ("p99_ns", "Int64"), ("max_ns", "Int64"), ("hist", "Array(Int64)"),
        ("group_ranks", "Array(Int32)"), ("bytes", "Int64")),
        "ReplacingMergeTree", "(job, window_id, function, rank)", "toYYYYMMDD(window_start)",
        "window_start", doc="FunctionPattern: one row per window, rank and function"),
    Table("iterations", (("job", LC), ("rank", "UInt32"), ("step", "Int64"), ("window_id", "Int64"),
                         ("window_start", DT), ("host", LC), ("step_time_ms", "Float64")),
          "ReplacingMergeTree", "(job, rank, step)", "toYYYYMMDD(window_start)", "window_start",
          doc="one row per training iteration of each rank (from RankWindow.step_time_ns)"),
    Table("rank_windows", _WINDOW + (("window_s", "Float32"),) + _RANK + (
        ("world_size", "UInt32"), ("signature", LC), ("functions", "UInt32"), ("steps", "UInt32"),
        ("last_step", "Int64"), ("step_time_ms_p50", "Float64"), ("step_time_ms_max", "Float64"),
        ("last_event", DT), ("last_function", LC), ("pending_group", LC), ("pending_seq", "Int64"),
        ("dropped_events", "Int64"), ("lost_batches", "Int64"), ("bytes_received", "Int64"),
        ("ended_cleanly", "UInt8"),  # the rank's last window, after its final batch (migration 4)
        ("restarts", "UInt32"),  # processes of the rank replaced under the job id (migration 4)
        ("mesh_coords", "Map(String, Int32)")),  # DeviceMesh coordinate per dim name (migration 5)
        "ReplacingMergeTree", "(job, window_id, rank)", "toYYYYMMDD(window_start)", "window_start",
        doc="RankWindow: liveness and collector health per window and rank"),
    Table("gpu_health", _WINDOW + _RANK + (
        ("hw_samples", "UInt32"), ("sm_clock_mhz", "Float32"), ("sm_clock_max_mhz", "Float32"),
        ("temp_c_max", "Float32"), ("power_w_mean", "Float32"), ("util_gpu_pct", "Float32"),
        ("throttle_reasons", "Int64"), ("pcie_gen_min", "Int16"), ("pcie_width_min", "Int16"),
        ("nvlink_errors", "Int64"), ("ecc_uncorrected", "Int64"), ("xid", "Int64")),
        "ReplacingMergeTree", "(job, window_id, rank)", "toYYYYMMDD(window_start)", "window_start",
        doc="RankWindow hardware summary: clocks, temperature, power, throttling, errors (-1 = no NVML)"),
    Table("collectives", _WINDOW + (
        ("function", LC), ("rank", "UInt32"), ("host", LC), ("gpu", "Int32"),
        ("collectives", "UInt32"), ("late_arrivals", "UInt32"), ("late_fraction", "Float64"),
        ("wait_caused_ms_per_step", "Float64"), ("p_value", "Float64"),
        ("group_wait_ms_per_step", "Float64"), ("transfer_ms_per_step", "Float64"),
        ("mixed_signatures", "UInt8")),
          "ReplacingMergeTree", "(job, window_id, function, rank)", "toYYYYMMDD(window_start)",
          "window_start",
          doc="FunctionComparison of a collective: per window, group and member rank, "
              "how often it arrived last and the waits it caused"),
    Table("function_outliers", _WINDOW + (
        ("function", LC), ("rank", "UInt32"), ("host", LC), ("gpu", "Int32"), ("peer_group", LC),
        ("value_ms_per_step", "Float64"), ("peer_median_ms_per_step", "Float64"), ("ratio", "Float64"),
        ("robust_z", "Float64"), ("cost_ms_per_step", "Float64"), ("calls_ratio", "Float64"),
        ("per_call_ratio", "Float64")),
          "ReplacingMergeTree", "(job, window_id, function, rank)", "toYYYYMMDD(window_start)",
          "window_start", doc="FunctionComparison: ranks whose function time is far from their peers'"),
    Table("anomalies", _INCIDENT_COLS, "ReplacingMergeTree",
          "(job, incident_id, last_seen, status)", "toYYYYMM(last_seen)", "last_seen", True,
          doc="every version of every Anomaly record (history)"),
    Table("incidents", _INCIDENT_COLS, "ReplacingMergeTree(version)", "(job, incident_id)",
          "", "last_seen", True, doc="latest state of each incident (read with FINAL)"),
    Table("remediations", (
        ("job", LC), ("incident_id", "String"), ("at", DT), ("cause", LC), ("node", "String"),
        ("mode", LC), ("action", LC), ("outcome", LC), ("reason", "String"), ("command", "String"),
        ("patch", "String")),
          "ReplacingMergeTree", "(job, incident_id, at, node)", "toYYYYMM(at)", "at", True,
          doc="what the remediation hook did about an incident's node: drained, would have (dry run), "
              "refused and why, failed (migration 9)"),
)}


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    tables: tuple[str, ...] = ()
    statements: tuple[str, ...] = ()


def _raw_ingest_statements() -> tuple[str, ...]:
    from .raw import migration_statements

    return migration_statements()


def _raw_constraint_statements() -> tuple[str, ...]:
    from .raw import recreate_raw_tables

    return recreate_raw_tables()


def _job_end_statements() -> tuple[str, ...]:
    """RankWindow v3 ``ended_cleanly`` and Anomaly v2 ``resolved_reason`` as columns; the raw
    RankWindow table and its view again, with the new field (added columns default to 0 / '')."""
    from .raw import recreate_view

    adds = (f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS `{column}` {typ}" for table, column, typ in (
        ("rank_windows", "ended_cleanly", "UInt8"), ("rank_windows", "restarts", "UInt32"),
        ("anomalies", "resolved_reason", LC),
        ("incidents", "resolved_reason", LC)))
    return (*adds, *_raw_constraint_statements(), *recreate_view("mv_rank_windows"))


def _mesh_statements() -> tuple[str, ...]:
    """RankWindow v4 ``mesh_coords`` as a column; the raw RankWindow table and its view again."""
    from .raw import recreate_view

    return ("ALTER TABLE rank_windows ADD COLUMN IF NOT EXISTS `mesh_coords` Map(String, Int32)",
            *_raw_constraint_statements(), *recreate_view("mv_rank_windows"))


def _pattern_v3_statements() -> tuple[str, ...]:
    """FunctionPattern v3's trimmed histogram and member ranges: the raw tables again (the new
    fields), and the view that stores the whole histogram and member list from them."""
    from .raw import recreate_view

    return (*_raw_constraint_statements(), *recreate_view("mv_function_stats"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial tables", tables=tuple(TABLES)),
    Migration(2, "raw Avro ingestion: Null tables and materialized views",
              statements=_raw_ingest_statements()),
    Migration(3, "content rules as constraints on the raw Avro tables",
              statements=_raw_constraint_statements()),
    Migration(4, "job end: rank_windows.ended_cleanly and .restarts, anomalies/incidents.resolved_reason",
              statements=_job_end_statements()),
    Migration(5, "parallel layout: rank_windows.mesh_coords", statements=_mesh_statements()),
    Migration(6, "FunctionPattern v2 mesh_coords: the raw tables again (the field is read, not stored)",
              statements=_raw_constraint_statements()),
    Migration(7, "RankWindow.restarts at least 0: the raw tables again (a negative count passed the rules "
                 "and wrapped around in the UInt32 column)", statements=_raw_constraint_statements()),
    Migration(8, "RankWindow v5 gpu_uuid and flight_records_json: the raw tables again (read, not stored: "
                 "the findings carry them)", statements=_raw_constraint_statements()),
    Migration(9, "remediations: what the remediation hook did about an incident's node",
              tables=("remediations",)),
    Migration(10, "FunctionPattern v3 hist_first/hist_counts and group_ranks_first/_step/_count (the histogram "
                  "trimmed, a group's members as a range): the raw tables again, and the view that stores the "
                  "whole histogram and member list from them",
              statements=_pattern_v3_statements()),
)


def _applied(store: Store, cluster: str = "") -> set[int]:
    engine = replicated("ReplacingMergeTree") if cluster else "ReplacingMergeTree"
    store.command(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE}{on_cluster(cluster)} (version UInt32, description String, "
        f"applied_at DateTime DEFAULT now()) ENGINE = {engine} ORDER BY version")
    res = store.query(f"SELECT DISTINCT version FROM {MIGRATIONS_TABLE}")
    return {int(r[0]) for r in res.rows}


def migrate(store: Store, retention_days: int = 30, incident_retention_days: int = 365,
            cluster: str = "") -> list[int]:
    """Apply the migrations not applied yet and the configured retention; return the versions applied.

    ``cluster``: run the DDL ``ON CLUSTER`` with replicated tables (module docstring); '' = one node.
    """
    done = _applied(store, cluster)
    applied = []
    for m in MIGRATIONS:
        if m.version in done:
            continue
        for name in m.tables:
            t = TABLES[name]
            days = incident_retention_days if t.incident_retention else retention_days
            store.command(t.create_sql(days, cluster))
        for sql in m.statements:
            store.command(cluster_statement(sql, cluster))
        store.insert(MIGRATIONS_TABLE, ["version", "description"], [[m.version], [m.description]])
        log.info("store schema migrated to v%d (%s)", m.version, m.description)
        applied.append(m.version)
    apply_retention(store, retention_days, incident_retention_days, cluster)
    return applied


def apply_retention(store: Store, retention_days: int, incident_retention_days: int,
                    cluster: str = "") -> list[str]:
    """Change the TTL of the tables whose retention differs from the settings; return their names."""
    res = store.query("SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()")
    engines = dict(res.rows)
    changed = []
    for t in TABLES.values():
        if not t.ttl_column or t.name not in engines:
            continue
        days = incident_retention_days if t.incident_retention else retention_days
        if f"toIntervalDay({int(days)})" in engines[t.name]:
            continue
        store.command(f"ALTER TABLE {t.name}{on_cluster(cluster)} MODIFY TTL {t.ttl_expr(days)}")
        log.info("retention of %s set to %d days", t.name, days)
        changed.append(t.name)
    return changed
