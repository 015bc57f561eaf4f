"""The event-at-a-time fold, kept as the oracle the product's fold (``chunk_fold.fold_chunk``, a
single batch being a chunk of one) is held equal to (``test_fold_equivalence.py``,
``test_chunk_fold.py``): one Python call chain per event (name, plausibility, progress, window
slot, accumulator), in the order one batch folds them (``rank_events``' module docstring).
Not used by the product."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect.chunk_columns import COMM_KEYS, ITER_KEYS, SPAN_KEYS
from perftracker_ml.streams.detect.model import comm_function, kind_function
from perftracker_ml.streams.detect.rank_events import RankFold, covered_ns
from perftracker_ml.streams.detect.summarize import RankSummarizer

from . import reference_close


class ReferenceFolder(RankFold):
    """One batch's comms, spans and iterations folded event by event, then its host evidence."""

    def fold(self, batch: dict) -> None:
        """Fold one EventBatch in; a batch whose columns cannot be read raises before anything of
        it is folded (rejected whole)."""
        for part, keys in (("comms", COMM_KEYS), ("spans", SPAN_KEYS), ("iterations", ITER_KEYS)):
            for k in keys:
                np.asarray(batch[part][k], dtype=np.float64)
        offset_ns = int(batch["wall_ns"]) - int(batch["mono_ns"])
        self.windows.batch_wall_ms = int(batch["wall_ns"]) // 1_000_000
        names = list(batch["names"])
        comm_iv = self._add_comms(batch, names, offset_ns)
        self._add_spans(batch["spans"], names, offset_ns, comm_iv)
        self._add_iterations(batch["iterations"], offset_ns)
        if not (len(batch["spans"]["kind"]) or len(batch["iterations"]["step"]) or len(comm_iv[0])):
            self.windows.note_data(self.windows.batch_wall_ms)  # a heartbeat: the data reached its time
        self.add_host_evidence(batch)

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

    def _span_rows(self, cols: dict, comm_iv: tuple[np.ndarray, np.ndarray]) -> Iterator[tuple] | None:
        """(kind, name, start ns, duration net of nested collective time, plausible) per span."""
        arrays = self._valid(cols, ("kind", "name", "start_ns", "dur_ns"))
        if arrays is None:
            return None
        kind, name, start, dur = arrays
        ok = np.isfinite(dur) & (dur >= 0) & (dur <= self.policy.max_duration_s * 1e9)
        if not ok.all():
            self.skipped["bad_duration"] += int((~ok).sum())
        start, dur = start.astype(np.int64), np.where(ok, dur, 0).astype(np.int64)
        net = np.where(kind == SpanKind.DEVICE, dur, dur - covered_ns(comm_iv[0], comm_iv[1], start, start + dur))
        return zip(kind.tolist(), name.tolist(), start.tolist(), net.tolist(), ok.tolist(), strict=False)

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

    def _note_event(self, wall_ms: int, function: str) -> None:
        """The rank was in ``function`` at ``wall_ms`` (implausible times are ignored here;
        the window lookup counts them)."""
        if not self.windows.in_range(wall_ms):
            return
        self.progress.note_event(wall_ms, function)
        self.windows.note_data(wall_ms)

    def _add_comms(self, batch: dict, names: list[str], offset_ns: int) -> tuple[np.ndarray, np.ndarray]:
        """Fold the collectives in; the intervals [start, end) (ns) of those kept."""
        arrays = self._valid(batch["comms"], ("op", "group", "seq", "bytes", "start_ns", "dur_ns"))
        starts: list[int] = []
        ends: list[int] = []
        if arrays is not None:
            groups = batch.get("groups", [])
            members: dict[int, list[int]] = {}  # a group's ranks, converted once per batch
            for op, grp, seq, nbytes, start, dur in zip(*(a.tolist() for a in arrays), strict=False):
                if not (0 <= op < len(names) and 0 <= grp < len(groups)):
                    self.skipped["bad_name_index"] += 1
                    continue
                if self._add_comm(names[int(op)], groups[int(grp)], members, seq, nbytes, start, dur, offset_ns):
                    starts.append(int(start))
                    ends.append(int(start + dur))
        return np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def _add_comm(self, op: str, group: dict, members: dict[int, list[int]], seq: float, nbytes: float,
                  start: float, dur: float, offset_ns: int) -> bool:
        """One collective call; True when it was added to a window. ``members``: the batch's
        groups' ranks as ints by ``id`` of the group, filled on first use."""
        group_id = str(group["group_id"])
        fname = comm_function(op, group_id)
        if not math.isfinite(start):
            self.skipped["bad_timestamp"] += 1
            return False
        wall_ms = int((offset_ns + start + max(dur, 0)) // 1_000_000)
        if dur < 0 and np.isfinite(dur):  # entry marker of a call still in flight
            self._note_entry(group_id, int(seq), fname, wall_ms, in_flight=True)
            self.skipped["in_flight_collective"] += 1
            return False
        if self._bad_dur(dur):
            return False
        self._note_entry(group_id, int(seq), fname, wall_ms)
        w = self.windows.slot(wall_ms)
        if w is None:
            return False
        ranks = members.get(id(group))
        if ranks is None:
            first, step, count = (int(group.get(f"ranks_{x}", 0)) for x in ("first", "step", "count"))
            ranks = members[id(group)] = [int(r) for r in group["ranks"]] + [first + i * step for i in range(count)]
        w.add_collective(fname, int(seq), int(dur), ranks, nbytes)
        w.last_event_ms = max(w.last_event_ms, wall_ms)
        return True

    def _note_entry(self, group: str, seq: int, fname: str, wall_ms: int, in_flight: bool = False) -> None:
        self.progress.note_entry(group, seq, wall_ms, in_flight)
        self._note_event(wall_ms, fname)

    def _add_spans(self, cols: dict, names: list[str], offset_ns: int,
                   comm_iv: tuple[np.ndarray, np.ndarray]) -> None:
        rows = self._span_rows(cols, comm_iv)
        if rows is None:
            return
        for k, n, s, d, keep in rows:
            if not keep:
                continue
            if not 0 <= n < len(names):
                self.skipped["bad_name_index"] += 1
                continue
            wall_ms = int((offset_ns + s) // 1_000_000)
            fname = names[int(n)] or kind_function(int(k))
            self._note_event(wall_ms, fname)
            w = self.windows.slot(wall_ms)
            if w is not None:
                w.add_duration(fname, int(k), int(d))
                w.last_event_ms = max(w.last_event_ms, wall_ms)


class ReferenceSummarizer(RankSummarizer):
    """A summarizer that folds each batch with :class:`ReferenceFolder`, event by event, and
    closes each window one function at a time (:mod:`.reference_close`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events = ReferenceFolder(self.windows, self.progress, self.policy, self.skipped)

    def _fold_one(self, batch: dict) -> None:
        self.events.fold(batch)

    def poll(self, now_wall_ms: int, flush: bool = False) -> list:
        return reference_close.close_windows(self.closing(now_wall_ms, flush))
