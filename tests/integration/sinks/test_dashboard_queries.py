"""Every panel and variable query of every dashboard runs on chDB and returns the columns it shows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.grafana.dashboards import (
    load_dashboards,
    load_provisioning,
    render_sql,
)
from perftracker_ml.sinks.schema import migrate
from perftracker_ml.sinks.store import Store, parse_store_url

from .test_store import load

pytestmark = pytest.mark.integration

JOBS = ["llama-70b-pretrain", "it's \"quoted\" ${job}"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path = tmp_path_factory.mktemp("dash") / "chdb"
    store = Store.open(parse_store_url(f"chdb://{path}", Path(".")))
    migrate(store)
    for job in JOBS:
        load(store, samples.job_records(job, world=16, windows=6, slow_rank=5))
    yield store
    store.close()


def referenced_columns(panel: dict) -> set[str]:
    cols = {o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
            if o["matcher"]["id"] == "byName"}
    for t in panel.get("transformations", []):
        opts = t["options"]
        cols |= {opts[k] for k in ("rowField", "columnField", "valueField") if k in opts}
    if panel["type"] in ("timeseries", "state-timeline"):
        cols.add("time")
    return cols


def cases() -> Iterator[tuple[str, list[str], dict]]:
    """(where, the SQL of each of its queries, the panel) for every ClickHouse panel, query
    variable and annotation (the health view's panels are PromQL)."""
    for name, d in load_dashboards().items():
        for panel in d["panels"]:
            sqls = [t["rawSql"] for t in panel["targets"] if "rawSql" in t]
            if sqls:
                yield f"{name}:{panel['title']}", sqls, panel
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                yield f"{name}:var {v['name']}", [v["query"]], {}
        for a in d["annotations"]["list"]:
            yield f"{name}:annotation {a['name']}", [a["target"]["rawSql"]], {}


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize(("where", "sqls", "panel"), list(cases()), ids=[c[0] for c in cases()])
def test_panel_query_runs_and_returns_its_columns(loaded, job, where, sqls, panel):
    """Each query returns rows on realistic data; together a panel's queries return every
    column the panel names (a band query returns p50/p99, its top-k query the ranks)."""
    now = datetime.now(timezone.utc)
    variables = {"job": [job], "host": ["node-000", "node-001"], "rank": list(range(16)), "k": ["5"]}
    columns: set[str] = set()
    for sql in sqls:
        rendered = render_sql(sql, variables, now - timedelta(hours=1), now + timedelta(minutes=1))
        res = loaded.query(rendered)
        assert res.rows, f"{where} returned no rows on realistic data"
        columns |= set(res.columns)
    if panel:
        missing = referenced_columns(panel) - columns
        assert not missing, f"{where} shows columns its queries do not return: {missing}"


def test_alert_rule_queries_run(loaded):
    now = datetime.now(timezone.utc)
    for g in load_provisioning()["alerting/rules.yaml"]["groups"]:
        for r in g["rules"]:
            sql = r["data"][0]["model"]["rawSql"].replace("$$", "$")
            res = loaded.query(render_sql(sql, {}, now - timedelta(minutes=15), now))
            assert "job" in res.columns and len(res.columns) == 2, r["uid"]


def test_the_slow_rank_stands_out_in_the_matrix_panels(loaded):
    d = load_dashboards()["job.json"]
    panel = next(p for p in d["panels"] if "late arrivals" in p["title"].lower())
    now = datetime.now(timezone.utc)
    sql = render_sql(panel["targets"][0]["rawSql"], {"job": [JOBS[0]], "host": ["node-000", "node-001"],
                                                     "rank": list(range(16)), "k": ["5"]},
                     now - timedelta(hours=1), now)
    rows = loaded.query(sql).dicts()
    worst = max(rows, key=lambda r: r["late_arrivals"])
    assert worst["rank_name"] == "rank 5"


def test_job_silent_rule_fires_only_for_a_job_that_stopped_without_a_clean_exit(loaded):
    """Two jobs went silent 10 minutes ago: the one whose ranks all sent their final batch
    (last RankWindow ended_cleanly) is done, the one with a rank that vanished is silent."""
    rule = next(r for g in load_provisioning()["alerting/rules.yaml"]["groups"] for r in g["rules"]
                if r["uid"] == "pt-job-silent")
    now = datetime.now(timezone.utc)
    last = int((now - timedelta(minutes=10)).timestamp()) // 5  # a window 10 minutes ago
    records = []
    for job, vanished in (("finished-job", None), ("died-job", 1)):
        for rank in range(4):
            for wid in range(last - 3, last + 1):
                rw = samples.rank_window(job, wid, rank, world=4)
                rw["ended_cleanly"] = wid == last and rank != vanished
                records.append(("RankWindow", rw))
    load(loaded, records)
    sql = rule["data"][0]["model"]["rawSql"].replace("$$", "$")
    res = {r["job"]: r["silent_s"] for r in loaded.query(render_sql(sql, {}, now - timedelta(minutes=15), now)).dicts()}
    assert "finished-job" not in res and res["died-job"] >= 300, res
