"""Automatic iteration detection from data fetches and optimizer steps (pure, no torch).

Algorithm (PerfTracker, see docs/background.md):

* Every ``DataLoader.__next__`` feeds a ``FETCH`` token and every
  ``Optimizer.step`` an ``OPT`` token, with their start and end times.
* While unlocked, after each ``OPT`` token the detector looks for the smallest
  period ``p`` (1..``max_period``) such that the last ``repeats * p`` tokens
  repeat with period ``p`` and the last ``p`` tokens start with ``FETCH`` and
  end with ``OPT``. That cycle is the iteration pattern (``FETCH OPT`` for a
  plain loop, ``FETCH FETCH OPT`` for two accumulation micro-batches, ...). It
  is then locked, and the ``repeats`` cycles that taught it are emitted.
* While locked, tokens are matched against the pattern in O(1). A completed
  cycle is one iteration: from the start of its first fetch to the end of its
  last optimizer step. A token that does not match counts as a miss and the
  matcher re-synchronises on the next ``FETCH`` that can start a cycle.
  ``repeats`` clean cycles in a row forget the misses; ``relearn_after``
  misses unlock the pattern and learning starts again (the loop changed).
* A loop that never goes through a ``DataLoader`` (batches from its own iterator or
  generator, common in LLM training) feeds only ``OPT`` tokens: after ``repeats + 1`` of
  them with no ``FETCH`` the pattern ``OPT`` alone is locked, and an iteration runs from the
  end of one optimizer step to the end of the next.
* Iteration numbers continue across re-learning, so every rank that sees the
  same token sequence numbers its iterations identically.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum
from typing import NamedTuple


class Token(IntEnum):
    FETCH = 0
    OPT = 1


class Iteration(NamedTuple):
    """One completed iteration (a NamedTuple: built once per step on the training thread)."""

    step: int
    start_ns: int
    dur_ns: int


_NONE: tuple[Iteration, ...] = ()


class IterationDetector:
    """Learns the repeated FETCH/OPT cycle of a training loop and emits iterations."""

    def __init__(self, repeats: int = 10, relearn_after: int = 200, max_period: int = 16):
        if repeats < 2 or relearn_after < 1 or max_period < 2:
            raise ValueError("repeats >= 2, relearn_after >= 1 and max_period >= 2 are required")
        self.repeats = repeats
        self.relearn_after = relearn_after
        self.max_period = max_period
        self.pattern: tuple[Token, ...] | None = None
        self.step = -1  # iteration in progress, -1 while unknown
        self.relearned = 0  # how many times a locked pattern was dropped
        self._hist: deque[tuple[int, int, int]] = deque(maxlen=repeats * max_period)
        self._next_step = 0
        self._pos = 0
        self._cycle_start_ns = 0
        self._misses = 0
        self._clean = 0
        self._cycle_missed = False
        self._prev_end_ns = 0  # end of the last optimizer step (OPT-only pattern: where a cycle starts)

    @property
    def opt_only(self) -> bool:
        return self.pattern == (Token.OPT,)

    @property
    def locked(self) -> bool:
        return self.pattern is not None

    @property
    def next_step(self) -> int:
        """The number the next iteration will get (iterations are numbered from 0, never reused)."""
        return self._next_step

    def feed(self, token: int, start_ns: int, end_ns: int) -> tuple[Iteration, ...]:
        """Feed one token; return the iterations it completes (usually none)."""
        if self.pattern is None:
            return self._learn(token, start_ns, end_ns)
        return self._match(token, start_ns, end_ns)

    # -- locked ---------------------------------------------------------------------------
    def _match(self, token: int, start_ns: int, end_ns: int) -> tuple[Iteration, ...]:
        pattern = self.pattern
        assert pattern is not None
        if token == pattern[self._pos]:
            if self._pos == 0:
                self._begin_cycle(start_ns)
            self._pos += 1
            if self._pos < len(pattern):
                return _NONE
            return (self._end_cycle(end_ns),)
        return self._miss(token, start_ns, end_ns)

    def _begin_cycle(self, start_ns: int) -> None:
        if self._prev_end_ns and self.opt_only:
            start_ns = self._prev_end_ns
        self._cycle_start_ns = start_ns
        self._cycle_missed = False
        self.step = self._next_step

    def _end_cycle(self, end_ns: int) -> Iteration:
        self._pos = 0
        self._prev_end_ns = end_ns
        self._next_step += 1
        if self._cycle_missed:
            self._clean = 0
        else:
            self._clean += 1
            if self._clean >= self.repeats:
                self._misses = 0
        return Iteration(self.step, self._cycle_start_ns, end_ns - self._cycle_start_ns)

    def _miss(self, token: int, start_ns: int, end_ns: int) -> tuple[Iteration, ...]:
        assert self.pattern is not None
        self._misses += 1
        self._clean = 0
        if self._misses >= self.relearn_after:
            self._unlock()
            return self._learn(token, start_ns, end_ns)
        if token == self.pattern[0]:
            self._begin_cycle(start_ns)
            self._pos = 1
        else:
            self._pos = 0
        self._cycle_missed = True
        return _NONE

    def _unlock(self) -> None:
        self.pattern = None
        self.step = -1
        self.relearned += 1
        self._hist.clear()
        self._pos = self._misses = self._clean = 0

    # -- learning -------------------------------------------------------------------------
    def _learn(self, token: int, start_ns: int, end_ns: int) -> tuple[Iteration, ...]:
        hist = self._hist
        hist.append((token, start_ns, end_ns))
        if token != Token.OPT:
            return _NONE
        period = self._find_period()
        if period == 0:
            return self._learn_opt_only()
        tokens = [h[0] for h in hist]
        self.pattern = tuple(Token(t) for t in tokens[-period:])
        learned = []
        for k in range(self.repeats, 0, -1):
            first = hist[len(hist) - k * period]
            last = hist[len(hist) - (k - 1) * period - 1]
            learned.append(Iteration(self._next_step, first[1], last[2] - first[1]))
            self._next_step += 1
        self._pos = 0
        self.step = -1
        hist.clear()
        return tuple(learned)

    def _learn_opt_only(self) -> tuple[Iteration, ...]:
        """Lock the ``OPT`` pattern once ``repeats + 1`` tokens came and none was a fetch."""
        hist = self._hist
        if len(hist) < self.repeats + 1 or any(h[0] != Token.OPT for h in hist):
            return _NONE
        self.pattern = (Token.OPT,)
        ends = [h[2] for h in hist][-(self.repeats + 1):]
        learned = []
        for prev_end, end in zip(ends, ends[1:], strict=False):
            learned.append(Iteration(self._next_step, prev_end, end - prev_end))
            self._next_step += 1
        self._prev_end_ns = ends[-1]
        self._pos = 0
        self.step = -1
        hist.clear()
        return tuple(learned)

    def _find_period(self) -> int:
        hist = self._hist
        n_hist = len(hist)
        for period in range(1, self.max_period + 1):
            need = self.repeats * period
            if need > n_hist:
                return 0
            if hist[n_hist - period][0] != Token.FETCH:
                continue
            if all(hist[n_hist - i][0] == hist[n_hist - i - period][0]
                   for i in range(1, need - period + 1)):
                return period
        return 0


class ExplicitSteps:
    """Iterations marked by the user with ``step()``: each mark ends one and starts the next."""

    def __init__(self, first_step: int = 0):
        self.step = first_step - 1
        self._start_ns = -1

    def mark(self, now_ns: int) -> Iteration | None:
        done = None
        if self._start_ns >= 0:
            done = Iteration(self.step, self._start_ns, now_ns - self._start_ns)
        self.step += 1
        self._start_ns = now_ns
        return done
