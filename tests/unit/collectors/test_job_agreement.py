"""Job agreement through the c10d store: rank 0 proposes, the others adopt, sending waits.

The store is torch's real in-process ``HashStore`` (the same interface as the TCPStore a
multi-node job gets); only ``torch.distributed``'s process-group queries are stood in
for, since one test process cannot be two ranks (the e2e suite runs real torchrun nodes).
"""

from __future__ import annotations

import pytest
from perftracker_ml.collectors.job_agreement import (
    STORE_KEY,
    JobAgreement,
    settled_job,
    world_size,
)

torch = pytest.importorskip("torch")


class FakeDist:
    def __init__(self, store, rank: int, initialized: bool = True):
        self.store, self.rank, self.initialized = store, rank, initialized
        self.distributed_c10d = self

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def get_rank(self) -> int:
        return self.rank

    def _get_default_store(self):
        return self.store


def agreement(dist, proposal: str, hold_s: float = 60.0) -> tuple[JobAgreement, list[str]]:
    adopted: list[str] = []
    return JobAgreement(proposal, adopted.append, hold_s, lambda: dist), adopted


def test_rank0_proposes_and_the_others_adopt_its_id() -> None:
    store = torch.distributed.HashStore()
    other, other_adopted = agreement(FakeDist(store, 1), "job-b")
    other.poll()
    assert not other.ready() and other_adopted == []  # rank 0 has not written yet: hold
    zero, zero_adopted = agreement(FakeDist(store, 0), "job-a")
    zero.poll()
    assert zero.ready() and zero_adopted == ["job-a"] and store.get(STORE_KEY) == b"job-a"
    other.poll()
    assert other.ready() and other_adopted == ["job-a"]


def test_holds_until_the_process_group_exists_then_gives_up_after_hold_s() -> None:
    dist = FakeDist(torch.distributed.HashStore(), 1, initialized=False)
    waiting, adopted = agreement(dist, "job-own", hold_s=60.0)
    waiting.poll()
    assert not waiting.ready()
    gave_up, adopted = agreement(dist, "job-own", hold_s=0.0)
    gave_up.poll()
    assert gave_up.ready() and adopted == ["job-own"]


def test_no_torch_means_no_agreement_yet() -> None:
    a, adopted = agreement(None, "job-x")
    a.poll()
    assert not a.ready() and adopted == []


def test_settled_ids_and_world_size() -> None:
    assert settled_job("given", {"SLURM_JOB_ID": "1"}) == "given"
    assert settled_job("", {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}) == "77"
    assert settled_job("", {}) == ""
    assert world_size({"WORLD_SIZE": "8"}) == 8
    assert world_size({"OMPI_COMM_WORLD_SIZE": "3"}) == 3
    assert world_size({}) == 1
