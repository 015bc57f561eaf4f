"""Who this process is: job, rank, local rank, world size, host, GPU, pid."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankIdentity:
    job: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    gpu: int  # CUDA device index on the host, -1 when none
    gpu_uuid: str
    pid: int

    @property
    def key(self) -> bytes:
        """Kafka message key of events and hardware batches: ``job|rank``."""
        return f"{self.job}|{self.rank}".encode()

    def with_gpu(self, gpu: int, gpu_uuid: str) -> RankIdentity:
        return RankIdentity(self.job, self.rank, self.local_rank, self.world_size, self.host,
                            gpu, gpu_uuid, self.pid)


# where each launcher puts them, first match wins: torchrun, SLURM's srun, Open MPI,
# MPICH/Intel MPI (PMI), PMIx
RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _first(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return default


def identity_from_env(job: str, env: Mapping[str, str] | None = None, host: str = "") -> RankIdentity:
    """Rank fields from torchrun/SLURM/MPI variables. ``host``: the configured machine name
    (``collector.host``), else the hostname; in a container the hostname is the pod's,
    so host-level causes could not be merged per machine without it."""
    env = os.environ if env is None else env
    rank = _first(env, RANK_VARS, 0)
    local_rank = _first(env, LOCAL_RANK_VARS, 0)
    world = _first(env, WORLD_SIZE_VARS, 1)
    return RankIdentity(job=job, rank=rank, local_rank=local_rank,
                        world_size=world, host=host or socket.gethostname(), gpu=-1, gpu_uuid="",
                        pid=os.getpid())
