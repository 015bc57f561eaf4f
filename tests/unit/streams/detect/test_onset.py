"""A slowdown that began inside a window (.onset): the rank's last steps all slow, not scattered."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.onset import onset_step

from .test_diagnose import run_events

RNG = np.random.default_rng(5)
POL = DetectionPolicy()


def steps(n: int, ms: float = 10.0) -> np.ndarray:
    return RNG.lognormal(np.log(ms), 0.08, n) * 1e6


def test_every_step_from_the_onset_slower_is_an_onset_near_it():
    x = np.concatenate([steps(120), steps(80, 30.0)])
    k = onset_step(x, min_after=50, policy=POL)
    assert k is not None and 90 <= k <= 120  # the earliest k from which 80 % are slow: a little before


def test_scattered_slow_steps_are_no_onset():
    x = steps(200)
    x[::5] *= 3.0  # every fifth step slow: an intermittent slowdown
    assert onset_step(x, min_after=50, policy=POL) is None


def test_a_one_off_spike_or_too_few_slow_steps_are_no_onset():
    spike = steps(200)
    spike[150] *= 100.0
    assert onset_step(spike, min_after=50, policy=POL) is None
    late = np.concatenate([steps(180), steps(20, 30.0)])  # 20 slow steps: fewer than needed
    assert onset_step(late, min_after=50, policy=POL) is None


def test_slow_first_steps_then_usual_ones_are_no_onset():
    warm_up = np.concatenate([steps(20, 40.0), steps(180)])
    assert onset_step(warm_up, min_after=50, policy=POL) is None


@given(st.lists(st.integers(min_value=0, max_value=10**10), max_size=300), st.integers(min_value=-5, max_value=400))
def test_any_series_gives_an_index_inside_it_or_none(xs, min_after):
    k = onset_step(xs, min_after, POL)
    assert k is None or POL.onset_min_before <= k <= len(xs) - max(1, min_after)


def test_a_fault_from_the_middle_of_a_window_opens_in_that_window():
    # 5 s windows; the data loader 20 ms slower from 12.5 s (half of 10-15 s): before, it was
    # "intermittent" there (fewer than half its calls slow) and opened only after 20 s
    anomalies = run_events("slow-dataloader", start_s=12.5, seconds=30, magnitude=20.0, policy=DetectionPolicy())
    (first, *_) = [a for a in anomalies if a["status"] == "OPEN"]
    assert first["cause"] == "slow_dataloader" and first["ranks"] == [2]
    assert first["last_seen_ms"] - 1_700_000_000_000 == 15_000  # the window of the onset
    assert json_evidence(first)["onset_in_window_step"] > 0


def json_evidence(a: dict) -> dict:
    import json

    return json.loads(a["evidence_json"])
