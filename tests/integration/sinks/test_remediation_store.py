"""The remediation record on chDB: migration 9, the hook's store hooks (job hosts, every sink's
history, recording), and what `perftracker diagnose` and the report show of it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from perftracker_ml.deploy.output import format_diagnosis
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.settings import RemediationSettings
from perftracker_ml.schemas.stackfile import StackState
from perftracker_ml.sinks import client
from perftracker_ml.sinks.alerts.remediation import Action, Outcome
from perftracker_ml.sinks.alerts.remediator import store_hooks
from perftracker_ml.sinks.client import incident_view, with_remediations
from perftracker_ml.sinks.queries import run_query
from perftracker_ml.sinks.report.data import normalize_incident
from perftracker_ml.sinks.report.html import render_card
from perftracker_ml.sinks.schema import MIGRATIONS_TABLE, migrate
from perftracker_ml.sinks.store import Store, parse_store_url

from .conftest import wait_for
from .test_store import load

pytestmark = pytest.mark.integration


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(parse_store_url(f"chdb://{tmp_path / 'chdb'}", tmp_path))
    yield s
    s.close()


def test_migration_9_adds_the_table_to_a_store_at_8(store):
    migrate(store)
    store.command("DROP TABLE remediations")
    store.command(f"ALTER TABLE {MIGRATIONS_TABLE} DELETE WHERE version = 9 SETTINGS mutations_sync = 2")
    assert migrate(store) == [9]
    assert run_query(store, "remediations", {"job": "j"}).rows == []


def test_recorded_actions_are_the_history_and_show_on_the_incident(store):
    migrate(store)
    hooks = store_hooks(store)
    load(store, samples.job_records("j", world=16, windows=2, slow_rank=3))  # hosts node-000, node-001; incident j-inc
    assert hooks["job_hosts"]("j") == 2 and hooks["job_hosts"]("nobody") is None
    load(store, [("Anomaly", samples.anomaly("j", incident_id="other"))])
    done = Action(1_900_000_000.5, "j", "j-inc", "slow_gpu", "node-000", "slurm", "drain", Outcome.DONE,
                  "node node-000 was IDLE", "scontrol update NodeName=node-000 State=DRAIN 'Reason=perftracker: "
                  "slow_gpu j-inc'")
    refused = Action(1_900_000_100.0, "j", "j-inc", "slow_gpu", "node-000", "slurm", "drain", Outcome.REFUSED,
                     "rate limit: 2 nodes drained in the last hour (remediation.max_per_hour 2)")
    for a in (done, refused, done):  # a retried record collapses
        hooks["record"](a)
    past = hooks["history"](1_900_000_000.0)
    assert sorted((p.at, p.outcome) for p in past) == [(1_900_000_000.5, "done"), (1_900_000_100.0, "refused")]
    assert hooks["history"](1_900_000_050.0)[0].outcome == "refused"

    actions = [dict(r, at=str(r["at"])) for r in run_query(store, "remediations", {"job": "j"}).dicts()]
    rows = with_remediations([incident_view(r) for r in run_query(store, "incidents", {"job": "j"}).dicts()],
                             actions)
    (row,) = [r for r in rows if r["incident_id"] == "j-inc"]
    assert [r for r in rows if r["incident_id"] == "other" and "remediation" not in r]
    assert [(a["outcome"], a["node"]) for a in row["remediation"]] == [("done", "node-000"), ("refused", "node-000")]
    text = format_diagnosis("j", [row])
    assert ("remediation: drain node-000: done (node node-000 was IDLE): scontrol update NodeName=node-000 "
            "State=DRAIN 'Reason=perftracker: slow_gpu j-inc'") in text
    assert "remediation: drain node-000 refused (rate limit: 2 nodes drained in the last hour" in text
    card = render_card(normalize_incident(row))
    assert '<p class="remediation">remediation: drain node-000: done' in card


def test_the_sink_runs_the_hook_and_diagnose_shows_what_it_did(sink_settings, start_sink, produce, unique):
    """The sink with remediation on (Kubernetes: the cordon recorded, never run): an incident
    consumed from Kafka is decided after confirm_s and `diagnose` (through the sink's query
    API) shows the command and the Node patch on the incident."""
    settings = replace(sink_settings, remediation=RemediationSettings(
        enabled=True, mode="kubernetes", causes="slow_dataloader", confirm_s=2.0, max_job_fraction=0.5))
    job = f"rem-{unique}"
    sink = start_sink(settings)
    StackState(bootstrap="", broker_pid=0, sink_pid=os.getpid(),
               query_url=json.loads(sink.ready.read_text())["query_url"]).save(settings.data_dir)
    records = list(samples.job_records(job, world=16, windows=2))  # 2 hosts; rank 3 on node-000
    produce(settings, [r for r in records if r[0] != "Anomaly"])
    # the job's RankWindows stored first: the limit counts the job's hosts from them, and the incident,
    # on a topic of its own, could otherwise be confirmed (confirm_s 2 s here, 300 s by default) before
    # a loaded machine has stored both hosts' rows
    hosts = store_hooks(sink.service.store)["job_hosts"]
    wait_for(lambda: hosts(job) == 2, 60)
    produce(settings, [r for r in records if r[0] == "Anomaly"])
    (row,) = wait_for(lambda: [r for r in client.diagnose(settings, job) if r.get("remediation")], 60)
    (a,) = row["remediation"]
    assert (a["outcome"], a["action"], a["node"], a["mode"]) == ("dry_run", "cordon", "node-000", "kubernetes")
    assert a["command"] == "kubectl cordon node-000" and json.loads(a["patch"]) == {"spec": {"unschedulable": True}}
    assert sink.service.stats_dict()["alerts"]["remediation"]["dry_run"] == 1
