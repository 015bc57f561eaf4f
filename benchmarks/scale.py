"""Cost per window of the whole worker path as ranks grow: ``python -m benchmarks.scale --json``.

The detection core a worker runs -- summarize (RankSummarizer) -> compare
(FunctionComparator) -> diagnose (JobDiagnoser) -- wired as the stream workers wire it
(:class:`perftracker_ml.streams.topology.LocalRunner`, in process, simulated clock, no
Kafka/Faust/codec), fed with the EventBatches of a synthetic job of N ranks:

* each rank runs 250 ms steps of ``--functions`` functions (default 30: data loader,
  forward, loss, backward, gradient clipping, optimizer and ``functions - 6`` per-layer
  ``@timed`` blocks nested in forward), TP all-gathers / reduce-scatters (4 + 4 per step,
  TP groups of 8 from 64 ranks up) and 6 DDP all-reduce buckets per step in the rank's DP
  group (PP of 4 from 512 ranks up, so DP groups are ranks / 32 there): about 180 events per
  rank per second, one batch per rank per second, durations lognormal (3 %);
* one slow rank (rank 1): one layer block 5 ms per step slower, its DP peers wait that
  long longer in the last all-reduce bucket (the victims).

Each process sets the garbage collector's thresholds as ``perftracker worker`` does after
start-up (``--gc-young``, default the setting ``streams.gc_young_objects``; 0: CPython's own,
as this benchmark ran before 2026-11-28: schemas/gc_policy.py), reported as ``gc_young``.

Per size, one fresh process (so memory is that size's own): CPU seconds of the runner's
``feed``/``tick`` calls only (building the batches is not timed) divided by the windows
run (``cpu_s_per_window``, ``cpu_us_per_rank_window``), the same per stage, and the peak
RSS growth over the process's RSS before the first batch (``peak_rss_mb``: the cores' state
and the transient arrays; VmHWM - VmRSS). The last line fits log-log slopes of
``cpu_s_per_window`` and ``peak_rss_mb`` against ranks (sizes from 64 up: the 8-rank point
is fixed overheads) and, for sizes above ``--measure-max``, prints the fit's extrapolation
(``"extrapolated": true``) instead of running them.

``--sharded RANKS`` measures the diagnose stage alone, unsharded and in shards of ranks
(``--shard-counts``, default 1,4,16): per shard, the merge, and whether the findings are the same
(:mod:`benchmarks.scale_shards`).

``--footprint RANKS`` sizes the rest of the pipeline instead: the records the stages route
for RANKS ranks (count and Avro bytes per record name), the store rows they become per
table and their bytes on disk in a fresh chDB store (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from perftracker_ml.deploy.workloads.ranks import (  # noqa: F401 (re-exported for the benchmark's readers)
    MS,
    SLOW_RANK,
    STEP_MS,
    TICK_MS,
    Layout,
    SyntheticRanks,
)
from perftracker_ml.schemas.gc_policy import tune_gc
from perftracker_ml.schemas.settings import StreamSettings
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH, Status
from perftracker_ml.streams.agents.stage import TAKE_MESSAGES
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.topology import STAGES, LocalRunner, Routed, Stage

DEFAULT_SIZES = (8, 64, 512, 4096)


def _timed_stages(cpu: dict[str, float]) -> list[Stage[Any]]:
    """The topology's stages with their feed/poll calls' CPU time (a chunk's and many cores' at
    once included) added to ``cpu[stage]``."""
    clock = time.process_time

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            t = clock()
            try:
                return fn(*args)
            finally:
                cpu[name] += clock() - t
        return timed

    def maybe(name: str, fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
        return None if fn is None else wrap(name, fn)

    return [dataclasses.replace(s, feed=wrap(s.name, s.feed), poll=wrap(s.name, s.poll),
                                feed_chunk=maybe(s.name, s.feed_chunk), poll_many=maybe(s.name, s.poll_many))
            for s in STAGES]


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_size(ranks: int, windows: int, functions: int = 30, policy: DetectionPolicy | None = None,
             seed: int = 0, wall0_ns: int = 1_700_000_000_000 * MS,
             capture: list[Routed] | None = None) -> dict[str, Any]:
    """Run ``windows`` windows of a ``ranks``-rank job through the worker path; the cost figures and
    what the path diagnosed (open incidents' causes and ranks). ``capture``: every record routed
    between the stages (and leaving them) is appended there."""
    policy = policy or DetectionPolicy()
    wms = policy.window_ms
    if wms % 1000:
        raise ValueError(f"window_s ({policy.window_s}) must be whole seconds")
    wall0 = wall0_ns - wall0_ns % (wms * MS)  # the job starts on a window edge
    sim = SyntheticRanks(ranks, functions, seed=seed, wall0_ns=wall0)
    stage_cpu = {s.name: 0.0 for s in STAGES}

    def keep(name: str, record: Any) -> Any:
        capture.append((name, record))  # type: ignore[union-attr]
        return record

    runner = LocalRunner(policy, stages=_timed_stages(stage_cpu), wire=keep if capture is not None else None)
    t0_ms = wall0 // MS
    out: list[Routed] = []
    cpu = 0.0
    rss0 = _rss_kb("VmRSS")
    seconds = windows * wms // 1000
    batches = events = 0
    for second in range(seconds):
        now = t0_ms + (second + 1) * 1000
        for first in range(0, ranks, TAKE_MESSAGES):  # in the agent's chunks (its fold, once per chunk)
            chunk = [(EVENT_BATCH, sim.batch(r, second)) for r in range(first, min(first + TAKE_MESSAGES, ranks))]
            c = time.process_time()
            out += runner.feed_chunk(chunk, now)
            cpu += time.process_time() - c
            batches += len(chunk)
            events += sim.events_per_batch * len(chunk)
        for k in range(1000 // TICK_MS):  # the timer's ticks over that second
            c = time.process_time()
            out += runner.tick(now + k * TICK_MS)
            cpu += time.process_time() - c
    end = t0_ms + seconds * 1000
    c = time.process_time()
    for k in range(1, 4):  # no more data: the grace runs out, the last window closes and is diagnosed
        out += runner.tick(end + k * (policy.grace_ms + policy.close_lag_ms + TICK_MS))
    cpu += time.process_time() - c
    peak_kb = max(_rss_kb("VmHWM") - rss0, 0)
    incidents = {a["incident_id"]: (a["cause"], list(a["ranks"])) for name, a in out
                 if name == ANOMALY and a["status"] == Status.OPEN}
    return {
        "ranks": ranks, "windows": windows, "functions": functions,
        "tp": sim.layout.tp, "pp": sim.layout.pp, "dp": sim.layout.dp,
        "batches": batches, "events": events, "events_per_rank_s": round(events / max(ranks * seconds, 1), 1),
        "cpu_s": round(cpu, 4), "cpu_s_per_window": round(cpu / windows, 4),
        "cpu_us_per_rank_window": round(cpu / windows / ranks * 1e6, 1),
        "cpu_s_per_window_by_stage": {k: round(v / windows, 4) for k, v in stage_cpu.items()},
        "events_per_cpu_s": round(events / cpu) if cpu > 0 else 0,
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "incidents": sorted(({"cause": c, "ranks": rk[:8]} for c, rk in incidents.values()),
                             key=lambda i: (i["cause"], i["ranks"])),
        "slow_rank": SLOW_RANK, "extrapolated": False,
    }


def footprint(ranks: int, windows: int, functions: int = 30) -> dict[str, Any]:
    """What one window of a ``ranks``-rank job puts on the internal topics and in the store:
    records and Avro bytes (encoded with the stages' codecs, and lz4-framed) per record name,
    rows per table (``perftracker_ml.sinks.rows``), and bytes on disk per row once written to a
    fresh chDB store (``perftracker_ml.sinks.schema.migrate``, then ``OPTIMIZE ... FINAL``)."""
    import tempfile
    from collections import Counter

    import lz4.frame
    from perftracker_ml.schemas import Codec
    from perftracker_ml.schemas.record_sets import expanded
    from perftracker_ml.sinks.rows import ROW_BUILDERS
    from perftracker_ml.sinks.schema import TABLES, migrate
    from perftracker_ml.sinks.store import Store, StoreTarget

    captured: list[Routed] = []
    run_size(ranks, windows, functions, wall0_ns=time.time_ns() - windows * 10 * 1_000_000_000, capture=captured)
    records: Counter[str] = Counter()
    encoded: Counter[str] = Counter()
    codecs: dict[str, Codec] = {}
    rows: dict[str, list] = {}
    for name, rec in captured:
        codec = codecs.setdefault(name, Codec(name))
        records[name] += 1
        encoded[name] += len(codec.encode(rec))
        for one_name, one in expanded(name, rec):  # a set is stored as its records
            for table, batch in ROW_BUILDERS.get(one_name, lambda r: [])(dict(one)):
                rows.setdefault(table, []).extend(batch)
    raw = b"".join(codecs[n].encode(r) for n, r in captured)
    lz4_ratio = len(lz4.frame.compress(raw)) / max(len(raw), 1)
    disk: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        store = Store.open(StoreTarget("chdb", path=d))
        try:
            migrate(store)
            for table, batch in rows.items():
                store.insert(table, TABLES[table].column_names, batch, column_oriented=False)
                store.command(f"OPTIMIZE TABLE {table} FINAL")
            res = store.query("SELECT table, sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) "
                              "FROM system.parts WHERE active AND database = currentDatabase() GROUP BY table")
            for table, n, comp, uncomp in res.rows:
                disk[str(table)] = {"rows": int(n), "bytes_per_row": round(int(comp) / max(int(n), 1), 1),
                                    "uncompressed_bytes_per_row": round(int(uncomp) / max(int(n), 1), 1)}
        finally:
            store.close()
    return {"ranks": ranks, "windows": windows, "functions": functions,
            "records_per_window": {k: v / windows for k, v in records.items()},
            "avro_bytes_per_record": {k: round(encoded[k] / records[k], 1) for k in records},
            "lz4_ratio": round(lz4_ratio, 3),
            "rows_per_window": {t: len(b) / windows for t, b in rows.items()}, "store": disk}


def windows_for(ranks: int) -> int:
    """Fewer windows at large sizes (the default run stays within a few minutes on 2 cores)."""
    return 3 if ranks <= 512 else 2 if ranks <= 4096 else 1


def sizes_up_to(max_ranks: int) -> list[int]:
    sizes = [s for s in DEFAULT_SIZES if s <= max_ranks]
    s = DEFAULT_SIZES[-1] * 8
    while s < max_ranks:
        sizes.append(s)
        s *= 8
    if max_ranks not in sizes:
        sizes.append(max_ranks)
    return sizes


def slope(xs: list[float], ys: list[float]) -> float | None:
    pts = [(math.log(x), math.log(max(y, 1e-3))) for x, y in zip(xs, ys, strict=True)]
    if len(pts) < 2:
        return None
    a, _ = np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)
    return round(float(a), 3)


def fit(results: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [r for r in results if not r["extrapolated"]]
    used = [r for r in measured if r["ranks"] >= 64] if sum(r["ranks"] >= 64 for r in measured) >= 2 else measured
    xs = [r["ranks"] for r in used]
    return {"sizes": [r["ranks"] for r in results], "fit_sizes": xs,
            "time_slope": slope(xs, [r["cpu_s_per_window"] for r in used]),
            "memory_slope": slope(xs, [r["peak_rss_mb"] for r in used]),
            "stage_time_slopes": {k: slope(xs, [r["cpu_s_per_window_by_stage"][k] for r in used])
                                  for k in (used[0]["cpu_s_per_window_by_stage"] if used else {})},
            "extrapolated": any(r["extrapolated"] for r in results)}


def extrapolate(ranks: int, measured: list[dict[str, Any]], f: dict[str, Any]) -> dict[str, Any]:
    last = max(measured, key=lambda r: r["ranks"])
    scale = ranks / last["ranks"]
    cpu = last["cpu_s_per_window"] * scale ** (f["time_slope"] or 1.0)
    mem = last["peak_rss_mb"] * scale ** (f["memory_slope"] or 1.0)
    stage_slopes = f.get("stage_time_slopes", {})
    stages = {name: round(v * scale ** (stage_slopes.get(name) or 1.0), 3)
              for name, v in last.get("cpu_s_per_window_by_stage", {}).items()}
    return {"ranks": ranks, "cpu_s_per_window": round(cpu, 2), "cpu_us_per_rank_window": round(cpu / ranks * 1e6, 1),
            "cpu_s_per_window_by_stage": stages, "peak_rss_mb": round(mem, 1), "extrapolated": True,
            "from_ranks": last["ranks"]}


def run_in_subprocess(ranks: int, windows: int, functions: int, gc_young: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.scale", "--one", str(ranks), "--windows", str(windows),
           "--functions", str(functions), "--gc-young", str(gc_young)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where ``benchmarks`` imports from
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=root)
    if done.returncode:
        raise RuntimeError(f"size {ranks} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--max-ranks", type=int, default=DEFAULT_SIZES[-1],
                    help="largest size (8, 64, 512, 4096, then x8 steps, then this)")
    ap.add_argument("--measure-max", type=int, default=32768,
                    help="sizes above this are extrapolated from the fit, not run")
    ap.add_argument("--functions", type=int, default=30, help="functions per rank (collectives aside)")
    ap.add_argument("--windows", type=int, default=0, help="windows per size (default: 3 up to 512 ranks, "
                    "2 up to 4096, then 1)")
    ap.add_argument("--gc-young", type=int, default=StreamSettings().gc_young_objects,
                    help="the garbage collector's young threshold, as the worker sets it (0: CPython's)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one size in this process
    ap.add_argument("--footprint", type=int, metavar="RANKS",
                    help="instead: topic bytes and store rows/bytes of RANKS ranks' windows (sizing)")
    ap.add_argument("--sharded", type=int, metavar="RANKS",
                    help="instead: the diagnose stage of RANKS ranks unsharded and in shards (benchmarks/scale_shards.py)")
    ap.add_argument("--shard-counts", default="1,4,16", help="with --sharded: the shard counts, comma-separated")
    args = ap.parse_args(argv)
    tune_gc(args.gc_young)  # as `perftracker worker` does after start-up
    if args.sharded:
        from .scale_shards import run_sharded
        counts = tuple(int(c) for c in args.shard_counts.split(",") if c.strip())
        out = run_sharded(args.sharded, args.windows or 2, args.functions, counts)
        print(json.dumps({**out, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                          "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}))
        return 0
    if args.footprint:
        print(json.dumps(footprint(args.footprint, args.windows or 2, args.functions)))
        return 0
    if args.one:
        print(json.dumps({**run_size(args.one, args.windows or windows_for(args.one), args.functions),
                          "gc_young": args.gc_young}))
        return 0
    machine = {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    results: list[dict[str, Any]] = []
    sizes = sizes_up_to(args.max_ranks)
    for ranks in sizes:
        if ranks > args.measure_max:
            break
        r = run_in_subprocess(ranks, args.windows or windows_for(ranks), args.functions, args.gc_young)
        results.append(r)
        print(json.dumps(r) if args.json else json.dumps(r, indent=2), flush=True)
    f = fit(results)
    for ranks in sizes[len(results):]:
        r = extrapolate(ranks, results, f)
        results.append(r)
        print(json.dumps(r) if args.json else json.dumps(r, indent=2), flush=True)
    last = {**f, "sizes": [r["ranks"] for r in results], "extrapolated": any(r["extrapolated"] for r in results),
            **machine}
    print(json.dumps(last) if args.json else json.dumps(last, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
