"""A SLURM cluster of one node for real: munged, slurmctld and slurmd on this machine, every
file in a temporary folder (the ``cluster`` fixture of ``conftest.py``, shared by the tests
of this package: `perftracker launch` under srun/sbatch, and the remediation hook's drain).

Debian's slurm-wlm and munge are installed when missing and this runs as root with apt-get
(as CI does); elsewhere the tests skip, saying why. Every daemon is stopped at the end,
whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from perftracker_ml.deploy.tansu import free_port

from ...system_binaries import stop

PROGRAMS = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "srun": "slurm-wlm",
            "sbatch": "slurm-wlm", "scontrol": "slurm-wlm", "scancel": "slurm-wlm", "sinfo": "slurm-wlm"}
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"])
NODE = "localhost"  # the cluster's one node (NodeName)


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

    def nodes(self) -> str:
        """``sinfo -N -h -o "%N %T %E"``: each node, its state and its reason."""
        return self.run(self.bin["sinfo"], "-N", "-h", "-o", "%N %T %E").stdout.strip()


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
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def wait(what: str, check: Callable[[], bool], cluster: Cluster, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout_s:.0f} s\n{cluster.logs()}")


@contextmanager
def running_cluster(root: Path) -> Iterator[Cluster]:
    """munged, slurmctld and slurmd on ``root`` (an empty folder) until the block ends: its one
    node idle when it starts; its jobs cancelled and every daemon stopped (and checked gone)
    when it ends."""
    bins = programs()
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
        wait("munged serving its socket", socket_path.exists, c, 20)
        started.append(subprocess.Popen([bins["slurmctld"], "-D", "-c", "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(root / "slurmctld.stderr.log", "wb")))
        started.append(subprocess.Popen([bins["slurmd"], "-D", "-N", NODE, "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=open(root / "slurmd.stderr.log", "wb")))
        wait(f"node {NODE} idle", lambda: c.run(bins["sinfo"], "-h", "-N", "-o", "%T").stdout.strip() == "idle", c)
        yield c
    finally:
        if len(started) == 3:
            c.run(bins["scancel"], "--user", "root", "--full", timeout=30)  # this cluster's jobs only
        for proc in reversed(started):
            stop(proc)
        left = [proc.args[0] for proc in started if proc.poll() is None]
        assert not left, f"daemons still running: {left}"
