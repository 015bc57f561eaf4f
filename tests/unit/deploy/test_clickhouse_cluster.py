"""The store migrations on a ClickHouse cluster: ON CLUSTER DDL and Replicated tables.

No ClickHouse server or Keeper here: the statements are captured from a fake
store, and chDB's parser (``EXPLAIN AST``, nothing executed) checks their syntax.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.sinks import schema


class _Result:
    def __init__(self, rows: list) -> None:
        self.rows = rows


class _RecordingStore:
    """Records DDL; reports every table present with a 1-day TTL so retention is re-applied."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def command(self, sql: str) -> None:
        self.statements.append(sql)

    def query(self, sql: str) -> _Result:
        if "system.tables" in sql:
            return _Result([(name, "... toIntervalDay(1)") for name in schema.TABLES])
        return _Result([])

    def insert(self, table: str, columns: list[str], data: list) -> None:
        pass


def _ddl(cluster: str) -> list[str]:
    store = _RecordingStore()
    schema.migrate(store, 30, 365, cluster=cluster)
    return store.statements


def test_single_node_ddl_has_no_cluster_clauses():
    for sql in _ddl(""):
        assert "ON CLUSTER" not in sql and "Replicated" not in sql, sql


def test_cluster_ddl_runs_every_statement_on_the_cluster_with_replicated_tables():
    single, clustered = _ddl(""), _ddl("perftracker")
    assert len(clustered) == len(single)
    for sql in clustered:
        assert re.match(r"(CREATE (TABLE|MATERIALIZED VIEW) IF NOT EXISTS|DROP TABLE IF EXISTS|ALTER TABLE) "
                        r"\w+ ON CLUSTER `perftracker`( |\(|$)", sql), sql
        engine = re.search(r"ENGINE = (\w+)", sql)
        if engine and engine.group(1) != "Null":
            assert engine.group(1).startswith("Replicated"), sql
            assert schema.REPLICA_PATH in sql, sql
    incidents = next(s for s in clustered if "EXISTS incidents " in s)
    assert f"ReplicatedReplacingMergeTree({schema.REPLICA_PATH}, version)" in incidents


def test_cluster_statement_handles_every_ddl_form_a_migration_may_hold():
    for sql, expected in (
            ("DROP TABLE IF EXISTS raw_x", "DROP TABLE IF EXISTS raw_x ON CLUSTER `c`"),
            ("ALTER TABLE t ADD CONSTRAINT k CHECK a > 0", "ALTER TABLE t ON CLUSTER `c` ADD CONSTRAINT k CHECK a > 0"),
            ("CREATE MATERIALIZED VIEW IF NOT EXISTS v TO t AS SELECT 1",
             "CREATE MATERIALIZED VIEW IF NOT EXISTS v ON CLUSTER `c` TO t AS SELECT 1")):
        assert schema.cluster_statement(sql, "c") == expected
        assert schema.cluster_statement(sql, "") == sql
    with pytest.raises(ValueError, match="cannot run on a cluster"):
        schema.cluster_statement("INSERT INTO t VALUES (1)", "c")


def test_cluster_name_must_be_an_identifier():
    for bad in ("a b", "x`; DROP TABLE incidents", "1abc"):
        with pytest.raises(ConfigError, match="cluster name"):
            schema.on_cluster(bad)


_PARSE = """
import json, sys, chdb
bad = []
for sql in json.load(sys.stdin):
    try:
        chdb.query("EXPLAIN AST " + sql, "CSV")
    except Exception as exc:
        bad.append([sql[:200], str(exc)[:300]])
print(json.dumps(bad))
"""


def test_chdb_parses_every_cluster_statement():
    statements = _ddl("perftracker")
    # chDB in a child process: its engine is one per process and other tests may hold it.
    out = subprocess.run([sys.executable, "-c", _PARSE], input=json.dumps(statements),
                         capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
