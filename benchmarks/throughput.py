"""One worker process's throughput, broker to per-window statistics: ``python -m benchmarks.throughput --json``.

The job (:mod:`perftracker_ml.deploy.workloads.batches`): ``--ranks`` ranks of a TP x PP x DP job, ``--seconds``
of its EventBatches built by the collectors' own BatchBuilder and encoded with the
collectors' codec, ~92 events per rank per second in one batch per rank per second.
The batches are produced to a real tansu broker first (lz4, keyed job|rank, as the
collectors send them), then timed in this one process:

* ``events_per_s`` (end to end): a confluent-kafka consumer reads every partition from
  the beginning (explicit assignment: no group join in the timing) and the messages go,
  in chunks of up to 500 as the agent takes them, through the summarize agent's own calls
  (the ``summarize`` stage of ``streams/topology.py`` as ``streams/agents/stage.py`` wires
  it) -- the input MultiCodec's ``decode`` and the content validation, the chunk's
  EventBatches folded together (``summarize.add_batches``: ``detect/chunk_fold.py``),
  the gap metrics and counters, a ``poll`` of each summarizer fed and the encoding of every closed
  FunctionPattern/RankWindow with the agent's codecs -- plus the
  stage's timer every 0.5 s, and a final flush so every window is closed once.
  Not the Faust/aiokafka consumer: the calls the agent makes, with librdkafka fetching.
* ``decode_events_per_s``: the input codec's ``decode`` and the validation alone over the
  encoded batches.
* ``summarize_events_per_s``: the chunk fold + ``poll`` (window closing included) alone
  over decoded batches (``sequential_batches``: those the chunk fold folded alone, their chunk unreadable together); ``emit_records_per_s``: encoding the closed records alone.
* ``consume_events_per_s``: the consumer loop alone (message values touched, nothing
  decoded): the broker and librdkafka floor.

``--relay-ranks N``: every N ranks share a host whose relay (``perftracker relay``,
collectors/relay_server.py) sends their batches of each second as one message, grouped by the
relay's own ``RelayBuffer``; the agent takes a bundle's items each as a message.

Each figure is the best of ``--repeat`` runs (wall clock; ``*_cpu_s`` is this process's
CPU time for the same run, librdkafka's threads included). On a shared machine compare
``load_avg_1m`` and ``cpus``. The process and the Faust worker run with the worker's garbage
collector thresholds (``--gc-young``, default ``streams.gc_young_objects``; 0: CPython's own). ``--profile FILE`` writes a cProfile of one end-to-end run.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from perftracker_ml.collectors.batch import event_count
from perftracker_ml.deploy.workloads.batches import Workload, batches
from perftracker_ml.schemas import Codec, bundle
from perftracker_ml.schemas.gc_policy import tune_gc
from perftracker_ml.schemas.rules import limits_for
from perftracker_ml.schemas.settings import StreamSettings
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.schemas.validate import validate
from perftracker_ml.schemas.vocabulary import EVENT_BATCH, HARDWARE_BATCH
from perftracker_ml.streams.agents.stage import TAKE_MESSAGES, encode_all
from perftracker_ml.streams.context import StreamContext
from perftracker_ml.streams.detect import DetectionPolicy, RankSummarizer
from perftracker_ml.streams.detect.summarize import add_batches
from perftracker_ml.streams.gaps import GapMetrics
from perftracker_ml.streams.topology import SUMMARIZE, TopicRole

from .faust_worker import catch_up

TICK_S = 0.5  # the summarize stage's timer (topology.POLL_INTERVAL_S)
GOAL_EVENTS_PER_S = 1_000_000


@dataclass
class Job:
    """The encoded batches of one workload, and the Kafka messages that carry them (one each, or
    with a relay one per host and second)."""

    keys: list[bytes]
    values: list[bytes]
    events: int
    ranks: int
    messages: list[tuple[bytes, bytes]] = field(default_factory=list)  # (key, value) as produced

    @property
    def batches(self) -> int:
        return len(self.values)


def encode_job(w: Workload, wall0_ns: int, relay_ranks: int = 0) -> Job:
    """``relay_ranks`` > 1: every ``relay_ranks`` ranks share a host whose relay sends their batches
    of each second as one message (the relay's own grouping, ``relay_server.RelayBuffer``)."""
    codec = Codec(EVENT_BATCH)  # what the collectors' Sender encodes with
    keys, values, events = [], [], 0
    for rank, record in batches(w, wall0_ns):
        keys.append(f"{w.job}|{rank}".encode())
        values.append(codec.encode(record))
        events += event_count(record)
    job = Job(keys, values, events, w.ranks)
    job.messages = relayed(job, relay_ranks) if relay_ranks > 1 else list(zip(keys, values, strict=True))
    return job


def relayed(job: Job, per_host: int) -> list[tuple[bytes, bytes]]:
    """The messages the hosts' relays send: each host's batches of one second (the batches come
    in rank order each second) through a RelayBuffer of that host, in their order."""
    from perftracker_ml.collectors.relay import frame
    from perftracker_ml.collectors.relay_server import RelayBuffer

    out: list[tuple[bytes, bytes]] = []
    buffers: dict[int, RelayBuffer] = {}
    last = -1
    for key, value in zip(job.keys, job.values, strict=True):
        host = int(key.rsplit(b"|", 1)[1]) // per_host
        if host < last:  # the next second: what every host held goes out
            out += _drain(buffers)
        last = host
        buf = buffers.setdefault(host, RelayBuffer(f"host{host}"))
        buf.add(frame(TOPIC, key, value), 0.0)
    out += _drain(buffers)
    return out


def _drain(buffers: dict[int, Any]) -> list[tuple[bytes, bytes]]:
    return [(key.encode(), message) for _, buf in sorted(buffers.items())
            for _, key, items in buf.due(0.0, flush=True) for message in bundle.bundled(items)]


@dataclass
class AgentCalls:
    """The summarize agent's per-message and per-tick calls, without Faust."""

    ctx: StreamContext
    summarizers: dict[tuple[str, int], RankSummarizer] = field(default_factory=dict)
    emitted: int = 0
    invalid: int = 0
    sequential: int = 0  # EventBatches folded alone in add_chunk (a chunk unreadable together)

    def __post_init__(self) -> None:
        self.gaps = GapMetrics(self.ctx.counters)
        self.limits = limits_for(self.ctx.policy.max_duration_s)

    @classmethod
    def create(cls) -> AgentCalls:
        return cls(StreamContext(names=TopicNames.for_prefix("bench"), policy=DetectionPolicy()))

    def decode(self, raw: bytes) -> tuple[str, dict] | None:
        """What the agent's ``ctx.decode`` does: decode, then validate the content (None: invalid)."""
        name, record = self.ctx.codecs[TopicRole.INPUTS].decode(raw)
        if validate(name, record, self.limits) is not None:
            self.invalid += 1
            return None
        return name, record

    def skipped(self) -> Counter[str]:
        """What every summarizer skipped, by reason."""
        return sum((s.skipped for s in self.summarizers.values()), Counter())

    def summarizer_for(self, record: dict) -> RankSummarizer:
        key = (record["job"], int(record["rank"]))
        s = self.summarizers.get(key)
        if s is None:
            s = self.summarizers[key] = RankSummarizer(key[0], key[1], self.ctx.policy)
        return s

    def add(self, name: str, record: dict, now: int, emit: bool = True) -> None:
        s = self.summarizer_for(record)
        if name == HARDWARE_BATCH:
            s.add_hardware(record, now)
        else:
            s.add_events(record, now)
            self.gaps.batch_in(s.job, s.rank, s.health.lost_batches, s.health.dropped_events, record)
        self.ctx.count_in(name)
        closed = s.poll(now)
        if emit:
            self.emit(closed)

    def add_chunk(self, decoded: list[tuple[str, dict]], now: int, emit: bool = True) -> None:
        """The agent's calls for one chunk: every batch fed at once (``add_batches``: EventBatches
        folded column-wise), then each summarizer fed polled once."""
        items = [(self.summarizer_for(record), name == HARDWARE_BATCH, record) for name, record in decoded]
        self.sequential += add_batches(items, now).sequential
        fed: dict[int, RankSummarizer] = {}
        for (s, hardware, record), (name, _) in zip(items, decoded, strict=True):
            if not hardware:
                self.gaps.batch_in(s.job, s.rank, s.health.lost_batches, s.health.dropped_events, record)
            self.ctx.count_in(name)
            fed.setdefault(id(s), s)
        closed, _ = SUMMARIZE.poll_all(list(fed.values()), now, False)  # as the agent: closed together
        if emit:
            self.emit(closed)

    def on_message(self, raw: bytes, now: int) -> None:
        decoded = self.decode(raw)
        if decoded is not None:
            self.add(*decoded, now)

    def on_messages(self, raws: list[bytes], now: int) -> None:
        """A chunk of messages as the agent takes them (``TAKE_MESSAGES`` at most; a bundle's items
        each as a message, as ``ctx.decode_all``)."""
        decoded = [d for raw in raws for item in bundle.records_in(raw) if (d := self.decode(item)) is not None]
        self.add_chunk(decoded, now)

    def tick(self, now: int, flush: bool = False, emit: bool = True) -> list[tuple[str, dict]]:
        closed, _ = SUMMARIZE.poll_all(list(self.summarizers.values()), now, flush)
        if emit:
            self.emit(closed)
        return closed

    def emit(self, closed: Iterable[tuple[str, dict]]) -> None:
        """Encode what the agent would send as its ``send`` encodes it (the records of one name
        at once: ``stage.encode_all``); the send itself is left out. A record that does not
        encode raises."""
        records = list(closed)
        for value in encode_all(self.ctx, records):
            if isinstance(value, Exception):
                raise value
        self.emitted += len(records)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, process CPU s, result) of one call."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def best(runs: list[tuple[float, float, Any]]) -> tuple[float, float, Any]:
    return min(runs, key=lambda r: r[0])


def rate(count: int, seconds: float) -> float:
    """count / seconds, rounded; 0 when nothing was timed."""
    return round(count / seconds) if seconds > 0 else 0.0


# ---- stages -------------------------------------------------------------------------------
def decode_all(job: Job) -> list[tuple[str, dict]]:
    decode = AgentCalls.create().decode
    return [d for d in map(decode, job.values) if d is not None]


def summarize_all(decoded: list[tuple[str, dict]]) -> AgentCalls:
    """The agent's chunks (``TAKE_MESSAGES`` batches folded at once, each summarizer polled), the
    timer's polls, a final flush; nothing encoded."""
    calls = AgentCalls.create()
    next_tick = time.perf_counter() + TICK_S
    for start in range(0, len(decoded), TAKE_MESSAGES):
        calls.add_chunk(decoded[start:start + TAKE_MESSAGES], now_ms(), emit=False)
        if time.perf_counter() >= next_tick:
            next_tick += TICK_S
            calls.tick(now_ms(), emit=False)
    calls.tick(now_ms() + 1, flush=True, emit=False)
    return calls


def closed_records(decoded: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Every record the summarizers close over the job (for timing their encoding)."""
    calls, now, out = AgentCalls.create(), now_ms(), []
    for _name, record in decoded:
        s = calls.summarizer_for(record)
        s.add_events(record, now)
        out += s.poll(now)
    return out + calls.tick(now + 1, flush=True, emit=False)


def emit_all(records: list[tuple[str, dict]]) -> int:
    calls = AgentCalls.create()
    calls.emit(records)
    return calls.emitted


# ---- broker -------------------------------------------------------------------------------
TOPIC = "bench.events"
PARTITIONS = 8


def produce(bootstrap: str, job: Job) -> None:
    from confluent_kafka import Producer
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import Topic

    ensure_topics({"bootstrap.servers": bootstrap}, [Topic(TOPIC, PARTITIONS, "job|rank", "bench")])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    for key, value in job.messages:
        while True:
            try:
                p.produce(TOPIC, key=key, value=value)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(60):
        raise RuntimeError("the broker did not take every batch")


def consume(bootstrap: str, total: int, on_values: Callable[[list[bytes]], None],
            on_tick: Callable[[], None] = lambda: None) -> int:
    """Read ``total`` messages of every partition from the beginning; ``on_values`` takes them in
    chunks of at most ``TAKE_MESSAGES``, as the agent does."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time_ns()}",
                  "enable.auto.commit": False, "fetch.max.bytes": 64 << 20})
    c.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen, next_tick = 0, time.perf_counter() + TICK_S
    try:
        while seen < total:
            values = [m.value() for m in c.consume(num_messages=min(TAKE_MESSAGES, total - seen), timeout=0.1)
                      if not m.error()]
            if values:
                on_values(values)
                seen += len(values)
            if time.perf_counter() >= next_tick:
                next_tick += TICK_S
                on_tick()
    finally:
        c.close()
    return seen


def end_to_end(bootstrap: str, job: Job) -> AgentCalls:
    calls = AgentCalls.create()
    consume(bootstrap, len(job.messages), lambda vs: calls.on_messages(vs, now_ms()), lambda: calls.tick(now_ms()))
    calls.tick(now_ms() + 1, flush=True)
    return calls


# ---- report -------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summary(job: Job, e2e: tuple[float, float], decode: tuple[float, float], summarize: tuple[float, float],
            emit: tuple[float, float], consume_s: float, emitted: int) -> dict:
    """The JSON object: rates from (wall s, CPU s) pairs of the best runs."""
    return {
        "events_per_s": rate(job.events, e2e[0]), "batches_per_s": rate(job.batches, e2e[0]),
        "decode_events_per_s": rate(job.events, decode[0]),
        "summarize_events_per_s": rate(job.events, summarize[0]),
        "emit_records_per_s": rate(int(emit[1]), emit[0]),
        "consume_events_per_s": rate(job.events, consume_s),
        "ranks": job.ranks, "events": job.events, "batches": job.batches,
        "events_per_batch": round(job.events / max(job.batches, 1), 1),
        "bytes_per_batch": round(sum(map(len, job.values)) / max(job.batches, 1)),
        "records_out": emitted,
        "end_to_end_s": round(e2e[0], 3), "end_to_end_cpu_s": round(e2e[1], 3),
        "cpu_events_per_s": rate(job.events, e2e[1]),
        "decode_cpu_s": round(decode[1], 3), "summarize_cpu_s": round(summarize[1], 3),
        "goal_events_per_s": GOAL_EVENTS_PER_S,
        "path": "confluent-kafka consumer + the summarize agent's calls per chunk of 500 (decode, validate, "
                "the chunk fold, gap metrics, poll, encode of closed records); not the Faust/aiokafka consumer",
    }


def offline_stages(job: Job, repeat: int) -> dict[str, tuple[float, float]]:
    """Best (wall s, CPU s) of decode alone, summarize alone, and (s, records) of emit alone."""
    decode = best([timed(lambda: decode_all(job)) for _ in range(repeat)])
    decoded = decode[2]
    summarize = best([timed(lambda: summarize_all(decoded)) for _ in range(repeat)])
    records = closed_records(decoded)
    emit_s = min(timed(lambda: emit_all(records))[0] for _ in range(repeat))
    return {"decode": decode[:2], "summarize": summarize[:2], "emit": (emit_s, len(records))}


def faust_rates(job: Job, run: dict) -> dict:
    """Events per second (wall, and per worker CPU second) of a real worker's catch-up run."""
    events = job.events * run["batches"] / job.batches
    return {"faust_events_per_s": rate(round(events), run["seconds"]),
            "faust_cpu_events_per_s": rate(round(events), run["cpu_s"]),
            "faust_drained_events_per_s": rate(round(events), run["drained_s"]),
            "faust_batches_timed": run["batches"], "faust_seconds": round(run["seconds"], 2)}


def broker_stages(job: Job, repeat: int, bootstrap: str | None, profile: str | None,
                  faust: bool = False, spy: str | None = None) -> tuple[float, tuple[float, float], AgentCalls, dict]:
    """Produce, then the best consume-only seconds, end-to-end (wall s, CPU s) and its calls'
    state, and (``faust``) a real worker's catch-up rates."""
    broker = None
    if bootstrap is None:
        from perftracker_ml.deploy.tansu import start_broker
        broker = start_broker()
        bootstrap = broker.bootstrap
    try:
        produce(bootstrap, job)
        consume_s = min(timed(lambda: consume(bootstrap, len(job.messages), len))[0] for _ in range(repeat))
        e2e = best([timed(lambda: end_to_end(bootstrap, job)) for _ in range(repeat)])
        if profile:
            prof = cProfile.Profile()
            prof.runcall(end_to_end, bootstrap, job)
            prof.dump_stats(profile)
        worker = faust_rates(job, catch_up(bootstrap, TOPIC.split(".")[0], job.batches, spy_out=spy)) if faust else {}
    finally:
        if broker is not None:
            broker.stop()
    return consume_s, e2e[:2], e2e[2], worker


def run(w: Workload, repeat: int, bootstrap: str | None, profile: str | None, faust: bool = False,
        spy: str | None = None, relay_ranks: int = 0) -> dict:
    window_ns = DetectionPolicy().window_ms * 1_000_000
    start_ns = time.time_ns() - int(w.seconds * 1e9)
    job = encode_job(w, start_ns - start_ns % window_ns, relay_ranks)  # the job starts on a window edge
    stages = offline_stages(job, repeat)
    consume_s, e2e, calls, worker = broker_stages(job, repeat, bootstrap, profile, faust, spy)
    out = summary(job, e2e, stages["decode"], stages["summarize"], stages["emit"], consume_s, calls.emitted)
    out.update(worker)
    out["relay_ranks"], out["messages"] = relay_ranks, len(job.messages)
    out["skipped_end_to_end"] = dict(calls.skipped())  # input the summarizers left out (should be none)
    out["invalid_end_to_end"] = calls.invalid  # batches validation refused (none: the job is clean)
    out["sequential_batches"] = calls.sequential  # folded alone (none on this clean job)
    out.update({"seconds_of_job": w.seconds, "flush_s": w.flush_s, "tp": w.tp, "pp": w.pp, "dp": w.dp, "repeat": repeat,
                "cpus": os.cpu_count(), "cpu_model": cpu_model(), "load_avg_1m": round(os.getloadavg()[0], 2),
                "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=12, help="seconds of the job's batches")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bootstrap", help="an existing broker (default: start tansu)")
    ap.add_argument("--profile", help="write a cProfile of one end-to-end run here")
    ap.add_argument("--faust", action="store_true",
                    help="also time a real `perftracker worker` (Faust) catching up on the same batches")
    ap.add_argument("--faust-spy", help="sample that worker with py-spy into this file (collapsed stacks)")
    ap.add_argument("--gc-young", type=int, default=StreamSettings().gc_young_objects,
                    help="this process's and the Faust worker's young GC threshold, as a worker sets it "
                         "(schemas/gc_policy.py; 0 = CPython's defaults)")
    ap.add_argument("--relay-ranks", type=int, default=0,
                    help="ranks per host whose batches a host relay sends as one message a second "
                         "(collectors/relay_server.py; 0 = one message per batch, no relay)")
    ap.add_argument("--flush-s", type=float, default=1.0,
                    help="seconds of events per batch (the collectors' flush interval; 1 by default)")
    args = ap.parse_args(argv)
    w = Workload(ranks=args.ranks, seconds=args.seconds, tp=args.tp, pp=args.pp, flush_s=args.flush_s)
    w.check()
    thresholds = tune_gc(args.gc_young)  # as `perftracker worker` does after start-up
    os.environ["PERFTRACKER_STREAMS_GC_YOUNG_OBJECTS"] = str(args.gc_young)  # the Faust worker's
    out = run(w, args.repeat, args.bootstrap, args.profile, args.faust or bool(args.faust_spy), args.faust_spy,
              args.relay_ranks)
    out["gc_thresholds"] = list(thresholds)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
