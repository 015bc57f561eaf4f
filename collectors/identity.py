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


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        return default


def identity_from_env(job: str, env: Mapping[str, str] | None = None, host: str = "") -> RankIdentity:
    """Rank fields from torchrun/SLURM variables. ``host``: the configured machine name
    (``collector.host``), else the hostname; in a container the hostname is the pod's,
    so host-level causes could not be merged per machine without it."""
    env = os.environ if env is None else env
    rank = _int(env, "RANK", _int(env, "SLURM_PROCID", 0))
    local_rank = _int(env, "LOCAL_RANK", _int(env, "SLURM_LOCALID", 0))
    world = _int(env, "WORLD_SIZE", _int(env, "SLURM_NTASKS", 1))
    return RankIdentity(job=job, rank=rank, local_rank=local_rank,
                        world_size=world, host=host or socket.gethostname(), gpu=-1, gpu_uuid="",
                        pid=os.getpid())
