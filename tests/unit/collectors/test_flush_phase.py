"""Batches go out at a fixed phase of the wall clock, so a comparison window (which ends on a
multiple of the flush interval) closes with each rank's first batch after its end."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from perftracker_ml.collectors.transport import FLUSH_PHASE, FLUSH_SPREAD, flush_delay


@given(now=st.floats(1.6e9, 2.0e9), interval=st.sampled_from([0.05, 0.5, 1.0, 2.0]),
       rank=st.integers(0, 100_000))
def test_sends_land_on_the_ranks_phase(now: float, interval: float, rank: int) -> None:
    key = f"job-a|{rank}".encode()
    delay = flush_delay(now, interval, key)
    assert interval / 10 <= delay <= interval * 1.1 + 1e-6
    phase = ((now + delay) % interval) / interval
    assert FLUSH_PHASE - 1e-4 <= phase <= FLUSH_PHASE + FLUSH_SPREAD + 1e-4


def test_steady_sends_are_one_interval_apart() -> None:
    key, t = b"job|3", 1_800_000_000.0
    t += flush_delay(t, 1.0, key)
    sends = [t]
    for _ in range(5):
        t += 0.02  # the send cycle itself
        t += flush_delay(t, 1.0, key)
        sends.append(t)
    gaps = [b - a for a, b in zip(sends, sends[1:], strict=False)]
    assert gaps == pytest.approx([1.0] * 5, abs=1e-6)


def test_a_window_end_is_followed_by_every_ranks_send_within_the_phase() -> None:
    window_end = 1_800_000_005.0  # a multiple of a 5 s window
    for rank in range(64):
        now = window_end - 0.3
        send = now + flush_delay(now, 1.0, f"j|{rank}".encode())
        while send < window_end:
            send += flush_delay(send + 0.01, 1.0, f"j|{rank}".encode()) + 0.01
        assert window_end + FLUSH_PHASE - 1e-6 <= send <= window_end + FLUSH_PHASE + FLUSH_SPREAD + 1e-6


def test_ranks_spread_their_sends() -> None:
    phases = {round(flush_delay(1_800_000_000.0, 1.0, f"j|{r}".encode()), 3) for r in range(256)}
    assert len(phases) > 50


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan")])
def test_a_broken_interval_still_waits(interval: float) -> None:
    assert flush_delay(1_800_000_000.0, interval) == 1.0
