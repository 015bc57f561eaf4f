"""Turn simulated steps of one window into FunctionPattern and RankWindow dicts.

Besides the host spans (``SPANS``) and their per-kind aggregates (``KIND_AGG``), every rank
(all are GPU ranks) gets the patterns of its device spans (``DEVICE_SPANS``): forward,
backward and optimizer step as the collectors time them between CUDA events on a CUDA
rank, kind ``SpanKind.DEVICE``, named ``cuda:`` + the host function's name, and their
per-phase aggregates (``DEVICE_AGG``: ``kind:device.forward`` ..., as the summarizer adds
them on a rank with device spans).
"""

from __future__ import annotations

import numpy as np

from ....collectors.cuda_timing import DEVICE_PREFIX
from ....schemas.vocabulary import SpanKind
from .hardware import hardware_fields, pending_fields
from .state import SimState

MS = 1_000_000
T0_MS = 1_700_000_000_000 // 5000 * 5000
# (name or None for per-stage names, value key, span kind, count key)
SPANS = [("DataLoader.__next__", "dl", 1, None), ("Trainer.log_metrics", "py", 0, None),
         (None, "fwd", 3, None), (None, "bwd", 4, None), ("Optimizer.step", "opt", 2, None),
         ("gc.collect", "gc", 5, "gc"), ("MoE.experts", "experts", 0, "calls"),
         ("Checkpoint.save", "ckpt", 6, "ckpt")]
# (host span as in SPANS, value key of its device time): kind DEVICE, name cuda:<host name>
DEVICE_SPANS = [(None, "fwd", "dev_fwd"), (None, "bwd", "dev_bwd"), ("Optimizer.step", "opt", "dev_opt")]
KIND_AGG = [("kind:dataloader", "dl", 1), ("kind:forward", "fwd", 3), ("kind:backward", "bwd", 4),
            ("kind:optimizer", "opt", 2), ("kind:gc", "gc", 5)]
DEVICE_AGG = [("kind:device.forward", "dev_fwd"), ("kind:device.backward", "dev_bwd"),
              ("kind:device.optimizer", "dev_opt")]


def _stack(steps: list[dict], key: str, n: int) -> np.ndarray:
    return np.stack([s[key] if key in s else np.zeros(n) for s in steps]) if steps else np.zeros((0, n))


def emit_window(sim: SimState, w: int) -> list[tuple[str, dict]]:
    _lay, n = sim.layout, sim.layout.ranks
    lo, hi = w * sim.w_ms, (w + 1) * sim.w_ms
    steps = sim.steps
    end = _stack(steps, "end_wall", n)
    mask = (end >= lo) & (end < hi)  # steps x ranks
    nsteps = mask.sum(axis=0)
    base = {"schema_version": 1, "job": sim.job, "window_id": T0_MS // int(sim.w_ms) + w,
            "window_start_ms": T0_MS + int(lo), "window_s": sim.window_s, "world_size": n}
    rank_base = [dict(base, rank=r, host=f"host{sim.host[r]}", gpu=r % 8, signature=f"stage{sim.p[r]}")
                 for r in range(n)]
    out: list[tuple[str, dict]] = []
    has = nsteps > 0
    for name, key, kind, count_key in SPANS:
        vals = _stack(steps, key, n)
        counts = _stack(steps, count_key, n) > 0 if count_key in ("gc", "ckpt") else (
            _stack(steps, count_key, n) if count_key else np.ones_like(vals))
        if key == "experts" and not sim.moe:
            continue
        out += _patterns(rank_base, name, key, kind, vals, counts, mask, nsteps, has, sim)
    for name, phase, key in DEVICE_SPANS:
        vals = _stack(steps, key, n)
        out += _patterns(rank_base, name, key, int(SpanKind.DEVICE), vals, np.ones_like(vals), mask, nsteps, has,
                         sim, prefix=DEVICE_PREFIX, phase=phase)
    for name, key in DEVICE_AGG:
        vals = _stack(steps, key, n)
        out += _patterns(rank_base, name, key, int(SpanKind.DEVICE), vals, np.ones_like(vals), mask, nsteps, has, sim)
    for name, key, kind in KIND_AGG:
        vals = _stack(steps, key, n)
        counts = (vals > 0) if key == "gc" else np.ones_like(vals)
        out += _patterns(rank_base, name, key, kind, vals, counts, mask, nsteps, has, sim)
    out += _comm_patterns(sim, rank_base, mask, nsteps)
    functions: dict[int, list[str]] = {}
    for _name, rec in out:
        if not rec["function"].startswith("kind:"):
            functions.setdefault(rec["rank"], []).append(rec["function"])
    out += _rank_windows(sim, rank_base, mask, nsteps, w, functions)
    return out


def masked_quantiles(vals: np.ndarray, mask: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """Per-column quantiles (nearest rank) of the masked entries; 0 where none. (len(qs), R)."""
    x = np.sort(np.where(mask, vals, np.inf), axis=0)
    n = mask.sum(axis=0)
    out = np.zeros((len(qs), vals.shape[1]))
    cols = np.arange(vals.shape[1])
    for i, q in enumerate(qs):
        idx = np.clip(np.ceil(q * n).astype(np.int64) - 1, 0, max(len(x) - 1, 0))
        out[i] = np.where(n > 0, x[idx, cols], 0.0) if len(x) else 0.0
    return out


def _patterns(rank_base, name, key, kind, vals, counts, mask, nsteps, has, sim, prefix: str = "",
              phase: str = "") -> list[tuple[str, dict]]:
    """One FunctionPattern per rank with steps (or calls) in the window; ``name`` None: the
    per-stage forward/backward (``phase`` or ``key`` fwd/bwd); ``prefix`` before the name."""
    total = (vals * mask).sum(axis=0)
    count = (counts * mask).sum(axis=0)
    per_call = vals / np.maximum(counts, 1)
    q = masked_quantiles(per_call, mask & (counts > 0), (0.5, 0.9, 0.99, 1.0))
    out = []
    tot, cnt, ns = (total * MS).astype(np.int64).tolist(), count.astype(np.int64).tolist(), nsteps.tolist()
    qs = (q * MS).astype(np.int64).tolist()
    fwd = (phase or key) == "fwd"
    stage_name = {p: f"{prefix}PipelineStage{p}.{'forward' if fwd else 'backward'}" for p in set(sim.p.tolist())}
    for r in np.flatnonzero(has | (count > 0)).tolist():
        if name and not name.startswith("kind:") and cnt[r] == 0:
            continue
        function = prefix + name if name else stage_name[int(sim.p[r])]
        out.append(("FunctionPattern", dict(
            rank_base[r], function=function, kind=kind, steps=ns[r], count=cnt[r],
            total_ns=tot[r], p50_ns=qs[0][r], p90_ns=qs[1][r], p99_ns=qs[2][r], max_ns=qs[3][r], hist=[],
            group_ranks=[], bytes=0, seqs=[], seq_dur_ns=[])))
    return out


def _groups(sim: SimState) -> list[tuple[str, str, int, np.ndarray]]:
    """(op, value key, seqs per step, group id per rank) of each collective family."""
    lay = sim.layout
    out = []
    if lay.tp > 1:
        gid = np.array([f"tp_{p}_{d}" for p, d in zip(sim.p, sim.d, strict=False)])
        out += [("all_reduce", "tp1", 0, gid), ("all_reduce", "tp2", 1, gid)]
    if lay.pp > 1:
        out.append(("send_recv", "pp", 0, np.array([f"pp_{d}_{t}" for d, t in zip(sim.d, sim.t, strict=False)])))
    if lay.dp > 1:
        out.append(("all_reduce", "dp", 0, np.array([f"dp_{p}_{t}" for p, t in zip(sim.p, sim.t, strict=False)])))
    return out


def _comm_patterns(sim, rank_base, mask, nsteps) -> list[tuple[str, dict]]:
    n = sim.layout.ranks
    step_ids = np.array([s["step"] for s in sim.steps], dtype=np.int64)
    fams: dict[tuple[str, str], list] = {}
    for op, key, k, gid in _groups(sim):
        fams.setdefault((op, key[:2]), []).append((key, k, gid))
    out = []
    members: dict[str, list[int]] = {}
    for fam in fams.values():
        for r, g in enumerate(fam[0][2]):
            members.setdefault(g, []).append(r)
    for (op, _), parts in fams.items():
        per = len(parts)
        gid = parts[0][2]
        # steps x per x ranks -> (steps*per) x ranks in seq order (seq = step * per + k)
        d = np.stack([_stack(sim.steps, key, n) for key, _, _ in parts], axis=1).reshape(-1, n)
        m = np.repeat(mask, per, axis=0)
        qs = (masked_quantiles(d, m, (0.5, 0.9, 0.99, 1.0)) * MS).astype(np.int64).tolist()
        tot = ((d * m).sum(axis=0) * MS).astype(np.int64).tolist()
        d_ns = (d * MS).astype(np.int64)
        seq_all = (step_ids[:, None] * per + np.arange(per)[None, :]).reshape(-1)
        ns, gids = nsteps.tolist(), gid.tolist()
        for r in np.flatnonzero(nsteps > 0).tolist():
            idx = np.flatnonzero(m[:, r])
            seqs = seq_all[idx].tolist()
            out.append(("FunctionPattern", dict(
                rank_base[r], function=f"comm:{op}:{gids[r]}", kind=100, steps=ns[r],
                count=len(seqs), total_ns=tot[r], p50_ns=qs[0][r], p90_ns=qs[1][r], p99_ns=qs[2][r],
                max_ns=qs[3][r], hist=[], group_ranks=members[gids[r]], bytes=len(seqs) << 24,
                seqs=seqs, seq_dur_ns=d_ns[idx, r].tolist())))
    return out


def _rank_windows(sim, rank_base, mask, nsteps, w, functions: dict[int, list[str]]) -> list[tuple[str, dict]]:
    """RankWindows: steps, hardware, pending collectives, the functions the rank reported, and
    its run-queue wait per step (the scheduler evidence a collector reads from /proc)."""
    n = sim.layout.ranks
    iters = _stack(sim.steps, "iter", n)
    rq = _stack(sim.steps, "rq", n)
    step_ids = np.array([s["step"] for s in sim.steps], dtype=np.int64)
    hw = hardware_fields(sim, w)
    pend = pending_fields(sim, mask, step_ids)
    out = []
    for r in range(n):
        idx = np.flatnonzero(mask[:, r])
        out.append(("RankWindow", dict(
            rank_base[r], functions=sorted(functions.get(r, [])), steps=int(nsteps[r]),
            runqueue_wait_ms_per_step=float(rq[idx, r].mean()) if len(idx) else -1.0,
            last_step=int(step_ids[idx].max()) if len(idx) else pend["last_step"][r],
            step_time_ns=[int(x * MS) for x in iters[idx, r]],
            last_event_ms=int(rank_base[r]["window_start_ms"] + sim.w_ms - 1) if len(idx) else 0,
            dropped_events=0, lost_batches=0, bytes_received=0, batches=1,  # alive: heartbeats arrive
            **{k: v[r] for k, v in hw.items()},
            **{k: v[r] for k, v in pend.items() if k != "last_step"})))
    return out
