"""The fault table is the one place a fault's expected cause is written: every fault a workload
injects is in it, and the demo and the live fault suite take their expectations from it."""

from __future__ import annotations

import re
from pathlib import Path

from perftracker_ml.deploy.demo import inject_fault
from perftracker_ml.deploy.demo.runner import EXPECTED_CAUSE
from perftracker_ml.deploy.workloads.faults import FAULTS, cause_of
from perftracker_ml.schemas.causes import Cause

from benchmarks.live_faults import DEAD, SCENARIOS

ROOT = Path(__file__).resolve().parents[3]


def script_faults(path: Path) -> set[str]:
    """The names in a training script's ``FAULTS = (...)`` tuple."""
    text = path.read_text()
    body = re.search(r"^FAULTS = \((.*?)\)$", text, re.S | re.M)
    assert body, path
    return set(re.findall(r'"([\w-]+)"', body.group(1)))


def test_every_fault_a_training_script_injects_is_in_the_table():
    assert set(inject_fault.FAULTS) <= set(FAULTS)
    composite = {"two-culprits"}  # two faults of the table at once, on two ranks
    assert script_faults(ROOT / "benchmarks" / "live_faults_train.py") - composite <= set(FAULTS)


def test_the_demo_and_the_live_suite_expect_what_the_table_says():
    assert all(EXPECTED_CAUSE[f] == cause_of(f) for f in inject_fault.FAULTS)
    for s in SCENARIOS.values():
        if s.fault in FAULTS:
            spec = FAULTS[s.fault]
            causes = set(s.expect.culprits.values()) | ({s.expect.job_cause} - {None})
            want = {DEAD} if s.fault == "killed" else ({spec.cause.value} if spec.cause else set())
            assert causes == want, s.name


def test_every_cause_of_the_table_is_a_real_cause():
    assert all(f.cause is None or isinstance(f.cause, Cause) for f in FAULTS.values())
    assert {f.cause for f in FAULTS.values()} >= {Cause.SLOW_FUNCTION, Cause.HANG, Cause.REGRESSION}
