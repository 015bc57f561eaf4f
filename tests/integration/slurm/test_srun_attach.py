"""`perftracker launch` under SLURM for real: munged, slurmctld and slurmd on this machine (one
node of 2+ CPUs, every file in a temporary folder), jobs submitted with srun and sbatch.

* ``perftracker launch -- srun -n 2 python tiny.py`` (the form that attached nothing on other
  nodes before): with the installed ``perftracker_ml_attach.pth``, launch writes no bootstrap
  folder and puts nothing on PYTHONPATH, so each task attaches as on a node of its own;
* ``sbatch -n 2 --wrap "srun -n 2 perftracker launch -- python tiny.py"`` (launch per task).

The tasks are plain Python processes (no torch): an attached collector sends its final
EventBatch at exit, to a spool (``spool:DIR``); the test reads each task's rank, world size
and job id (SLURM_JOB_ID) there. Debian's slurm-wlm and munge are installed when missing
and this runs as root with apt-get (as CI does); elsewhere the module skips, saying why.
Every daemon is stopped at the end, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from perftracker_ml.deploy.tansu import free_port

from ...spooled import event_batches
from ...system_binaries import stop

pytestmark = pytest.mark.integration

PROGRAMS = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "srun": "slurm-wlm",
            "sbatch": "slurm-wlm", "scontrol": "slurm-wlm", "scancel": "slurm-wlm", "sinfo": "slurm-wlm"}
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
PERFTRACKER = Path(sys.executable).parent / "perftracker"
TINY = """\
import json, os, sys, time
time.sleep(0.5)
print(json.dumps({"procid": os.environ.get("SLURM_PROCID"), "job": os.environ.get("SLURM_JOB_ID"),
                  "attached": "perftracker_ml.collectors.api" in sys.modules,
                  "pythonpath": os.environ.get("PYTHONPATH", "")}), flush=True)
"""


def programs() -> dict[str, str]:
    """The SLURM and munge programs, installed first when missing (root with apt-get)."""
    found = {p: shutil.which(p, path=SEARCH) for p in PROGRAMS}
    if all(found.values()):
        return {p: str(path) for p, path in found.items()}
    packages = sorted({PROGRAMS[p] for p, path in found.items() if not path})
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"SLURM not installed and not installable here (needs root and apt-get): "
                    f"apt-get install {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(["apt-get", "install", "-y", "-qq", *packages], env=env, capture_output=True, text=True)
    if done.returncode != 0:  # a stale package list: refresh it once
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        done = subprocess.run(["apt-get", "install", "-y", "-qq", *packages], env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"apt-get install {' '.join(packages)} failed:\n{done.stderr[-2000:]}"
    found = {p: shutil.which(p, path=SEARCH) for p in PROGRAMS}
    assert all(found.values()), f"installed {packages} but missing {[p for p, v in found.items() if not v]}"
    return {p: str(path) for p, path in found.items()}


@dataclass
class Cluster:
    bin: dict[str, str]
    root: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**self.env, **env}, capture_output=True, text=True,
                              timeout=timeout, cwd=self.root)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("*.log")))

    def job_state(self, job: str) -> str:
        out = self.run(self.bin["scontrol"], "show", "job", "-o", job).stdout
        return next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), "")


def slurm_conf(root: Path, cpus: int, munge_socket: Path) -> str:
    return f"""\
ClusterName=ptci
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/slurmd
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _wait(what: str, check, cluster: Cluster, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout_s:.0f} s\n{cluster.logs()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bins = programs()
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o700)
    for sub in ("ctld", "slurmd", "munge"):
        (root / sub).mkdir(mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket_path = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, max(2, os.cpu_count() or 1), socket_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFTRACKER_", "SLURM_"))
           and k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(SLURM_CONF=str(conf), PATH=SEARCH)
    c = Cluster(bins, root, env)
    started: list[subprocess.Popen] = []
    try:
        started.append(subprocess.Popen(
            [bins["munged"], "-F", "--force", f"--socket={socket_path}", f"--key-file={key}",
             f"--log-file={root / 'munged.log'}", f"--pid-file={root / 'munge' / 'munged.pid'}",
             f"--seed-file={root / 'munge' / 'munged.seed'}"], env=env, stdout=subprocess.DEVNULL,
            stderr=open(root / "munged.stderr.log", "wb")))
        _wait("munged serving its socket", socket_path.exists, c, 20)
        started.append(subprocess.Popen([bins["slurmctld"], "-D", "-c", "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(root / "slurmctld.stderr.log", "wb")))
        started.append(subprocess.Popen([bins["slurmd"], "-D", "-N", "localhost", "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(root / "slurmd.stderr.log", "wb")))
        _wait("node localhost idle", lambda: c.run(bins["sinfo"], "-h", "-N", "-o", "%T").stdout.strip() == "idle", c)
        yield c
    finally:
        if len(started) == 3:
            c.run(bins["scancel"], "--user", "root", "--full", timeout=30)  # this cluster's jobs only
        for proc in reversed(started):
            stop(proc)


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
    _wait(f"job {job} done", lambda: cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING",
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
    _wait(f"job {job} done", lambda: cluster.job_state(job) not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                    "COMPLETING", ""), cluster, 120)
    batch, task = (json.loads(line) for line in out.read_text().splitlines() if line.startswith("{"))
    assert not slurm_task(batch), {k: v for k, v in batch.items() if k.startswith("SLURM_STEP")}
    assert slurm_task(task) and task["SLURM_JOB_ID"] == batch["SLURM_JOB_ID"] == job
