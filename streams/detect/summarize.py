"""Stage 1: one rank's EventBatches and HardwareBatches -> per-window records.

Algorithm. Each event's wall time is ``batch.wall_ns - batch.mono_ns + start_ns``
(the rank's own host clock; hosts may be skewed, which only shifts window edges).
Its window is ``floor(wall_ms / window_ms)``. Span durations are reduced by the
collective time nested inside them (union of the rank's comm intervals, same
clock), so a victim's ``backward`` that merely waited in an all-reduce does not
look slow. A window closes when this rank's data has moved ``close_lag_ms`` past
its end, or when ``now_wall_ms`` passes its end + grace (so a silent rank still
produces RankWindows with zero steps: liveness and hang detection need them).
Bad input is skipped and counted in ``skipped``; it never raises.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ...schemas.vocabulary import FUNCTION_PATTERN, RANK_WINDOW, SpanKind
from .accumulate import (
    RankMeta,
    WindowAcc,
    add_kind_aggregates,
    pattern_record,
    rank_window_record,
    signature_of,
)
from .model import comm_function, kind_function
from .policy import DetectionPolicy

FUTURE_SLACK_MS = 1000  # an event may end at most this long after its batch's wall time
HW_FIELDS = ("sm_clock_mhz", "sm_clock_max_mhz", "temp_c", "power_w", "util_gpu_pct",
             "pcie_gen", "pcie_width", "nvlink_errors", "ecc_uncorrected", "xid")


def covered_ns(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length (ns) of [a_i, b_i) covered by the union of intervals [starts, ends)."""
    if len(starts) == 0:
        return np.zeros(len(a), dtype=np.int64)
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    e = np.maximum.accumulate(e)  # merge overlaps: clip each start to the running end
    s = np.maximum(s, np.concatenate([[s[0]], e[:-1]]))
    seg = np.maximum(e - s, 0)
    cum = np.concatenate([[0], np.cumsum(seg)])

    def upto(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(s, t, side="right")
        prev = np.clip(i - 1, 0, len(s) - 1)
        part = np.clip(t - s[prev], 0, seg[prev])
        return np.where(i > 0, cum[np.maximum(i - 1, 0)] + part, 0)

    return upto(b) - upto(a)


class RankSummarizer:
    """Per (job, rank) window accumulator; see the module docstring."""

    def __init__(self, job: str, rank: int, policy: DetectionPolicy | None = None):
        self.job, self.rank = job, int(rank)
        self.policy = policy or DetectionPolicy()
        self.skipped: Counter[str] = Counter()
        self.meta = RankMeta(job, self.rank, 0, "", -1)
        self.windows: dict[int, WindowAcc] = {}
        self.next_window: int | None = None  # lowest window not yet closed
        self.data_ms = 0  # latest event wall time seen
        self.last_input_ms = 0  # caller clock of the latest input
        self.sticky: dict[str, Any] = {"last_step": -1, "last_function": "", "pending_group": "",
                                       "pending_seq": -1, "last_event_ms": 0}
        self.health = {"dropped_events": 0, "lost_batches": 0, "bytes_received": 0}
        self.collector_dropped = 0  # the batch header's cumulative count
        self.dropped_here = 0  # well-formed events this summarizer could not place in an open window
        self._batch_seq: tuple[int, int] | None = None  # (pid, last seq)
        self._batch_wall_ms = 0
        self.batches_since_close = 0  # sign of life, heartbeats included

    # ---- input -------------------------------------------------------------------------
    def add_events(self, batch: dict, now_wall_ms: int | None = None) -> None:
        """Fold one decoded EventBatch in. Never raises on bad content."""
        try:
            if int(batch["rank"]) != self.rank or batch["job"] != self.job:
                self.skipped["wrong_rank_or_job"] += 1
                return
            if not self._accept_seq(int(batch.get("pid", 0)), int(batch["seq"])):
                return
            self.batches_since_close += 1
            self.meta = RankMeta(self.job, self.rank, int(batch["world_size"]),
                                 str(batch["host"]), int(batch["gpu"]))
            self.collector_dropped = int(batch.get("dropped_events", 0))
            offset_ns = int(batch["wall_ns"]) - int(batch["mono_ns"])
            self._batch_wall_ms = int(batch["wall_ns"]) // 1_000_000
            names = list(batch["names"])
            comm_iv = self._add_comms(batch, names, offset_ns)
            self._add_spans(batch["spans"], names, offset_ns, comm_iv)
            self._add_iterations(batch["iterations"], offset_ns)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self.skipped[f"bad_batch:{type(exc).__name__}"] += 1
        if now_wall_ms is not None:
            self.last_input_ms = int(now_wall_ms)

    def _accept_seq(self, pid: int, seq: int) -> bool:
        prev = self._batch_seq
        if prev is not None and prev[0] == pid:
            if seq <= prev[1]:
                self.skipped["duplicate_batch"] += 1
                return False
            self.health["lost_batches"] += max(0, seq - prev[1] - 1)
        self._batch_seq = (pid, seq)
        return True

    def _window_for(self, wall_ms: int) -> WindowAcc | None:
        if not self._plausible(wall_ms):
            return None
        wid = wall_ms // self.policy.window_ms
        if self.next_window is not None and wid < self.next_window:
            self.skipped["late_event"] += 1
            self.dropped_here += 1
            return None
        if wid not in self.windows:
            if len(self.windows) >= self.policy.max_open_windows:
                self.skipped["too_many_open_windows"] += 1
                self.dropped_here += 1
                return None
            self.windows[wid] = WindowAcc()
        return self.windows[wid]

    def _plausible(self, wall_ms: int) -> bool:
        """Events happen before their batch is sent, and not hours before (a corrupt
        timestamp must not open far-away windows or close the current ones early)."""
        ref = self._batch_wall_ms
        if ref and not (ref - self.policy.max_duration_s * 1000 <= wall_ms <= ref + FUTURE_SLACK_MS):
            self.skipped["bad_timestamp"] += 1
            return False
        return True

    def _valid(self, cols: dict, keys: tuple[str, ...]) -> tuple[np.ndarray, ...] | None:
        arrays = tuple(np.asarray(cols[k], dtype=np.float64) for k in keys)
        if len({len(a) for a in arrays}) > 1:
            self.skipped["ragged_columns"] += 1
            return None
        return arrays

    def _bad_dur(self, dur: float) -> bool:
        if not np.isfinite(dur) or dur < 0 or dur > self.policy.max_duration_s * 1e9:
            self.skipped["bad_duration"] += 1
            return True
        return False

    def _note_event(self, wall_ms: int, function: str) -> None:
        ref = self._batch_wall_ms
        if ref and not (ref - self.policy.max_duration_s * 1000 <= wall_ms <= ref + FUTURE_SLACK_MS):
            return
        if wall_ms >= self.sticky["last_event_ms"]:
            self.sticky["last_event_ms"] = wall_ms
            self.sticky["last_function"] = function
        self.data_ms = max(self.data_ms, wall_ms)
        if self.next_window is None:
            self.next_window = wall_ms // self.policy.window_ms

    def _add_comms(self, batch: dict, names: list[str], offset_ns: int) -> tuple[np.ndarray, np.ndarray]:
        cols = batch["comms"]
        arrays = self._valid(cols, ("op", "group", "seq", "bytes", "start_ns", "dur_ns"))
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if arrays is None:
            return empty
        groups = batch.get("groups", [])
        starts, ends = [], []
        for op, grp, seq, nbytes, start, dur in zip(*arrays, strict=False):
            if not (0 <= op < len(names) and 0 <= grp < len(groups)):
                self.skipped["bad_name_index"] += 1
                continue
            g = groups[int(grp)]
            fname = comm_function(names[int(op)], str(g["group_id"]))
            wall_ms = int((offset_ns + start + max(dur, 0)) // 1_000_000)
            if dur < 0 and np.isfinite(dur):  # entry marker of a call still in flight
                self._note_pending(str(g["group_id"]), int(seq), fname, wall_ms)
                self.skipped["in_flight_collective"] += 1
                continue
            if self._bad_dur(dur):
                continue
            self._note_pending(str(g["group_id"]), int(seq), fname, wall_ms)
            w = self._window_for(wall_ms)
            if w is None:
                continue
            acc = w.fn(fname, int(SpanKind.COLLECTIVE))
            acc.seqs.append(int(seq))
            acc.seq_durs.append(int(dur))
            acc.group_ranks = [int(r) for r in g["ranks"]]
            acc.bytes += int(nbytes)
            w.last_event_ms = max(w.last_event_ms, wall_ms)
            starts.append(int(start))
            ends.append(int(start + dur))
        return np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def _note_pending(self, group: str, seq: int, fname: str, wall_ms: int) -> None:
        if group != self.sticky["pending_group"] or seq >= self.sticky["pending_seq"]:
            if wall_ms >= self.sticky["last_event_ms"] or seq > self.sticky["pending_seq"]:
                self.sticky["pending_group"], self.sticky["pending_seq"] = group, seq
        self._note_event(wall_ms, fname)

    def _add_spans(self, cols: dict, names: list[str], offset_ns: int,
                   comm_iv: tuple[np.ndarray, np.ndarray]) -> None:
        arrays = self._valid(cols, ("kind", "name", "start_ns", "dur_ns"))
        if arrays is None:
            return
        kind, name, start, dur = arrays
        ok = np.isfinite(dur) & (dur >= 0) & (dur <= self.policy.max_duration_s * 1e9)
        if not ok.all():
            self.skipped["bad_duration"] += int((~ok).sum())
        start, dur = start.astype(np.int64), np.where(ok, dur, 0).astype(np.int64)
        net = dur - covered_ns(comm_iv[0], comm_iv[1], start, start + dur)
        for k, n, s, d, keep in zip(kind, name, start, net, ok, strict=False):
            if not keep:
                continue
            if not 0 <= n < len(names):
                self.skipped["bad_name_index"] += 1
                continue
            wall_ms = int((offset_ns + s) // 1_000_000)
            fname = names[int(n)] or kind_function(int(k))
            self._note_event(wall_ms, fname)
            w = self._window_for(wall_ms)
            if w is not None:
                w.add_duration(fname, int(k), int(d))
                w.last_event_ms = max(w.last_event_ms, wall_ms)

    def _add_iterations(self, cols: dict, offset_ns: int) -> None:
        arrays = self._valid(cols, ("step", "start_ns", "dur_ns"))
        if arrays is None:
            return
        for step, start, dur in zip(*arrays, strict=False):
            if self._bad_dur(dur):
                continue
            wall_ms = int((offset_ns + start + dur) // 1_000_000)
            if not self._plausible(wall_ms):
                continue
            self.data_ms = max(self.data_ms, wall_ms)
            if self.next_window is None:
                self.next_window = wall_ms // self.policy.window_ms
            w = self._window_for(wall_ms)
            if w is None:
                continue
            w.steps.append(int(step))
            w.step_ns.append(int(dur))
            self.sticky["last_step"] = max(self.sticky["last_step"], int(step))

    def add_hardware(self, hw: dict, now_wall_ms: int | None = None) -> None:
        """Fold one decoded HardwareBatch in (samples bucketed by their wall time)."""
        try:
            if int(hw["rank"]) != self.rank:
                self.skipped["wrong_rank_or_job"] += 1
                return
            walls = list(hw["wall_ns"])
            for i, wall in enumerate(walls):
                w = self._window_for(int(wall) // 1_000_000)
                if w is None:
                    continue
                for f in HW_FIELDS:
                    w.hw.setdefault(f, []).append(float(hw[f][i]))
                reasons = int(hw["throttle_reasons"][i])
                w.throttle |= reasons if reasons > 0 else 0
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self.skipped[f"bad_hardware:{type(exc).__name__}"] += 1
        if now_wall_ms is not None:
            self.last_input_ms = int(now_wall_ms)

    # ---- output ------------------------------------------------------------------------
    def poll(self, now_wall_ms: int, flush: bool = False) -> list[tuple[str, dict]]:
        """Close every finished window, in order; ``flush`` closes all open ones."""
        out: list[tuple[str, dict]] = []
        if self.next_window is None:
            return out
        wms, lag, grace = self.policy.window_ms, self.policy.close_lag_ms, self.policy.grace_ms
        last_open = max(self.windows) if self.windows else self.next_window - 1
        while True:
            wid = self.next_window
            end = (wid + 1) * wms
            # by the rank's own data; by the caller's clock only once the rank went quiet, so a
            # replay or a lagging consumer (data far behind now) still fills its windows
            quiet = now_wall_ms - self.last_input_ms > grace
            done = self.data_ms >= end + lag or (quiet and now_wall_ms > end + grace)
            if not (done or (flush and wid <= last_open)):
                break
            if not self.windows.get(wid) and self._silent_too_long(now_wall_ms, end):
                break
            out.extend(self._close(wid, self.windows.pop(wid, WindowAcc())))
            self.next_window = wid + 1
        return out

    def _silent_too_long(self, now_wall_ms: int, end_ms: int) -> bool:
        """Stop emitting empty windows once the rank has been silent for idle_after_s."""
        return end_ms - self.data_ms > self.policy.idle_after_s * 1000

    def _close(self, wid: int, w: WindowAcc) -> list[tuple[str, dict]]:
        sig = signature_of(w.functions)
        wsec = self.policy.window_s
        out: list[tuple[str, dict]] = []
        steps = len(w.steps)
        if w.functions or steps:
            add_kind_aggregates(w)
        for name, acc in sorted(w.functions.items()):
            out.append((FUNCTION_PATTERN, pattern_record(self.meta, wid, wsec, sig, name, acc, steps)))
        self.health["dropped_events"] = self.collector_dropped + self.dropped_here
        out.append((RANK_WINDOW, rank_window_record(self.meta, wid, wsec, sig, w, self.sticky, self.health,
                                                     batches=self.batches_since_close)))
        self.batches_since_close = 0
        return out

    def idle(self, now_wall_ms: int) -> bool:
        """True when nothing is open and no input came for idle_after_s (caller may drop us)."""
        quiet_ms = self.policy.idle_after_s * 1000
        return not self.windows and now_wall_ms - max(self.last_input_ms, self.data_ms) > quiet_ms
