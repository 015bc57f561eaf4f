"""The typed records the window's rules read (facts.py): an Outlier and a LateArrival are built
once from the comparisons' entries, keep their values as the records carry them, and are what
the pipeline hands from rule to rule (never a dict read by string keys)."""

from __future__ import annotations

import dataclasses

import pytest
from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.facts import LateArrival, Outlier, outliers_by_rank
from perftracker_ml.streams.detect.pipeline import RULES, Diagnosis, WindowFacts
from perftracker_ml.streams.detect.window import step_ms

from .test_cpu_evidence import comparison
from .test_host_level import allreduce, job, straggler

POL = DetectionPolicy()


def test_an_outlier_keeps_its_records_values_with_its_comparisons_function_and_kind():
    c = comparison(SpanKind.BACKWARD, "torch.autograd.backward", rank=3, cost=12.5)
    (o,) = outliers_by_rank([c], "outliers")[3]
    assert o == Outlier(rank=3, function="torch.autograd.backward", kind=int(SpanKind.BACKWARD), host="h3", gpu=-1,
                        value_ms_per_step=22.5, peer_median_ms_per_step=10.0, ratio=3.0, robust_z=20.0,
                        cost_ms_per_step=12.5, calls_ratio=1.0, per_call_ratio=3.0)
    assert o.intermittent is False and o.peer_group == ""  # fields the record lacks: their defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.cost_ms_per_step = 0.0  # type: ignore[misc]


def test_outliers_by_rank_reads_the_named_field_of_non_collective_comparisons_only():
    fwd = comparison(SpanKind.FORWARD, "kind:forward", rank=1)
    fwd["minor_outliers"] = [{**fwd["outliers"][0], "rank": 2, "cost_ms_per_step": 0.5}]
    collective = {**comparison(SpanKind.COLLECTIVE, "comm:all_reduce:pg0"), "outliers": [{"rank": 0}]}
    assert set(outliers_by_rank([fwd, collective], "outliers")) == {1}
    (minor,) = outliers_by_rank([fwd, collective], "minor_outliers")[2]
    assert minor.function == "kind:forward" and minor.cost_ms_per_step == 0.5


def test_a_late_arrival_is_its_straggler_entry_with_its_collective():
    s = LateArrival.of(straggler(3, 0.6, 7.0), "comm:all_reduce:pg0-4-abc")
    assert (s.rank, s.function, s.host, s.late_seqs, s.late_fraction, s.caused_ms_per_step, s.p_value) == \
        (3, "comm:all_reduce:pg0-4-abc", "node-1", 60, 0.6, 7.0, 1e-12)


def test_the_pipeline_hands_on_typed_records():
    cpu_phase = comparison(SpanKind.FORWARD, "kind:forward", rank=1)
    rws = job({})
    facts = WindowFacts(rws, [cpu_phase, allreduce(straggler(3))], step_ms(rws), POL)
    d = Diagnosis()
    for _, rule, _ in RULES:
        d = dataclasses.replace(d, **dict(rule(facts, d).state))
    assert [type(o) for outs in d.outliers.values() for o in outs] == [Outlier]
    assert [type(s) for late in d.late.values() for s in late] == [LateArrival]
    assert set(d.outliers) == {1} and set(d.late) == {3}
