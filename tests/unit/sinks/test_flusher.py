import threading
import time

from perftracker_ml.sinks.flusher import BackgroundFlusher

from .test_base import make


def test_batch_is_retried_until_the_store_is_back_then_reaped_with_its_offsets():
    sink = make()
    sink.add("a", (1, 2))
    sink.add("b", (3,))
    sink.fail_tables = {"b"}
    stop = threading.Event()
    f = BackgroundFlusher(sink, stop, max_backoff_s=0.05)
    f.submit(sink.take(), {("t", 0): 41})
    try:
        _retried_then_written(f, sink)
    finally:
        stop.set()
        f.shutdown()


def _retried_then_written(f, sink):
    assert sink.buffered == 0 and f.busy
    time.sleep(0.2)
    assert f.reap() is None and f.failures >= 2
    sink.fail_tables = set()
    done = f.reap(wait_s=2)
    assert done is not None and done.rows == 2 and done.offsets == {("t", 0): 41}
    assert sink.written == {"a": [(1, 2)], "b": [(3,)]}  # "a" written once despite the retries
    assert not f.busy


def test_stop_abandons_a_batch_the_store_never_took():
    sink = make()
    sink.add("a", (1, 2))
    sink.fail_tables = {"a"}
    stop = threading.Event()
    f = BackgroundFlusher(sink, stop, max_backoff_s=0.05)
    f.submit(sink.take(), {("t", 0): 1})
    stop.set()
    assert f.reap(wait_s=2) is None and not f.busy
    f.shutdown()
