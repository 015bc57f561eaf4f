"""Realistic synthetic records for tests, the benchmark and dashboard checks.

A job of ``world`` ranks over ``windows`` windows: rank ``slow_rank`` is a
straggler (slow data loading, a throttled GPU) and arrives last at the
all-reduce; an incident names it. Shapes follow the Avro schemas exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

from ...schemas.vocabulary import (
    ANOMALY,
    FUNCTION_COMPARISON,
    FUNCTION_PATTERN,
    RANK_WINDOW,
    SpanKind,
)

FUNCTIONS = ("train.py:forward", "train.py:backward", "torch.utils.data:DataLoader.__next__",
             "torch.optim:Optimizer.step", "comm:all_reduce:0")
HOST_NAME = "node-{:03d}"


def _start(window_id: int, window_s: float) -> datetime:
    return datetime.fromtimestamp(window_id * window_s, tz=timezone.utc).replace(microsecond=0)


def _kind(function: str) -> int:
    return int(SpanKind.COLLECTIVE if function.startswith("comm:") else SpanKind.DATALOADER)


def pattern(job: str, window_id: int, rank: int, function: str, world: int = 8,
            total_ms: float = 10.0, steps: int = 50, window_s: float = 5.0) -> dict:
    total_ns = int(total_ms * 1e6 * steps)
    per = max(total_ns // max(steps, 1), 1)
    return {
        "job": job, "window_id": window_id, "window_start_ms": _start(window_id, window_s),
        "window_s": window_s, "rank": rank, "world_size": world, "host": HOST_NAME.format(rank // 8),
        "gpu": rank % 8, "signature": "sig-a", "function": function,
        "kind": _kind(function), "steps": steps, "count": steps,
        "total_ns": total_ns, "p50_ns": per, "p90_ns": int(per * 1.1), "p99_ns": int(per * 1.3),
        "max_ns": int(per * 1.5), "hist": [0, 1, 4, 9, steps],
        "group_ranks": list(range(world)) if function.startswith("comm:") else [],
        "bytes": 1 << 20 if function.startswith("comm:") else 0,
        "seqs": [], "seq_dur_ns": [],
    }


def rank_window(job: str, window_id: int, rank: int, world: int = 8, steps: int = 50,
                step_ms: float = 100.0, window_s: float = 5.0, throttled: bool = False) -> dict:
    start = _start(window_id, window_s)
    rng = random.Random(window_id * 1000 + rank)
    return {
        "job": job, "window_id": window_id, "window_start_ms": start, "window_s": window_s,
        "rank": rank, "world_size": world, "host": HOST_NAME.format(rank // 8), "gpu": rank % 8,
        "signature": "sig-a", "functions": list(FUNCTIONS), "steps": steps,
        "last_step": (window_id + 1) * steps - 1,
        "step_time_ns": [int(step_ms * 1e6 * rng.uniform(0.98, 1.02)) for _ in range(steps)],
        "last_event_ms": start + timedelta(seconds=window_s), "last_function": "comm:all_reduce:0",
        "pending_group": "0", "pending_seq": window_id * steps, "dropped_events": 0,
        "lost_batches": 0, "bytes_received": 123456, "hw_samples": 50,
        "sm_clock_mhz": 1100.0 if throttled else 1980.0, "sm_clock_max_mhz": 1980.0,
        "temp_c_max": 88.0 if throttled else 65.0, "power_w_mean": 400.0, "util_gpu_pct": 97.0,
        "throttle_reasons": 0x20 if throttled else 0, "pcie_gen_min": 5, "pcie_width_min": 16,
        "nvlink_errors": 0, "ecc_uncorrected": 0, "xid": 0,
    }


def comparison(job: str, window_id: int, world: int = 8, slow_rank: int = 3,
               function: str = "comm:all_reduce:0", window_s: float = 5.0) -> dict:
    """A FunctionComparison: for a collective, ``slow_rank`` arrives last at most seqs;
    for any other function, ``slow_rank`` is an outlier against its peers."""
    collective = function.startswith("comm:")
    host = HOST_NAME.format(slow_rank // 8)
    return {
        "job": job, "window_id": window_id, "window_start_ms": _start(window_id, window_s),
        "window_s": window_s, "function": function, "kind": _kind(function),
        "ranks_seen": world, "ranks_scored": world, "peer_groups": 1, "median_ms_per_step": 10.0,
        "groups": [{"key": "sig-a", "size": world, "median_ms_per_step": 10.0,
                    "median_calls_per_step": 1.0, "ranks": []}],
        "outliers": [] if collective else [{
            "rank": slow_rank, "host": host, "gpu": slow_rank % 8, "peer_group": "sig-a",
            "value_ms_per_step": 20.0, "peer_median_ms_per_step": 10.0, "ratio": 2.0,
            "robust_z": 12.0, "cost_ms_per_step": 10.0, "calls_ratio": 1.0, "per_call_ratio": 2.0}],
        "members": list(range(world)) if collective else [],
        "member_max_seq": [window_id * 50 + 49] * world if collective else [],
        "mixed_signatures": False, "seqs_compared": 50 if collective else 0,
        "transfer_ms_median": 0.5, "transfer_ms_per_step": 0.5,
        "wait_ms_per_step": 9.5 if collective else 0.0, "bytes_per_call": float(1 << 20),
        "stragglers": [{"rank": slow_rank, "host": host, "gpu": slow_rank % 8, "late_seqs": 45,
                        "late_fraction": 0.9, "caused_ms_per_step": 9.5, "p_value": 1e-9}]
        if collective else [],
        "skipped": {},
    }


def anomaly(job: str, incident_id: str = "inc-1", status: str = "OPEN", rank: int = 3,
            impact_ms: float = 18.0, last_seen_s: float | None = None,
            function: str = "torch.utils.data:DataLoader.__next__", cause: str = "slow_dataloader") -> dict:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    last = now if last_seen_s is None else datetime.fromtimestamp(last_seen_s, tz=timezone.utc)
    first = last - timedelta(seconds=100)
    return {
        "incident_id": incident_id, "job": job, "status": status, "kind": "straggler",
        "cause": cause, "ranks": [rank], "hosts": [HOST_NAME.format(rank // 8)], "gpus": [rank % 8],
        "function": function, "score": 12.5, "impact_ms_per_step": impact_ms, "step_time_ms": 118.0,
        "first_seen_ms": first, "last_seen_ms": last,
        "windows": 3, "summary": f"rank {rank} arrives last at all_reduce: {function} is slow",
        "evidence_json": json.dumps({"peer_median_ms": 2.0, "value_ms": 20.0, "late_arrivals": 45}),
    }


def job_records(job: str, world: int = 8, windows: int = 3, slow_rank: int = 3,
                first_window: int | None = None) -> Iterator[tuple[str, dict]]:
    """(record name, record) for a whole job: patterns, rank windows, comparisons, one incident."""
    if first_window is None:
        first_window = int(datetime.now(timezone.utc).timestamp() // 5) - windows
    for w in range(first_window, first_window + windows):
        for rank in range(world):
            slow = rank == slow_rank
            for fn in FUNCTIONS:
                ms = 20.0 if slow and "DataLoader" in fn else 0.5 if slow and fn.startswith("comm:") else 10.0
                yield FUNCTION_PATTERN, pattern(job, w, rank, fn, world, total_ms=ms)
            yield RANK_WINDOW, rank_window(job, w, rank, world, throttled=slow)
        yield FUNCTION_COMPARISON, comparison(job, w, world, slow_rank)
        yield FUNCTION_COMPARISON, comparison(job, w, world, slow_rank,
                                              function="torch.utils.data:DataLoader.__next__")
    yield ANOMALY, anomaly(job, f"{job}-inc", rank=slow_rank)
