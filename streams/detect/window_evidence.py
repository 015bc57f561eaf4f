"""The evidence fields of a closed window's RankWindow: its hardware samples reduced (means; max
for temperature, errors and clock limit; min for PCIe generation and width), its CPU samples and
sampled frames, its network samples (:func:`.rank_records.rank_window_record`)."""

from __future__ import annotations

import json

import numpy as np

from ...schemas.records import RankCpu, RankHardware, RankNet
from .accumulate import CpuAcc, NetAcc, WindowAcc


def _mean(xs: list[float]) -> float:
    vals = [x for x in xs if x >= 0]
    return float(np.mean(vals)) if vals else -1.0


def _agg(xs: list[float], how: str) -> float:
    vals = [x for x in xs if x >= 0]
    if not vals:
        return -1.0
    return float(max(vals) if how == "max" else min(vals))


def hardware_fields(w: WindowAcc) -> RankHardware:
    """The window's hardware samples reduced; -1 (or 0 for counters) when none were taken."""
    hw = w.hw
    return RankHardware(
        hw_samples=len(hw.get("sm_clock_mhz", [])),
        sm_clock_mhz=_mean(hw.get("sm_clock_mhz", [])),
        sm_clock_max_mhz=_agg(hw.get("sm_clock_max_mhz", []), "max"),
        temp_c_max=_agg(hw.get("temp_c", []), "max"),
        power_w_mean=_mean(hw.get("power_w", [])),
        util_gpu_pct=_mean(hw.get("util_gpu_pct", [])),
        throttle_reasons=int(w.throttle),
        pcie_gen_min=int(_agg(hw.get("pcie_gen", []), "min")),
        pcie_width_min=int(_agg(hw.get("pcie_width", []), "min")),
        nvlink_errors=int(max(0.0, _agg(hw.get("nvlink_errors", []), "max"))),
        ecc_uncorrected=int(max(0.0, _agg(hw.get("ecc_uncorrected", []), "max"))),
        xid=int(max(0.0, _agg(hw.get("xid", []), "max"))))


TOP_FRAMES = 8  # per kind


def _per_step(total: int, steps: int) -> float:
    return round(total / steps, 4) if total >= 0 and steps > 0 else -1.0


def cpu_fields(cpu: CpuAcc, steps: int) -> RankCpu:
    """The window's CPU evidence: ratios and per-step rates (-1 unknown), top frames per kind."""
    wall, busy = cpu.total("interval_ns"), cpu.total("thread_cpu_ns")
    wait = cpu.total("runqueue_wait_ns")
    top = sorted(cpu.frames.items(), key=lambda kv: (-kv[0][1], -kv[1], kv[0][0]))
    frames = [kv for kind in (1, 0) for kv in [x for x in top if x[0][1] == kind][:TOP_FRAMES]]
    return RankCpu(
        cpu_samples=cpu.samples,
        cpu_ratio=round(busy / wall, 4) if busy >= 0 and wall > 0 else -1.0,
        runqueue_wait_ms_per_step=_per_step(wait, steps) / 1e6 if wait >= 0 and steps > 0 else -1.0,
        involuntary_switches_per_step=_per_step(cpu.total("involuntary_switches"), steps),
        voluntary_switches_per_step=_per_step(cpu.total("voluntary_switches"), steps),
        major_faults=cpu.total("major_faults"), load1=cpu.load1,
        steal_pct=round(float(np.mean(cpu.steal)), 3) if cpu.steal else -1.0,
        stack_samples=cpu.stack_samples, stack_hz=cpu.stack_hz,
        top_frames=[k[0] for k, _ in frames], top_frame_samples=[n for _, n in frames],
        top_frame_kinds=[k[1] for k, _ in frames])


def net_fields(net: NetAcc) -> RankNet:
    """The window's network evidence (RankWindow v6 ``net_*``, ``ib_*``; -1 unknown): the host's
    retransmit share and throughput, and per remote address the unsent bytes of each sample
    that found the rank's connections to it non-empty."""
    wall_s = net.total("interval_ns") / 1e9
    sent, retrans = net.total("out_segs"), net.total("retrans_segs")

    def rate(key: str, scale: float) -> float:
        v = net.total(key)
        return round(v / scale / wall_s, 4) if v >= 0 and wall_s > 0 else -1.0

    backlog = dict(sorted(net.backlog.items()))
    return RankNet(net_samples=net.samples, net_addr=net.addr,
                   net_retrans_pct=round(100.0 * retrans / sent, 4) if sent > 0 and retrans >= 0 else -1.0,
                   net_tx_mb_per_s=rate("tx_bytes", 1e6), net_rx_mb_per_s=rate("rx_bytes", 1e6),
                   net_backlog_json=json.dumps(backlog) if backlog else "",
                   ib_xmit_wait_per_s=rate("ib_xmit_wait", 1.0), ib_errors=net.total("ib_errors"))
