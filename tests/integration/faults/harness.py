"""The real components of a fault test, started and killed as an operator would.

``Deployment`` is one perftracker deployment's settings (as ``PERFTRACKER_*``
environment variables on a temp data dir and random topics) and the processes
started with them: `perftracker worker` (Faust) and `perftracker sink` (chDB, or a
ClickHouse server URL), each a real OS process that can be killed with SIGKILL.
``Traffic`` sends synthetic jobs (:mod:`perftracker_ml.deploy.workloads.synthetic`) paced in
real time, one batch per rank per second, as the collectors of a running job do.
"""

from __future__ import annotations

import heapq
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perftracker_ml.deploy.tansu import free_port
from perftracker_ml.deploy.workloads.synthetic import SyntheticJob, batches
from perftracker_ml.schemas import Codec, MultiCodec, bundle
from perftracker_ml.schemas.kafka_admin import quiet_kafka_logger
from perftracker_ml.schemas.record_sets import FORMATS, expanded
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.schemas.vocabulary import EVENT_BATCH

from ..waiting import wait_for

WINDOW_S = 5  # short windows: an incident opens within ~20 s of job time
GRACE_S = 2


@dataclass
class Component:
    """One `perftracker worker` or `perftracker sink` process."""

    name: str
    proc: subprocess.Popen
    log: Path
    web_port: int = 0  # worker: its Faust web port
    ready_file: Path | None = None  # sink: where it writes its query API address

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait (a sink flushes and commits first); SIGKILL past ``timeout_s``."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return int(self.proc.returncode)

    def stats(self) -> dict:
        """A worker's counters and assigned partitions, a sink's /health stats ({} when not answering)."""
        if self.web_port:
            url = f"http://127.0.0.1:{self.web_port}/perftracker/stats/"
        else:
            info = _read_json(self.ready_file) if self.ready_file else None
            if not info:
                return {}
            url = info["query_url"] + "/health"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return {}
        return body.get("stats", body)

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Deployment:
    """Settings of one deployment and the processes started with them (see the module docstring)."""

    def __init__(self, root: Path, bootstrap: str, unique: str, partitions: int = 8, **settings: str):
        self.root = root
        self.data_dir = root / "data"
        self.prefix = f"f{unique}"
        self.topics = TopicNames.for_prefix(self.prefix)
        self.partitions = partitions
        self.bootstrap = bootstrap
        self.app_id = f"faults-{unique}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
        self.env.update({
            "PERFTRACKER_DATA_DIR": str(self.data_dir), "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PERFTRACKER_KAFKA_TOPIC_PREFIX": self.prefix, "PERFTRACKER_KAFKA_PARTITIONS": str(partitions),
            "PERFTRACKER_STREAMS_APP_ID": self.app_id, "PERFTRACKER_STREAMS_WINDOW_S": str(WINDOW_S),
            "PERFTRACKER_STREAMS_WINDOW_GRACE_S": str(GRACE_S), "PYTHONUNBUFFERED": "1",
            **{f"PERFTRACKER_{k.upper()}": v for k, v in settings.items()},
        })
        self.components: list[Component] = []

    @property
    def kafka_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def _spawn(self, name: str, args: list[str], **env: str) -> subprocess.Popen:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", *args],
                                    env={**self.env, **env}, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def start_worker(self) -> Component:
        """`perftracker worker` on a free web port; returns once it answers (not yet assigned)."""
        name = f"worker-{sum(c.web_port > 0 for c in self.components)}"
        port = free_port()
        proc = self._spawn(name, ["worker"], PERFTRACKER_STREAMS_WEB_PORT=str(port))
        c = Component(name, proc, self.root / "logs" / f"{name}.log", web_port=port)
        self.components.append(c)
        wait_for(lambda: c.stats() or not c.alive, 180, 0.5)
        assert c.alive, f"{name} exited at start:\n{c.tail()}"
        return c

    def start_sink(self) -> Component:
        """`perftracker sink`; returns once it wrote its ready file (store open, consuming)."""
        name = f"sink-{sum(c.ready_file is not None for c in self.components)}"
        ready = self.root / f"{name}.ready"
        proc = self._spawn(name, ["sink", "--ready-file", str(ready)])
        c = Component(name, proc, self.root / "logs" / f"{name}.log", ready_file=ready)
        self.components.append(c)
        wait_for(lambda: ready.exists() or not c.alive, 120, 0.2)
        assert c.alive, f"{name} exited at start:\n{c.tail()}"
        return c

    def stop_all(self) -> None:
        """Workers one at a time (a tansu group jams when two leave at once), then sinks."""
        for c in sorted(self.components, key=lambda c: c.ready_file is not None):
            c.stop()

    def logs(self) -> str:
        return "\n".join(f"----- {c.name} (tail) -----\n{c.tail()}" for c in self.components)


def partitions_of(assigned: list[str], topic: str) -> set[int]:
    return {int(a.rsplit(":", 1)[1]) for a in assigned if a.rsplit(":", 1)[0] == topic}


@dataclass(eq=False)
class Traffic(threading.Thread):
    """Sends the batches of ``jobs`` paced in real time (``speed`` simulated seconds per second),
    keyed ``job|rank`` with the collectors' producer settings; counts what was acknowledged."""

    conf: dict[str, str]
    topic: str
    jobs: list[SyntheticJob]
    speed: float = 1.0
    sent: int = 0
    delivered: int = 0
    failed: int = 0
    steps: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)  # (job, rank, seq) -> steps

    def __post_init__(self) -> None:
        super().__init__(name="fault-traffic", daemon=True)
        self._stop_event = threading.Event()

    def _stream(self) -> Iterator[tuple[int, int, dict]]:
        """(wall_ns, rank, batch) of every job, merged in time order, starting now."""
        def shifted(cfg: SyntheticJob) -> Iterator[tuple[int, int, dict]]:
            for rank, rec in batches(cfg):
                rec["wall_ns"] += int(cfg.seconds * 1e9)  # the job starts now, not `seconds` ago
                yield rec["wall_ns"], rank, rec
        return heapq.merge(*(shifted(c) for c in self.jobs), key=lambda t: t[0])

    def run(self) -> None:
        from confluent_kafka import Producer

        codec = Codec(EVENT_BATCH)
        producer = Producer({**self.conf, "linger.ms": 50, "compression.type": "lz4",
                             "message.timeout.ms": 60_000, "reconnect.backoff.max.ms": 5_000,
                             "logger": quiet_kafka_logger("perftracker.tests.traffic")})

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                self.delivered += 1
            else:
                self.failed += 1

        start_wall, start_mono = time.time_ns(), time.monotonic()
        for wall_ns, rank, rec in self._stream():
            due = start_mono + (wall_ns - start_wall) / 1e9 / self.speed
            while (wait := due - time.monotonic()) > 0:
                if self._stop_event.wait(min(wait, 0.2)):
                    break
                producer.poll(0)
            if self._stop_event.is_set():
                break
            try:
                producer.produce(self.topic, key=f"{rec['job']}|{rank}".encode(), value=codec.encode(rec),
                                 on_delivery=on_delivery)
            except BufferError:
                self.failed += 1
            self.sent += 1
            self.steps[(rec["job"], rank, rec["seq"])] = list(rec["iterations"]["step"])
            producer.poll(0)
        producer.flush(90)

    def stop(self) -> None:
        self._stop_event.set()


def read_topic(conf: dict[str, str], topic: str, names: list[str],
               timeout_s: float = 60.0) -> list[tuple[str, dict]]:
    """Every record on ``topic`` (all partitions, from the start) as (record name, record); a set's
    records (schemas/record_sets.py) one by one, as they are stored."""
    from confluent_kafka import Consumer, TopicPartition

    codec = MultiCodec([*names, *(FORMATS[n].name for n in names if n in FORMATS)])
    consumer = Consumer({**conf, "group.id": f"reader-{time.monotonic_ns()}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending, out = set(parts), []
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        pending.discard(msg.partition())
                    continue
                out += [one for item in bundle.records_in(msg.value()) for one in expanded(*codec.decode(item))]
        assert not pending, f"{topic}: partitions {sorted(pending)} not read to the end in {timeout_s}s"
        return out
    finally:
        consumer.close()


def chdb_reader(path: Path) -> Callable[[list[str]], list[list[list]]]:
    """Runs SQL statements on the chDB store at ``path`` from a fresh process (chDB allows one
    process per data dir: the sink must be stopped first); returns each statement's rows."""
    script = ("import json, sys; from perftracker_ml.sinks.store import Store, StoreTarget;"
              "s = Store.open(StoreTarget('chdb', path=sys.argv[1]));"
              "print(json.dumps([[list(r) for r in s.query(q).rows] for q in sys.argv[2:]], default=str))")

    def run(sqls: list[str]) -> list[list[list]]:
        out = subprocess.run([sys.executable, "-c", script, str(path), *sqls], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    return run


def server_reader(url: str) -> Callable[[list[str]], list[list[list]]]:
    """Runs SQL statements on a ClickHouse server store (``clickhouse://...``)."""
    from perftracker_ml.sinks.store import Store, parse_store_url

    def run(sqls: list[str]) -> list[list[list]]:
        store = Store.open(parse_store_url(url, Path(".")))
        try:
            return [[list(r) for r in store.query(q).rows] for q in sqls]
        finally:
            store.close()
    return run


def group_lag(conf: dict[str, str], group: str, topics: list[str], detail: bool = False) -> Any:
    """Messages on ``topics`` past ``group``'s committed offsets (all partitions; read without
    joining the group); ``detail``: {topic:partition: (committed, low, high)} of those behind.
    tansu's high watermark can read one below a committed offset (seen after batches of
    several records): a partition committed at or past it counts 0."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False,
                  "logger": quiet_kafka_logger("perftracker.tests.lag")})
    try:
        tps = [TopicPartition(t, p) for t in topics for p in c.list_topics(t, timeout=10).topics[t].partitions]
        lag, behind = 0, {}
        for tp in c.committed(tps, timeout=10):
            low, high = c.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)
            n = max(0, high - (tp.offset if tp.offset >= 0 else low))
            lag += n
            if n:
                behind[f"{tp.topic}:{tp.partition}"] = (tp.offset, low, high)
        return behind if detail else lag
    finally:
        c.close()


def sink_caught_up(d: Deployment) -> bool:
    """The sink has written and committed everything on its input topics."""
    t = d.topics
    return group_lag(d.kafka_conf, f"{d.app_id}-sink", [t.patterns, t.findings, t.anomalies]) == 0


def stop_workers(d: Deployment) -> None:
    """Stop every worker (one at a time), then let the sink catch up with what they sent."""
    for c in d.components:
        if c.web_port:
            c.stop()
    t = d.topics
    wait_for(lambda: sink_caught_up(d), 180, 1.0, lambda: group_lag(
        d.kafka_conf, f"{d.app_id}-sink", [t.patterns, t.findings, t.anomalies], detail=True))
