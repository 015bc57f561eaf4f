"""A backlog diagnosed as the same data live: ``python -m benchmarks.catch_up --json``.

The job (:class:`benchmarks.scale.SyntheticRanks`, ``--functions 10``: 100 events per
rank per second in one batch per rank per second, TP 8 x PP 4 x DP from 512 ranks; rank 1's
layer block 5 ms per step slower, its DP peers the victims) is run through the worker path
(:class:`perftracker_ml.streams.topology.LocalRunner`: summarize -> compare -> diagnose, in this
process) twice per size:

* ``live``: each second's batches arrive when they were sent (the caller's clock is the
  batches' time), the stages' timers tick every 0.5 s between them;
* ``backlog``: the same job, ``--behind-s`` seconds old, read as fast as this process goes
  on the real wall clock with the timers ticking every 0.5 s of it -- a worker restarted
  behind the live head, or a burst. ``seconds`` is the time to drain it. The stages are
  told that input waits unread while the backlog is fed, as the Faust worker's timer learns
  from its consumer's lag (streams/agents/stage.py).

Each run reports the RankWindows emitted (every rank, every window), the events dropped
for want of an open window (``dropped_late``: the RankWindows' ``dropped_events``, the
collector drops none here), patterns and records that came after their window was
evaluated (``late_patterns``, ``late_records``), and the incidents opened (cause, ranks,
function). ``same_as_live``: the backlog emitted the same RankWindows (rank, window, steps)
and opened the same incidents as live. ``--wall-clock-only`` runs the backlog as before the
job clock (windows closed on the caller's clock only: the late drops this fixes).
``peak_rss_mb``: this process's peak RSS growth over the size's run. One fresh process per
size (``--ranks 2048,8192``).

``--worker`` also runs the backlog through a real ``perftracker worker`` (tansu broker, Faust,
Avro) started after the batches were produced: ``worker_seconds`` from its first consumed
batch to its last, its late drops and RankWindows read back from the findings topic, its
incidents from the anomalies topic, and its peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perftracker_ml.deploy.workloads.ranks import MS, SLOW_RANK, TICK_MS, SyntheticRanks
from perftracker_ml.schemas.record_sets import expanded
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH, RANK_WINDOW, Status
from perftracker_ml.streams.detect import DetectionPolicy
from perftracker_ml.streams.detect.job_clock import JobClock
from perftracker_ml.streams.topology import LocalRunner

DEFAULT_SIZES = (2048, 8192)


@dataclass
class Outcome:
    """What one run of the job through the worker path produced."""

    windows: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, window) -> steps
    dropped: dict[int, int] = field(default_factory=dict)  # rank -> events dropped (cumulative, max)
    incidents: set[tuple[str, tuple[int, ...], str]] = field(default_factory=set)  # (cause, ranks, function)
    late: Counter[str] = field(default_factory=Counter)

    def keep(self, name: str, record: Any) -> Any:
        for one_name, one in expanded(name, record):  # a record set's records one by one
            if one_name == RANK_WINDOW:
                rank = int(one["rank"])
                self.windows[(rank, int(one["window_id"]))] = int(one["steps"])
                self.dropped[rank] = max(self.dropped.get(rank, 0), int(one["dropped_events"]))
            elif one_name == ANOMALY and one["status"] == Status.OPEN:
                self.incidents.add((str(one["cause"]), tuple(int(r) for r in one["ranks"]), str(one["function"])))
        return record

    def upto(self, last_window: int) -> dict[tuple[int, int], int]:
        """The RankWindows up to ``last_window`` (the job's last window with data; past it, a
        stage emits empty windows of silent ranks for as long as it runs)."""
        return {k: v for k, v in self.windows.items() if k[1] <= last_window}

    def relative(self, first_window: int, last_window: int) -> dict[tuple[int, int], int]:
        """:meth:`upto`, each window counted from the job's first (``first_window``): runs of the
        same job started at different times compare window for window."""
        return {(r, w - first_window): v for (r, w), v in self.upto(last_window).items()}

    def summary(self) -> dict[str, Any]:
        ranks = {r for r, _ in self.windows}
        per_rank = Counter(r for r, _ in self.windows)
        return {"rank_windows": len(self.windows), "ranks_with_windows": len(ranks),
                "windows_per_rank": sorted(set(per_rank.values())),
                "dropped_late": sum(self.dropped.values()), **{k: v for k, v in sorted(self.late.items())},
                "incidents": sorted({"cause": c, "ranks": list(r[:8]), "function": f}
                                    for c, r, f in self.incidents),
                "culprit_named": any(r == (SLOW_RANK,) for _, r, _ in self.incidents)}


def _late_counts(runner: LocalRunner) -> Counter[str]:
    late: Counter[str] = Counter()
    for name, key in (("summarize", "late_event"), ("compare", "late_pattern"), ("diagnose", "late_record")):
        for core in runner.cores[name].by_key.values():
            late[key + "s"] += core.skipped.get(key, 0)
    return late


def _close_out(runner: LocalRunner, end_ms: int, policy: DetectionPolicy) -> None:
    """No more data: the grace runs out, the last windows close and are diagnosed."""
    for k in range(1, 5):
        runner.tick(end_ms + k * (policy.grace_ms + policy.close_lag_ms + TICK_MS) + policy.catch_up_margin_ms)


def _sim(ranks: int, functions: int, wall0_ns: int, seed: int) -> SyntheticRanks:
    return SyntheticRanks(ranks, functions, job="catchup", seed=seed, wall0_ns=wall0_ns)


def run_live(ranks: int, seconds: int, functions: int, wall0_ns: int, seed: int = 0) -> Outcome:
    """The job's batches arriving as they were sent (the caller's clock: their send time)."""
    policy = DetectionPolicy()
    out = Outcome()
    runner = LocalRunner(policy, wire=out.keep)
    _feed_live(runner, _sim(ranks, functions, wall0_ns, seed), seconds)
    _close_out(runner, wall0_ns // MS + seconds * 1000, policy)
    out.late = _late_counts(runner)  # the close-out's included: the last windows are evaluated there
    return out


def _feed_live(runner: LocalRunner, sim: SyntheticRanks, seconds: int) -> None:
    t0 = sim.wall0_ns // MS
    for second in range(seconds):
        now = t0 + (second + 1) * 1000
        for r in range(sim.layout.ranks):
            runner.feed(EVENT_BATCH, sim.batch(r, second), now + 20)
        for k in range(1000 // TICK_MS):
            runner.tick(now + 20 + k * TICK_MS)


def tick_cost(ranks: int, seconds: int, functions: int, ticks: int = 60) -> dict[str, Any]:
    """The timers' cost once the job is idle: ``seconds`` of the job fed live, the last windows
    closed, then ``ticks`` timer ticks 0.5 s apart (every stage, as the worker's timers) timed
    with nothing fed; a tick that closes nothing is idle (its cost: ticks over the cores held)."""
    policy = DetectionPolicy()
    out = Outcome()
    runner = LocalRunner(policy, wire=out.keep)
    wall0 = 1_700_000_000_000 * MS
    _feed_live(runner, _sim(ranks, functions, wall0, 0), seconds)
    end = wall0 // MS + seconds * 1000
    _close_out(runner, end, policy)
    now = end + 5 * (policy.grace_ms + policy.close_lag_ms + TICK_MS) + policy.catch_up_margin_ms
    idle_ms: list[float] = []
    busy_ms: list[float] = []
    for k in range(ticks):
        before = len(out.windows)
        t = time.perf_counter()
        left = runner.tick(now + k * TICK_MS)
        dt = (time.perf_counter() - t) * 1000
        (busy_ms if left or len(out.windows) != before else idle_ms).append(dt)
    cores = {name: len(c.by_key) for name, c in runner.cores.items()}

    def q(xs: list[float], p: float) -> float:
        return round(sorted(xs)[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else 0.0

    return {"ranks": ranks, "tick_cost": True, "cores": cores, "ticks": ticks, "idle_ticks": len(idle_ms),
            "idle_tick_ms_p50": q(idle_ms, 0.5), "idle_tick_ms_p90": q(idle_ms, 0.9),
            "idle_tick_us_per_rank": round(q(idle_ms, 0.5) * 1000 / ranks, 2),
            "closing_ticks": len(busy_ms), "closing_tick_ms_p50": q(busy_ms, 0.5)}


def now_ms() -> int:
    return time.time_ns() // MS


def run_backlog(ranks: int, seconds: int, functions: int, wall0_ns: int, seed: int = 0,
                clock: Callable[[], int] = now_ms) -> tuple[Outcome, float, int]:
    """The same job read long after it was sent, as fast as this process goes, the timers ticking
    every 0.5 s of ``clock``; (outcome, seconds to drain, events)."""
    policy = DetectionPolicy()
    out = Outcome()
    runner = LocalRunner(policy, wire=out.keep)
    sim = _sim(ranks, functions, wall0_ns, seed)
    events = 0
    t_start = time.perf_counter()
    next_tick = clock() + TICK_MS
    for second in range(seconds):
        for r in range(ranks):
            batch = sim.batch(r, second)
            runner.feed(EVENT_BATCH, batch, clock())
            events += sim.events_per_batch
            if (now := clock()) >= next_tick:
                _pending(runner, True)  # as the Faust tick learns from its consumer: the backlog is unread
                runner.tick(now)
                next_tick = now + TICK_MS
    drained = time.perf_counter() - t_start
    _pending(runner, False)
    _close_out(runner, clock(), policy)
    out.late = _late_counts(runner)  # the close-out's included (it evaluates the last windows)
    return out, drained, events


def _pending(runner: LocalRunner, pending: bool) -> None:
    """Tell every stage's job clocks whether input waits unread (the Faust worker's tick reads
    it from its consumer's lag and its agents' queues; a runner in process is told)."""
    for cores in runner.cores.values():
        cores.clocks.input_pending(pending)


def _rss_kb(field_name: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _wall_clock_only() -> None:
    """The behaviour before the job clock: the caller's clock always decides, data time never."""
    JobClock.by_wall = lambda self, now_ms: True  # type: ignore[method-assign]
    JobClock.data_past = lambda self, point_ms: False  # type: ignore[method-assign]


def last_window(wall0_ns: int, seconds: int, window_ms: int) -> int:
    return (wall0_ns // MS + seconds * 1000 - 1) // window_ms


def run_size(ranks: int, seconds: int, functions: int, behind_s: int, wall_clock_only: bool = False,
             live: bool = True) -> dict[str, Any]:
    if wall_clock_only:
        _wall_clock_only()
    policy = DetectionPolicy()
    wms = policy.window_ms
    start = time.time_ns() - (seconds + behind_s) * 1_000_000_000
    wall0 = start - start % (wms * MS)  # the job starts on a window edge
    rss0 = _rss_kb("VmRSS")
    backlog, drained, events = run_backlog(ranks, seconds, functions, wall0)
    peak = max(_rss_kb("VmHWM") - rss0, 0)
    res: dict[str, Any] = {"ranks": ranks, "seconds_of_job": seconds, "behind_s": behind_s,
                           "events": events, "batches": ranks * seconds,
                           "events_per_rank_s": round(events / (ranks * seconds), 1),
                           "seconds": round(drained, 2), "events_per_s": round(events / drained),
                           "peak_rss_mb": round(peak / 1024, 1), "wall_clock_only": wall_clock_only,
                           "backlog": backlog.summary()}
    if live:
        lv = run_live(ranks, seconds, functions, wall0)
        res["live"] = lv.summary()
        last = last_window(wall0, seconds, wms)
        res["same_as_live"] = lv.upto(last) == backlog.upto(last) and lv.incidents == backlog.incidents
        res["_live"] = lv
        res["_window0"] = (wall0 // MS) // wms  # the job's first window (it starts on a window edge)
    return res


# ---- the real worker -----------------------------------------------------------------------------
def produce_backlog(bootstrap: str, topic: str, ranks: int, seconds: int, functions: int, wall0_ns: int) -> int:
    from confluent_kafka import Producer
    from perftracker_ml.schemas import Codec

    codec = Codec(EVENT_BATCH)
    sim = _sim(ranks, functions, wall0_ns, 0)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    n = 0
    for second in range(seconds):
        for r in range(ranks):
            value = codec.encode(sim.batch(r, second))
            while True:
                try:
                    p.produce(topic, key=f"{sim.job}|{r}".encode(), value=value)
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
            n += 1
    if p.flush(120):
        raise RuntimeError("the broker did not take every batch")
    return n


def read_back(bootstrap: str, prefix: str) -> Outcome:
    """The RankWindows on the findings topic and the OPEN anomalies on the anomalies topic."""
    from confluent_kafka import Consumer, TopicPartition
    from perftracker_ml.schemas import MultiCodec, bundle
    from perftracker_ml.schemas.topics import TopicNames
    from perftracker_ml.schemas.vocabulary import FUNCTION_COMPARISON, RANK_WINDOW_SET

    names = TopicNames.for_prefix(prefix)
    out = Outcome()
    for topic, records in ((names.findings, [RANK_WINDOW, FUNCTION_COMPARISON, RANK_WINDOW_SET]),
                           (names.anomalies, [ANOMALY])):
        codec = MultiCodec(records)
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{time.time_ns()}",
                      "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest"})
        try:
            parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
            c.assign([TopicPartition(topic, p, 0) for p in parts])
            pending, deadline = set(parts), time.monotonic() + 120
            while pending and time.monotonic() < deadline:
                for msg in c.consume(1000, 0.5):
                    if msg.error():
                        if msg.error().code() == -191:  # partition EOF
                            pending.discard(msg.partition())
                        continue
                    for item in bundle.records_in(msg.value()):  # RecordBundles: each record
                        for name, record in expanded(*codec.decode(item)):  # RankWindowSets: each RankWindow
                            out.keep(name, record)
        finally:
            c.close()
    return out


def _worker_counters(port: int) -> dict[str, Any]:
    from perftracker_ml.deploy.stack import worker_stats

    return (worker_stats(port) or {}).get("counters", {})


def run_worker(ranks: int, seconds: int, functions: int, behind_s: int, timeout_s: float) -> dict[str, Any]:
    """The backlog through a real ``perftracker worker`` started after it was produced."""
    import signal
    import tempfile
    from pathlib import Path

    from perftracker_ml.deploy.tansu import start_broker
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    from .faust_worker import _cpu_s, start_worker

    policy = DetectionPolicy()
    prefix = f"cu{time.time_ns() % 10**8}"
    start = time.time_ns() - (seconds + behind_s) * 1_000_000_000
    wall0 = start - start % (policy.window_ms * MS)
    broker = start_broker()
    try:
        ensure_topics({"bootstrap.servers": broker.bootstrap}, all_topics(prefix))
        sent = produce_backlog(broker.bootstrap, TopicNames.for_prefix(prefix).events, ranks, seconds,
                               functions, wall0)
        log = Path(tempfile.mkdtemp(prefix="pt-bench-catchup-")) / "worker.log"
        proc, port = start_worker(broker.bootstrap, prefix, log)
        try:
            first: tuple[float, float] | None = None
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not drain {sent} batches; see {log}")
                n = int(_worker_counters(port).get("records_in.EventBatch", 0))
                if n and first is None:
                    first = (time.perf_counter(), _cpu_s(proc.pid))
                if first and n >= sent:
                    drained, cpu = time.perf_counter() - first[0], _cpu_s(proc.pid) - first[1]
                    break
                time.sleep(0.2)
            # the last windows close once the input stopped for a grace, then are diagnosed
            time.sleep((2 * policy.grace_ms + policy.close_lag_ms + policy.catch_up_margin_ms) / 1000 + 5)
            counters = _worker_counters(port)
            peak = _rss_kb("VmHWM", str(proc.pid))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        outcome = read_back(broker.bootstrap, prefix)
    finally:
        broker.stop()
    events_dropped = sum(int(v) for k, v in counters.items() if k.startswith("events_dropped"))
    return {"worker_seconds": round(drained, 2), "worker_cpu_s": round(cpu, 2),
            "worker_events_per_s": round(sent * outcome_events_per_batch(ranks, functions) / drained),
            "worker_peak_rss_mb": round(peak / 1024, 1), "worker_events_dropped": events_dropped,
            "worker": outcome.summary(), "_outcome": outcome,
            "_last": last_window(wall0, seconds, policy.window_ms), "_window0": (wall0 // MS) // policy.window_ms}


def outcome_events_per_batch(ranks: int, functions: int) -> int:
    sim = _sim(ranks, functions, 0, 0)
    sim.batch(0, 0)
    return sim.events_per_batch


def run_in_subprocess(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.catch_up", "--one", *args], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON lines, one per size")
    ap.add_argument("--ranks", type=sizes, default=list(DEFAULT_SIZES), help="comma-separated sizes")
    ap.add_argument("--seconds", type=int, default=15, help="seconds of the job in the backlog")
    ap.add_argument("--functions", type=int, default=10)
    ap.add_argument("--behind-s", type=int, default=60, help="how old the backlog's last batch is")
    ap.add_argument("--no-live", action="store_true", help="skip the live run (no same_as_live)")
    ap.add_argument("--wall-clock-only", action="store_true",
                    help="windows closed on the caller's clock only (the behaviour before the job clock)")
    ap.add_argument("--worker", action="store_true", help="also through a real `perftracker worker`")
    ap.add_argument("--worker-timeout-s", type=float, default=900)
    ap.add_argument("--tick-cost", action="store_true",
                    help="time the timers' ticks once the job is idle (--seconds of it fed live first)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for ranks in args.ranks:
        if args.one and args.tick_cost:
            res = tick_cost(ranks, args.seconds, args.functions)
            res.update(machine())
            print(json.dumps(res))
            continue
        if args.one:
            res = run_size(ranks, args.seconds, args.functions, args.behind_s, args.wall_clock_only,
                           live=not args.no_live or args.worker)
            if args.worker:
                w = run_worker(ranks, args.seconds, args.functions, args.behind_s, args.worker_timeout_s)
                outcome, live, last, first = w.pop("_outcome"), res["_live"], w.pop("_last"), w.pop("_window0")
                res.update(w)
                # the worker's job was produced later than the live run's: windows compared from each one's first
                live_first = res.pop("_window0")
                res["worker_same_as_live"] = (live.relative(live_first, live_first + last - first)
                                              == outcome.relative(first, last)) and live.incidents == outcome.incidents
            res.pop("_live", None)
            res.pop("_window0", None)
            res.update(machine())
            print(json.dumps(res))
            continue
        extra = ["--seconds", str(args.seconds), "--functions", str(args.functions),
                 "--behind-s", str(args.behind_s), "--worker-timeout-s", str(args.worker_timeout_s)]
        extra += ["--no-live"] * args.no_live + ["--wall-clock-only"] * args.wall_clock_only
        extra += ["--worker"] * args.worker + ["--tick-cost"] * args.tick_cost
        res = run_in_subprocess(["--ranks", str(ranks), *extra])
        print(json.dumps(res) if args.json else json.dumps(res, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
