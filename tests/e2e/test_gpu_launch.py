"""`perftracker launch -- torchrun` of an unmodified NCCL DDP script on CUDA. Skipped without a GPU.

What the CPU suite cannot show: collectives timed by CUDA events (DDP's bucket
all-reduces through the timed comm hook, and explicit ones), a profiling window
that summarizes CUDA kernels and memory copies, and NVML hardware batches that
name the rank's GPU.
"""

from __future__ import annotations

import pytest
from perftracker_ml.schemas.vocabulary import HARDWARE_BATCH, OpKind

from .helpers import by_rank, comm_rows, consume_events, launch_profiled

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.e2e, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS = 40
PROFILE_STEP = 15


@pytest.fixture(scope="module")
def gpu_run(kafka_broker, tmp_path_factory):
    prefix = "gpu" + tmp_path_factory.mktemp("x").name[-6:].replace("_", "")
    topics, job = launch_profiled(kafka_broker.bootstrap, prefix, "train_cuda.py", 1, STEPS,
                                  "gpu-prof", PROFILE_STEP)
    events = by_rank(consume_events(kafka_broker.bootstrap, topics.events, job))
    hardware = consume_events(kafka_broker.bootstrap, topics.hardware, job, schema=HARDWARE_BATCH)
    return events, hardware


def test_iterations_and_ddp_all_reduces_timed_on_the_gpu(gpu_run):
    events, _ = gpu_run
    records = events[0]
    steps = [s for r in records for s in r["iterations"]["step"]]
    assert steps == list(range(STEPS))
    rows = comm_rows(records)
    all_reduces = [row for row in rows if row[0] == "all_reduce"]
    # DDP's bucket all-reduces every step plus the explicit one every 10 steps
    assert len(all_reduces) >= STEPS + STEPS // 10
    assert sorted(row[2] for row in all_reduces) == list(range(len(all_reduces)))
    assert {row[3] for row in all_reduces} >= {4}  # the explicit fp32 scalar
    durs = [d for r in records for d in r["comms"]["dur_ns"]]
    assert all(d > 0 for d in durs)
    assert records[-1]["dropped_events"] == 0


def test_profiling_window_summarizes_cuda_kernels_and_copies(gpu_run):
    events, _ = gpu_run
    ops = [(r["names"][k["name"]], k) for r in events[0] for k in r["kernels"]]
    assert ops and {k["profile_id"] for _, k in ops} == {"gpu-prof"}
    kinds = {k["kind"] for _, k in ops}
    assert OpKind.CUDA_KERNEL in kinds and OpKind.MEMCPY in kinds
    gemm = [k for name, k in ops if k["kind"] == OpKind.CUDA_KERNEL and k["total_ns"] > 0]
    assert gemm


def test_nvml_hardware_batches_name_the_gpu(gpu_run):
    events, hardware = gpu_run
    assert hardware, "no hardware batch arrived"
    uuid = events[0][-1]["gpu_uuid"]
    assert uuid.startswith("GPU-") and {h["gpu_uuid"] for h in hardware} == {uuid}
    first = hardware[0]
    assert max(first["sm_clock_max_mhz"]) > 0 and max(first["power_limit_w"]) > 0
