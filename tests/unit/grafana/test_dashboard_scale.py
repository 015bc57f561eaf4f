"""The dashboards stay readable at 10,000 ranks: on a real chDB store holding one job of 10,000
ranks, every time-series query comes back as at most k + 2 series (a p50/p99 band and the k
worst ranks), the rank x function tables hold the worst ranks only, the planted culprits are
the ones shown, and the incident annotation and the culprit timeline name the incident.

Rows are the synthetic records the other store tests use (``deploy.workloads.store_records``)
through the sink's own row builders, at two steps per window and three windows, to stay fast
(about 5 s to fill on the 2-core development machine).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.grafana.build import ALL_VALUES
from perftracker_ml.grafana.dashboards import load_dashboards, render_sql
from perftracker_ml.schemas.vocabulary import (
    ANOMALY,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    RANK_WINDOW,
)
from perftracker_ml.sinks.rows import flat_rows
from perftracker_ml.sinks.schema import TABLES, migrate
from perftracker_ml.sinks.store import QueryResult, Store, parse_store_url

WORLD = 10_000
WINDOWS = 3
JOB = "gpt-10k"
SLOW = (17, 4242, 9999)  # slow data loading; 4242 also arrives last at the all-reduce and runs hot
DEFAULT_K = 5


def records(now: datetime) -> Iterator[tuple[str, dict]]:
    first = int(now.timestamp() // 5) - WINDOWS
    for w in range(first, first + WINDOWS):
        for rank in range(WORLD):
            slow = rank in SLOW
            for fn in samples.FUNCTIONS:
                ms = 20.0 + SLOW.index(rank) if slow and "DataLoader" in fn else 10.0
                # world 8 keeps a collective's group_ranks short (no panel reads it)
                pattern = samples.pattern(JOB, w, rank, fn, 8, total_ms=ms, steps=2)
                yield FUNCTION_PATTERN, {**pattern, "world_size": WORLD}
            rw = samples.rank_window(JOB, w, rank, WORLD, steps=2,
                                     step_ms=130.0 + SLOW.index(rank) if slow else 100.0, throttled=rank == 4242)
            yield RANK_WINDOW, rw
        yield FUNCTION_COMPARISON, samples.comparison(JOB, w, WORLD, slow_rank=4242)
    yield ANOMALY, samples.anomaly(JOB, "gpt-10k-inc", rank=4242)
    yield ANOMALY, {**samples.anomaly(JOB, "gpt-10k-advice", rank=17), "kind": "advice"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store.open(parse_store_url(f"chdb://{tmp_path_factory.mktemp('dash10k') / 'chdb'}", Path(".")))
    migrate(s)
    buffers: dict[str, list] = {}
    for name, rec in records(datetime.now(timezone.utc)):
        for table, row in flat_rows(name, rec):
            buffers.setdefault(table, []).append(row)
    for table, rows in buffers.items():
        s.insert(table, TABLES[table].column_names, rows, column_oriented=False)
    yield s
    s.close()


def run(store: Store, sql: str, k: int = DEFAULT_K, every_rank: bool = False) -> QueryResult:
    """The query as Grafana sends it with host and rank at "All" (their custom all values), or
    with ``every_rank``, each of the 10,000 ranks and 1,250 hosts picked one by one."""
    now = datetime.now(timezone.utc)
    variables = {"job": [JOB], "host": sorted({samples.HOST_NAME.format(r // 8) for r in range(WORLD)}),
                 "rank": list(range(WORLD)), "k": [str(k)]}
    return store.query(render_sql(sql, variables, now - timedelta(hours=1), now + timedelta(minutes=1),
                                  all_selected=None if every_rank else ALL_VALUES))


def series(res: QueryResult) -> set[str]:
    """The series Grafana draws from a time-series-format result: the ClickHouse plugin pivots
    long rows on their string columns, so each numeric column makes one series per distinct
    combination of the string columns' values."""
    text = [i for i, c in enumerate(res.columns) if any(isinstance(r[i], str) for r in res.rows)]
    values = [c for i, c in enumerate(res.columns) if c != "time" and i not in text]
    labels = {" ".join(str(r[i]) for i in text) for r in res.rows}
    return {f"{v} {label}".strip() for v in values for label in labels}


def time_series_panels() -> Iterator[tuple[str, dict]]:
    for name, d in load_dashboards().items():
        for p in d["panels"]:
            if any(t.get("format") == 0 and "rawSql" in t for t in p["targets"]):
                yield f"{name}:{p['title']}", p


CASES = list(time_series_panels())


def test_the_store_holds_ten_thousand_ranks(store):
    assert store.query(f"SELECT uniqExact(rank) FROM rank_windows WHERE job = '{JOB}'").rows == [(WORLD,)]
    assert store.query(f"SELECT uniqExact(rank) FROM function_stats WHERE job = '{JOB}'").rows == [(WORLD,)]


@pytest.mark.parametrize(("k", "every_rank"), [(DEFAULT_K, False), (3, False), (DEFAULT_K, True)])
@pytest.mark.parametrize(("where", "panel"), CASES, ids=[c[0] for c in CASES])
def test_every_time_series_query_returns_at_most_k_plus_two_series(store, where, panel, k, every_rank):
    drawn: set[str] = set()
    for t in panel["targets"]:
        res = run(store, t["rawSql"], k, every_rank)
        assert res.rows, f"{where} ({t['refId']}) returned nothing"
        drawn |= {f"{t['refId']}:{s}" for s in series(res)}
    assert 1 <= len(drawn) <= k + 2, (where, sorted(drawn))


def test_step_time_is_a_band_and_the_k_slowest_ranks(store):
    (p,) = [p for w, p in CASES if "Step time" in w]
    band, worst = (run(store, t["rawSql"]) for t in p["targets"])
    assert band.columns == ["time", "p50", "p99"] and all(p50 <= p99 for _, p50, p99 in band.rows)
    names = {r[1] for r in worst.rows}
    assert len(names) == DEFAULT_K and {f"rank {r}" for r in SLOW} <= names


def test_the_rank_by_function_tables_show_the_worst_ranks_first(store):
    panels = {p["id"]: p for p in load_dashboards()["job.json"]["panels"]}
    slowdown = run(store, panels[2]["targets"][0]["rawSql"]).dicts()
    ranks = list(dict.fromkeys(r["rank_name"] for r in slowdown))
    assert len(ranks) == 20 and ranks[:3] == ["rank 9999", "rank 4242", "rank 17"]
    assert max(r["slowdown"] for r in slowdown) == pytest.approx(22 / 10, abs=0.01)
    late = run(store, panels[3]["targets"][0]["rawSql"]).dicts()
    assert len({r["rank_name"] for r in late}) <= 20 and late[0]["rank_name"] == "rank 4242"


def test_the_culprit_timeline_and_the_annotations_name_the_incident(store):
    d = load_dashboards()["job.json"]
    (timeline,) = [p for p in d["panels"] if p["type"] == "state-timeline"]
    res = run(store, timeline["targets"][0]["rawSql"])
    assert {r[1] for r in res.rows} == {"rank 4242"}  # the advice on rank 17 is not a culprit
    mapping = timeline["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {mapping[str(r[2])]["text"] for r in res.rows if r[2] is not None} == {"Slow data loader"}
    for name, dash in load_dashboards().items():
        (anno,) = dash["annotations"]["list"]
        rows = run(store, anno["target"]["rawSql"]).dicts()
        assert len(rows) == 1 and rows[0]["timeEnd"] >= rows[0]["time"], name
        assert "rank 4242" in rows[0]["text"] and rows[0]["tags"].startswith("slow_dataloader,"), name
