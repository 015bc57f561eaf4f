"""A rank's signature (its peer group): structural names, not synchronization."""

from __future__ import annotations

from perftracker_ml.schemas.vocabulary import SpanKind
from perftracker_ml.streams.detect.accumulate import FunctionAcc
from perftracker_ml.streams.detect.rank_records import signature_of


def fns(*names: str) -> dict[str, FunctionAcc]:
    kinds = {"Net.forward": SpanKind.FORWARD, "torch.autograd.backward": SpanKind.BACKWARD}
    return {n: FunctionAcc(int(kinds.get(n, SpanKind.COLLECTIVE)), durations=[1]) for n in names}


REPLICA = ("Net.forward", "torch.autograd.backward", "comm:all_reduce:pg0")


def test_a_barrier_entered_in_another_window_does_not_split_replicas():
    assert signature_of(fns(*REPLICA, "comm:barrier:pg0")) == signature_of(fns(*REPLICA))
    assert signature_of(fns(*REPLICA, "comm:monitored_barrier:pg0")) == signature_of(fns(*REPLICA))


def test_ops_that_move_data_still_tell_stages_apart():
    assert signature_of(fns(*REPLICA, "comm:send:pp01")) != signature_of(fns(*REPLICA))
    assert signature_of(fns(*REPLICA, "comm:broadcast:pg0")) != signature_of(fns(*REPLICA))


def test_group_ids_are_left_out():
    assert signature_of(fns("Net.forward", "comm:all_reduce:pg1")) == signature_of(fns("Net.forward", "comm:all_reduce:pg2"))
