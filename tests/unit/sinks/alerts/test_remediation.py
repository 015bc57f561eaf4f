"""Remediation's pure decisions: which incident is a candidate, which is refused and why, the
limits (rate, node cooldown, share of a job's hosts) as properties, and the commands."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.errors import ConfigError
from perftracker_ml.schemas.settings import RemediationSettings
from perftracker_ml.sinks.alerts.base import Incident
from perftracker_ml.sinks.alerts.remediation import (
    HOUR_S,
    Action,
    Outcome,
    Past,
    RemediationPolicy,
    action_row,
    candidate,
    kubernetes_cordon,
    limit,
    refusal,
    slurm_drain,
    stale,
)
from perftracker_ml.sinks.schema import TABLES

POLICY = RemediationPolicy(enabled=True, dry_run=False, max_per_hour=2, node_cooldown_s=86400,
                           max_job_fraction=0.25)


def incident(**kw) -> Incident:
    rec = samples.anomaly("j", cause=kw.pop("cause", "slow_gpu"), **{k: kw.pop(k) for k in list(kw)
                                                                   if k in ("status", "rank", "incident_id")})
    rec.update(kw)
    return Incident.from_anomaly(rec)


def test_default_allow_list_is_the_gpu_hardware_causes_and_the_settings_parse():
    policy = RemediationPolicy.from_settings(RemediationSettings())
    assert policy.causes == {Cause.SLOW_GPU.value, Cause.GPU_THROTTLE.value}
    assert not policy.enabled and policy.dry_run and policy.mode == "slurm" and policy.action == "drain"
    custom = RemediationPolicy.from_settings(RemediationSettings(mode="kubernetes", causes=" slow_gpu, slow_link ,"))
    assert custom.causes == {"slow_gpu", "slow_link"} and custom.action == "cordon" and custom.simulated
    with pytest.raises(ConfigError, match="remediation.mode 'lsf'"):
        RemediationPolicy.from_settings(RemediationSettings(mode="lsf"))
    with pytest.raises(ConfigError, match="remediation.causes: slow_gpus not a cause"):
        RemediationPolicy.from_settings(RemediationSettings(causes="slow_gpus"))


def test_candidates_are_open_root_causes_naming_ranks():
    assert candidate(incident(), is_open=True)
    assert not candidate(incident(), is_open=False)  # the dispatcher does not have it open
    assert not candidate(incident(status="RESOLVED"), is_open=True)
    assert not candidate(incident(kind="advice"), is_open=True)  # the job's shape
    assert not candidate(incident(ranks=[], hosts=[]), is_open=True)  # job-wide


@pytest.mark.parametrize(("changes", "said"), [
    ({"cause": "slow_dataloader"}, "cause slow_dataloader is not in remediation.causes (gpu_throttle, slow_gpu)"),
    ({"cause": "host_cpu_contention"}, "cause host_cpu_contention is not in remediation.causes"),
    ({"hosts": [""]}, "no host named"),
    ({"hosts": ["a", "b", "a"]}, "2 hosts named (a, b): not one culprit node"),
    ({"hosts": ["node[1-64]"]}, "host 'node[1-64]' is not a plain node name"),
    ({"hosts": ["n1,n2"]}, "is not a plain node name"),
    ({"hosts": ["n1 State=DOWN"]}, "is not a plain node name"),
])
def test_refusals_say_why(changes, said):
    assert said in refusal(incident(**changes), POLICY)


def test_one_allowed_host_is_accepted_even_named_by_several_ranks():
    assert refusal(incident(cause="gpu_throttle", ranks=[0, 1], hosts=["gpu-17", "gpu-17"]), POLICY) is None


def test_stale_is_a_replay():
    assert stale(1000.0, 1000.0 + 600, POLICY) is None
    assert "a replay" in stale(1000.0, 1000.0 + 601, POLICY)


def test_limits_name_what_stopped_them():
    now = 100_000.0
    assert limit("n1", "j", 8, [], now, POLICY) is None
    assert "node n1 was drained 60 s ago" in limit("n1", "j", 8, [Past(now - 60, "k", "x", "n1", "done")], now, POLICY)
    two = [Past(now - 100, "k", "x", "a", "done"), Past(now - 200, "k", "y", "b", "done")]
    assert "rate limit: 2 nodes drained in the last hour (remediation.max_per_hour 2)" in limit("n1", "j", 8, two, now, POLICY)
    older = [replace(p, at=now - HOUR_S - 1) for p in two]
    assert limit("n1", "j", 8, older, now, POLICY) is None  # out of the rolling hour
    assert "the job's hosts are unknown" in limit("n1", "j", None, [], now, POLICY)
    assert "make 1 of the job's 3 hosts" in limit("n1", "j", 3, [], now, POLICY)  # 0.25 * 3 < 1
    assert "make 3 of the job's 8 hosts (remediation.max_job_fraction 0.25 allows 2)" in limit(
        "n1", "j", 8, [Past(now - 7200, "j", "x", "a", "done"), Past(now - 9000, "j", "y", "b", "done")], now, POLICY)


def test_refusals_and_failures_count_against_no_limit_a_dry_run_only_in_a_dry_run():
    now = 100_000.0
    past = [Past(now - 10, "j", "x", "n1", o) for o in ("refused", "failed", "dry_run")]
    assert limit("n1", "j", 8, past, now, POLICY) is None
    assert "node n1 was drained" in limit("n1", "j", 8, past, now, replace(POLICY, dry_run=True))


# -- the limits as properties: whatever arrives, what is acted on keeps them -------------------

events = st.lists(st.tuples(st.floats(0, 5 * HOUR_S), st.sampled_from(["a", "b", "c", "d", "e", "f"]),
                            st.sampled_from(["j1", "j2"])), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events, st.integers(1, 4), st.floats(0, 3 * HOUR_S), st.sampled_from([0.25, 0.5, 1.0]),
       st.integers(1, 8), st.booleans())
def test_what_is_acted_on_never_breaks_a_limit(arrivals, per_hour, cooldown, fraction, hosts, dry_run):
    policy = RemediationPolicy(True, "slurm", dry_run, POLICY.causes, 0, 600, per_hour, cooldown, fraction)
    history: list[Past] = []
    for n, (at, node, job) in enumerate(sorted(arrivals)):
        if limit(node, job, hosts, history, at, policy) is None:
            history.append(Past(at, job, f"i{n}", node, "dry_run" if dry_run else "done"))
    for p in history:
        window = [q for q in history if p.at <= q.at < p.at + HOUR_S]
        assert len(window) <= per_hour
        assert not [q for q in history if q is not p and q.node == p.node and 0 <= q.at - p.at < cooldown]
    for job in ("j1", "j2"):
        assert len({p.node for p in history if p.job == job}) <= fraction * hosts + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, HOUR_S), st.sampled_from(["a", "b"])), max_size=20))
def test_the_first_drain_of_a_fresh_node_in_a_quiet_hour_is_always_allowed(earlier):
    now = 10 * HOUR_S
    history = [Past(at, "old", "x", node, "done") for at, node in earlier]  # long ago
    assert limit("fresh", "j", 4, history, now, replace(POLICY, node_cooldown_s=3600)) is None


# -- the commands ------------------------------------------------------------------------

def test_slurm_drain_is_one_node_with_the_cause_and_incident_in_its_reason():
    assert slurm_drain("/usr/bin/scontrol", "gpu-17", "slow_gpu", "0123abcd") == [
        "/usr/bin/scontrol", "update", "NodeName=gpu-17", "State=DRAIN", "Reason=perftracker: slow_gpu 0123abcd"]


def test_kubernetes_cordon_is_the_command_and_the_node_patch_it_sends():
    argv, patch = kubernetes_cordon("gke-pool-1-abc")
    assert argv == ["kubectl", "cordon", "gke-pool-1-abc"]
    assert patch == {"spec": {"unschedulable": True}}
    assert json.loads(json.dumps(patch)) == patch  # what the API server takes as a merge patch


def test_an_action_is_a_row_of_the_remediations_table():
    a = Action(1700000000.123, "j", "inc", "slow_gpu", "n1", "slurm", "drain", Outcome.DONE, "was IDLE", "scontrol ...")
    row = action_row(a)
    assert len(row) == len(TABLES["remediations"].column_names)
    assert dict(zip(TABLES["remediations"].column_names, row, strict=True))["at"] == 1700000000123
    assert a.describe() == "remediation done: drain n1 for slow_gpu incident inc of job j: was IDLE"
