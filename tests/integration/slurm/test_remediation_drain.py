"""The remediation hook against a real slurmctld (the package's cluster, :mod:`.cluster`).

An incident naming the cluster's node goes through the alert dispatcher to the hook (its own
thread, real ``scontrol`` with a timeout); the node ends up drained with the reason
``perftracker: <cause> <incident id>`` (``sinfo -N -h -o "%N %T %E"``), and the action is
recorded in a chDB store, where `perftracker diagnose` reads it. A second incident within the
hour is refused by the rate limit and leaves the node in service; a node an administrator
drained keeps the administrator's reason. Each test leaves the node in service again.
"""

from __future__ import annotations

import functools
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.sinks.alerts.dispatcher import AlertDispatcher
from perftracker_ml.sinks.alerts.remediation import Action, Outcome, RemediationPolicy
from perftracker_ml.sinks.alerts.remediator import Remediator, store_hooks
from perftracker_ml.sinks.queries import run_query
from perftracker_ml.sinks.schema import migrate
from perftracker_ml.sinks.store import Store, parse_store_url

from .cluster import NODE, Cluster, wait

pytestmark = pytest.mark.integration

POLICY = RemediationPolicy(enabled=True, dry_run=False, causes=frozenset({"gpu_throttle", "slow_gpu"}),
                           confirm_s=1.0, max_per_hour=1, node_cooldown_s=0, max_job_fraction=0.25)


@pytest.fixture
def node(cluster: Cluster) -> Iterator[str]:
    """The cluster's node, in service before and after the test."""
    assert cluster.nodes() == f"{NODE} idle none"
    yield NODE
    cluster.run(cluster.bin["scontrol"], "update", f"NodeName={NODE}", "State=RESUME")
    wait(f"{NODE} back in service", lambda: cluster.nodes() == f"{NODE} idle none", cluster, 30)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(parse_store_url(f"chdb://{tmp_path / 'chdb'}", tmp_path))
    migrate(s)
    yield s
    s.close()


def hook(cluster: Cluster, store: Store, policy: RemediationPolicy = POLICY) -> AlertDispatcher:
    """The dispatcher with the hook, as the sink builds it: the store's history and records,
    real scontrol (with the cluster's SLURM_CONF); a job of 4 hosts."""
    hooks = store_hooks(store)
    rem = Remediator(policy, cluster.bin["scontrol"], 10.0, history=hooks["history"], record=hooks["record"],
                     job_hosts=lambda job: 4, run=functools.partial(subprocess.run, env=cluster.env))
    d = AlertDispatcher([], remediator=rem)
    d.start()
    return d


def incident(incident_id: str, cause: str = "gpu_throttle") -> dict:
    rec = samples.anomaly("train-7", incident_id=incident_id, cause=cause, rank=5)
    rec["hosts"] = [NODE]
    return rec


def decided(d: AlertDispatcher, n: int, timeout_s: float = 30) -> list[Action]:
    rem = d.remediator
    assert isinstance(rem, Remediator)
    deadline = time.monotonic() + timeout_s
    while len(rem.actions) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(rem.actions) == n, rem.actions
    return rem.actions


def test_a_confirmed_gpu_fault_drains_the_node_with_the_incident_as_reason(cluster, node, store):
    d = hook(cluster, store)
    try:
        d.submit(incident("a1b2c3d4e5f60718"))
        assert cluster.nodes() == f"{node} idle none"  # not before it is confirmed (confirm_s)
        (a,) = decided(d, 1)
    finally:
        d.stop()
    shown = cluster.nodes()
    print(f'\nsinfo -N -h -o "%N %T %E" after the drain:\n{shown}')
    assert a.outcome is Outcome.DONE, a
    assert shown == f"{node} drained perftracker: gpu_throttle a1b2c3d4e5f60718"
    show = cluster.run(cluster.bin["scontrol"], "show", "node", "-o", node).stdout
    assert "State=IDLE+DRAIN" in show and "Reason=perftracker: gpu_throttle a1b2c3d4e5f60718" in show
    (row,) = run_query(store, "remediations", {"job": "train-7"}).dicts()
    assert (row["incident_id"], row["node"], row["outcome"], row["action"]) == ("a1b2c3d4e5f60718", node, "done", "drain")
    assert row["command"].endswith(f"update NodeName={node} State=DRAIN 'Reason=perftracker: gpu_throttle a1b2c3d4e5f60718'")


def test_the_rate_limit_refuses_a_second_drain_within_the_hour(cluster, node, store):
    d = hook(cluster, store)
    try:
        d.submit(incident("first0000000001"))
        decided(d, 1)
        cluster.run(cluster.bin["scontrol"], "update", f"NodeName={node}", "State=RESUME")  # an admin resumes it
        wait(f"{node} back in service", lambda: cluster.nodes() == f"{node} idle none", cluster, 30)
        d.submit(incident("second000000002", cause="slow_gpu"))
        first, second = decided(d, 2)
    finally:
        d.stop()
    shown = cluster.nodes()
    print(f'\nsinfo -N -h -o "%N %T %E" after the refused second drain:\n{shown}')
    assert first.outcome is Outcome.DONE
    assert second.outcome is Outcome.REFUSED
    assert second.reason == "rate limit: 1 nodes drained in the last hour (remediation.max_per_hour 1)"
    assert shown == f"{node} idle none"
    rows = run_query(store, "remediations", {"job": "train-7"}).dicts()
    assert sorted((r["incident_id"], r["outcome"]) for r in rows) == [
        ("first0000000001", "done"), ("second000000002", "refused")]
    # the limit holds across a restart: a new hook reads the store's record
    again = hook(cluster, store, replace(POLICY, confirm_s=0))
    try:
        again.submit(incident("third0000000003"))
        (third,) = decided(again, 1)
    finally:
        again.stop()
    assert third.outcome is Outcome.REFUSED and third.reason.startswith("rate limit: 1 nodes drained")


def test_a_node_an_administrator_drained_keeps_its_reason(cluster, node, store):
    cluster.run(cluster.bin["scontrol"], "update", f"NodeName={node}", "State=DRAIN", "Reason=bad DIMM, ticket 42")
    d = hook(cluster, store, replace(POLICY, confirm_s=0))
    try:
        d.submit(incident("c0ffee0000000000"))
        (a,) = decided(d, 1)
    finally:
        d.stop()
    assert a.outcome is Outcome.REFUSED and "already IDLE+DRAIN" in a.reason and "bad DIMM, ticket 42" in a.reason
    assert cluster.nodes() == f"{node} drained bad DIMM, ticket 42"
