"""A hang diagnosed during the stall on the real stack (`perftracker up`: tansu, Faust worker,
chDB) at default detection settings: 4 gloo DDP ranks under `perftracker launch`, rank 3
stalls in plain Python before a forward while the others wait in DDP's all-reduce. The stalled
rank is named within hang_floor_s + one window (+ the pipeline's delivery) and the waiting
ranks never are."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.stack.conftest import Stack, running_stack

from .helpers import SCRIPTS

pytestmark = pytest.mark.e2e

STALL_RANK, STALL_STEP, STALL_S = 3, 60, 75.0
HANG_FLOOR_S, WINDOW_S = 30.0, 5.0
SLACK_S = 15.0  # window close grace, stage hand-offs and the store's poll


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("hangstack")) as s:
        yield s


def test_stalled_rank_is_named_during_the_stall_and_the_waiting_ranks_never(stack: Stack, tmp_path: Path):
    job = f"hang-{uuid.uuid4().hex[:6]}"
    mark = tmp_path / "stall_started"
    env = {**stack.env, "TRAIN_STALL_FILE": str(mark), "TRAIN_STEPS": "90", "TRAIN_HIDDEN": "64", "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "TRAIN_STALL": f"{STALL_RANK}:{STALL_STEP}:{STALL_S}", "TRAIN_REPORT": ""}
    cmd = [sys.executable, "-m", "perftracker.deploy.cli", "launch", "--job", job, "--", sys.executable, "-m",
           "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(SCRIPTS / "train_ddp.py")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        hangs, named_at = _watch(stack, job, proc)
    finally:
        out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-3000:]
    assert hangs, "no hang reported"
    blamed = {r for h in hangs for r in h["ranks"]}
    assert blamed == {STALL_RANK}, [(h["status"], h["ranks"], h["summary"]) for h in hangs]
    stall_started = float(mark.read_text())
    assert named_at is not None and named_at < stall_started + STALL_S, "not named during the stall"
    assert named_at - stall_started <= HANG_FLOOR_S + WINDOW_S + SLACK_S, (named_at - stall_started, hangs)
    print(f"stalled rank named {named_at - stall_started:.1f} s after the stall began")
    first = next(h for h in hangs if h["ranks"])
    assert "never entered all_reduce" in first["summary"], first["summary"]
    assert "died" not in first["summary"]
    named = [h["summary"] for h in hangs if STALL_RANK in h["ranks"]]
    assert any("now at " in t and "_stall `time.sleep(seconds)`" in t for t in named), named  # its current stack


def _watch(stack: Stack, job: str, proc: subprocess.Popen) -> tuple[list[dict], float | None]:
    """Poll diagnose while the job runs: (hang rows seen, when the stalled rank was first named)."""
    hangs: list[dict] = []
    named_at = None
    while proc.poll() is None:
        rows = [r for r in stack.diagnose(job) if r["cause"] == "hang"]
        hangs += rows
        if named_at is None and any(STALL_RANK in r["ranks"] for r in rows):
            named_at = time.time()
        time.sleep(2.0)
    return hangs, named_at
