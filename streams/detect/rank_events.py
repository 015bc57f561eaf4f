"""Folding one rank's EventBatch columns into its open windows.

Each event's wall time is ``batch.wall_ns - batch.mono_ns + start_ns`` (the rank's own
host clock; hosts may be skewed, which only shifts window edges). Collectives are
folded first: each completed call adds its (seq, time inside the call) to the window
its end falls in, and its interval [start, end) to the rank's comm intervals. Span
durations are then reduced by the collective time nested inside them (the length of
the span covered by the union of those intervals, same monotonic clock), so a victim's
``backward`` that merely waited in an all-reduce does not look slow. Iterations add
their step and duration to the window they end in. A comm event with ``dur_ns < 0`` is
the entry marker of a call still in flight: it only moves the rank's pending
collective (hang culprits). A time that is not a finite number is counted
(``bad_timestamp``, ``bad_duration``) and its event left out, never read. A batch with nothing completed in it (a heartbeat, or only
entry markers) moves the rank's data to the batch's time, so a stalled or waiting rank's
windows keep closing. Bad columns and values are counted in ``skipped``.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...schemas.vocabulary import SpanKind
from .accumulate import RankProgress
from .model import comm_function, kind_function
from .policy import DetectionPolicy
from .rank_windows import RankWindows


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


def _as_list(column: Any) -> list:
    """A column as a list of Python numbers (an EventBatch v8 column is a numpy array)."""
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


@functools.lru_cache(maxsize=8192)  # a job's stacks repeat the same few hundred frames
def frame_text(name: str, line: int, code: str) -> str:
    """``'<file> <function>'`` + line + source -> ``'train.py:88 step `x.clone()`'``."""
    file, _, func = name.rpartition(" ")
    text = f"{file or func}:{line} {func}" if file else f"{func}:{line}"
    return f"{text} `{code}`" if code else text


class EventFolder:
    """Adds one rank's events to its windows and its progress; see the module docstring."""

    def __init__(self, windows: RankWindows, progress: RankProgress, policy: DetectionPolicy,
                 skipped: Counter[str]):
        self.windows, self.progress, self.policy = windows, progress, policy
        self.skipped = skipped  # shared with the summarizer

    def fold(self, batch: dict) -> None:
        """Fold one EventBatch's comms, spans and iterations in (raises on a malformed batch)."""
        offset_ns = int(batch["wall_ns"]) - int(batch["mono_ns"])
        self.windows.batch_wall_ms = int(batch["wall_ns"]) // 1_000_000
        names = list(batch["names"])
        comm_iv = self._add_comms(batch, names, offset_ns)
        self._add_spans(batch["spans"], names, offset_ns, comm_iv)
        self._add_iterations(batch["iterations"], offset_ns)
        if not (len(batch["spans"]["kind"]) or len(batch["iterations"]["step"]) or len(comm_iv[0])):
            # nothing completed since the previous batch (a heartbeat, or calls still in flight):
            # the rank's data reached the batch's time, so its windows close as it keeps reporting
            self.windows.note_data(self.windows.batch_wall_ms)
        self._add_cpu(batch, names)
        self._add_net(batch)

    def _add_net(self, batch: dict) -> None:
        """EventBatch v7 network samples go to the window the batch was built in, as CPU ones."""
        net = batch.get("net") or []
        w = self.windows.slot(self.windows.batch_wall_ms) if net else None
        if w is not None:
            for sample in net:
                w.net.add_sample(sample)

    def _add_cpu(self, batch: dict, names: list[str]) -> None:
        """EventBatch v3 CPU samples and stack rows go to the window the batch was built in
        (they cover the flush interval that ends there); older batches have none."""
        cpu, stacks = batch.get("cpu") or [], batch.get("stacks") or {}
        if not cpu and not len(stacks.get("frame", ())):
            return
        w = self.windows.slot(self.windows.batch_wall_ms)
        if w is None:
            return
        for sample in cpu:
            w.cpu.add_sample(sample)
        # lists (v1..v7) or arrays (v8): Python ints either way
        cols = [_as_list(stacks.get(k, [])) for k in ("frame", "line", "kind", "count")]
        codes = _as_list(stacks.get("code", [])) or [-1] * len(cols[0])
        if len({len(c) for c in cols} | {len(codes)}) > 1:
            self.skipped["ragged_columns"] += 1
            return
        frames, n = w.cpu.frames, len(names)
        for frame, line, kind, count, code in zip(*cols, codes, strict=True):
            if not (0 <= frame < n and -1 <= code < n):
                self.skipped["bad_name_index"] += 1
                continue
            key = (frame_text(names[frame], int(line), names[code] if code >= 0 else ""), int(kind))
            frames[key] = frames.get(key, 0) + int(count)  # (frame text, kind) -> samples

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

    def _add_comms(self, batch: dict, names: list[str], offset_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Fold the collectives in; the intervals [start, end) (ns) of those kept. One pass, in
        the batch's order (the rank's pending collective depends on it), with what is the same
        for many calls looked up once per batch: each (op, group)'s function name and the
        group's ranks, the plausible time range, the window length."""
        arrays = self._valid(batch["comms"], ("op", "group", "seq", "bytes", "start_ns", "dur_ns"))
        starts: list[int] = []
        ends: list[int] = []
        if arrays is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        groups = batch.get("groups", [])
        progress, windows, skipped = self.progress, self.windows, self.skipped
        lo, hi = windows.range_ms()
        wms, max_dur = self.policy.window_ms, self.policy.max_duration_s * 1e9
        named: dict[tuple[float, float], tuple[str, str]] = {}  # (op, group) -> (function, group id)
        members: dict[float, list[int]] = {}  # group index -> its ranks as ints, on first use
        for op, grp, seq, nbytes, start, dur in zip(*(a.tolist() for a in arrays), strict=False):
            fn_group = named.get((op, grp))
            if fn_group is None:
                if not (0 <= op < len(names) and 0 <= grp < len(groups)):
                    skipped["bad_name_index"] += 1
                    continue
                group_id = str(groups[int(grp)]["group_id"])
                fn_group = named[(op, grp)] = (comm_function(names[int(op)], group_id), group_id)
            fname, group_id = fn_group
            if not math.isfinite(start):
                skipped["bad_timestamp"] += 1
                continue
            if not math.isfinite(dur):
                skipped["bad_duration"] += 1
                continue
            wall_ms = int((offset_ns + start + max(dur, 0)) // 1_000_000)
            in_range = lo <= wall_ms <= hi
            if dur < 0:  # entry marker of a call still in flight
                progress.note_entry(group_id, int(seq), wall_ms, True)
                if in_range:
                    progress.note_event(wall_ms, fname)
                    windows.note_data(wall_ms)
                skipped["in_flight_collective"] += 1
                continue
            if dur > max_dur:
                skipped["bad_duration"] += 1
                continue
            iseq = int(seq)
            progress.note_entry(group_id, iseq, wall_ms)
            if not in_range:
                skipped["bad_timestamp"] += 1
                continue
            progress.note_event(wall_ms, fname)
            windows.note_data(wall_ms)
            w = windows.open_slot(wall_ms // wms)
            if w is None:
                continue
            ranks = members.get(grp)
            if ranks is None:
                ranks = members[grp] = [int(r) for r in groups[int(grp)]["ranks"]]
            w.add_collective(fname, iseq, int(dur), ranks, nbytes)
            if wall_ms > w.last_event_ms:
                w.last_event_ms = wall_ms
            starts.append(int(start))
            ends.append(int(start + dur))
        return np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def _span_rows(self, cols: dict, comm_iv: tuple[np.ndarray, np.ndarray]) -> Iterator[tuple] | None:
        """The spans as (kind, name, start ns, duration net of the collective time nested in it,
        plausible duration) rows, computed column-wise (implausible durations counted); None
        when the columns are ragged."""
        arrays = self._valid(cols, ("kind", "name", "start_ns", "dur_ns"))
        if arrays is None:
            return None
        kind, name, start, dur = arrays
        ok = np.isfinite(dur) & (dur >= 0) & (dur <= self.policy.max_duration_s * 1e9)
        if not ok.all():
            self.skipped["bad_duration"] += int((~ok).sum())
        start, dur = start.astype(np.int64), np.where(ok, dur, 0).astype(np.int64)
        # a device span is timed on the device: the host intervals of collectives are not inside it
        net = np.where(kind == SpanKind.DEVICE, dur, dur - covered_ns(comm_iv[0], comm_iv[1], start, start + dur))
        return zip(kind.tolist(), name.tolist(), start.tolist(), net.tolist(), ok.tolist(), strict=False)

    def _add_spans(self, cols: dict, names: list[str], offset_ns: int,
                   comm_iv: tuple[np.ndarray, np.ndarray]) -> None:
        """Fold the spans in (:meth:`_span_rows`) in one pass like :meth:`_add_comms`'s."""
        rows = self._span_rows(cols, comm_iv)
        if rows is None:
            return
        progress, windows, skipped = self.progress, self.windows, self.skipped
        lo, hi = windows.range_ms()
        wms = self.policy.window_ms
        named: dict[tuple[float, float], str] = {}  # (name, kind) -> function
        for k, n, s, d, keep in rows:
            if not keep:
                continue
            fname = named.get((n, k))
            if fname is None:
                if not 0 <= n < len(names):
                    skipped["bad_name_index"] += 1
                    continue
                fname = named[(n, k)] = names[int(n)] or kind_function(int(k))
            wall_ms = int((offset_ns + s) // 1_000_000)
            if not lo <= wall_ms <= hi:
                skipped["bad_timestamp"] += 1
                continue
            progress.note_event(wall_ms, fname)
            windows.note_data(wall_ms)
            w = windows.open_slot(wall_ms // wms)
            if w is not None:
                w.add_duration(fname, int(k), int(d))
                if wall_ms > w.last_event_ms:
                    w.last_event_ms = wall_ms

    def _add_iterations(self, cols: dict, offset_ns: int) -> None:
        arrays = self._valid(cols, ("step", "start_ns", "dur_ns"))
        if arrays is None:
            return
        for step, start, dur in zip(*(a.tolist() for a in arrays), strict=False):
            if self._bad_dur(dur):
                continue
            if not math.isfinite(start):
                self.skipped["bad_timestamp"] += 1
                continue
            wall_ms = int((offset_ns + start + dur) // 1_000_000)
            if not self.windows.plausible(wall_ms):
                continue
            self.windows.note_data(wall_ms)
            w = self.windows.slot(wall_ms)
            if w is None:
                continue
            w.add_step(int(step), int(dur))
            self.progress.note_step(int(step))
