"""`perftracker record`: keep a job's input messages as they arrived, for replay.

Reads the input topics (events and hardware) of the configured prefix from the start of
every partition with a consumer of its own (no group offsets committed: the stream
workers' reading is untouched), keeps the messages whose key names the job (``job|rank``,
as the collectors key them; a message without a key is decoded to find its job), and
writes them, bytes untouched, to a recording (:mod:`perftracker_ml.schemas.recording`).

Two ways to stop, for the two uses:

* a past job (``source`` "retained"): read what the topics still hold and stop once a poll
  has brought nothing for ``quiet_s`` (the broker's end offset is not trusted: tansu reports
  it too low, docs/background.md);
* a running job (``--follow``, "live"): wait up to ``wait_s`` for its first message, then
  read on until it has been silent for ``idle_s`` (it ended, or stopped reporting), or
  ``limit_s`` passed.

Either way the recording holds what the topics retained: a job older than the topics'
retention is lost, and what was lost is said (no message of the job: an error).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..schemas import MultiCodec, SchemaError, bundle
from ..schemas.errors import PerftrackerError
from ..schemas.recording import RecordedMessage, RecordingHeader, write_recording
from ..schemas.settings import Settings
from ..schemas.stackfile import resolve_bootstrap
from ..schemas.topics import TopicNames
from ..streams.topology import TopicRole, records_on

POLL_S = 0.5


class RecordError(PerftrackerError):
    """Nothing could be recorded (no broker, no message of the job)."""


@dataclass(frozen=True)
class RecordOptions:
    job: str
    follow: bool = False
    quiet_s: float = 3.0  # retained: stop after this long with nothing new
    wait_s: float = 120.0  # follow: the job's first message must come by then
    idle_s: float = 20.0  # follow: stop once the job has been silent this long
    limit_s: float = 3600.0  # follow: stop after this long whatever happens
    note: str = ""


def job_of_key(key: bytes | None) -> str | None:
    """``b"job|3"`` -> ``"job"`` (None for a key of another shape)."""
    if not key or b"|" not in key:
        return None
    job, _, rank = key.rpartition(b"|")
    return job.decode("utf-8", "replace") if rank.isdigit() else None


def _job_of_value(codec: MultiCodec, value: bytes) -> str | None:
    try:
        for item in bundle.records_in(value):
            return str(codec.decode(item)[1].get("job"))
    except (SchemaError, KeyError, TypeError):
        return None
    return None


def record_job(settings: Settings, out: Path, options: RecordOptions,
               echo: Callable[[str], None] = lambda _line: None) -> int:
    """Record ``options.job`` into ``out``; returns the number of messages kept."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    bootstrap = resolve_bootstrap(settings)
    if not bootstrap:
        raise RecordError("no Kafka to read: start the embedded stack (`perftracker up`) or set "
                          "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS")
    names = TopicNames.for_prefix(settings.kafka.topic_prefix)
    topics = {names.events: TopicRole.INPUTS, names.hardware: TopicRole.INPUTS}
    conf = {**settings.kafka.client_conf(), "bootstrap.servers": bootstrap,
            "group.id": f"perftracker-record-{options.job}-{time.time_ns()}", "enable.auto.commit": False,
            "fetch.wait.max.ms": 200, "enable.partition.eof": False}
    consumer = Consumer(conf)
    codec = MultiCodec(records_on(TopicRole.INPUTS))
    kept: list[RecordedMessage] = []
    try:
        try:
            assigned = []
            for topic in topics:
                meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
                if meta is None or meta.error is not None or not meta.partitions:
                    raise RecordError(f"topic {topic} not found at {bootstrap} (is the prefix "
                                      f"{settings.kafka.topic_prefix!r} the stack's?)")
                assigned += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]
            consumer.assign(assigned)
        except KafkaException as exc:
            raise RecordError(f"cannot read the topics at {bootstrap}: {exc}") from exc
        started = last_any = last_job = time.monotonic()
        seen_job = False
        while True:
            msg = consumer.poll(POLL_S)
            now = time.monotonic()
            if msg is not None and not msg.error():
                value = msg.value() or b""
                key = msg.key()
                job = job_of_key(key)
                if job is None:
                    job = _job_of_value(codec, value)
                last_any = now
                if job == options.job:
                    seen_job, last_job = True, now
                    _ts_type, ts = msg.timestamp()
                    topic = str(msg.topic())
                    kept.append(RecordedMessage(topics[topic], topic, int(msg.partition() or 0),
                                                int(msg.offset() or 0), int(ts), key, value))
                    if len(kept) % 1000 == 0:
                        echo(f"{len(kept)} messages of {options.job} so far")
                continue
            if not options.follow:
                if now - last_any >= options.quiet_s:
                    break
                continue
            if not seen_job and now - started >= options.wait_s:
                break
            if seen_job and now - last_job >= options.idle_s:
                break
            if now - started >= options.limit_s:
                break
    finally:
        consumer.close()
    if not kept:
        raise RecordError(f"no message of job {options.job!r} on {', '.join(topics)} at {bootstrap}"
                          + (f" within {options.wait_s:.0f} s" if options.follow else
                             " (the job id is wrong, or the topics no longer retain it)"))
    header = RecordingHeader(job=options.job, source="live" if options.follow else "retained",
                             recorded_at_ms=time.time_ns() // 1_000_000, topic_prefix=settings.kafka.topic_prefix,
                             perftracker_version=_version(), note=options.note)
    write_recording(out, header, kept)
    return len(kept)


def record_spool(directory: Path, out: Path, job: str | None = None, note: str = "") -> tuple[str, int]:
    """A recording of one job's messages from a spool directory (collectors run with
    ``spool:DIR``, no broker: :mod:`perftracker_ml.schemas.spool`); returns (job, messages).
    Each spool file is one partition, its frames the offsets. ``job`` None: the spool's only
    job (several: an error naming them)."""
    from ..schemas.spool import SpoolReading, read_spool

    codec = MultiCodec(records_on(TopicRole.INPUTS))
    reading = SpoolReading()
    by_job: dict[str, list[RecordedMessage]] = {}
    partitions: dict[str, int] = {}
    prefixes: set[str] = set()
    for m in read_spool(directory, reading):
        found = job_of_key(m.key) or _job_of_value(codec, m.value)
        if found is None or (job is not None and found != job):
            continue
        partition = partitions.setdefault(m.file, len(partitions))
        prefixes.add(m.topic.rpartition(".")[0])
        by_job.setdefault(found, []).append(RecordedMessage(TopicRole.INPUTS, m.topic, partition, m.index,
                                                            m.timestamp_ms, m.key, m.value))
    if not by_job:
        raise RecordError(f"no message of {'job ' + repr(job) if job else 'any job'} in the spool {directory} "
                          f"({reading.files} files, {reading.frames} messages)")
    if len(by_job) > 1:
        raise RecordError(f"the spool {directory} holds several jobs ({', '.join(sorted(by_job))}): name one with --job")
    (name, kept), = by_job.items()
    header = RecordingHeader(job=name, source="spool", recorded_at_ms=time.time_ns() // 1_000_000,
                             topic_prefix=min(prefixes, default=""), perftracker_version=_version(),
                             note=note, extra={"spool_files": reading.files, "spool_cut_files": reading.cut})
    write_recording(out, header, kept)
    return name, len(kept)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perftracker-ml")
    except PackageNotFoundError:
        return ""
