"""Rows the store refuses never stop writing: real chDB rejects them, the sink bisects them
out, writes every other row once and hands the rejected ones over (dead-lettered by the
service); the raw Avro tables enforce the same content rules as the Python validation."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import MultiCodec, SchemaError
from perftracker_ml.schemas.settings import StoreSettings
from perftracker_ml.schemas.validate import validate
from perftracker_ml.sinks.clickhouse import ClickHouseSink
from perftracker_ml.sinks.decode import RecordDecoder
from perftracker_ml.sinks.errors import RowsRejected, StoreUnavailable
from perftracker_ml.sinks.raw import RAW_TABLES, RawMessage, container, migration_statements
from perftracker_ml.sinks.rows import ROW_BUILDERS
from perftracker_ml.sinks.schema import MIGRATIONS, TABLES, Migration, migrate
from perftracker_ml.sinks.store import Store, parse_store_url

from ...hostile import SINK_NAMES, hostile_sink_record
from .conftest import wait_for

pytestmark = pytest.mark.integration

CODEC = MultiCodec(SINK_NAMES)
DECODER = RecordDecoder(SINK_NAMES)


class CountingStore(Store):
    """A real chDB store that counts inserts and can fail (connection refused) on chosen ones."""

    inserts = 0
    fail_at: set[int] = set()

    def insert(self, table, columns, data, column_oriented=True):
        type(self).inserts += 1
        if type(self).inserts in self.fail_at:
            raise StoreUnavailable(f"insert into {table} failed: connection refused")
        super().insert(table, columns, data, column_oriented)


def open_sink(path: Path, store_cls: type[Store] = Store) -> tuple[ClickHouseSink, list]:
    rejected: list[tuple[str, dict, str]] = []
    store = store_cls.open(parse_store_url(f"chdb://{path}", path))
    sink = ClickHouseSink(store, StoreSettings(), on_rejected=lambda t, row, why: rejected.append((t, row, why)))
    sink.setup()
    return sink, rejected


def collective_rows(job: str, members: list[int]) -> list[tuple]:
    rec = {**samples.comparison(job, int(time.time() // 5), world=len(members)), "members": members}
    return dict(ROW_BUILDERS["FunctionComparison"](rec))["collectives"]


def count(store: Store, table: str, job: str, final: bool = False) -> int:
    sql = f"SELECT count() FROM {table} {'FINAL' if final else ''} WHERE job = {{j:String}}"
    return store.query(sql, {"j": job}).rows[0][0]


def test_the_probes_rank_minus_5_is_rejected_alone_and_every_other_row_written(tmp_path):
    """rank -5 into `collectives` made the insert fail forever; now only that row is refused."""
    sink, rejected = open_sink(tmp_path / "s")
    rows = collective_rows("probe", [0, 1, -5, 3])
    sink.add_rows("collectives", rows)
    sink.add_rows("incidents", dict(ROW_BUILDERS["Anomaly"](samples.anomaly("probe")))["incidents"])
    assert sink.flush() == 4  # three members and the incident; the refused row is not counted
    assert [(t, r["rank"]) for t, r, _ in rejected] == [("collectives", -5)]
    assert "insert into collectives failed" in rejected[0][2]
    assert count(sink.store, "collectives", "probe") == 3 and count(sink.store, "incidents", "probe") == 1
    assert sink.rejected_rows == 1 and sink.buffered == 0
    with pytest.raises(RowsRejected):  # the store's verdict, not a connection error
        sink.store.insert("collectives", TABLES["collectives"].column_names, list(zip(*rows[2:3], strict=True)))
    sink.store.close()


def test_bisection_costs_a_few_inserts_per_bad_row(tmp_path):
    CountingStore.inserts, CountingStore.fail_at = 0, set()
    sink, rejected = open_sink(tmp_path / "b", CountingStore)
    members = list(range(1000))
    for bad in (17, 500, 998):
        members[bad] = -bad
    before = CountingStore.inserts
    sink.add_rows("collectives", collective_rows("bisect", members))
    assert sink.flush() == 997
    inserts = CountingStore.inserts - before
    assert sorted(r["rank"] for _, r, _ in rejected) == [-998, -500, -17]
    assert count(sink.store, "collectives", "bisect") == 997
    assert inserts <= 1 + 2 * 3 * 10, inserts  # ~2 k log2(n): never one insert per row
    sink.store.close()


def test_store_down_during_the_bisection_keeps_only_what_is_left(tmp_path):
    """A connection error in the middle: the retry writes each remaining row once and refuses
    the bad row once; nothing is written twice."""
    CountingStore.inserts = 0
    sink, rejected = open_sink(tmp_path / "d", CountingStore)
    CountingStore.fail_at = {CountingStore.inserts + 4}  # whole, half, quarter ok/refused, then down
    members = list(range(64))
    members[40] = -40
    sink.add_rows("collectives", collective_rows("down", members))
    with pytest.raises(StoreUnavailable):
        sink.flush()
    CountingStore.fail_at = set()
    sink.flush()
    assert [r["rank"] for _, r, _ in rejected] == [-40]
    assert count(sink.store, "collectives", "down") == 63 == count(sink.store, "collectives", "down", final=True)
    sink.store.close()


def test_a_raw_container_with_an_absurd_record_is_refused_by_the_constraints(tmp_path):
    bad: list[tuple[RawMessage, str]] = []
    sink, _ = open_sink(tmp_path / "raw")
    sink._on_bad = lambda m, reason: bad.append((m, reason))
    w = int(time.time() // 5)
    good = samples.rank_window("raw-abs", w, 0, steps=5)
    absurd = [("RankWindow", {**samples.rank_window("raw-abs", w, 1, steps=5), "rank": -5}),
              ("RankWindow", {**samples.rank_window("raw-abs", w, 2, steps=5), "step_time_ns": [-(2**62)] * 5}),
              ("FunctionPattern", {**samples.pattern("raw-abs", w, 3, "f"), "world_size": 0, "rank": 10**9})]
    sink.add_raw("RankWindow", RawMessage(CODEC.encode("RankWindow", good), "t", 0, 1))
    for i, (name, rec) in enumerate(absurd, start=2):
        sink.add_raw(name, RawMessage(CODEC.encode(name, rec), "t", 0, i))
    sink.flush()
    assert sorted(m.offset for m, _ in bad) == [2, 3, 4]
    assert all(reason.startswith("invalid: ") for _, reason in bad), bad
    assert "RankWindow.rank = -5" in dict((m.offset, r) for m, r in bad)[2]
    rows = sink.store.query("SELECT rank, count() FROM iterations WHERE job = 'raw-abs' GROUP BY rank").rows
    assert rows == [(0, 5)]  # the absurd records reached no table, not even through a view
    sink.store.close()


def test_a_store_migrated_before_the_constraints_gets_them(tmp_path, monkeypatch):
    store = Store.open(parse_store_url(f"chdb://{tmp_path / 'old'}", tmp_path))
    try:  # closed even when an assertion fails: chDB holds one path per process, the next test opens another
        monkeypatch.setattr("perftracker_ml.sinks.raw.constraints_sql", lambda name: [])
        old = (MIGRATIONS[0], Migration(2, MIGRATIONS[1].description, statements=migration_statements()))
        monkeypatch.setattr("perftracker_ml.sinks.schema.MIGRATIONS", old)
        assert migrate(store) == [1, 2]
        monkeypatch.undo()
        absurd = {**samples.pattern("mig", int(time.time() // 5), 0, "f"), "rank": -5}
        data = container("FunctionPattern", [RawMessage(CODEC.encode("FunctionPattern", absurd), "t", 0, 0)])
        store.raw_insert(RAW_TABLES["FunctionPattern"], data, "Avro")  # no rules yet: accepted
        assert migrate(store) == [m.version for m in MIGRATIONS[2:]]  # every later one, the rules' included
        with pytest.raises(RowsRejected, match="VIOLATED_CONSTRAINT"):
            store.raw_insert(RAW_TABLES["FunctionPattern"], data, "Avro")
        good = samples.pattern("mig", int(time.time() // 5), 1, "f")
        store.raw_insert(RAW_TABLES["FunctionPattern"], container(
            "FunctionPattern", [RawMessage(CODEC.encode("FunctionPattern", good), "t", 0, 1)]), "Avro")
        assert store.query("SELECT rank FROM function_stats WHERE job = 'mig' ORDER BY rank").rows == [
            (1,), (4294967291,)]  # the view still feeds the table; -5 had wrapped before the rules
    finally:
        store.close()


@pytest.fixture
def shared_sink(tmp_path):
    """One store for all the examples of a property (chDB holds one path per process)."""
    sink, rejected = open_sink(tmp_path / "prop")
    yield sink, rejected
    sink.store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(item=hostile_sink_record())
def test_the_store_and_the_raw_rules_agree_with_validate(shared_sink, item):
    """Whatever passes validation the store takes, through rows or raw Avro; whatever a raw
    table refuses, validation refuses too (one set of rules, in Python and in SQL)."""
    sink, rejected = shared_sink
    name, rec = item
    try:
        name, decoded = DECODER.decode(CODEC.encode(name, rec))
    except SchemaError:
        return
    reason = validate(name, decoded)
    if name in RAW_TABLES:
        data = container(name, [RawMessage(CODEC.encode(name, rec), "t", 0, 0)])
        try:
            sink.store.raw_insert(RAW_TABLES[name], data, "Avro")
            refused = None
        except RowsRejected as exc:
            refused = str(exc)
        assert (refused is None) == (reason is None), (reason, refused)
    if reason is None:
        rejected.clear()
        for table, rows in ROW_BUILDERS[name](decoded):
            sink.write(table, sink._columns[table], rows)
        assert not rejected, rejected


def test_the_service_dead_letters_invalid_records_and_rejected_rows(sink_settings, start_sink, produce,
                                                                  unique, kafka_conf, monkeypatch):
    from confluent_kafka import Consumer

    settings = replace(sink_settings, store=replace(sink_settings.store, raw_ingest=False))
    sink = start_sink(settings)
    job = f"inv-{unique}"
    good = samples.anomaly(job, f"{job}-ok")
    produce(settings, [("Anomaly", {**samples.anomaly(job, f"{job}-bad"), "ranks": [-5]}), ("Anomaly", good)])
    wait_for(lambda: sink.service.stats.dead_lettered == 1 and sink.service.idle()
             and sink.service.stats.rows_written >= 2, 30)
    assert sink.service.store is not None
    ids = sink.service.store.query("SELECT incident_id FROM incidents WHERE job = {j:String}", {"j": job}).rows
    assert ids == [(f"{job}-ok",)]
    # a row the store refuses (validation switched off): dead-lettered with its table, the rest written
    monkeypatch.setattr("perftracker_ml.sinks.service.validate", lambda name, record: None)
    comparison = {**samples.comparison(job, int(time.time() // 5), world=2), "members": [0, -5]}
    produce(settings, [("FunctionComparison", comparison)])
    wait_for(lambda: sink.service.stats.rows_rejected == 1 and sink.service.idle(), 30)
    c = Consumer({**kafka_conf, "group.id": f"dl-{unique}", "auto.offset.reset": "earliest"})
    c.subscribe([f"{settings.kafka.topic_prefix}.deadletter"])
    headers: list[dict] = []
    deadline = time.monotonic() + 30
    while len(headers) < 2 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            headers.append({k: v.decode() for k, v in m.headers()})
    c.close()
    assert headers[0]["reason"].startswith("invalid: Anomaly.ranks[0] = -5")
    assert headers[1]["table"] == "collectives" and "rejected by the store" in headers[1]["reason"]
    assert count(sink.service.store, "collectives", job) == 1
