"""Named counters: declared once, counted by declaration, flattened for JSON, sampled for export."""

from __future__ import annotations

import threading

import pytest
from perftracker_ml.schemas.counters import Counter, CounterSet, Histogram, Kind, Sample


class Things(CounterSet):
    component = "things"

    seen = Counter("things seen")
    lost = Counter("things lost", labels=("reason", "detail"))
    queued = Counter("things queued now", kind=Kind.GAUGE, initial=-1)


def test_unlabelled_counter_reads_as_its_value_and_inc_returns_the_new_one():
    things = Things()
    assert things.seen == 0 and things.queued == -1
    assert things.inc(Things.seen) == 1 and things.inc(Things.seen, by=4) == 5
    assert things.seen == 5 and things.value(Things.seen) == 5


def test_labelled_counter_keeps_one_value_per_label_values_and_reads_as_their_sum():
    things = Things()
    things.inc(Things.lost, "full", "")
    things.inc(Things.lost, "late", "x", by=2)
    assert things.lost == 3
    assert things.value(Things.lost, "late", "x") == 2 and things.value(Things.lost, "gone", "") == 0
    assert things.series(Things.lost) == {("full", ""): 1, ("late", "x"): 2}


def test_snapshot_is_flat_in_declaration_order_and_leaves_empty_label_values_out():
    things = Things()
    things.inc(Things.lost, "full", "")
    things.inc(Things.lost, "late", "x")
    things.set(Things.queued, 7)
    assert list(things.snapshot().items()) == [("seen", 0), ("lost.full", 1), ("lost.late.x", 1),
                                               ("queued", 7)]


def test_samples_carry_the_declaration_for_an_exporter():
    things = Things()
    things.inc(Things.lost, "full", "a")
    samples = list(things.samples())
    assert samples[0] == Sample("things", "seen", "things seen", Kind.COUNTER, (), 0)
    assert samples[1].labels == (("reason", "full"), ("detail", "a")) and samples[1].value == 1
    assert samples[2].kind is Kind.GAUGE and samples[2].value == -1


def test_misuse_fails_loudly():
    class Other(CounterSet):
        seen = Counter("another set's counter")

    things = Things()
    with pytest.raises(ValueError, match="labels"):
        things.inc(Things.lost, "only-one")
    with pytest.raises(ValueError, match="cannot go down"):
        things.inc(Things.seen, by=-1)
    with pytest.raises(KeyError, match="not declared"):
        things.inc(Other.seen)
    with pytest.raises(AttributeError, match="inc"):
        things.seen = 3
    things.inc(Things.queued, by=-2)  # a gauge may go down
    assert things.queued == -3


def test_sets_are_independent_and_subclasses_inherit_declarations():
    class More(Things):
        extra = Counter("one more")

    a, b = Things(), More()
    a.inc(Things.seen)
    b.inc(More.extra)
    assert a.seen == 1 and b.seen == 0 and b.extra == 1
    assert [c.name for c in More.declared] == ["seen", "lost", "queued", "extra"]


def test_inc_from_many_threads_loses_nothing():
    things = Things()

    def count() -> None:
        for _ in range(10_000):
            things.inc(Things.seen)
            things.inc(Things.lost, "r", "")

    threads = [threading.Thread(target=count) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert things.seen == 40_000 and things.lost == 40_000


def test_a_cell_is_the_same_value_the_set_reads():
    things = Things()
    cell = things.cell(Things.lost, "hot", "")
    cell.value += 3
    assert things.lost == 3 and things.cell(Things.lost, "hot", "") is cell


class Timed(CounterSet):
    component = "timed"

    wait_ms = Histogram("time waited, in ms", buckets=(10, 100))
    lag = Counter("lag per partition", labels=("topic", "partition"), kind=Kind.GAUGE)
    wait_seconds = Histogram("time waited, in seconds (observed in ms)", buckets=(10, 100, 1500), per_unit=1000)
    paused_seconds = Counter("time paused, in seconds (counted in ns)", per_unit=1_000_000_000)


def test_histogram_counts_into_inclusive_buckets_and_reads_as_its_count():
    timed = Timed()
    for ms in (0, 10, 11, 100, 101):
        timed.observe(Timed.wait_ms, ms)
    assert timed.wait_ms == 5
    assert timed.snapshot()["wait_ms"] == 5 and timed.snapshot()["wait_ms_sum"] == 222
    parts = [(s.suffix, dict(s.labels).get("le"), s.value) for s in timed.samples() if s.name == "wait_ms"]
    assert parts == [("_bucket", "10", 2), ("_bucket", "100", 4), ("_bucket", "+Inf", 5),
                     ("_sum", None, 222), ("_count", None, 5)]
    with pytest.raises(ValueError, match="increasing"):
        Histogram("bad", buckets=(5, 1))
    with pytest.raises(TypeError, match="not a Histogram"):
        timed.observe(Timed.lag, 1, "t", "0")
    at_once, one_by_one = Timed(), Timed()
    at_once.observe(Timed.wait_ms, 50, times=3)  # a set's records observed together, as each alone
    for _ in range(3):
        one_by_one.observe(Timed.wait_ms, 50)
    assert list(at_once.samples()) == list(one_by_one.samples())


def test_a_value_counted_in_a_smaller_unit_is_exported_in_the_unit_of_its_name():
    timed = Timed()
    for ms in (5, 250, 2000):
        timed.observe(Timed.wait_seconds, ms)
    timed.inc(Timed.paused_seconds, by=1_500_000_000)
    assert timed.value(Timed.paused_seconds) == 1_500_000_000  # kept as counted: an int add
    snap = timed.snapshot()
    assert snap["wait_seconds"] == 3 and snap["wait_seconds_sum"] == 2.255 and snap["paused_seconds"] == 1.5
    parts = [(s.suffix, dict(s.labels).get("le"), s.value) for s in timed.samples() if s.name == "wait_seconds"]
    assert parts == [("_bucket", "0.01", 1), ("_bucket", "0.1", 1), ("_bucket", "1.5", 2),
                     ("_bucket", "+Inf", 3), ("_sum", None, 2.255), ("_count", None, 3)]
    with pytest.raises(ValueError, match="per_unit"):
        Counter("bad", per_unit=0)


def test_replace_sets_every_series_and_remove_forgets_by_label_prefix():
    timed = Timed()
    timed.replace(Timed.lag, {("a", "0"): 5, ("a", "1"): 0, ("b", "0"): 2})
    timed.replace(Timed.lag, {("a", "1"): 3, ("b", "0"): 1})  # partition a/0 revoked
    assert timed.series(Timed.lag) == {("a", "1"): 3, ("b", "0"): 1}
    timed.remove(Timed.lag, "a")
    assert timed.series(Timed.lag) == {("b", "0"): 1}
