"""The sink service end to end: tansu -> sink -> chDB -> diagnose/query."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest
from confluent_kafka import Consumer
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import bundle
from perftracker_ml.schemas.settings import Secret
from perftracker_ml.schemas.stackfile import StackState
from perftracker_ml.sinks import client
from perftracker_ml.sinks.errors import StoreUnavailable
from perftracker_ml.sinks.rows import flat_rows
from perftracker_ml.sinks.schema import TABLES
from perftracker_ml.sinks.service import SinkService
from perftracker_ml.sinks.store import Store

from .conftest import CODEC_NAMES, wait_for
from .receiver import Receiver

pytestmark = pytest.mark.integration


def read_one(conf, topic, group):
    c = Consumer({**conf, "group.id": f"dl-{group}", "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000})
    c.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                return m
        raise AssertionError(f"nothing on {topic}")
    finally:
        c.close()


@pytest.mark.parametrize("raw_ingest", [True, False], ids=["raw-avro", "python-decode"])
def test_records_reach_the_store_and_diagnose(sink_settings, start_sink, produce, unique, kafka_conf,
                                              raw_ingest):
    sink_settings = replace(sink_settings, store=replace(sink_settings.store, raw_ingest=raw_ingest))
    job = f"job-{unique}"
    sink = start_sink(sink_settings)
    ready = json.loads(sink.ready.read_text())
    assert ready["query_url"].startswith("http://127.0.0.1:")
    records = list(samples.job_records(job, world=4, windows=2))
    produce(sink_settings, records, raw=[b"not avro at all"])
    # the CLI finds the sink through stack.json and asks its query API
    StackState(bootstrap="", broker_pid=0, sink_pid=__import__("os").getpid(),
               query_url=ready["query_url"]).save(sink_settings.data_dir)
    found = wait_for(lambda: client.diagnose(sink_settings, job), 30)
    assert found[0]["ranks"] == [3] and found[0]["cause"] == "slow_dataloader"
    assert found[0]["evidence"]["late_arrivals"] == 45
    for key in ("kind", "cause", "ranks", "hosts", "function", "score", "impact_ms_per_step",
                "first_seen", "last_seen", "evidence", "summary", "status", "incident_id"):
        assert key in found[0]
    wait_for(lambda: sink.service.stats.dead_lettered == 1, 10)
    dead = read_one(kafka_conf, f"{sink_settings.kafka.topic_prefix}.deadletter", unique)
    headers = dict(dead.headers())
    assert dead.value() == b"not avro at all" and headers["reason"].startswith(b"undecodable")
    assert headers["source_topic"] == f"{sink_settings.kafka.topic_prefix}.findings".encode()
    steps = wait_for(lambda: client.query(sink_settings, "step_times", job=job), 10)
    assert {r["rank"] for r in steps} == {0, 1, 2, 3}
    slow = client.query(sink_settings, "rank_function_slowdown", job=job)
    worst = max(slow, key=lambda r: r["slowdown"])
    assert worst["rank"] == 3 and "DataLoader" in worst["function"]


@pytest.mark.parametrize("raw_ingest", [True, False], ids=["raw-avro", "python-decode"])
def test_bundled_records_reach_the_store_as_plain_messages_would(sink_settings, start_sink, produce, unique,
                                                                  kafka_conf, raw_ingest):
    """Records in RecordBundles (as the workers send patterns and findings) give every row the
    same records sent one per message give; a bad item is dead-lettered alone, a corrupt bundle whole."""
    sink_settings = replace(sink_settings, store=replace(sink_settings.store, raw_ingest=raw_ingest))
    job = f"bundled-{unique}"
    sink = start_sink(sink_settings)
    records = [(n, r) for n, r in samples.job_records(job, world=4, windows=2) if n in CODEC_NAMES]
    expected = rows_expected(records)
    corrupt = bundle.pack([b"x" * 40, b"y"])[:-20]
    produce(sink_settings, records, raw=[bundle.pack([b"not avro, in a bundle", b"\xc3\x01 neither"]), corrupt],
            bundled=True)
    assert sink.ready.exists()
    store = wait_for(lambda: sink.service.store if sink.service.idle() and sink.service.stats.dead_lettered == 3
                     else None, 30)
    wait_for(lambda: rows_stored(store, job) == expected or None, 30)
    assert sum(expected.values()) > len(records)
    dead = read_all(kafka_conf, f"{sink_settings.kafka.topic_prefix}.deadletter", unique, 3)
    assert sorted(m.value() for m in dead) == sorted([b"not avro, in a bundle", b"\xc3\x01 neither", corrupt])


def test_record_sets_reach_the_store_as_their_records_would(sink_settings, start_sink, produce, unique,
                                                                      kafka_conf):
    """RankWindows and FunctionPatterns sent in sets (schemas/record_sets.py, as the workers send
    them) give the rows they give sent one per message; one breaking its rules is dead-lettered
    alone, naming its rank."""
    job = f"sets-{unique}"
    sink = start_sink(sink_settings)
    records = [(n, r) for n, r in samples.job_records(job, world=4, windows=2) if n in CODEC_NAMES]
    last = max(r["window_id"] for n, r in records if n == "RankWindow")
    bad = [(n, {**r, "restarts": -1} if n == "RankWindow" and (r["rank"], r["window_id"]) == (3, last) else r)
           for n, r in records]
    assert bad != records
    expected = rows_expected([(n, r) for n, r in bad if r.get("restarts") != -1])  # all but the dead-lettered one
    produce(sink_settings, bad, bundled=True, sets=True)
    store = wait_for(lambda: sink.service.store if sink.service.idle() and sink.service.stats.dead_lettered == 1
                     else None, 30)
    wait_for(lambda: rows_stored(store, job) == expected or None, 30)
    assert expected["rank_windows"] > 4
    (dead,) = read_all(kafka_conf, f"{sink_settings.kafka.topic_prefix}.deadletter", unique, 1)
    assert b"RankWindowSet rank 3" in dict(dead.headers())["reason"]


def rows_expected(records: list[tuple[str, dict]]) -> dict[str, int]:
    """Rows per table the sink's row builders make of ``records``."""
    expected = {t: 0 for t in TABLES}
    for n, r in records:
        for table, _row in flat_rows(n, r):
            expected[table] += 1
    return expected


def rows_stored(store: Store, job: str) -> dict[str, int]:
    """Rows per table the store holds of ``job``."""
    return {t: store.query(f"SELECT count() FROM {t} FINAL WHERE job = {{j:String}}", {"j": job}).rows[0][0]
            for t in TABLES}


def read_all(conf, topic, group, n):
    c = Consumer({**conf, "group.id": f"dl-{group}", "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000})
    c.subscribe([topic])
    got = []
    try:
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m)
        return got
    finally:
        c.close()


class FlakyStore(Store):
    """A real chDB store whose inserts fail while ``down`` is set (no server to stop here)."""

    down = threading.Event()

    def insert(self, table, columns, data, column_oriented=True):
        if self.down.is_set():
            raise StoreUnavailable(f"insert into {table} failed: connection refused")
        super().insert(table, columns, data, column_oriented)

    def raw_insert(self, table, data, fmt):
        if self.down.is_set():
            raise StoreUnavailable(f"insert into {table} failed: connection refused")
        return super().raw_insert(table, data, fmt)

    def ping(self):
        return not self.down.is_set() and super().ping()


def test_store_outage_then_back_loses_and_duplicates_nothing(sink_settings, start_sink, produce, unique):
    job = f"out-{unique}"
    service = SinkService(sink_settings, open_store=lambda t: FlakyStore.open(t))
    sink = start_sink(sink_settings, service)
    FlakyStore.down.set()
    records = [(n, r) for n, r in samples.job_records(job, world=4, windows=3) if n in CODEC_NAMES]
    expected = sum(len(list(flat_rows(n, r))) for n, r in records)
    produce(sink_settings, records)
    wait_for(lambda: service.stats.flush_failures >= 2, 20)
    assert service.stats.rows_written == 0 and service.stats.commits == 0
    FlakyStore.down.clear()
    wait_for(lambda: service.stats.consumed == len(records) and service.idle(), 20)
    sink.stop()
    # a second sink in the same group finds everything committed: nothing replayed
    again = SinkService(sink_settings)
    start_sink(sink_settings, again)
    time.sleep(12)  # > session timeout: the group has surely assigned the partitions
    assert again.stats.consumed == 0
    assert again.store is not None
    for table in TABLES:
        raw = again.store.query(f"SELECT count() FROM {table} WHERE job = {{j:String}}", {"j": job}).rows
        final = again.store.query(f"SELECT count() FROM {table} FINAL WHERE job = {{j:String}}",
                                  {"j": job}).rows
        assert raw == final, table
    total = sum(again.store.query(f"SELECT count() FROM {t} WHERE job = {{j:String}}", {"j": job}).rows[0][0]
                for t in TABLES)
    assert total == expected


def test_anomaly_on_the_topic_reaches_the_webhook(sink_settings, start_sink, produce, unique):
    with Receiver() as rx:
        settings = replace(sink_settings, alerts=replace(
            sink_settings.alerts, webhook_url=rx.url + "/hook", webhook_secret=Secret("k")))
        start_sink(settings)
        produce(settings, [("Anomaly", samples.anomaly(f"alert-{unique}"))])
        wait_for(lambda: rx.received, 30)
        produce(settings, [("Anomaly", samples.anomaly(f"alert-{unique}", status="RESOLVED"))])
        wait_for(lambda: len(rx.received) == 2, 30)
    assert [r.json()["event"] for r in rx.received] == ["open", "resolve"]
