"""`perftracker status --job J` on a real store: the data dir's chDB, written the way
`import-traces` keeps records (`sinks.client.keep`, no stack running), read by the real CLI
in subprocesses. A job of 4 ranks whose rank 2 went silent five minutes before the others
and whose rank 3 never reported; a job whose ranks all report; an unknown job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..stack.conftest import Stack, stack_env

pytestmark = pytest.mark.integration

WRITE = """
import time
from perftracker_ml.deploy.workloads.store_records import rank_window
from perftracker_ml.schemas.settings_loader import load_settings
from perftracker_ml.sinks.client import keep

now = int(time.time() // 5)  # window ids of 5 s windows, the last ones ending about now
records = []
for w in range(now - 80, now):
    records += [("RankWindow", rank_window("half", w, rank, world=4)) for rank in (0, 1)]
    if w < now - 60:  # rank 2: silent for the last 60 windows (300 s)
        records.append(("RankWindow", rank_window("half", w, 2, world=4)))
    records += [("RankWindow", rank_window("full", w, rank, world=2)) for rank in (0, 1)]
kept = keep(load_settings(), records)
assert kept.rows_written and not kept.invalid, kept
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    data = tmp_path_factory.mktemp("status") / "data"
    s = Stack(data, stack_env(data))
    subprocess.run([sys.executable, "-c", WRITE], env=s.env, check=True, timeout=300)
    assert not (data / "stack.json").exists()  # no stack: the CLI opens the chDB itself
    return s


def test_the_missing_ranks_are_named_with_what_is_known_of_each(store: Stack) -> None:
    proc = store.cli("status", "--job", "half", check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("job half: 2 of 4 ranks reporting (world size from the job's RankWindows; ")
    assert lines[1] == "missing: 2-3"
    assert lines[2].startswith("  never reported: 3 (no collector attached?")
    assert lines[3] == "  rank 2     host node-000: last event 300 s before the job's newest (more than 60 s)"


def test_the_json_form_and_a_longer_recent_window(store: Stack) -> None:
    got = json.loads(store.cli("status", "--job", "half", "--json", check=False).stdout)
    assert (got["world_size"], got["expected"], got["reporting"], got["missing"]) == (4, 4, [0, 1], [2, 3])
    assert got["never_seen"] == [3] and got["silent"] == [{"rank": 2, "host": "node-000", "behind_s": 300.0}]
    assert 0 <= got["age_s"] < 600
    wide = json.loads(store.cli("status", "--job", "half", "--json", "--recent", "400", check=False).stdout)
    assert wide["reporting"] == [0, 1, 2] and wide["missing"] == [3]


def test_a_job_whose_ranks_all_report_exits_0(store: Stack) -> None:
    out = store.cli("status", "--job", "full").stdout.splitlines()
    assert len(out) == 1 and out[0].startswith("job full: 2 of 2 ranks reporting")


def test_an_unknown_job_is_refused_naming_the_known_ones(store: Stack) -> None:
    proc = store.cli("status", "--job", "nope", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("perftracker: error: no such job 'nope' (known: ")
    assert "half" in proc.stderr and "full" in proc.stderr


def test_without_a_store_it_says_the_stack_is_not_initialised(tmp_path: Path) -> None:
    s = Stack(tmp_path / "empty", stack_env(tmp_path / "empty"))
    proc = s.cli("status", "--job", "half", check=False)
    assert proc.returncode == 1 and "stack not initialised" in proc.stderr
