"""Raw ingestion (ClickHouse decodes the Avro, materialized views shape the rows) gives the
same rows as the Python path, and a container with a bad record loses only that record."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas import MultiCodec
from perftracker_ml.schemas.settings import StoreSettings
from perftracker_ml.sinks.clickhouse import ClickHouseSink
from perftracker_ml.sinks.raw import RawMessage
from perftracker_ml.sinks.schema import TABLES
from perftracker_ml.sinks.store import Store, parse_store_url

from .test_store import load

pytestmark = pytest.mark.integration

RAW_FED = ["function_stats", "iterations", "rank_windows", "gpu_health"]
CODEC = MultiCodec(["FunctionPattern", "RankWindow"])


def records() -> list[tuple[str, dict]]:
    out = [(n, r) for n, r in samples.job_records("raw-job", world=4, windows=2)
           if n in ("FunctionPattern", "RankWindow")]
    w = int(time.time() // 5)  # recent: older windows are past the TTL and dropped on insert
    odd = samples.rank_window("raw-job", w, 1, steps=3)  # odd count: median is the middle one
    even = samples.rank_window("raw-job", w, 2, steps=4)  # even count: mean of the middle two
    empty = {**samples.rank_window("raw-job", w, 3, steps=0), "steps": 0}
    ended = {**samples.rank_window("raw-job", w, 0, steps=2), "ended_cleanly": True, "restarts": 2,
             "mesh_coords": {"dp": 1, "tp": 0}}  # RankWindow v3, v4
    hostile = {**samples.pattern("raw-job", w, 0, "it's \"odd\" \\ ${x}"), "host": "h'; DROP"}
    return out + [("RankWindow", odd), ("RankWindow", even), ("RankWindow", empty), ("RankWindow", ended),
                  ("FunctionPattern", hostile)]


def dump(store: Store) -> dict[str, list[tuple]]:
    out = {}
    for t in RAW_FED:
        cols = ", ".join(f"`{c}`" for c in TABLES[t].column_names)
        out[t] = store.query(f"SELECT {cols} FROM {t} FINAL ORDER BY {cols}").rows
    return out


def open_store(path: Path) -> ClickHouseSink:
    store = Store.open(parse_store_url(f"chdb://{path}", path))
    sink = ClickHouseSink(store, StoreSettings())
    sink.setup()
    return sink


def test_raw_path_gives_the_same_rows_as_the_python_path(tmp_path: Path):
    recs = records()
    sink = open_store(tmp_path / "python")
    load(sink.store, recs)
    expected = dump(sink.store)
    sink.store.close()

    sink = open_store(tmp_path / "raw")
    for i, (name, rec) in enumerate(recs):
        sink.add_raw(name, RawMessage(CODEC.encode(name, rec), "t", 0, i))
    sink.flush()
    got = dump(sink.store)
    sink.store.close()
    for t in RAW_FED:
        assert got[t] == expected[t], t
    assert len(got["iterations"]) == 2 * 4 * 50 + 3 + 4 + 2
    ended_col = TABLES["rank_windows"].column_names.index("ended_cleanly")
    assert sum(row[ended_col] for row in got["rank_windows"]) == 1
    restarts_col = TABLES["rank_windows"].column_names.index("restarts")
    assert sum(row[restarts_col] for row in got["rank_windows"]) == 2
    mesh_col = TABLES["rank_windows"].column_names.index("mesh_coords")
    assert sorted(dict(row[mesh_col]) for row in got["rank_windows"] if row[mesh_col]) == [{"dp": 1, "tp": 0}]


def test_a_bad_record_in_a_container_is_dead_lettered_alone(tmp_path: Path):
    bad: list[tuple[RawMessage, str]] = []
    sink = open_store(tmp_path / "bad")
    sink._on_bad = lambda m, reason: bad.append((m, reason))
    good = CODEC.encode("RankWindow", samples.rank_window("raw-bad", int(time.time() // 5), 0, steps=5))
    broken = good[:40]  # right header, truncated body
    sink.add_raw("RankWindow", RawMessage(good, "t", 0, 1))
    sink.add_raw("RankWindow", RawMessage(broken, "t", 0, 2))
    sink.flush()
    assert [m.offset for m, _ in bad] == [2] and "undecodable" in bad[0][1]
    n = sink.store.query("SELECT count() FROM iterations WHERE job = 'raw-bad'").rows[0][0]
    sink.store.close()
    assert n == 5
