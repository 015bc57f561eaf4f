"""One job id for every rank, whatever started them.

Algorithm. A job id is *settled* when it was given (``--job``,
``PERFTRACKER_COLLECTOR_JOB``) or a launcher names the run for every node alike
(torchrun ``--rdzv-id``/``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``, a Kubernetes
JobSet/PyTorchJob name). Otherwise each process starts with a *provisional* id (its
launcher's, so restarts of an elastic job under one launcher keep it) and, when the
world has more than one rank, holds its batches back until the ranks agree: once the
job's own ``init_process_group`` has run, rank 0 writes its provisional id into the
job's c10d store under :data:`STORE_KEY` and every other rank reads it from there. The
check runs on the sender thread (never the training thread) with non-blocking store
calls; batches built after it carry the agreed id, so nothing sent is keyed wrongly and
nothing held is lost (the recorder's bounded buffer keeps the events; overflow is
counted as usual). If no process group appears within ``hold_s`` the provisional id is
used and said so once in the log.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger("perftracker_ml.collectors")

STORE_KEY = "perftracker/job"
PROVISIONAL_ENV = "PERFTRACKER_COLLECTOR_PROVISIONAL_JOB"
# launcher variables that name the same run on every node (first match wins)
LAUNCHER_JOB_VARS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "JOBSET_NAME", "PYTORCHJOB_NAME")


def settled_job(explicit: str, env: Mapping[str, str]) -> str:
    """The job id every rank already shares, or '' when the ranks must agree on one."""
    if explicit:
        return explicit
    for name in LAUNCHER_JOB_VARS:
        value = env.get(name, "")
        if value and value != "none":
            return value
    return ""


def provisional_job(env: Mapping[str, str]) -> str:
    """This process's candidate id: its launcher's, else a fresh one."""
    return env.get(PROVISIONAL_ENV, "") or "job-" + uuid.uuid4().hex[:10]


class JobAgreement:
    """Sender-thread task: agree on rank 0's id through the c10d store, then release sending."""

    def __init__(self, provisional: str, set_job: Callable[[str], None], hold_s: float,
                 dist: Callable[[], Any]):
        self.job = provisional
        self._set_job = set_job
        self._deadline = time.monotonic() + hold_s
        self._dist = dist  # returns torch.distributed once imported, else None
        self.settled = False

    def ready(self) -> bool:
        """True once batches may be sent (the id is agreed, or waiting gave up)."""
        return self.settled

    def poll(self) -> None:
        """One non-blocking step; called at every send cycle."""
        if self.settled:
            return
        agreed = self._from_store()
        if agreed is not None:
            self._settle(agreed)
        elif time.monotonic() >= self._deadline:
            log.warning("perftracker: no process group to agree on a job id with; this rank "
                        "reports as job %s (set --job or PERFTRACKER_COLLECTOR_JOB)", self.job)
            self._settle(self.job)

    def _from_store(self) -> str | None:
        dist = self._dist()
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            store.set(STORE_KEY, self.job)
            return self.job
        if not store.check([STORE_KEY]):
            return None
        return bytes(store.get(STORE_KEY)).decode()

    def _settle(self, job: str) -> None:
        self.job = job
        self._set_job(job)
        self.settled = True


def torch_distributed() -> Any:
    """``torch.distributed`` if the job imported torch, else None (never imports it)."""
    import sys

    torch = sys.modules.get("torch")
    return getattr(torch, "distributed", None) if torch is not None else None


def world_size(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    from .identity import WORLD_SIZE_VARS

    for name in WORLD_SIZE_VARS:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return 1
