"""Closing many ranks' windows together (``summarize.poll_many``, ``rank_records.close_windows``)
gives the records each rank's own ``poll`` gives, in the same order; a rank whose poll fails is
left out and its error returned, the others' windows still closed."""

from __future__ import annotations

from perftracker_ml.deploy.workloads.batches import Workload, batches
from perftracker_ml.schemas.record_sets import in_sets
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer
from perftracker_ml.streams.detect.summarize import add_batches, poll_many
from perftracker_ml.streams.topology import SUMMARIZE

MS = 1_000_000
WALL0 = 1_700_000_000_000 * MS


def _fed(ranks: int = 16, seconds: int = 6) -> dict[int, RankSummarizer]:
    pol = DetectionPolicy()
    out: dict[int, RankSummarizer] = {}
    items = []
    for rank, batch in batches(Workload(ranks=ranks, seconds=seconds, tp=4, pp=2), WALL0):
        s = out.setdefault(rank, RankSummarizer(batch["job"], rank, pol))
        items.append((s, False, batch))
    add_batches(items, 0)
    return out


def test_poll_many_equals_each_ranks_poll_in_order() -> None:
    one, many = _fed(), _fed()
    now = WALL0 // MS + 3_000
    for flush in (False, True):
        expected = [r for s in one.values() for r in s.poll(now, flush)]
        got, failed = poll_many(list(many.values()), now, flush)
        assert not failed
        assert got == expected and len(expected) > 0
        now += 10_000


def test_a_failing_rank_is_left_out_and_the_others_are_closed() -> None:
    one, many = _fed(8), _fed(8)

    def broken(now_wall_ms: int, flush: bool = False) -> list:
        raise ValueError("bad state")

    many[2].closing = broken  # type: ignore[method-assign]
    expected = in_sets([r for rank, s in one.items() if rank != 2 for r in s.poll(0, True)],
                       DetectionPolicy().record_set_min)  # the stage sends what it closed together in sets
    got, failed = SUMMARIZE.poll_all(list(many.values()), 0, True)
    assert [type(e) for e in failed] == [ValueError]
    assert got == expected and len(got) > 0


def test_a_failure_packing_record_sets_costs_none_of_the_polls_records(monkeypatch) -> None:
    import perftracker_ml.streams.topology as topology

    one, many = _fed(8), _fed(8)
    expected = [r for s in one.values() for r in s.poll(0, True)]

    def broken(records: list, min_ranks: int) -> list:
        raise RuntimeError("packing defect")

    monkeypatch.setattr(topology, "in_sets", broken)
    got, failed = SUMMARIZE.poll_all(list(many.values()), 0, True)
    assert got == expected and any(n == "RankWindow" for n, _ in got)
    assert [str(e) for e in failed] == ["packing defect"]
