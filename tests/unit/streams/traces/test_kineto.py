"""Kineto parser: real DLRM rank, and small hand-written traces for each rule."""

from __future__ import annotations

import pytest
from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.columns import as_lists
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, EVENT_BATCH_VERSION, SpanKind
from perftracker_ml.streams.traces.kineto import parse_trace, parse_trace_with_skips, span_kind
from perftracker_ml.streams.traces.load import RawTrace, TraceError, read_traces

from .helpers import dlrm_archive, tiny_trace


def dlrm_rank(rank: int) -> dict:
    traces = [t for t in read_traces(dlrm_archive()) if isinstance(t, RawTrace)]
    return parse_trace(traces[rank].data, "dlrm", traces[rank].source)


def comms_of(batch: dict) -> list[tuple[str, int, int]]:
    c, names = batch["comms"], batch["names"]
    return [(names[o], s, d) for o, s, d in zip(c["op"], c["seq"], c["dur_ns"], strict=True)]


def test_real_rank_becomes_an_event_batch_that_encodes():
    batch = dlrm_rank(7)
    assert (batch["rank"], batch["world_size"], batch["gpu"]) == (7, 8, 7)
    assert batch["iterations"]["step"] == [10] and batch["iterations"]["dur_ns"] == [12_509_000]
    assert batch["groups"] == [{"group_id": "world", "ranks": list(range(8))}]
    decoded = as_lists(Codec(EVENT_BATCH).decode(Codec(EVENT_BATCH).encode(batch)))  # v8: packed, arrays decoded
    assert decoded["comms"] == batch["comms"] and len(decoded["kernels"]) == len(batch["kernels"])
    assert batch["schema_version"] == decoded["schema_version"] == EVENT_BATCH_VERSION


def test_real_collectives_are_numbered_per_group_and_op_in_launch_order():
    ops = [(op, seq) for op, seq, _ in comms_of(dlrm_rank(0))]
    assert ops == [("all_to_all", 0), ("all_to_all", 1), ("all_to_all", 2), ("all_to_all", 3),
                   ("all_reduce", 0), ("all_to_all", 4), ("all_reduce", 1), ("all_reduce", 2)]
    # time inside = the NCCL kernel's duration; bytes from the annotation's input dims
    assert comms_of(dlrm_rank(0))[0][2] == 2_146_000
    assert dlrm_rank(0)["comms"]["bytes"][:2] == [6144 * 4, 24 * 8]


def test_real_annotations_map_to_span_kinds():
    b = dlrm_rank(0)
    kinds = {b["names"][n]: k for n, k in zip(b["spans"]["name"], b["spans"]["kind"], strict=True)}
    assert kinds["## forward ##"] == SpanKind.FORWARD and kinds["## backward ##"] == SpanKind.BACKWARD
    assert kinds["## optimizer ##"] == SpanKind.OPTIMIZER
    assert kinds["enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"] == SpanKind.DATALOADER
    assert kinds["## wait_for_batch ##"] == SpanKind.SYNCHRONIZE
    assert kinds["Optimizer.step#Adagrad.step"] == SpanKind.USER  # nested in ## optimizer ##: counted once
    assert "nccl:all_to_all" not in kinds and "ProfilerStep#10" not in kinds


@pytest.mark.parametrize("name, kind", [
    ("## forward ##", SpanKind.FORWARD), ("DistributedDataParallel.forward", SpanKind.FORWARD),
    ("## backward ##", SpanKind.BACKWARD), ("Optimizer.zero_grad#SGD.zero_grad", SpanKind.OPTIMIZER),
    ("## KJTListAwaitable wait() ##", SpanKind.SYNCHRONIZE), ("gc.collect", SpanKind.GC),
    ("save_checkpoint", SpanKind.CHECKPOINT), ("## sparse_data_dist ##", SpanKind.USER),
])
def test_span_kind_by_name(name, kind):
    assert span_kind(name) == kind


def test_nccl_kernel_linked_to_its_annotation_by_correlation():
    b = parse_trace(tiny_trace(comm_us=250), "j")
    assert comms_of(b) == [("all_reduce", 0, 250_000)] and b["comms"]["bytes"] == [4096]
    assert b["comms"]["step"] == [3]


def test_recorded_collective_metadata_wins():
    t = tiny_trace(world=4)
    t["traceEvents"][6]["args"].update({"Collective name": "all_gather", "Process Group Name": "7",
                                        "Process Group Ranks": "[1, 3]", "Seq": 41,
                                        "In msg nelems": 10, "dtype": "BFloat16"})
    b = parse_trace(t, "j")
    assert b["groups"] == [{"group_id": "pg:7", "ranks": [1, 3]}]
    assert comms_of(b) == [("all_gather", 41, 100_000)] and b["comms"]["bytes"] == [20]


def test_cpu_only_trace_uses_backend_annotations():
    t = tiny_trace()
    t["traceEvents"] = [e for e in t["traceEvents"] if e["cat"] != "kernel"]
    t["traceEvents"][4]["name"] = "gloo:all_reduce"
    assert comms_of(parse_trace(t, "j")) == [("all_reduce", 0, 20_000)]


def test_relative_timestamps_get_base_time_added():
    t = tiny_trace(baseTimeNanoseconds=1_700_000_000_000_000_000)
    for e in t["traceEvents"]:
        e["ts"] -= 1_700_000_000_000_000
    assert parse_trace(t, "j")["iterations"]["start_ns"] == [1_700_000_000_000_000_000]


def test_negative_and_absurd_durations_are_counted_not_raised():
    extra = [{"ph": "X", "cat": "cpu_op", "name": "bad", "pid": 1, "tid": 1, "ts": 1.7e15, "dur": -5},
             {"ph": "X", "cat": "cpu_op", "name": "huge", "pid": 1, "tid": 1, "ts": 1.7e15, "dur": 9e12},
             {"ph": "X", "cat": "cpu_op", "name": "nan", "pid": 1, "tid": 1, "ts": "x", "dur": 1}, 42]
    batch, skipped = parse_trace_with_skips(tiny_trace(extra=extra), "j")
    assert skipped == {"negative duration": 1, "duration over one hour": 1, "non-numeric ts or dur": 1,
                       "not an object": 1}
    assert batch["dropped_events"] == 4


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t.pop("distributedInfo"), "no distributedInfo.rank"),
    (lambda t: t["distributedInfo"].update(world_size=0), "does not cover rank"),
    (lambda t: t.pop("traceEvents"), "no traceEvents"),
    (lambda t: t.update(traceEvents=[{"ph": "M", "name": "x"}]), "no usable complete events"),
])
def test_unusable_trace_is_a_trace_error_naming_the_source(mutate, fragment):
    t = tiny_trace()
    mutate(t)
    with pytest.raises(TraceError, match=f"r0.json: .*{fragment}"):
        parse_trace(t, "j", "r0.json")
