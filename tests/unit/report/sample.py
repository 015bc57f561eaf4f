"""A report's data as the store would give it: the default demo (rank 2's data loader) at a few
ranks, and a 1,024-rank job built as the store's query rows and normalized as the report does."""

from __future__ import annotations

import math
import random
from datetime import datetime, timezone

T0 = 1_790_000_000.0
FAULT_S = T0 + 25  # injected inside the window [T0 + 20, T0 + 30): first seen at its start, before the onset
DETECTED_S = T0 + 35  # the end of the window that opened the incident
FUNCTIONS = ("torch.utils.data.DataLoader.__next__", "forward", "backward", "comm:all_reduce",
             "torch.optim.SGD.step")


def incident(**over) -> dict:
    row = {"incident_id": "inc-1", "job": "demo-1", "status": "OPEN", "kind": "straggler",
           "cause": "slow_dataloader", "ranks": [2], "hosts": ["node000"], "gpus": [],
           "function": "torch.utils.data.DataLoader.__next__", "score": 41.5,
           "impact_ms_per_step": 12.4, "step_time_ms": 37.0,
           "first_seen": "2026-09-21T14:13:40+00:00", "last_seen": "2026-09-21T14:14:05+00:00",
           "windows": 6, "summary": "rank 2 arrives last at all_reduce: its data loader takes 15.8 ms "
                                    "vs 0.6 ms on peers, costing 12.4 ms/step",
           "evidence": {"value_ms": 15.8, "peer_median_ms": 0.6, "ratio": 26.3,
                        "late_arrival_share": 0.97, "collective": "all_reduce"}}
    row.update(over)
    return row


def advice_row(**over) -> dict:
    """A pipeline's last stage doing more work from the job's start: advice, not an incident."""
    row = incident(incident_id="adv-1", kind="advice", cause="stage_imbalance", ranks=[3], function="backward",
                   impact_ms_per_step=2.1, score=6.0, summary="pipeline stage of rank 3 does more work per step "
                   "than the others from the job's start", evidence={"stage_ms": 9.1, "peer_stage_ms": 7.0})
    row.update(over)
    return row


def report_data(incidents: list[dict] | None = None, world: int = 4) -> dict:
    steps = []
    for w in range(12):
        for rank in range(world):
            ms = 22.0 + rank * 0.3 + (15.0 if w >= 5 else 0.0) + 0.4 * math.sin(1.7 * w + rank)
            steps.append({"t": T0 + 5 * w, "rank": rank, "step_time_ms": ms, "steps": 200})
    slow = []
    for rank in range(world):
        for f in FUNCTIONS:
            ms = {"comm:all_reduce": 9.0, "torch.utils.data.DataLoader.__next__": 0.6}.get(f, 4.0)
            if rank == 2 and f.startswith("torch.utils.data"):
                ms = 15.8
            if rank == 2 and f == "comm:all_reduce":
                ms = 1.1
            slow.append({"rank": rank, "function": f, "ms_per_step": ms, "peer_median_ms": 4.0,
                         "slowdown": ms / 4.0})
    late = [{"function": "comm:all_reduce", "rank": r, "late_arrivals": 970 if r == 2 else 10,
             "collectives": 1000, "wait_caused_ms_per_step": 11.8 if r == 2 else 0.0,
             "late_windows": 6 if r == 2 else 0} for r in range(world)]
    incs = [incident()] if incidents is None else incidents
    from perftracker_ml.sinks.report.data import normalize_incident

    return {"job": "demo-1", "title": "perftracker demo: slow-dataloader on rank 2",
            "generated_s": T0 + 70, "missing": [], "step_times": steps, "slowdown": slow,
            "late_arrivals": late, "diagnosis": incs,
            "incidents": [{**normalize_incident(i), "detected_s": DETECTED_S} for i in incs],
            "markers": [{"t": FAULT_S, "kind": "fault", "label": "fault injected: slow-dataloader, rank 2"}]}


LARGE_FUNCTIONS = {"train.py:forward": 60.0, "train.py:backward": 95.0,
                   "torch.utils.data:DataLoader.__next__": 1.0, "torch.optim:Optimizer.step": 4.0,
                   "comm:all_reduce:0": 20.0, "comm:all_gather:1": 6.0}
LARGE_CULPRIT, LARGE_SLOW_HOST = 613, range(296, 304)  # a slow data loader; a host a little slower than most


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat()


def store_rows(world: int = 1024, windows: int = 24, fault_window: int = 10, seed: int = 7) -> dict[str, list]:
    """The rows the report's named queries return for a ``world``-rank job: ``step_times``,
    ``rank_function_slowdown`` and ``collective_late_arrivals`` (column names and shapes as in
    sinks/queries.py), with rank ``LARGE_CULPRIT``'s data loader slow from ``fault_window`` on."""
    rng = random.Random(seed)
    steps = []
    for w in range(windows):
        late = w >= fault_window
        for rank in range(world):
            ms = 180.0 + rng.gauss(0, 1.5) + (4.0 if rank in LARGE_SLOW_HOST else 0.0) + (38.0 if late else 0.0)
            steps.append({"window_start": _iso(T0 + 5 * w), "rank": rank, "step_time_ms": round(ms, 3),
                          "steps": 25})
    per_fn: dict[str, dict[int, float]] = {}
    for f, base in LARGE_FUNCTIONS.items():
        per_fn[f] = {}
        for rank in range(world):
            ms = base * rng.uniform(0.97, 1.03) * (1.02 if rank in LARGE_SLOW_HOST else 1.0)
            if rank == LARGE_CULPRIT and "DataLoader" in f:
                ms = 22.0
            elif f == "comm:all_reduce:0":  # everyone else waits for the culprit inside the all_reduce
                ms = 3.0 if rank == LARGE_CULPRIT else ms + 16.0
            per_fn[f][rank] = ms
    slowdown = []
    for f, by_rank in per_fn.items():
        peer = sorted(by_rank.values())[world // 2]
        slowdown += [{"rank": r, "function": f, "ms_per_step": ms, "peer_median_ms": peer,
                      "slowdown": ms / peer if peer > 0 else 0.0} for r, ms in by_rank.items()]
    calls = 25 * windows
    late_rows = []
    for f in (f for f in LARGE_FUNCTIONS if f.startswith("comm:")):
        for rank in range(world):
            n = int(calls * 0.93) if rank == LARGE_CULPRIT and "all_reduce" in f else rng.choice((0, 0, 0, 1, 2))
            late_rows.append({"function": f, "rank": rank, "late_arrivals": n, "collectives": calls,
                              "wait_caused_ms_per_step": 17.2 if rank == LARGE_CULPRIT and n > 100 else
                              (float("nan") if n == 0 else 0.3), "late_windows": windows - fault_window
                              if rank == LARGE_CULPRIT and n > 100 else min(n, 1), "host_name": f"node-{rank // 8:03d}"})
    return {"step_times": steps, "rank_function_slowdown": slowdown, "collective_late_arrivals": late_rows}


def large_report_data(world: int = 1024) -> dict:
    """A ``world``-rank job's report data, from :func:`store_rows` through the report's own normalizers,
    with an incident on the culprit and a pipeline-stage advice naming the last quarter of the ranks."""
    from perftracker_ml.sinks.report.data import (
        normalize_incident,
        normalize_late_arrivals,
        normalize_slowdown,
        normalize_step_times,
    )

    rows = store_rows(world)
    host = f"node-{LARGE_CULPRIT // 8:03d}"
    incs = [incident(job="big-1", ranks=[LARGE_CULPRIT], hosts=[host], gpus=[LARGE_CULPRIT % 8],
                     function="torch.utils.data:DataLoader.__next__", impact_ms_per_step=38.4, step_time_ms=218.0,
                     summary=f"rank {LARGE_CULPRIT} arrives last at all_reduce: its data loader takes 22.0 ms vs "
                             "1.0 ms on peers, costing 38.4 ms/step",
                     evidence={"value_ms": 22.0, "peer_median_ms": 1.0, "ratio": 22.0,
                               "late_arrival_share": 0.93, "collective": "all_reduce"}),
            advice_row(job="big-1", ranks=list(range(world * 3 // 4, world)), step_time_ms=180.0,
                       impact_ms_per_step=6.5, hosts=[f"node-{r:03d}" for r in range(world * 3 // 32, world // 8)],
                       summary="the last pipeline stage (ranks 768-1023) does more work per step than the "
                               "others from the job's start")]
    return {"job": "big-1", "title": f"perftracker: a {world:,}-rank job, slow data loader on rank {LARGE_CULPRIT}",
            "generated_s": T0 + 130, "missing": [],
            "step_times": normalize_step_times(rows["step_times"]),
            "slowdown": normalize_slowdown(rows["rank_function_slowdown"]),
            "late_arrivals": normalize_late_arrivals(rows["collective_late_arrivals"]),
            "diagnosis": incs,
            "incidents": [{**normalize_incident(i), "detected_s": T0 + 60} for i in incs],
            "markers": [{"t": T0 + 52, "kind": "fault", "label": f"fault injected: slow-dataloader, rank {LARGE_CULPRIT}"}]}
