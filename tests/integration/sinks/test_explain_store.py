"""`perftracker diagnose --job J --explain RANK` on incidents stored in chDB: the decision trace
kept in each incident's evidence says why a rank was or was not named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from perftracker_ml.deploy.cli import main
from perftracker_ml.schemas.recording import Recording
from perftracker_ml.schemas.settings import Settings
from perftracker_ml.sinks.client import incident_view, store_target
from perftracker_ml.sinks.explain import explain_rank
from perftracker_ml.sinks.queries import run_query
from perftracker_ml.sinks.schema import migrate
from perftracker_ml.sinks.store import Store
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.replay import replay

from benchmarks.corpus import CORPUS_DIR

from .test_store import load

pytestmark = pytest.mark.integration


def stored_host_copies(data_dir: Path) -> str:
    """The data dir's chDB store holding the incidents of a replay of the host-copies recording
    (rank 1 late into its pair group; rank 0, held up there, late elsewhere); the job id."""
    res = replay(Recording(next(CORPUS_DIR.rglob("host-copies.ptrec"))).messages(), DetectionPolicy())
    job = res.anomalies[0]["job"]
    store = Store.open(store_target(Settings(data_dir=data_dir)))
    try:
        migrate(store)
        load(store, [("Anomaly", a) for a in res.anomalies])
    finally:
        store.close()
    return job


def test_explain_reads_the_decisions_stored_with_the_incident(tmp_path, monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith("PERFTRACKER_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    job = stored_host_copies(data)
    store = Store.open(store_target(Settings(data_dir=data)))
    try:
        rows = [incident_view(r) for r in run_query(store, "incidents", {"job": job, "include_resolved": 1}).dicts()]
    finally:
        store.close()
    assert [r["ranks"] for r in rows] == [[1]]
    assert "rule stragglers cleared it" in explain_rank(job, 0, rows)

    for rank, said in ((0, "was not named:\n  - rule stragglers flagged it"), (1, "was named in 1 incident(s):"),
                       (3, "was not named: no outlier and no late arrival against its peers")):
        try:
            main(["--data-dir", str(data), "diagnose", "--job", job, "--explain", str(rank)])
        except SystemExit as exc:
            assert not exc.code, capsys.readouterr().err
        out = capsys.readouterr().out
        assert out.startswith(f"rank {rank} of job {job} {said}"), out
