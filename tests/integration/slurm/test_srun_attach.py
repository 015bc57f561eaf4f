"""`perftracker launch` under SLURM for real: the package's cluster (``cluster``, one node of 2+
CPUs: :mod:`.cluster`), jobs submitted with srun and sbatch.

* ``perftracker launch -- srun -n 2 python tiny.py`` (the form that attached nothing on other
  nodes before): with the installed ``perftracker_ml_attach.pth``, launch writes no bootstrap
  folder and puts nothing on PYTHONPATH, so each task attaches as on a node of its own;
* ``sbatch -n 2 --wrap "srun -n 2 perftracker launch -- python tiny.py"`` (launch per task).

The tasks are plain Python processes (no torch): an attached collector sends its final
EventBatch at exit, to a spool (``spool:DIR``); the test reads each task's rank, world size
and job id (SLURM_JOB_ID) there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ...spooled import event_batches
from .cluster import Cluster, wait

pytestmark = pytest.mark.integration

PERFTRACKER = Path(sys.executable).parent / "perftracker"
TINY = """\
import json, os, sys, time
time.sleep(0.5)
print(json.dumps({"procid": os.environ.get("SLURM_PROCID"), "job": os.environ.get("SLURM_JOB_ID"),
                  "attached": "perftracker_ml.collectors.api" in sys.modules,
                  "pythonpath": os.environ.get("PYTHONPATH", "")}), flush=True)
"""


@pytest.fixture(scope="module")
def tiny(cluster: Cluster) -> Path:
    path = cluster.root / "tiny.py"
    path.write_text(TINY)
    return path


def reports(out: str) -> list[dict]:
    return sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["procid"])


def check_spool(spool: Path, job: str) -> None:
    batches = event_batches(spool)
    by_rank = {b["rank"]: b for b in batches if b["final"]}
    assert sorted(by_rank) == [0, 1], f"ranks that reported: {sorted({b['rank'] for b in batches})}"
    assert {(b["job"], b["world_size"]) for b in batches} == {(job, 2)}
    assert len({b["pid"] for b in by_rank.values()}) == 2


def test_launch_in_front_of_srun_attaches_every_task_through_the_installed_pth(cluster: Cluster, tiny: Path) -> None:
    spool = cluster.root / "spool-srun"
    done = cluster.run(str(PERFTRACKER), "launch", "--", cluster.bin["srun"], "-n", "2", sys.executable, str(tiny),
                       timeout=120, PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"spool:{spool}")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{cluster.logs()}"
    assert "ranks on other nodes attach where perftracker-ml is installed" in done.stderr
    tasks = reports(done.stdout)
    assert [t["procid"] for t in tasks] == ["0", "1"] and all(t["attached"] for t in tasks), tasks
    assert not any("perftracker-boot" in t["pythonpath"] for t in tasks)  # the .pth alone, as on another node
    (job,) = {t["job"] for t in tasks}
    check_spool(spool, job)


def test_sbatch_with_launch_per_task_reports_under_slurm_job_id(cluster: Cluster, tiny: Path) -> None:
    spool, out = cluster.root / "spool-sbatch", cluster.root / "sbatch.out"
    wrap = f"srun -n 2 {PERFTRACKER} launch -- {sys.executable} {tiny}"
    submitted = cluster.run(cluster.bin["sbatch"], "--parsable", "-n", "2", "-o", str(out), "--wrap", wrap,
                            PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"spool:{spool}")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait(f"job {job} done", lambda: cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                    "COMPLETING", ""), cluster, 120)
    assert cluster.job_state(job) == "COMPLETED", f"{out.read_text() if out.exists() else ''}\n{cluster.logs()}"
    tasks = reports(out.read_text())
    assert [t["procid"] for t in tasks] == ["0", "1"] and all(t["attached"] for t in tasks), out.read_text()
    assert {t["job"] for t in tasks} == {job}
    check_spool(spool, job)


def test_the_batch_scripts_shell_is_no_task_and_an_srun_task_is(cluster: Cluster) -> None:
    """What `bootstrap.slurm_task` tells apart, in SLURM's own environments: the shell of an
    sbatch script (a Python process it starts directly is no rank) and a task of its srun."""
    from perftracker_ml.collectors.bootstrap import slurm_task

    out = cluster.root / "env.out"
    dump = f"{sys.executable} -c 'import json, os; print(json.dumps(dict(os.environ)))'"
    submitted = cluster.run(cluster.bin["sbatch"], "--parsable", "-o", str(out), "--wrap", f"{dump}; srun {dump}")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait(f"job {job} done", lambda: cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                    "COMPLETING", ""), cluster, 120)
    batch, task = (json.loads(line) for line in out.read_text().splitlines() if line.startswith("{"))
    assert not slurm_task(batch), {k: v for k, v in batch.items() if k.startswith("SLURM_STEP")}
    assert slurm_task(task) and task["SLURM_JOB_ID"] == batch["SLURM_JOB_ID"] == job
