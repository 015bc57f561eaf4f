"""Two torchrun "nodes" diagnosed through the real pipeline: `perftracker up` (tansu, a Faust
worker, chDB) and two `perftracker launch -- torchrun --nnodes 2 --node-rank {0,1}` (static
rendezvous, no run id), each with its own PERFTRACKER_COLLECTOR_HOST (node-0, node-1): one
job of 4 gloo ranks on 2 hosts, as in test_two_nodes.py, now down to the incidents.

* (a slow rank of the second node named with its host, and no rank of node-0 blamed, is
  asserted on a recorded real two-node run: tests/unit/benchmarks/test_replayed_runs.py,
  ``test_a_slow_rank_of_the_second_node_is_named_with_its_host``);
* CPU contention on the second "host" (both of its ranks pinned to one core with busy
  competitors, set on node-1's launcher only) is ONE incident naming node-1 and both of its
  ranks, and no rank of node-0 is blamed.

The job id is the one the ranks agreed on; the test finds it in the store's ``jobs`` query.
Training runs while a hold file exists and stops once the diagnosis is there (or after
TRAIN_LIMIT_S), so each test takes about a minute.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perftracker_ml.schemas.settings_loader import load_settings

from tests.integration.stack.conftest import Stack, running_stack

from .helpers import SCRIPTS, finish_launchers, new_job, stored_jobs

pytestmark = pytest.mark.e2e

TRAIN_LIMIT_S = 150.0  # longest training while waiting for the diagnosis
NODE0_RANKS = {0, 1}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("nodesstack"), show_logs=True) as s:
        yield s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_nodes(stack: Stack, tmp_path: Path, node_env: dict[int, dict[str, str]],
                  done: Callable[[list[dict]], bool]) -> tuple[str, list[dict], list[dict]]:
    """Both launchers of one 2x2 job, training until ``done(diagnosis)`` or TRAIN_LIMIT_S;
    returns (job, every diagnosis row seen while it ran, the diagnosis after it ended)."""
    settings = load_settings(env=stack.env)
    before = {j["job"] for j in stored_jobs(settings)}
    hold = tmp_path / "hold"
    hold.write_text("train while this exists")
    launcher = shutil.which("perftracker", path=str(Path(sys.executable).parent))
    assert launcher, "the perftracker command is not installed next to this Python"
    port = free_port()
    base = {k: v for k, v in stack.env.items() if not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    base.update({"TRAIN_STEPS": "20", "TRAIN_HOLD_FILE": str(hold), "TRAIN_REPORT": "",
                 "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0", "OMP_NUM_THREADS": "1"})
    nodes = []
    for node in (0, 1):
        env = {**base, **node_env.get(node, {}), "PERFTRACKER_COLLECTOR_HOST": f"node-{node}"}
        nodes.append(subprocess.Popen(
            [launcher, "launch", "--", sys.executable, "-m", "torch.distributed.run",
             "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2", "--master-addr=127.0.0.1",
             f"--master-port={port}", str(SCRIPTS / "train_ddp.py")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    seen: list[dict] = []
    job = None
    try:
        deadline = time.monotonic() + TRAIN_LIMIT_S
        while time.monotonic() < deadline and all(p.poll() is None for p in nodes):
            time.sleep(2.0)
            job = job or new_job(settings, before)
            rows = stack.diagnose(job) if job else []
            seen += rows
            if rows and done(rows):
                break
    finally:
        hold.unlink(missing_ok=True)
        outputs = finish_launchers(nodes)
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    job = job or new_job(settings, before)
    assert job, "no job of the two nodes reached the store"
    final = stack.diagnose(job)
    (tmp_path / "diagnosis.json").write_text(json.dumps(seen + final, indent=1))
    return job, seen + final, final


def _show(rows: list[dict]) -> str:
    """The last row of each incident seen."""
    last = {r["incident_id"]: r for r in rows}
    return json.dumps([{k: r[k] for k in ("status", "cause", "ranks", "hosts", "summary")} for r in last.values()],
                      indent=1)


def _blames_node0(rows: list[dict]) -> list[dict]:
    return [r for r in rows if set(r["ranks"]) & NODE0_RANKS or "node-0" in r["hosts"]]


def test_cpu_contention_on_one_host_is_one_incident_naming_that_host(stack: Stack, tmp_path: Path):
    def host_incident(rows: list[dict]) -> list[dict]:
        return [r for r in rows if r["cause"] == "host_cpu_contention" and r["hosts"] == ["node-1"]]

    def merged(rows: list[dict]) -> bool:
        return any(r["ranks"] == [2, 3] for r in host_incident(rows))

    job, seen, final = run_two_nodes(stack, tmp_path, {1: {"TRAIN_CPU_HOGS": "2"}}, merged)
    assert merged(seen), f"no one incident of host node-1 with ranks 2 and 3 in {job}:\n{_show(seen)}"
    assert len({r["incident_id"] for r in host_incident(seen)}) == 1, _show(host_incident(seen))
    assert not _blames_node0(seen), f"node-0 blamed:\n{_show(_blames_node0(seen))}"
    incident = next(r for r in host_incident(seen) if r["ranks"] == [2, 3])
    print(f"\ntwo-node diagnosis of {job}:\n{incident['summary']}")
