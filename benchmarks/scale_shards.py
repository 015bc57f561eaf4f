"""The diagnose stage sharded (streams/detect/shards.py): ``python -m benchmarks.scale --json --sharded 16384``.

A synthetic job of N ranks (:func:`benchmarks.scale.run_size`: the same job, layout and slow
rank) runs through summarize and compare once; the RankWindows and FunctionComparisons the
diagnose stage received are kept and fed, in the order they came, to a fresh
:class:`JobDiagnoser` per shard count (1, 4, 16 by default), each window cut into that many
shards of ranks. CPU seconds per window of the job (the trailing window each rank closes last included, as in
:mod:`benchmarks.scale`), split by where they would run once the
shards are spread over workers by the Kafka key (job, shard):

* ``shard_cpu_s_max`` / ``shard_cpu_s_mean``: one shard's own work (:func:`diagnose_shard`),
  the slowest and the mean; ``buffer_rank_windows_cpu_s``: buffering the window's RankWindows
  (``JobDiagnoser.add``), which a shard's owner does for its ranks (1/S of it each);
* ``merge_cpu_s``: the merge's own cost (:func:`merge`: the job-wide rules, placing, rendering);
  ``split_cpu_s``: cutting the window (the routing by key, once spread); ``job_checks_cpu_s``:
  the rest of the evaluation (incidents, regression, hang, periodic stalls), at the merge;
  ``buffer_comparisons_cpu_s``: the comparisons, which go to the merge;
* ``merge_side_cpu_s`` = merge + job checks + comparisons buffered: the merge owner's share;
  ``shard_side_cpu_s`` = the slowest shard + its share of the RankWindows buffered;
* ``same_findings``: every shard count's Anomaly records byte-identical to the unsharded run's;
* ``input``: what reading those records costs the worker that takes them from Kafka, which the
  figures above leave out (they feed decoded records): each RankWindow and FunctionComparison
  encoded as the summarizers and comparators send it, then decoded (``Codec.decode``) and
  validated (:func:`perftracker_ml.schemas.validate.validate`, the worker's limits), CPU s per window;
  ``input.RankWindowSet``: the same RankWindows as the summarize stage sends them, in the
  RankWindowSets it made (schemas/record_sets.py): each set decoded, its RankWindows unpacked and
  checked (``record_sets.read``), as the diagnose stage's agent reads them.

The run is one process (shard counts one after another: CPU time, not wall time, is reported).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from perftracker_ml.schemas import Codec, record_sets
from perftracker_ml.schemas.record_sets import expanded
from perftracker_ml.schemas.rules import limits_for
from perftracker_ml.schemas.validate import validate
from perftracker_ml.schemas.vocabulary import FUNCTION_COMPARISON, RANK_WINDOW, RANK_WINDOW_SET
from perftracker_ml.streams.detect import DetectionPolicy, JobDiagnoser
from perftracker_ml.streams.detect import shards as shards_module
from perftracker_ml.streams.replay import canonical
from perftracker_ml.streams.topology import Routed

SHARD_COUNTS = (1, 4, 16)


class Timer:
    """CPU seconds of named calls, summed."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.shards: list[float] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - t
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    def mapper(self, fn: Callable[[Any], Any], inputs: Iterable[Any]) -> list[Any]:
        out = []
        for inp in inputs:
            t = time.process_time()
            out.append(fn(inp))
            self.shards.append(time.process_time() - t)
        return out


def diagnose_captured(records: list[Routed], shards: int | None, policy: DetectionPolicy,
                      windows: int | None = None) -> dict[str, Any]:
    """Feed the diagnose stage's captured input to a fresh diagnoser (``shards``: None unsharded);
    CPU per window of the job (``windows``; default: per window evaluated)."""
    timer = Timer()
    job = str(records[0][1]["job"])
    saved = (shards_module.split, shards_module.merge, JobDiagnoser._evaluate)
    shards_module.split = timer.wrap("split", shards_module.split)  # type: ignore[assignment]
    shards_module.merge = timer.wrap("merge", shards_module.merge)  # type: ignore[assignment]
    timed_evaluate, sizes = timer.wrap("evaluate", JobDiagnoser._evaluate), []

    def evaluate(self: JobDiagnoser, ready: Any, now: int) -> Any:
        sizes.append(len(ready.rank_windows))
        return timed_evaluate(self, ready, now)

    JobDiagnoser._evaluate = evaluate  # type: ignore[method-assign]
    try:
        d = JobDiagnoser(job, policy, shards=shards, mapper=timer.mapper)
        add_rw, add_cmp, poll = timer.wrap("add_rw", d.add), timer.wrap("add_cmp", d.add), timer.wrap("poll", d.poll)
        out, now = [], 0
        for name, rec in records:  # each as it came: its window closed, a comparison a grace later
            now = max(now, (int(rec["window_id"]) + 1) * policy.window_ms + policy.close_lag_ms
                      + (policy.grace_ms if name == FUNCTION_COMPARISON else 0))
            (add_rw if name == RANK_WINDOW else add_cmp)(name, rec, now)
            out += poll(now)[0]
        out += poll(now + 10**8)[0]
    finally:
        shards_module.split, shards_module.merge, JobDiagnoser._evaluate = saved  # type: ignore[method-assign]
    cpu, sharded = timer.cpu, shards is not None
    n = windows or max(timer.calls.get("evaluate", 0), 1)
    shard_total = sum(timer.shards)
    evaluate = cpu.get("evaluate", 0.0)
    checks = evaluate - (cpu.get("split", 0.0) + shard_total + cpu.get("merge", 0.0) if sharded else 0.0)
    result = {
        "shards": shards or 0, "windows_evaluated": timer.calls.get("evaluate", 0),
        "diagnose_cpu_s_per_window": round((cpu.get("add_rw", 0) + cpu.get("add_cmp", 0) + cpu.get("poll", 0)) / n, 4),
        "buffer_rank_windows_cpu_s": round(cpu.get("add_rw", 0.0) / n, 4),
        "buffer_comparisons_cpu_s": round(cpu.get("add_cmp", 0.0) / n, 4),
        "evaluate_cpu_s": round(evaluate / n, 4),
        "ranks_per_window": sizes,
        "_anomalies": canonical(out),
    }
    if sharded:
        result.update({
            "shard_cpu_s_max": round(max(timer.shards, default=0.0), 4),
            "shard_cpu_s_mean": round(shard_total / max(len(timer.shards), 1), 4),
            "split_cpu_s": round(cpu.get("split", 0.0) / n, 4),
            "merge_cpu_s": round(cpu.get("merge", 0.0) / n, 4),
            "job_checks_cpu_s": round(checks / n, 4),
        })
        result["merge_side_cpu_s"] = round(result["merge_cpu_s"] + result["job_checks_cpu_s"]
                                           + result["buffer_comparisons_cpu_s"], 4)
        result["shard_side_cpu_s"] = round(result["shard_cpu_s_max"]
                                           + result["buffer_rank_windows_cpu_s"] / shards, 4)  # type: ignore[operator]
    return result


def run_sharded(ranks: int, windows: int, functions: int = 30,
                shard_counts: tuple[int, ...] = SHARD_COUNTS) -> dict[str, Any]:
    """The diagnose stage of a ``ranks``-rank job, unsharded and in each of ``shard_counts``."""
    from .scale import run_size

    policy = DetectionPolicy(diagnose_shard_ranks=0)
    captured: list[Routed] = []
    t = time.monotonic()
    run_size(ranks, windows, functions, policy=policy, capture=captured)
    sets = [r for n, r in captured if n == RANK_WINDOW_SET]
    records = [(n, r) for n0, r0 in captured for n, r in expanded(n0, r0) if n in (RANK_WINDOW, FUNCTION_COMPARISON)]
    built_s = time.monotonic() - t
    del captured  # the other stages' records: not the diagnose stage's heap
    read = input_cost(records, policy, windows)
    if sets:
        read[RANK_WINDOW_SET] = set_input_cost(sets, policy, windows)
    base = diagnose_captured(records, None, policy, windows)
    runs = [diagnose_captured(records, s, policy, windows) for s in shard_counts]
    same = all(r["_anomalies"] == base["_anomalies"] for r in runs)
    opened = base["_anomalies"].count(b'"status": "OPEN"')
    for r in (base, *runs):
        del r["_anomalies"]
    return {"ranks": ranks, "windows": windows, "functions": functions, "unsharded": base, "sharded": runs,
            "same_findings": same, "anomalies_opened": opened, "build_s": round(built_s, 1), "input": read}


def set_input_cost(sets: list[Any], policy: DetectionPolicy, windows: int) -> dict[str, Any]:
    """CPU s per window to read the job's RankWindows as the summarizers send them, in
    RankWindowSets (schemas/record_sets.py): decode each set (``decode_cpu_s``), then its
    RankWindows unpacked and checked (``record_sets.read``, ``read_cpu_s``), as the diagnose
    stage's agent does (streams/context.py ``set_members``); and the bytes per rank."""
    limits = limits_for(policy.max_duration_s)
    codec = Codec(RANK_WINDOW_SET)
    data = codec.encode_many(sets)
    ranks = sum(record_sets.size(s) for s in sets)
    t = time.process_time()
    decoded = [codec.decode(d) for d in data]
    decode_s = time.process_time() - t
    t = time.process_time()
    bad = sum(reason is not None for d in decoded for _, reason in record_sets.read(RANK_WINDOW_SET, d, limits))
    validate_s = time.process_time() - t
    return {"sets_per_window": round(len(data) / windows, 1), "ranks_per_window": round(ranks / windows),
            "bytes_per_rank": round(sum(map(len, data)) / max(ranks, 1)),
            "decode_cpu_s": round(decode_s / windows, 4), "read_cpu_s": round(validate_s / windows, 4),
            "us_per_rank": round((decode_s + validate_s) / max(ranks, 1) * 1e6, 1), "invalid": bad}


def input_cost(records: list[Routed], policy: DetectionPolicy, windows: int) -> dict[str, Any]:
    """CPU s per window to decode and validate the diagnose stage's input, by record (see the
    module docstring), and the records' mean encoded size."""
    limits = limits_for(policy.max_duration_s)
    out: dict[str, Any] = {}
    for name in (RANK_WINDOW, FUNCTION_COMPARISON):
        codec = Codec(name)
        data = codec.encode_many([r for n, r in records if n == name])
        t = time.process_time()
        decoded = [codec.decode(b) for b in data]
        decode_s = time.process_time() - t
        t = time.process_time()
        bad = sum(validate(name, r, limits) is not None for r in decoded)
        validate_s = time.process_time() - t
        out[name] = {"records_per_window": round(len(data) / windows), "bytes_mean": round(sum(map(len, data)) / max(len(data), 1)),
                     "decode_cpu_s": round(decode_s / windows, 4), "validate_cpu_s": round(validate_s / windows, 4),
                     "us_per_record": round((decode_s + validate_s) / max(len(data), 1) * 1e6, 1), "invalid": bad}
    return out
