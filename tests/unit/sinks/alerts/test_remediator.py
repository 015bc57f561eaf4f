"""The remediation hook with a fake scontrol: confirmation through the dispatcher's lifecycle,
what it runs, what it records, and that nothing it meets raises into the sink."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace

from perftracker_ml.deploy.workloads import store_records as samples
from perftracker_ml.schemas.diagnosis import remediation_text
from perftracker_ml.sinks.alerts.dispatcher import AlertDispatcher
from perftracker_ml.sinks.alerts.remediation import Action, Outcome, Past, RemediationPolicy
from perftracker_ml.sinks.alerts.remediator import Remediator

POLICY = RemediationPolicy(enabled=True, dry_run=False, confirm_s=60, max_per_hour=2)


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Scontrol:
    """Answers ``show node`` with ``state`` and records every call."""

    def __init__(self, state: str = "IDLE", fail: str = "", raises: Exception | None = None):
        self.calls: list[list[str]] = []
        self.state, self.fail, self.raises = state, fail, raises

    def __call__(self, argv, **kw):
        assert kw["timeout"] > 0 and kw["capture_output"]
        self.calls.append(list(argv))
        if self.raises is not None:
            raise self.raises
        if argv[1] == "show":
            return subprocess.CompletedProcess(argv, 0, f"NodeName={argv[-1]} State={self.state} Reason=admin says no "
                                                        "[root@2025] Comment=(null)\n", "")
        if self.fail:
            return subprocess.CompletedProcess(argv, 1, "", f"scontrol: error: {self.fail}\n")
        return subprocess.CompletedProcess(argv, 0, "", "")


def anomaly(status="OPEN", incident_id="inc-1", rank=3, cause="slow_gpu", at=None, **kw):
    rec = samples.anomaly("j", incident_id=incident_id, status=status, rank=rank, cause=cause, last_seen_s=at)
    rec.update(kw)
    return rec


def hook(clock: Clock, run=None, policy=POLICY, hosts=8, **kw) -> tuple[AlertDispatcher, Remediator, list[Action]]:
    recorded: list[Action] = []
    rem = Remediator(policy, "scontrol", 5.0, job_hosts=lambda job: hosts, record=recorded.append,
                     run=run or Scontrol(), clock=clock, **kw)
    return AlertDispatcher([], remediator=rem), rem, recorded


def test_a_confirmed_host_fault_drains_its_node_once():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, recorded = hook(clock, sc)
    d.submit(anomaly(at=clock.t))
    assert rem.process() == [] and sc.calls == []  # waiting to be confirmed
    clock.t += 30
    d.submit(anomaly("UPDATED", at=clock.t, impact_ms_per_step=30.0))
    assert rem.process() == []
    clock.t += 31
    (a,) = rem.process()
    assert (a.outcome, a.node, a.action, a.cause) == (Outcome.DONE, "node-000", "drain", "slow_gpu")
    assert sc.calls == [["scontrol", "show", "node", "-o", "node-000"],
                        ["scontrol", "update", "NodeName=node-000", "State=DRAIN", "Reason=perftracker: slow_gpu inc-1"]]
    assert a.command == "scontrol update NodeName=node-000 State=DRAIN 'Reason=perftracker: slow_gpu inc-1'"
    assert recorded == [a]
    clock.t += 100
    d.submit(anomaly("UPDATED", at=clock.t, impact_ms_per_step=60.0))
    assert rem.process() == [] and len(sc.calls) == 2  # decided once
    assert remediation_text({**a.__dict__, "outcome": "done"}) == (
        "remediation: drain node-000: done (node node-000 was IDLE): "
        "scontrol update NodeName=node-000 State=DRAIN 'Reason=perftracker: slow_gpu inc-1'")


def test_resolved_before_confirmation_is_never_acted_on():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, recorded = hook(clock, sc)
    d.submit(anomaly(at=clock.t))
    rem.process()
    clock.t += 20
    d.submit(anomaly("RESOLVED", at=clock.t))
    clock.t += 100
    assert rem.process() == [] and sc.calls == [] and recorded == []


def test_an_incident_below_the_paging_threshold_is_not_open_so_not_acted_on():
    clock = Clock(time.time())
    d, rem, recorded = hook(clock)
    d.policy = replace(d.policy, min_impact_ms_per_step=100.0)
    d.submit(anomaly(at=clock.t))
    clock.t += 100
    assert rem.process() == [] and recorded == []


def test_not_allowed_causes_and_replays_are_refused_at_once_and_recorded():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, recorded = hook(clock, sc)
    d.submit(anomaly(cause="slow_dataloader", at=clock.t))
    d.submit(anomaly(incident_id="old", at=clock.t - 3600))
    d.submit(anomaly(incident_id="advice", kind="advice", at=clock.t))  # never even a candidate
    d.submit(anomaly(incident_id="wide", ranks=[], hosts=[], cause="regression", at=clock.t))
    refused = rem.process()
    assert [(a.incident_id, a.outcome) for a in refused] == [("inc-1", Outcome.REFUSED), ("old", Outcome.REFUSED)]
    assert "not in remediation.causes" in refused[0].reason and "a replay" in refused[1].reason
    assert recorded == refused and sc.calls == []


def test_the_rate_limit_refuses_a_second_drain_and_says_so():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, recorded = hook(clock, sc, policy=replace(POLICY, max_per_hour=1, confirm_s=0))
    d.submit(anomaly(incident_id="a", rank=3, at=clock.t))
    d.submit(anomaly(incident_id="b", rank=11, at=clock.t))  # another host: node-001
    first, second = rem.process()
    assert first.outcome is Outcome.DONE and second.outcome is Outcome.REFUSED
    assert second.reason.startswith("rate limit: 1 nodes drained in the last hour")
    assert len([c for c in sc.calls if c[1] == "update"]) == 1


def test_a_node_already_drained_is_left_with_its_reason():
    clock, sc = Clock(time.time()), Scontrol(state="IDLE+DRAIN")
    d, rem, _ = hook(clock, sc, policy=replace(POLICY, confirm_s=0))
    d.submit(anomaly(at=clock.t))
    (a,) = rem.process()
    assert a.outcome is Outcome.REFUSED and "already IDLE+DRAIN (Reason=admin says no [root@2025])" in a.reason
    assert [c[1] for c in sc.calls] == ["show"]


def test_failures_and_timeouts_are_recorded_never_raised():
    for run, said in ((Scontrol(fail="Invalid node name specified"), "exit status 1: scontrol: error: Invalid node"),
                      (Scontrol(raises=subprocess.TimeoutExpired("scontrol", 5)), "timed out after 5 s"),
                      (Scontrol(raises=FileNotFoundError("no scontrol")), "could not run scontrol")):
        clock = Clock(time.time())
        d, rem, recorded = hook(clock, run, policy=replace(POLICY, confirm_s=0))
        d.submit(anomaly(at=clock.t))
        (a,) = rem.process()
        assert a.outcome is Outcome.FAILED and said in a.reason, a.reason
        assert recorded == [a]


def test_a_broken_store_neither_raises_nor_loses_the_record():
    clock, attempts, stored = Clock(time.time()), [], []

    def record(a: Action) -> None:
        attempts.append(a)
        if len(attempts) == 1:
            raise OSError("store away")
        stored.append(a)

    def history(since: float) -> list[Past]:
        raise OSError("store away")

    rem = Remediator(replace(POLICY, confirm_s=0), job_hosts=lambda job: 1 / 0, history=history, record=record,
                     run=Scontrol(), clock=clock)
    d = AlertDispatcher([], remediator=rem)
    d.submit(anomaly(at=clock.t))
    (a,) = rem.process()
    assert a.outcome is Outcome.REFUSED and "the job's hosts are unknown" in a.reason  # job_hosts raised
    assert stored == []
    rem.process()
    assert stored == [a]


def test_an_incident_the_store_has_an_action_for_is_not_decided_again():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, recorded = hook(clock, sc, policy=replace(POLICY, confirm_s=0),
                            history=lambda since: [Past(clock.t - 5000, "j", "inc-1", "node-000", "done")])
    d.submit(anomaly(at=clock.t))
    assert rem.process() == [] and sc.calls == [] and recorded == []


def test_dry_run_and_kubernetes_run_nothing_and_record_the_command():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, _ = hook(clock, sc, policy=replace(POLICY, confirm_s=0, dry_run=True))
    d.submit(anomaly(at=clock.t))
    (a,) = rem.process()
    assert a.outcome is Outcome.DRY_RUN and a.command.startswith("scontrol update NodeName=node-000 State=DRAIN")
    clock.t += 1
    d.submit(anomaly(incident_id="other", rank=3, at=clock.t))
    (again,) = rem.process()  # the dry run counts against the limits as the real drain would
    assert again.outcome is Outcome.REFUSED and "node node-000 was drained" in again.reason
    d, rem, _ = hook(clock, sc, policy=replace(POLICY, confirm_s=0, mode="kubernetes", dry_run=False))
    d.submit(anomaly(at=clock.t))
    (k,) = rem.process()
    assert (k.outcome, k.action, k.command) == (Outcome.DRY_RUN, "cordon", "kubectl cordon node-000")
    assert json.loads(k.patch) == {"spec": {"unschedulable": True}}
    assert sc.calls == []


def test_revoked_partitions_hand_their_waiting_incidents_over():
    clock, sc = Clock(time.time()), Scontrol()
    d, rem, _ = hook(clock, sc)
    d.submit(anomaly(at=clock.t), source=("pt.anomalies", 1))
    rem.process()
    d.release([("pt.anomalies", 1)])
    clock.t += 100
    assert rem.process() == [] and sc.calls == []


def test_the_thread_acts_and_stops():
    sc = Scontrol()
    d, rem, recorded = hook(Clock(time.time()), sc, policy=replace(POLICY, confirm_s=0))
    rem._clock = time.time
    d.start()
    try:
        d.submit(anomaly(at=time.time()))
        deadline = time.monotonic() + 10
        while not recorded and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        d.stop()
    assert [a.outcome for a in recorded] == [Outcome.DONE]
    assert d.stats()["remediation"]["done"] == 1
    assert rem._thread is not None and not rem._thread.is_alive()
