"""The corpus's replays, made once per test session and shared by the tests that read them."""

from __future__ import annotations

from functools import cache

from perftracker_ml.schemas.recording import Recording
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.replay import ReplayResult, replay

from benchmarks.corpus import Entry, entries

ENTRIES = entries()
BY_NAME = {e.truth.name: e for e in ENTRIES}
POLICY = DetectionPolicy()


@cache
def replayed(name: str) -> ReplayResult:
    """The replay of the named recording at the default policy (made once)."""
    return fresh(BY_NAME[name])


def fresh(entry: Entry) -> ReplayResult:
    return replay(Recording(entry.recording).messages(), POLICY)
