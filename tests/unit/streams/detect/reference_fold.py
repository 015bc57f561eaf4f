"""The event-at-a-time fold that ``rank_events.EventFolder`` replaced (main at 2ae05f2), kept
as the oracle of the differential test in ``test_fold_equivalence.py``: one Python call chain
per event (name, plausibility, progress, window slot, accumulator). Not used by the product."""

from __future__ import annotations

import numpy as np
from perftracker_ml.streams.detect.model import comm_function, kind_function
from perftracker_ml.streams.detect.rank_events import EventFolder


class ReferenceFolder(EventFolder):
    """:class:`EventFolder` with the old per-event comms, spans and iterations."""

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
            ranks = members[id(group)] = [int(r) for r in group["ranks"]]
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
