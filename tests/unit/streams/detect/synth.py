"""Synthetic records for the detection unit tests (plain dicts shaped like the Avro ones)."""

from __future__ import annotations

W_MS = 5000
T0_WINDOW = 340_000_000  # a window id near 2023 in 5 s windows


def pattern(rank: int, function: str, ms_per_step: float, *, window: int = T0_WINDOW, steps: int = 10,
            calls: int = 1, signature: str = "s", kind: int = 3, host: str | None = None,
            p50_ms: float | None = None, **extra) -> dict:
    total_ns = int(ms_per_step * steps * 1e6)
    per_call = ms_per_step / max(calls, 1)
    rec = {"schema_version": 1, "job": "job", "window_id": window, "window_start_ms": window * W_MS,
           "window_s": 5.0, "rank": rank, "world_size": 64, "host": host or f"host{rank // 8}", "gpu": rank % 8,
           "signature": signature, "function": function, "kind": kind, "steps": steps,
           "count": calls * steps, "total_ns": total_ns,
           "p50_ns": int((p50_ms if p50_ms is not None else per_call) * 1e6),
           "p90_ns": int((p50_ms if p50_ms is not None else per_call) * 1e6), "p99_ns": 0,
           "max_ns": 0, "hist": [], "group_ranks": [], "bytes": 0, "seqs": [], "seq_dur_ns": []}
    rec.update(extra)
    return rec


def comm_pattern(rank: int, group: str, seqs: list[int], durs_ms: list[float], members: list[int],
                 *, window: int = T0_WINDOW, steps: int = 10, signature: str = "s") -> dict:
    return pattern(rank, f"comm:all_reduce:{group}", sum(durs_ms) / steps, window=window, steps=steps,
                   calls=max(1, len(seqs) // steps), signature=signature, kind=100, group_ranks=members,
                   seqs=list(seqs), seq_dur_ns=[int(d * 1e6) for d in durs_ms])


def rank_window(rank: int, *, window: int = T0_WINDOW, steps: int = 10, step_ms: float = 100.0,
                world: int = 64, **extra) -> dict:
    rec = {"schema_version": 1, "job": "job", "window_id": window, "window_start_ms": window * W_MS,
           "window_s": 5.0, "rank": rank, "world_size": world, "host": f"host{rank // 8}", "gpu": rank % 8,
           "signature": "s", "functions": [], "steps": steps, "last_step": 100 + steps,
           "step_time_ns": [int(step_ms * 1e6)] * steps, "last_event_ms": window * W_MS + 4000,
           "last_function": "Model.forward", "pending_group": "dp", "pending_seq": 100,
           "dropped_events": 0, "lost_batches": 0, "bytes_received": 0, "hw_samples": 10,
           "sm_clock_mhz": 1950.0, "sm_clock_max_mhz": 1980.0, "temp_c_max": 65.0, "power_w_mean": 600.0,
           "util_gpu_pct": 95.0, "throttle_reasons": 0, "pcie_gen_min": 5, "pcie_width_min": 16,
           "nvlink_errors": 0, "ecc_uncorrected": 0, "xid": 0, "batches": 1}
    rec.update(extra)
    return rec
