"""A report's data as the store would give it for the default demo (rank 2's data loader)."""

from __future__ import annotations

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


def report_data(incidents: list[dict] | None = None) -> dict:
    steps = []
    for w in range(12):
        for rank in range(4):
            ms = 22.0 + rank * 0.3 + (15.0 if w >= 5 else 0.0)
            steps.append({"t": T0 + 5 * w, "rank": rank, "step_time_ms": ms, "steps": 200})
    slow = []
    for rank in range(4):
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
             "late_windows": 6 if r == 2 else 0} for r in range(4)]
    incs = [incident()] if incidents is None else incidents
    from perftracker_ml.sinks.report.data import normalize_incident

    return {"job": "demo-1", "title": "perftracker demo: slow-dataloader on rank 2",
            "generated_s": T0 + 70, "missing": [], "step_times": steps, "slowdown": slow,
            "late_arrivals": late, "diagnosis": incs,
            "incidents": [{**normalize_incident(i), "detected_s": DETECTED_S} for i in incs],
            "markers": [{"t": FAULT_S, "kind": "fault", "label": "fault injected: slow-dataloader, rank 2"}]}
