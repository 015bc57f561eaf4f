"""The event table reads raw JSON events and plain dicts alike, and counts what it skips."""

from __future__ import annotations

import json

import numpy as np
from perftracker_ml.streams.traces.load import RawTrace, decode_trace
from perftracker_ml.streams.traces.table import Cat, build_table

from .helpers import tiny_trace

ODD = [5, "text", None, [1, 2],
       {"ph": "X", "cat": "cpu_op", "name": "bad ts", "pid": 1, "tid": 1, "ts": True, "dur": 3},
       {"ph": "X", "cat": "cpu_op", "name": "negative", "pid": 1, "tid": 1, "ts": 10, "dur": -1},
       {"ph": "X", "cat": "kernel", "name": "args not an object", "pid": 0, "tid": "7", "ts": 20, "dur": 1, "args": 4},
       {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": "1", "tid": 1, "ts": 30.5, "dur": 2,
        "args": {"correlation": 9, "cbid": 211, "Input Dims": [[1]]}},
       {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 40, "dur": 5,
        "args": {"Input Dims": [[2, 2]], "correlation": 3.0}},
       {"ph": "i", "name": "instant", "ts": 50}]


def _columns(t) -> dict:
    return {"names": t.names, "threads": t.threads, "args": t.args, "skipped": dict(t.skipped),
            **{c: getattr(t, c).tolist() for c in ("cat", "name", "tid", "ts_ns", "dur_ns", "corr")}}


def test_raw_json_events_and_dicts_give_the_same_table() -> None:
    trace = tiny_trace(extra=ODD)
    loaded = decode_trace("t", json.dumps(trace).encode())
    assert isinstance(loaded, RawTrace)
    assert _columns(build_table(loaded.data)) == _columns(build_table(trace))


def test_skips_are_counted_by_reason() -> None:
    t = build_table(tiny_trace(extra=ODD))
    assert t.skipped == {"not an object": 4, "non-numeric ts or dur": 1, "negative duration": 1}
    assert "1:1" in t.threads and "0:7" in t.threads  # pid 1 and "1" print alike: one thread


def test_args_are_kept_where_analyses_read_them() -> None:
    t = build_table(tiny_trace(extra=ODD))
    kept = {t.name_of(r) for r in t.args}
    assert {"nccl:all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float(x)", "void gemm()"} <= kept
    assert "aten::mm" not in kept and "cudaLaunchKernel" not in kept
    runtime = t.rows(Cat.CUDA_RUNTIME)
    assert sorted(t.corr[runtime].tolist()) == [7, 9]  # correlation read without keeping the args
    assert t.corr[int(np.flatnonzero(np.asarray(t.names)[t.name] == "aten::mm")[0])] == 3


def test_non_strict_json_is_still_read() -> None:
    text = json.dumps(tiny_trace()).replace('"dur": 30}', '"dur": NaN}')
    loaded = decode_trace("t", text.encode())
    assert isinstance(loaded, RawTrace)
    assert build_table(loaded.data).skipped == {"non-numeric ts or dur": 1}
