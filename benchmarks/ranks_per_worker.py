"""Ranks one worker follows in real time: ``python -m benchmarks.ranks_per_worker --json``.

A job of N ranks (:class:`benchmarks.scale.SyntheticRanks`, ``--functions 10``: one batch per
rank per second of 100 events -- 4 steps of 250 ms, each 10 spans, 8 TP and 6 DP collectives
and the iteration; the collector's default rate is one batch per rank per second) is sent to
a tansu broker in real time, each second's batches spread over that second, while fresh
``perftracker worker`` processes (Faust, all three stages) consume it. The batches are built
and encoded before the trial starts, so the sender costs only the producer's calls.

Per trial: ``--warmup-s`` seconds, then ``--judge-s`` seconds during which the consumer lag
(batches sent minus batches the workers' ``records_in.EventBatch`` counters say were
consumed, sampled every 0.5 s) must stay **bounded**: below two windows of the job's batches
(2 x window_s x N / P, P = ``--batch-s``) at every sample, and not growing -- the mean of the
judged period's last quarter at most one second of batches (N / P) above the mean of its first
quarter. ``--batch-s P``: one batch per rank every P seconds holding those P seconds' events (what
``PERFTRACKER_COLLECTOR_BATCH_WINDOW_S`` makes; the collectors' default is one a second), sent
spread over the second after the period's data ends. **Named**: rank ``SLOW_RANK`` runs the normal step until
``--onset-s`` (10; rounded up to a whole batch period), then its layer is slower and its
data-parallel peers wait for it; the trial reads the anomalies topic as the workers write it and
times the first incident opened naming that rank alone, on the wall clock, from the onset's wall
time. A trial **passes** when its lag is bounded and the rank is named at most
``--named-within-s`` (15) s after the onset. The rank
count is doubled from ``--start`` while trials pass, then bisected ``--bisect`` times between
the last passing and the first failing count. The same search runs with two workers in one
consumer group, starting at one worker's count (``scale_2_workers``: their largest N over one
worker's).

``memory_mb_per_rank``: the worker's RSS growth from before the first batch to the end of
the largest passing one-worker trial, over its ranks. ``cpus`` and ``load_avg_1m`` say what the
machine had; the workers, the sender and the broker share those CPUs. On a shared host a
worker gets a fraction of a core: ``events_per_worker_cpu_s`` (events the workers processed
over the CPU seconds they used while the batches were sent) and ``ranks_per_core_estimate``
(that over the events per rank per second) say what one worker with a core to itself would
follow -- an estimate, not a measured real-time run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from perftracker_ml.deploy.workloads.ranks import MS, SLOW_RANK, SyntheticRanks
from perftracker_ml.schemas.vocabulary import ANOMALY, EVENT_BATCH, Status
from perftracker_ml.streams.detect import DetectionPolicy

from .faust_worker import start_worker

WINDOW_S = DetectionPolicy().window_s


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _consumed(port: int) -> int | None:
    """Batches the worker took in; None when its stats did not answer within 1 s (a worker
    busy with a chunk): such a sample is left out rather than read as nothing consumed."""
    from perftracker_ml.deploy.stack import worker_stats

    stats = worker_stats(port)
    if stats is None:
        return None
    return int((stats.get("counters") or {}).get("records_in.EventBatch", 0))


def _assigned(port: int) -> int:
    from perftracker_ml.deploy.stack import worker_stats

    return len((worker_stats(port) or {}).get("assigned") or [])


def build(ranks: int, seconds: int, functions: int, job: str, batch_s: int = 1,
          slow_from_s: int = 0) -> tuple[list[list[tuple[bytes, bytes]]], int, int]:
    """Encoded batches per period of ``batch_s`` seconds (one batch per rank each; wall times from a
    start fixed after building: returned)."""
    from perftracker_ml.schemas import Codec

    codec = Codec(EVENT_BATCH)
    t0 = time.perf_counter()
    probe = SyntheticRanks(ranks, functions, job=job)
    for r in range(min(ranks, 50)):
        codec.encode(probe.batch(r, 0))
    per_batch = (time.perf_counter() - t0) / min(ranks, 50)
    start_ms = time.time_ns() // MS + int(per_batch * ranks * seconds * 1000 * 1.3) + 3000
    sim = SyntheticRanks(ranks, functions, job=job, wall0_ns=(start_ms - 1000) * MS, slow_from_s=slow_from_s)
    out = [[(f"{job}|{r}".encode(), codec.encode(sim.batch(r, s, batch_s))) for r in range(ranks)]
           for s in range(0, seconds - batch_s + 1, batch_s)]
    return out, start_ms, sim.events_per_batch


class Sender(threading.Thread):
    """Sends period s's batches, whose data ends at ``start + (s + 1) P - 1 s`` (P = ``period_s``,
    the collectors' batch period), spread over the second after that end, as a job's ranks send
    theirs (wall clock): for P = 1 one second's batches over the next second."""

    def __init__(self, bootstrap: str, topic: str, seconds: list[list[tuple[bytes, bytes]]], start_ms: int,
                 period_s: int = 1):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.seconds, self.start_ms = bootstrap, topic, seconds, start_ms
        self.period_ms = period_s * 1000
        self.sent = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 10, "compression.type": "lz4"})
        for s, batch in enumerate(self.seconds):
            n = len(batch)
            for i, (key, value) in enumerate(batch):
                due = self.start_ms + (s + 1) * self.period_ms - 1000 + i * 1000 // n
                while (wait := due - time.time_ns() // MS) > 0:
                    if self.stop_flag.wait(min(wait, 50) / 1000):
                        return
                    p.poll(0)
                while True:
                    try:
                        p.produce(self.topic, key=key, value=value)
                        break
                    except BufferError:
                        p.poll(0.01)
                self.sent += 1
                p.poll(0)
        p.flush(30)


class AnomalyWatch(threading.Thread):
    """Reads the anomalies topic as the workers write it: when (wall clock, ms) the first OPEN
    incident naming the slow rank alone came, and the other incidents opened meanwhile."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.named_ms: int | None = None
        self.named: dict[str, Any] = {}
        self.others: list[dict[str, Any]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        from perftracker_ml.schemas import Codec, bundle

        codec = Codec(ANOMALY)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"rpw-watch-{time.time_ns()}",
                      "enable.auto.commit": False})
        try:
            parts = c.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            while not self.stop_flag.is_set() and self.named_ms is None:
                for m in c.consume(50, timeout=0.2):
                    if m.error():
                        continue
                    for item in bundle.records_in(m.value()):
                        self.note(codec.decode(item))
        finally:
            c.close()

    def note(self, a: dict[str, Any]) -> None:
        if a["status"] != Status.OPEN:
            return
        seen = {"cause": a["cause"], "ranks": list(a["ranks"]), "function": a["function"]}
        if list(a["ranks"]) == [SLOW_RANK] and self.named_ms is None:
            self.named_ms, self.named = time.time_ns() // MS, seen
        elif self.named_ms is None:
            self.others.append(seen)


def trial(bootstrap: str, ranks: int, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    prefix = f"rw{time.time_ns() % 10**9}"
    ensure_topics({"bootstrap.servers": bootstrap}, all_topics(prefix))
    seconds = args.warmup_s + args.judge_s
    log_dir = Path(tempfile.mkdtemp(prefix="pt-bench-rpw-"))
    procs = []
    try:
        app = f"{prefix}-app"
        for i in range(workers):
            procs.append(start_worker(bootstrap, prefix, log_dir / f"worker-{i}.log", app_id=app))
        deadline = time.monotonic() + 180
        while not all(_assigned(port) for _, port in procs) and time.monotonic() < deadline:
            time.sleep(0.5)  # every worker holds partitions (after the group's last rebalance)
        time.sleep(2)
        rss0 = [_rss_mb(p.pid) for p, _ in procs]
        cpu0 = [_cpu_s(p.pid) for p, _ in procs]
        onset_s = -(-args.onset_s // args.batch_s) * args.batch_s  # a whole batch period: no batch spans it
        batches, start_ms, events_per_batch = build(ranks, seconds, args.functions, f"rpw{ranks}", args.batch_s,
                                                    onset_s)
        onset_ms = start_ms - 1000 + onset_s * 1000  # the wall time of the slow rank's first slow step
        if time.time_ns() // MS > start_ms:  # building took longer than planned: no real-time run
            return {"ranks": ranks, "workers": workers, "error": "batches were built too late"}
        sender = Sender(bootstrap, TopicNames.for_prefix(prefix).events, batches, start_ms, args.batch_s)
        watch = AnomalyWatch(bootstrap, TopicNames.for_prefix(prefix).anomalies)
        watch.start()
        sender.start()
        samples: list[tuple[float, int]] = []
        unanswered = 0  # samples left out: a worker's stats did not answer
        end_ms = start_ms + seconds * 1000
        while time.time_ns() // MS < end_ms:
            time.sleep(0.5)
            t = (time.time_ns() // MS - start_ms) / 1000
            sent, consumed_now = sender.sent, [_consumed(port) for _, port in procs]
            if None in consumed_now:
                unanswered += 1
                continue
            samples.append((t, sent - sum(c for c in consumed_now if c is not None)))
        sender.stop_flag.set()
        sender.join(10)
        named_by = onset_ms + int(args.named_within_s * 1000)
        while watch.named_ms is None and time.time_ns() // MS < named_by + 2000:
            time.sleep(0.2)  # the job's last seconds still being diagnosed: the culprit may come yet
        watch.stop_flag.set()
        watch.join(10)
        from perftracker_ml.deploy.stack import worker_stats

        out_counts: dict[str, int] = {}  # what the workers' stages handed on, and set aside
        for _, port in procs:
            for k, v in ((worker_stats(port) or {}).get("counters") or {}).items():
                if k.startswith(("records_out.", "records_skipped.", "records_late", "rule_decisions.")):
                    out_counts[k] = out_counts.get(k, 0) + int(v)
        rss = [_rss_mb(p.pid) for p, _ in procs]
        cpu = [_cpu_s(p.pid) - c0 for (p, _), c0 in zip(procs, cpu0, strict=True)]
        consumed = sum(_consumed(port) or 0 for _, port in procs)
    finally:
        for p, _ in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p, _ in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    judged = [lag for t, lag in samples if t >= args.warmup_s]
    q = max(1, len(judged) // 4)
    growth = (sum(judged[-q:]) / q - sum(judged[:q]) / q) if judged else float("inf")
    per_s = ranks / args.batch_s  # batches of one second of the job
    limit = 2 * WINDOW_S * per_s
    ok = bool(judged) and max(judged) < limit and growth <= max(per_s, 1)
    named_s = None if watch.named_ms is None else round((watch.named_ms - onset_ms) / 1000, 1)
    named = named_s is not None and named_s <= args.named_within_s
    return {"ranks": ranks, "workers": workers, "passed": ok and named, "bounded": ok, "named": named,
            "named_s": named_s, "named_incident": watch.named, "others_opened": watch.others[:5],
            "onset_s": onset_s, "worker_counts": out_counts if not named else {},
            "lag_max_batches": max(judged, default=-1),
            "lag_limit_batches": int(limit), "lag_growth_batches": round(growth, 1),
            "lag_last_s": round((judged[-1] if judged else 0) / per_s, 2),
            "events_per_s": round(ranks * events_per_batch / args.batch_s), "rss_mb": [round(x, 1) for x in rss],
            "rss_growth_mb": round(sum(rss) - sum(rss0), 1), "worker_cpu_s": [round(c, 1) for c in cpu],
            "events_per_worker_cpu_s": round(consumed * events_per_batch / max(sum(cpu), 1e-9)),
            "stats_unanswered": unanswered, "load_avg_1m": round(os.getloadavg()[0], 2)}


def _cpu_s(pid: int) -> float:
    from .faust_worker import _cpu_s as cpu

    return cpu(pid)


def search(bootstrap: str, workers: int, args: argparse.Namespace, log: list[dict],
           start: int | None = None) -> dict[str, Any] | None:
    """Largest passing trial: doubling from ``start`` (default ``args.start``), then
    ``args.bisect`` bisections."""
    good: dict[str, Any] | None = None
    bad: int | None = None
    n = start or args.start
    while n <= args.max_ranks:
        r = trial(bootstrap, n, workers, args)
        log.append(r)
        _progress(r)
        if r.get("passed"):
            good, n = r, n * 2
        else:
            bad = n
            break
    for _ in range(args.bisect if bad is not None else 0):
        lo = good["ranks"] if good else 0
        mid = (lo + bad) // 2 // 32 * 32  # TP x PP multiples
        if mid <= lo:
            break
        r = trial(bootstrap, mid, workers, args)
        log.append(r)
        _progress(r)
        if r.get("passed"):
            good = r
        else:
            bad = mid
    if good is not None:
        good = {**good, "first_unbounded": bad}
    return good


def _progress(r: dict) -> None:
    print(json.dumps({"trial": r}), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--start", type=int, default=256, help="first rank count (a multiple of 32)")
    ap.add_argument("--max-ranks", type=int, default=8192)
    ap.add_argument("--bisect", type=int, default=1, help="bisection steps after the first unbounded count")
    ap.add_argument("--warmup-s", type=int, default=10)
    ap.add_argument("--judge-s", type=int, default=16)
    ap.add_argument("--functions", type=int, default=10)
    ap.add_argument("--no-two", action="store_true", help="skip the two-worker search")
    ap.add_argument("--onset-s", type=int, default=10,
                    help="second of the job at which its slow rank slows down (the onset the naming is timed from)")
    ap.add_argument("--named-within-s", type=float, default=15.0,
                    help="a trial passes only if the slow rank is named (an incident opened naming it alone) "
                         "this soon after the onset")
    ap.add_argument("--batch-s", type=int, default=1,
                    help="seconds of events per batch: one batch per rank every this many seconds (the "
                         "collectors' default is 1; PERFTRACKER_COLLECTOR_BATCH_WINDOW_S=5 makes 5)")
    args = ap.parse_args(argv)
    from perftracker_ml.deploy.tansu import start_broker

    trials: list[dict] = []
    broker = start_broker()
    try:
        one = search(broker.bootstrap, 1, args, trials)
        # two workers follow at least what one does: their search starts at one worker's count
        two = None if args.no_two else search(broker.bootstrap, 2, args, trials,
                                               start=one["ranks"] if one else None)
    finally:
        broker.stop()
    ranks_1 = one["ranks"] if one else 0
    ranks_2 = two["ranks"] if two else 0
    out = {
        "ranks_per_worker": ranks_1, "ranks_2_workers": ranks_2 if not args.no_two else None,
        "scale_2_workers": round(ranks_2 / ranks_1, 2) if ranks_1 and not args.no_two else None,
        "events_per_rank_s": round(one["events_per_s"] / ranks_1) if one else None,
        "batches_per_rank_s": round(1 / args.batch_s, 3),
        "events_per_s_1_worker": one["events_per_s"] if one else 0,
        "first_unbounded_1_worker": one.get("first_unbounded") if one else None,
        "first_unbounded_2_workers": two.get("first_unbounded") if two else None,
        # what one worker would follow with a whole core to itself, from the CPU it used (an estimate)
        "events_per_worker_cpu_s": one["events_per_worker_cpu_s"] if one else None,
        "ranks_per_core_estimate": round(one["events_per_worker_cpu_s"] / (one["events_per_s"] / ranks_1))
        if one else None,
        "memory_mb_per_rank": round(one["rss_growth_mb"] / ranks_1, 3) if one else None,
        "worker_rss_mb": one["rss_mb"] if one else None,
        "named_s": one["named_s"] if one else None,
        "passed": "bounded and named: lag < 2 windows of batches at every sample of the judged period and its "
                  f"last quarter's mean at most 1 s of batches above its first quarter's, and rank {SLOW_RANK} "
                  f"named alone at most {args.named_within_s:g} s after its onset",
        "batch_s": args.batch_s, "onset_s": args.onset_s,
        "warmup_s": args.warmup_s, "judge_s": args.judge_s, "trials": trials,
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
