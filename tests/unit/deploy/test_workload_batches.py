"""The throughput benchmark's job: collector-built batches the summarizer takes without a skip."""

from __future__ import annotations

import pytest
from perftracker_ml.collectors.batch import event_count
from perftracker_ml.deploy.workloads.batches import Workload, batches
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.columns import as_lists
from perftracker_ml.schemas.records import group_members
from perftracker_ml.schemas.validate import validate
from perftracker_ml.schemas.vocabulary import EVENT_BATCH
from perftracker_ml.streams.detect import RankSummarizer

SMALL = Workload(ranks=32, seconds=3, tp=4, pp=2)


def test_batches_round_trip_and_hold_the_stated_rate() -> None:
    out = list(batches(SMALL))
    assert len(out) == SMALL.ranks * SMALL.seconds
    codec = Codec(EVENT_BATCH)
    for rank, record in out:
        decoded = codec.decode(codec.encode(record))
        assert as_lists(decoded)["spans"] == record["spans"] and len(decoded["stacks"]["count"]) and decoded["cpu"]
        assert validate(EVENT_BATCH, decoded) is None  # what a worker admits
        assert record["rank"] == rank and record["world_size"] == SMALL.ranks
        ends = [s + d for s, d in zip(record["spans"]["start_ns"], record["spans"]["dur_ns"], strict=True)]
        assert max(ends) <= record["mono_ns"]  # only what was recorded by the flush
    per_rank_s = sum(event_count(r) for _, r in out) / SMALL.ranks / SMALL.seconds
    assert 80 <= per_rank_s <= 100


def test_groups_are_the_tp_dp_and_pipeline_groups() -> None:
    _, first = next(iter(batches(SMALL)))
    ids = {g["group_id"]: group_members(g) for g in first["groups"]}
    assert sorted(len(r) for r in ids.values()) == [2, 4, 4]  # pipeline pair, DP (32 / 8), TP
    assert {first["names"][op] for op in first["comms"]["op"]} == {
        "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "send"}


def test_the_summarizer_takes_every_batch_without_a_skip() -> None:
    summarizers: dict[int, RankSummarizer] = {}
    closed = []
    for rank, record in batches(SMALL):
        s = summarizers.setdefault(rank, RankSummarizer(SMALL.job, rank))
        s.add_events(record)
        closed += s.poll(0, flush=False)
    for s in summarizers.values():
        closed += s.poll(0, flush=True)
        assert not s.skipped
    assert {name for name, _ in closed} == {"FunctionPattern", "RankWindow"}


def test_a_rank_count_that_does_not_fill_the_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of tp"):
        Workload(ranks=30, tp=4, pp=2).check()
