"""A rank whose functional collectives were recorded during one step in n only is judged on
those steps: spans and completed collectives of the other steps left out, times per step over
the recorded steps; its progress (iterations) and entry markers kept whole."""

import numpy as np
from perftracker_ml.streams.detect import RankSummarizer
from perftracker_ml.streams.detect.step_gating import gate_of, recorded_only, recorded_steps
from perftracker_ml.streams.detect.summarize import add_batches

from .test_summarize import MS, POL, batch, by_name


def _gated_batch(gate):
    """8 steps of 400 ms, 500 ms apart; each a 100 ms backward; at steps 0 and 4 (the recorded ones under
    gate 4) a 40 ms collective inside it, as a rank whose tensor-parallel all-reduces were
    seen only then."""
    steps = range(8)
    b = batch(spans=[(4, 2, 0.5 + 0.5 * i, 100) for i in steps],
              comms=[(i, 0.5 + 0.5 * i + 0.02, 40) for i in (0, 4)],
              iters=[(i, 0.5 + 0.5 * i, 400) for i in steps])
    b["spans"]["step"] = list(steps)
    b["comms"]["step"] = [0, 4]
    b["functional_steps"] = gate
    return b


def _patterns(gate, chunk=False):
    s = RankSummarizer("job", 0, POL)
    if chunk:
        add_batches([(s, False, _gated_batch(gate))])
    else:
        s.add_events(_gated_batch(gate))
    return by_name(s.poll(now_wall_ms=0, flush=True))


def test_a_gated_rank_is_judged_on_its_recorded_steps():
    for chunk in (False, True):
        gated, plain = _patterns(4, chunk), _patterns(1, chunk)
        backward = gated[("FunctionPattern", "Model.backward")]
        # recorded steps 0 and 4 only: 2 x (100 - 40) ms, per recorded step 60 ms (the wait taken out)
        assert backward["steps"] == 2 and backward["total_ns"] == 120 * MS
        assert gated[("FunctionPattern", "comm:all_reduce:world")]["steps"] == 2
        # ungated, the same events read as every step recorded: 8 x 100 - 2 x 40 over 8 steps
        assert plain[("FunctionPattern", "Model.backward")]["steps"] == 8
        assert plain[("FunctionPattern", "Model.backward")]["total_ns"] == 720 * MS
        # progress is whole either way
        assert gated[("RankWindow", "")]["steps"] == plain[("RankWindow", "")]["steps"] == 8


def test_recorded_only_keeps_unknown_steps_and_entry_markers_and_leaves_its_input_alone():
    b = batch(spans=[(4, 2, 1.0, 10), (4, 2, 1.5, 10), (4, 2, 2.0, 10)],
              comms=[(0, 1.0, 5), (1, 1.5, 5), (2, 2.0, 5)])
    b["spans"]["step"] = [-1, 1, 2]
    b["comms"]["step"] = [0, 1, 3]
    b["comms"]["dur_ns"][2] = -1  # entered, still running: kept whatever its step
    out = recorded_only(b, 2)
    assert out["spans"]["step"] == [-1, 2] and out["comms"]["seq"] == [0, 2]
    assert b["spans"]["step"] == [-1, 1, 2] and len(b["comms"]["seq"]) == 3  # not changed
    packed = {**b, "spans": {k: np.asarray(v) for k, v in b["spans"].items()}}  # EventBatch v8's arrays
    assert recorded_only(packed, 2)["spans"]["step"].tolist() == [-1, 2]
    assert recorded_only(b, 1) is b and gate_of(b) == 1 and gate_of({"functional_steps": 4}) == 4
    assert recorded_steps([0, 1, 2, 3, 4], 2) == 3 and recorded_steps([0, 1], 1) == 2
