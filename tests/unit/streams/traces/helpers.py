"""Shared test inputs: the real DLRM traces and tiny hand-written Kineto traces."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
# the real traces ship with the tests (tests/data/traces/README.md: source and licence);
# PERFTRACKER_TEST_TRACES names another folder holding them
CANDIDATES = [Path(p) for p in [os.environ.get("PERFTRACKER_TEST_TRACES", "")] if p] + [REPO / "tests" / "data" / "traces"]


def dlrm_archive() -> Path:
    for c in CANDIDATES:
        if (c / "dlrm_kineto.tar.gz").is_file():
            return (c / "dlrm_kineto.tar.gz").resolve()
    pytest.skip(f"real traces absent: dlrm_kineto.tar.gz not found in {[str(c) for c in CANDIDATES]}")


def tiny_trace(rank: int = 0, world: int = 2, comm_us: float = 100.0, extra: list | None = None,
               **top) -> dict:
    """A minimal trace: one ProfilerStep, forward/backward annotations, one NCCL all_reduce
    launched from inside ``nccl:all_reduce`` (times in us)."""
    t = 1_700_000_000_000_000
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": t, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "## forward ##", "pid": 1, "tid": 1, "ts": t + 10, "dur": 300},
        {"ph": "X", "cat": "user_annotation", "name": "Model.forward", "pid": 1, "tid": 1, "ts": t + 20, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "## backward ##", "pid": 1, "tid": 1, "ts": t + 400, "dur": 400},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 1, "ts": t + 500, "dur": 20,
         "args": {"Input Dims": [[1024]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 505, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(x)", "pid": 0, "tid": 7,
         "ts": t + 520, "dur": comm_us, "args": {"correlation": 7, "device": rank}},
        {"ph": "X", "cat": "kernel", "name": "void gemm()", "pid": 0, "tid": 7, "ts": t + 30, "dur": 50,
         "args": {"correlation": 3, "device": rank}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 25, "dur": 30},
    ] + (extra or [])
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": events, **top}


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path
