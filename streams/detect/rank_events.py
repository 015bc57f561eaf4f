"""One rank's fold state, and what the fold shares: the covered-time arithmetic and frame texts.

The events of EventBatches are folded column-wise, one chunk of batches at a time, by
:mod:`.chunk_fold` (a single batch is a chunk of one): that is the product's only fold. What it
folds into is a :class:`RankFold` per rank -- its windows, its progress and its skip counts --
and the host evidence a batch carries (CPU samples, stack rows, network samples), which goes
to the window the batch was built in, is added here, one batch at a time (a few rows a batch).
The fold's rules, in the order one batch applies them: collectives first (each completed call
adds its (seq, time inside the call) to the window its end falls in, its interval [start, end)
to the batch's comm intervals; an entry marker, ``dur_ns < 0``, of a call still in flight only
moves the pending collective), then spans, their durations net of the collective time nested
inside them (:func:`covered_ns`, same monotonic clock; a device span kept whole), then
iterations, then the host evidence; a batch with nothing completed in it moves the rank's data
to the batch's time. ``tests/unit/streams/detect/reference_fold.py`` keeps these rules as an
event-at-a-time oracle that the chunk fold is held equal to.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import numpy as np

from .accumulate import RankProgress, WindowAcc
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


class RankFold:
    """What one rank's events are folded into (its windows, progress and skip counts), and the
    host evidence of a batch; see the module docstring."""

    def __init__(self, windows: RankWindows, progress: RankProgress, policy: DetectionPolicy,
                 skipped: Counter[str]):
        self.windows, self.progress, self.policy = windows, progress, policy
        self.skipped = skipped  # shared with the summarizer

    def add_host_evidence(self, batch: dict, crowded: bool = False) -> None:
        """A batch's CPU samples and stack rows (EventBatch v3), then its network samples (v7), to
        the window the batch was built in (they cover the flush interval that ends there; the
        fold set ``windows.batch_wall_ms``). ``crowded``: that window would be one more than
        may be open (the chunk fold worked it out in the fold's order): counted and dropped."""
        cpu, stacks = batch.get("cpu") or [], batch.get("stacks") or {}
        if cpu or len(stacks.get("frame", ())):
            w = self._host_window(crowded)
            if w is not None:
                self._add_cpu(w, cpu, stacks, list(batch["names"]))
        net = batch.get("net") or []
        if net:
            w = self._host_window(crowded)
            if w is not None:
                for sample in net:
                    w.net.add_sample(sample)

    def _host_window(self, crowded: bool) -> WindowAcc | None:
        if crowded:
            self.skipped["too_many_open_windows"] += 1
            self.windows.dropped += 1
            return None
        return self.windows.slot(self.windows.batch_wall_ms)

    def _add_cpu(self, w: WindowAcc, cpu: list, stacks: dict, names: list[str]) -> None:
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
