"""The store on chDB: migrations, retention, hostile strings, named queries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.sinks.client import incident_view
from perftracker_ml.sinks.queries import QUERIES, run_query
from perftracker_ml.sinks.rows import flat_rows
from perftracker_ml.sinks.schema import MIGRATIONS, MIGRATIONS_TABLE, TABLES, migrate
from perftracker_ml.sinks.store import Store, parse_store_url

pytestmark = pytest.mark.integration

HOSTILE = ["job'; DROP TABLE incidents; --", 'a"b\\c{job:String}', "%s %(x)s ${job} $__timeFilter(x)",
           "ünïcødé 🚀 \t\n tab", "x" * 2000, "\x00nul"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(parse_store_url(f"chdb://{tmp_path / 'chdb'}", tmp_path))
    yield s
    s.close()


def load(store: Store, records) -> None:
    buffers: dict[str, list] = {}
    for name, rec in records:
        for table, row in flat_rows(name, rec):
            buffers.setdefault(table, []).append(row)
    for table, rows in buffers.items():
        store.insert(table, TABLES[table].column_names, rows, column_oriented=False)


def test_migration_twice_is_a_no_op(store):
    assert migrate(store) == [m.version for m in MIGRATIONS]
    before = store.query("SELECT name, create_table_query FROM system.tables "
                         "WHERE database = currentDatabase() ORDER BY name").rows
    assert migrate(store) == []
    after = store.query("SELECT name, create_table_query FROM system.tables "
                        "WHERE database = currentDatabase() ORDER BY name").rows
    assert before == after
    assert store.query(f"SELECT count() FROM {MIGRATIONS_TABLE} FINAL").rows == [(len(MIGRATIONS),)]
    assert {n for n, _ in after} >= set(TABLES)


def test_migration_5_adds_mesh_coords_to_a_store_that_has_data(store):
    """A store at migration 4 (no mesh_coords, the view without it) with a row in it:
    migration 5 adds the column (the old row reads {}), and both paths store it afterwards."""
    import time

    from perftracker_ml.schemas import MultiCodec
    from perftracker_ml.sinks.raw import RAW_TABLES, VIEWS, RawMessage, container

    migrate(store)
    old_view = VIEWS["mv_rank_windows"][1].replace(", mesh_coords", "")
    assert old_view != VIEWS["mv_rank_windows"][1]
    for sql in ("DROP TABLE mv_rank_windows", "ALTER TABLE rank_windows DROP COLUMN mesh_coords",
                f"CREATE MATERIALIZED VIEW mv_rank_windows TO rank_windows AS {old_view}",
                f"ALTER TABLE {MIGRATIONS_TABLE} DELETE WHERE version = 5 SETTINGS mutations_sync = 2"):
        store.command(sql)
    w = int(time.time() // 5)
    names = TABLES["rank_windows"].column_names
    old_cols = [c for c in names if c != "mesh_coords"]
    row = dict(zip(names, next(r for t, r in flat_rows("RankWindow", samples.rank_window("mig5", w, 0, steps=2))
                               if t == "rank_windows"), strict=True))
    store.insert("rank_windows", old_cols, [[row[c]] for c in old_cols])

    assert migrate(store) == [5]
    codec = MultiCodec(["RankWindow"])
    raw_rw = {**samples.rank_window("mig5", w + 1, 0, steps=2), "mesh_coords": {"dp": 1, "tp": 0}}
    store.raw_insert(RAW_TABLES["RankWindow"], container(
        "RankWindow", [RawMessage(codec.encode("RankWindow", raw_rw), "t", 0, 0)]), "Avro")
    load(store, [("RankWindow", {**samples.rank_window("mig5", w + 2, 0, steps=2), "mesh_coords": {"pp": 3}})])
    got = store.query("SELECT window_id, mesh_coords FROM rank_windows FINAL WHERE job = 'mig5'"
                      " ORDER BY window_id").rows
    assert [(wid, dict(m)) for wid, m in got] == [(w, {}), (w + 1, {"dp": 1, "tp": 0}), (w + 2, {"pp": 3})]
    assert migrate(store) == []


def test_migration_4_adds_the_job_end_columns_to_a_store_that_has_data(store):
    """A store at migration 3 (no ended_cleanly, no resolved_reason, the view without the
    field) with rows in it: migration 4 adds the columns (old rows read 0 / ''), and the raw
    path and the Python path both store the new fields afterwards."""
    import time

    from perftracker_ml.schemas import MultiCodec
    from perftracker_ml.sinks.raw import RAW_TABLES, VIEWS, RawMessage, container

    migrate(store)
    old_view = VIEWS["mv_rank_windows"][1].replace(
        ", toUInt8(ended_cleanly) AS ended_cleanly, toUInt32(restarts) AS restarts", "")
    assert old_view != VIEWS["mv_rank_windows"][1]
    for sql in ("DROP TABLE mv_rank_windows", "ALTER TABLE rank_windows DROP COLUMN ended_cleanly",
                "ALTER TABLE rank_windows DROP COLUMN restarts",
                "ALTER TABLE anomalies DROP COLUMN resolved_reason", "ALTER TABLE incidents DROP COLUMN resolved_reason",
                f"CREATE MATERIALIZED VIEW mv_rank_windows TO rank_windows AS {old_view}",
                f"ALTER TABLE {MIGRATIONS_TABLE} DELETE WHERE version = 4 SETTINGS mutations_sync = 2"):
        store.command(sql)
    w = int(time.time() // 5)
    old_rw = samples.rank_window("mig4", w, 0, steps=2)
    old_cols = [c for c in TABLES["rank_windows"].column_names if c not in ("ended_cleanly", "restarts")]
    row = dict(zip(TABLES["rank_windows"].column_names, next(r for t, r in flat_rows("RankWindow", old_rw)
                                                             if t == "rank_windows"), strict=True))
    store.insert("rank_windows", old_cols, [[row[c]] for c in old_cols])

    assert migrate(store) == [4]
    codec = MultiCodec(["RankWindow"])
    new_rw = {**samples.rank_window("mig4", w + 1, 0, steps=2), "ended_cleanly": True, "restarts": 1}
    store.raw_insert(RAW_TABLES["RankWindow"], container(
        "RankWindow", [RawMessage(codec.encode("RankWindow", new_rw), "t", 0, 0)]), "Avro")
    load(store, [("Anomaly", {**samples.anomaly("mig4", status="RESOLVED"), "resolved_reason": "job finished"})])
    assert store.query("SELECT window_id, ended_cleanly, restarts FROM rank_windows FINAL WHERE job = 'mig4'"
                       " ORDER BY window_id").rows == [(w, 0, 0), (w + 1, 1, 1)]
    assert store.query("SELECT resolved_reason FROM incidents FINAL WHERE job = 'mig4'").rows == [("job finished",)]
    assert migrate(store) == []


def test_retention_change_is_applied_once(store):
    migrate(store, retention_days=30)
    migrate(store, retention_days=7, incident_retention_days=90)
    engines = dict(store.query("SELECT name, engine_full FROM system.tables "
                               "WHERE database = currentDatabase()").rows)
    assert "toIntervalDay(7)" in engines["function_stats"]
    assert "toIntervalDay(90)" in engines["incidents"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_strings_are_stored_verbatim_and_never_break_a_query(store, name):
    migrate(store)
    records = [(n, {**r, **({"function": name} if n == "FunctionPattern" else {})})
               for n, r in samples.job_records(name, world=2, windows=1)]
    records.append(("Anomaly", {**samples.anomaly(name, incident_id=name, function=name),
                                "summary": name, "hosts": [name]}))
    load(store, records)
    found = [incident_view(r) for r in run_query(store, "incidents", {"job": name}).dicts()]
    mine = [f for f in found if f["incident_id"] == name]
    assert mine and mine[0]["job"] == name and mine[0]["function"] == name and mine[0]["hosts"] == [name]
    fns = {r["function"] for r in run_query(store, "rank_function_slowdown", {"job": name}).dicts()}
    assert name in fns
    for qname, q in QUERIES.items():
        params = {"job": name} if "job" in q.params else {}
        run_query(store, qname, params)  # never a syntax error
    assert store.query("SELECT count() FROM incidents").rows[0][0] >= 1


def test_replayed_rows_collapse(store):
    migrate(store)
    records = list(samples.job_records("replay", world=2, windows=2))
    load(store, records)
    load(store, records)  # at-least-once: the same batch again
    for table in set(TABLES) - {"remediations"}:  # not fed by records (test_remediation_store.py)
        raw = store.query(f"SELECT count() FROM {table}").rows[0][0]
        final = store.query(f"SELECT count() FROM {table} FINAL").rows[0][0]
        assert raw == 2 * final and final > 0, table


def test_report_queries_late_wait_per_step_and_the_window_that_opened_an_incident(store):
    """The late-arrival figure is the mean over the windows the rank was late in (what its
    incident says), not diluted by the windows before the fault; the detection time is the
    OPEN record's window end, not the incident's first window start."""
    from datetime import datetime, timezone

    migrate(store)
    t0 = int(datetime.now(timezone.utc).timestamp()) // 5 * 5
    rows = [("j", w, datetime.fromtimestamp(t0 + 5 * w, tz=timezone.utc), "comm:all_reduce", 2, "h", -1, 50,
             25 if w >= 2 else 0, 0.5 if w >= 2 else 0.0, 15.3 if w >= 2 else 0.0, 1e-6, 4.0, 1.0, 0)
            for w in range(6)]
    store.insert("collectives", TABLES["collectives"].column_names, rows, column_oriented=False)
    (late,) = run_query(store, "collective_late_arrivals", {"job": "j"}).dicts()
    assert late["wait_caused_ms_per_step"] == 15.3 and late["late_windows"] == 4 and late["late_arrivals"] == 100
    load(store, [("Anomaly", samples.anomaly("j", status=s, last_seen_s=t0 + dt))
                 for s, dt in (("OPEN", 10), ("UPDATED", 20), ("RESOLVED", 30))])
    (opened,) = run_query(store, "incident_opened", {"job": "j"}).dicts()
    assert opened["incident_id"] == "inc-1" and opened["opened"].timestamp() == t0 + 10


def test_diagnose_names_what_the_job_end_resolved_but_not_what_cleared(store):
    migrate(store)
    load(store, [("Anomaly", {**samples.anomaly("ended", incident_id=i, status=s), "resolved_reason": why})
                 for i, s, why in (("open", "OPEN", ""), ("cleared", "RESOLVED", "cleared"),
                                   ("at-end", "RESOLVED", "job finished"), ("died", "RESOLVED", "job died"))])
    shown = {r["incident_id"]: r["resolved_reason"] for r in run_query(store, "incidents", {"job": "ended"}).dicts()}
    assert shown == {"open": "", "at-end": "job finished", "died": "job died"}
    every = run_query(store, "incidents", {"job": "ended", "include_resolved": True}).dicts()
    assert {r["incident_id"] for r in every} == {"open", "cleared", "at-end", "died"}


def test_migration_10_stores_the_whole_histogram_and_members_of_v3_and_older_patterns(store):
    """A store at migration 9 (the raw table of FunctionPattern v2, the view storing ``hist`` and
    ``group_ranks`` as sent): migration 10 makes the raw table v3's and the view rebuild the whole
    histogram and member list, so a v3 pattern (``hist_first`` zeros, then ``hist_counts``; its
    group as a range) stores the same ``hist`` and ``group_ranks`` through the raw path and the
    Python path as a v2 pattern that sent them whole."""
    import time

    from perftracker_ml.schemas import Codec, bundled_schemas
    from perftracker_ml.sinks.raw import RAW_TABLES, VIEWS, RawMessage, _ch_type, container

    migrate(store)
    v2_fields = bundled_schemas().restricted("FunctionPattern", 2).latest("FunctionPattern").raw["fields"]
    v2_table = ", ".join(f"`{f['name']}` {_ch_type(f['type'])}" for f in v2_fields)
    old_view = VIEWS["mv_function_stats"][1].replace(
        "arrayConcat(hist, arrayWithConstant(hist_first, toInt64(0)), hist_counts) AS hist", "hist").replace(
        "arrayConcat(group_ranks, arrayMap(i -> toInt32(group_ranks_first + i * group_ranks_step),"
        " range(toUInt32(group_ranks_count)))) AS group_ranks", "group_ranks")
    assert old_view != VIEWS["mv_function_stats"][1]
    for sql in ("DROP TABLE mv_function_stats", "DROP TABLE raw_function_patterns",
                f"CREATE TABLE raw_function_patterns ({v2_table}) ENGINE = Null",
                f"CREATE MATERIALIZED VIEW mv_function_stats TO function_stats AS {old_view}",
                f"ALTER TABLE {MIGRATIONS_TABLE} DELETE WHERE version = 10 SETTINGS mutations_sync = 2"):
        store.command(sql)
    assert migrate(store) == [10]

    w = int(time.time() // 5)
    whole = [0] * 9 + [1] + [0] * 69 + [2]  # bucket 9 once, bucket 79 (1 ms) twice
    members = [1, 5, 9, 13]
    v2 = {**samples.pattern("mig10", w, 0, "f", world=16), "hist": whole, "group_ranks": members}
    v3 = {**samples.pattern("mig10", w, 0, "f", world=16), "hist": [], "hist_first": 9, "hist_counts": whole[9:],
          "group_ranks": [], "group_ranks_first": 1, "group_ranks_step": 4, "group_ranks_count": 4}
    old = Codec("FunctionPattern", bundled_schemas().restricted("FunctionPattern", 2))
    new = Codec("FunctionPattern")
    store.raw_insert(RAW_TABLES["FunctionPattern"], container(
        "FunctionPattern", [RawMessage(new.encode({**v3, "rank": 1}), "t", 0, 0)]), "Avro")
    load(store, [("FunctionPattern", {**new.decode(new.encode(v3)), "rank": 2}),
                 ("FunctionPattern", {**new.decode(old.encode(v2)), "rank": 3})])
    got = store.query("SELECT rank, hist, group_ranks FROM function_stats FINAL WHERE job = 'mig10' ORDER BY rank").rows
    assert [(r, list(h), list(g)) for r, h, g in got] == [(1, whole, members), (2, whole, members), (3, whole, members)]
    assert migrate(store) == []
