import pytest
from perftracker_ml.sinks.base import BatchingSink
from perftracker_ml.sinks.errors import StoreUnavailable


class MemorySink(BatchingSink):
    def __init__(self, **kw):
        super().__init__({"a": ["x", "y"], "b": ["z"]}, **kw)
        self.written: dict[str, list] = {"a": [], "b": []}
        self.fail_tables: set[str] = set()

    def write(self, table, columns, data):
        if table in self.fail_tables:
            raise StoreUnavailable("down", retry_after=0.1)
        self.written[table].extend(tuple(r) for r in data)


def make(**kw):
    return MemorySink(**{"flush_rows": 3, "flush_interval_s": 10.0, "max_backlog_rows": 100, **kw})


def test_due_by_rows_and_by_time():
    s = make()
    s.add("a", (1, 2))
    assert not s.due()
    assert s.due(now=s._last_flush + 11)
    s.add("a", (3, 4))
    s.add("b", (5,))
    assert s.due()


def test_a_row_of_an_urgent_table_is_due_at_once():
    s = make(urgent=("b", "not_a_table"))
    s.add("a", (1, 2))
    assert not s.due()
    s.add("b", (3,))  # e.g. an anomaly: written without waiting for the interval or the row count
    assert s.due()
    s.take()
    assert not s.due()


def test_clickhouse_sink_writes_detections_at_once():
    from perftracker_ml.sinks.clickhouse import URGENT_TABLES
    from perftracker_ml.sinks.schema import TABLES
    assert set(URGENT_TABLES) == {"anomalies", "incidents"} <= set(TABLES)


def test_failed_table_is_kept_and_written_table_not_repeated():
    s = make()
    s.add("a", (1, 2))
    s.add("b", (3,))
    s.fail_tables = {"b"}
    with pytest.raises(StoreUnavailable):
        s.flush()
    assert s.written["a"] == [(1, 2)] and s.buffered == 1
    s.fail_tables = set()
    assert s.flush() == 1
    assert s.written == {"a": [(1, 2)], "b": [(3,)]} and s.buffered == 0


def test_backlog_is_bounded_and_drops_are_counted_oldest_first():
    s = make(max_backlog_rows=5)
    for i in range(8):
        s.add("a", (i, i))
    assert s.buffered == 5 and s.dropped_rows == 3
    s.flush()
    assert [x for x, _ in s.written["a"]] == [3, 4, 5, 6, 7]
