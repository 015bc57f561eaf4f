"""Simulated NVML readings and pending-collective state per rank for one window."""

from __future__ import annotations

import numpy as np

from .state import SimState

SW_POWER_CAP, SW_THERMAL, HW_THERMAL = 0x4, 0x20, 0x40


def hardware_fields(sim: SimState, w: int) -> dict[str, list]:
    """Per-rank RankWindow hardware columns; faults with hw_evidence change them."""
    n = sim.layout.ranks
    rng = sim.rng
    clock = np.full(n, 1980.0) - rng.uniform(0, 40, n)
    temp = rng.uniform(55, 76, n)
    reasons = np.where(rng.random(n) < 0.2, SW_POWER_CAP, 0)
    width = np.full(n, 16)
    for f in sim.faults:
        if not (f.active(w) and f.hw_evidence):
            continue
        r = list(f.ranks)
        if f.family == "gpu_throttle":
            clock[r] = 1980.0 / f.magnitude
            temp[r] = 91.0
            reasons[r] = reasons[r] | SW_THERMAL | HW_THERMAL
        elif f.family == "slow_link":
            width[r] = 8
    return {"hw_samples": [10] * n, "sm_clock_mhz": clock.tolist(), "sm_clock_max_mhz": [1980.0] * n,
            "temp_c_max": temp.tolist(), "power_w_mean": rng.uniform(550, 690, n).tolist(),
            "util_gpu_pct": [97.0] * n, "throttle_reasons": reasons.astype(int).tolist(),
            "pcie_gen_min": [5] * n, "pcie_width_min": width.astype(int).tolist(), "nvlink_errors": [0] * n,
            "ecc_uncorrected": [0] * n, "xid": [0] * n}


def pending_fields(sim: SimState, mask: np.ndarray, step_ids: np.ndarray) -> dict[str, list]:
    """last_function / pending_group / pending_seq; during a hang the culprit is stuck in
    backward and everyone else waits inside a collective it never reached."""
    lay, n = sim.layout, sim.layout.ranks
    last = sim.step_no - 1 if not mask.any() else int(step_ids[mask.any(axis=1)].max())
    dp_group = [f"dp_{p}_{t}" for p, t in zip(sim.p, sim.t, strict=False)]
    tp_group = [f"tp_{p}_{d}" for p, d in zip(sim.p, sim.d, strict=False)]
    use_tp = lay.tp > 1
    group = tp_group if use_tp else dp_group
    seq = np.full(n, 2 * last + 1 if use_tp else last)
    fn = ["Optimizer.step"] * n
    pend_group = list(dp_group) if lay.dp > 1 else list(group)
    pend_seq = np.full(n, last)
    hang = next((f for f in sim.faults if f.family == "hang"), None)
    if sim.hung_at is not None and hang is not None and not mask.any():
        culprit = hang.ranks[0]
        peers = [r for r in range(n) if group[r] == group[culprit]]
        pend_group = [dp_group[r] if lay.dp > 1 else group[r] for r in range(n)]
        pend_seq = np.full(n, last + 1)
        for r in peers:
            pend_group[r] = group[r]
            pend_seq[r] = seq[r] + 1 if use_tp else last + 1
            fn[r] = "comm:all_reduce:" + group[r]
        pend_group[culprit] = group[culprit]
        pend_seq[culprit] = seq[culprit] if use_tp else last
        fn[culprit] = f"PipelineStage{sim.p[culprit]}.forward"
    return {"last_step": [last] * n, "last_function": fn, "pending_group": pend_group,
            "pending_seq": pend_seq.astype(int).tolist()}
