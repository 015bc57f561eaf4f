"""GPU-side evidence (device_evidence.py) in the diagnosis: a GPU rank's late arrival whose CPU
thread waits at the same line as its peers' is named from its device times, and a slow GPU is
only named with device times (or NVML evidence) behind it."""

from __future__ import annotations

import dataclasses

from perftracker_ml.schemas.causes import Cause
from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.device_evidence import gpu_side, phase_kind
from perftracker_ml.streams.detect.facts import Outlier
from perftracker_ml.streams.detect.window import diagnose_window

from .test_cpu_evidence import cpu_rw
from .test_host_level import allreduce, blamed, straggler

POL = DetectionPolicy()
FWD = "__main__.Net.forward"
SAME = [("train.py:40 step `loss.backward()`", 100)]


def gpu_job(device_functions: bool = True) -> dict[int, dict]:
    """Four GPU ranks on one host, 25 Hz stack samples: every CPU thread at the same line."""
    fns = [FWD, "cuda:" + FWD, "torch.autograd.backward", "cuda:torch.autograd.backward"] if device_functions \
        else [FWD, "torch.autograd.backward"]
    return {r: {**cpu_rw(r, frames=SAME), "host": "h", "gpu": r, "functions": fns,
                "gpu_uuid": f"GPU-0000000{r}-aaaa-bbbb-cccc-dddddddddddd"} for r in range(4)}


def outlier(rank: int, value: float, peer: float) -> dict:
    return {"rank": rank, "host": "h", "gpu": rank, "peer_group": "sig:x", "value_ms_per_step": value,
            "peer_median_ms_per_step": peer, "ratio": value / peer, "robust_z": 20.0,
            "cost_ms_per_step": value - peer, "calls_ratio": 1.0, "per_call_ratio": value / peer,
            "intermittent": False}


def comparison(function: str, kind: int, *outs: dict) -> dict:
    return {"kind": int(kind), "function": function, "outliers": list(outs), "minor_outliers": [],
            "stragglers": [], "members": [0, 1, 2, 3], "ranks_scored": 4, "peer_groups": 1}


def gpu_straggler(rank: int = 2) -> dict:
    return {**straggler(rank, 0.99, 24.0), "host": "h", "gpu": rank}


def test_a_gpu_timed_late_arrival_with_alike_cpu_samples_is_named_slow_gpu():
    comps = [comparison("cuda:" + FWD, SpanKind.DEVICE, outlier(2, 15.2, 1.8)),
             comparison("torch.autograd.backward", SpanKind.BACKWARD, outlier(2, 14.0, 2.0)),
             allreduce(gpu_straggler())]
    (f,) = blamed(diagnose_window(gpu_job(), comps, POL))
    assert f.ranks == (2,) and f.cause == Cause.SLOW_GPU and f.identity == "slow_gpu|2"
    side = f.evidence["gpu_side"]
    assert (side["phase"], side["device_ms_per_step"], side["peer_device_ms_per_step"]) == (FWD, 15.2, 1.8)
    assert f.evidence["gpu_side"]["device_only_excess_ms_per_step"] == 13.4
    assert f.evidence["gpu_side"]["host_only_excess_ms_per_step"] == 12.0
    assert f.evidence["gpu_uuids"] == {"2": "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd"}
    assert f.gpu_label == "GPU 2 GPU-00000002-aaaa-bbbb-cccc-dddddddddddd on h"


def test_the_same_late_arrival_without_device_times_is_not_raised_from_alike_samples():
    """CPU samples alike and no device timing: nothing shows it late (scheduling skew)."""
    assert blamed(diagnose_window(gpu_job(device_functions=False), [allreduce(gpu_straggler())], POL)) == []


def test_a_device_timed_rank_is_not_cleared_by_alike_cpu_samples():
    (f,) = blamed(diagnose_window(gpu_job(), [allreduce(gpu_straggler())], POL))
    assert f.ranks == (2,) and f.cause == Cause.SLOW_FUNCTION
    assert "the delay is in GPU or host work outside them" in f.summary


def test_device_and_host_slow_alike_is_no_gpu_evidence():
    outs = [Outlier(rank=2, kind=int(SpanKind.DEVICE), function="cuda:" + FWD, cost_ms_per_step=10.0),
            Outlier(rank=2, kind=int(SpanKind.FORWARD), function=FWD, cost_ms_per_step=10.0)]
    assert gpu_side(outs, 1.0, 0.7) is None
    outs[1] = dataclasses.replace(outs[1], cost_ms_per_step=2.0)
    side = gpu_side(outs, 1.0, 0.7)
    assert side is not None and side.device_only_ms == 8.0 and side.host_only_ms == 0.0


def test_host_only_excess_larger_than_the_devices_is_the_host():
    outs = [Outlier(rank=2, kind=int(SpanKind.DEVICE), function="cuda:" + FWD, cost_ms_per_step=5.0),
            Outlier(rank=2, kind=int(SpanKind.OPTIMIZER), function="torch.optim.sgd.SGD.step", cost_ms_per_step=9.0)]
    assert gpu_side(outs, 1.0, 0.7) is None


def test_phases_are_named_as_the_collectors_name_them():
    assert phase_kind("x.Net.forward") == SpanKind.FORWARD
    assert phase_kind("torch.autograd.backward") == SpanKind.BACKWARD
    assert phase_kind("torch.optim.adamw.AdamW.step") == SpanKind.OPTIMIZER
    assert phase_kind("train.load_batch") == -1


def test_nvml_fault_readings_of_a_slow_gpu_are_named_with_their_numbers():
    rws = gpu_job()
    for r, rw in rws.items():
        rw.update(hw_samples=5, ecc_uncorrected=3 if r == 2 else 0, xid=79 if r == 2 else 0)
    comps = [comparison("cuda:" + FWD, SpanKind.DEVICE, outlier(2, 15.2, 1.8)), allreduce(gpu_straggler())]
    (f,) = blamed(diagnose_window(rws, comps, POL))
    assert f.cause == Cause.SLOW_GPU and f.evidence["hardware"]["2"] == {"ecc_uncorrected": 3, "xid": 79}
    assert "(NVML: 3 uncorrected ECC errors, Xid 79)" in f.summary


def test_ecc_errors_alone_name_no_slow_gpu():
    rws = gpu_job()
    for r, rw in rws.items():
        rw.update(hw_samples=5, ecc_uncorrected=3 if r == 2 else 0)
    assert blamed(diagnose_window(rws, [], POL)) == []
