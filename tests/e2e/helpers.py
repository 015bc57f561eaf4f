"""Helpers of the e2e suite: run a script under `perftracker launch`, read what arrived."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from perftracker_ml.schemas import Codec
from perftracker_ml.schemas.settings_loader import load_settings
from perftracker_ml.schemas.topics import TopicNames
from perftracker_ml.schemas.vocabulary import EVENT_BATCH
from perftracker_ml.sinks.client import query
from perftracker_ml.sinks.errors import NoStore

SCRIPTS = Path(__file__).parent / "scripts"


def torchrun(script: str, nproc: int = 4) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(SCRIPTS / script)]


def launch(command: list[str], job: str, env: dict[str, str], relay: bool = False) -> tuple[int, float]:
    """``perftracker launch --job JOB [--relay] -- command`` in-process; returns (exit code, seconds)."""
    from perftracker_ml.collectors.launch import run

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        started = time.monotonic()
        code = run(command, job, load_settings(env=os.environ), relay=relay)
        return code, time.monotonic() - started
    finally:
        os.environ.clear()
        os.environ.update(saved)


def consume_events(bootstrap: str, topic: str, job: str, quiet_s: float = 3.0,
                   limit_s: float = 30.0, schema: str = EVENT_BATCH) -> list[dict]:
    """Every record (``schema``, EventBatch by default) of ``job`` on ``topic``,
    reading until nothing new for ``quiet_s``."""
    records: list[dict] = []
    last_new = time.monotonic()
    for record in read_records(bootstrap, topic, job, limit_s, schema, f"e2e-{job}", poll_s=0.5):
        if record is not None:
            records.append(record)
            last_new = time.monotonic()
        elif time.monotonic() - last_new >= quiet_s:
            break
    return records


def first_record(bootstrap: str, topic: str, job: str, accept: Callable[[dict], bool],
                 limit_s: float, group: str) -> dict | None:
    """The first EventBatch of ``job`` on ``topic`` that ``accept`` takes, or None by ``limit_s``."""
    for record in read_records(bootstrap, topic, job, limit_s, EVENT_BATCH, group, poll_s=0.2):
        if record is not None and accept(record):
            return record
    return None


def read_records(bootstrap: str, topic: str, job: str, limit_s: float, schema: str, group: str,
                 poll_s: float, any_job: bool = False) -> Iterator[dict | None]:
    """``job``'s records on every partition of ``topic`` from the start, for at most
    ``limit_s``; None after each poll that brought none, so callers can stop on silence."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "fetch.wait.max.ms": int(poll_s * 1000)})
    codec = Codec(schema)
    deadline = time.monotonic() + limit_s
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        while time.monotonic() < deadline:
            msg = consumer.poll(poll_s)
            if msg is None or msg.error():
                yield None
                continue
            record = codec.decode(msg.value())
            yield record if any_job or record["job"] == job else None
    finally:
        consumer.close()


def by_rank(records: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for record in sorted(records, key=lambda r: r["seq"]):
        out.setdefault(record["rank"], []).append(record)
    return out


def comm_rows(records: list[dict]) -> list[tuple[str, str, int, int]]:
    """(op, group_id, seq, bytes) of every comm event, in batch order."""
    rows = []
    for r in records:
        c = r["comms"]
        for op, g, seq, nbytes in zip(c["op"], c["group"], c["seq"], c["bytes"], strict=True):
            rows.append((r["names"][op], r["groups"][g]["group_id"], seq, nbytes))
    return rows


def span_names(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        for name in r["spans"]["name"]:
            counts[r["names"][name]] = counts.get(r["names"][name], 0) + 1
    return counts


def request_profile(conf: dict[str, str], topic: str, job: str, request_id: str,
                    start_step: int) -> None:
    """A PROFILE request on the control topic, as an operator or the stream worker sends it."""
    import datetime as dt

    from confluent_kafka import Producer
    from perftracker_ml.schemas.vocabulary import CONTROL

    msg = {"job": job, "request_id": request_id, "command": "PROFILE", "start_step": start_step,
           "duration_s": 0.2, "reason": "e2e", "issued_ms": dt.datetime.now(dt.timezone.utc)}
    producer = Producer(conf)
    producer.produce(topic, Codec(CONTROL).encode(msg), job.encode())
    assert producer.flush(10) == 0


def launch_profiled(bootstrap: str, prefix: str, script: str, nproc: int, steps: int,
                    profile_id: str, profile_step: int) -> tuple[TopicNames, str]:
    """Topics under ``prefix``, a PROFILE request for ``profile_step``, then ``script``
    under ``perftracker launch`` (torchrun, ``nproc`` ranks, ``steps`` steps, no
    duty-cycle window); asserts it exits 0 and returns (topics, job)."""
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import all_topics

    conf = {"bootstrap.servers": bootstrap}
    ensure_topics(conf, all_topics(prefix))
    topics = TopicNames.for_prefix(prefix)
    job = f"job-{prefix}"
    # a loaded CI host: the profile of a short job may still be summarized at its exit, given half
    # of exit_flush_s (2 s by default; test_profiling_control.py covers the budget itself)
    env = {"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix,
           "TRAIN_STEPS": str(steps), "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0",
           "PERFTRACKER_COLLECTOR_CONTROL": "1",  # off by default
           "PERFTRACKER_COLLECTOR_EXIT_FLUSH_S": "8"}
    request_profile(conf, topics.control, job, profile_id, profile_step)
    code, _seconds = launch(torchrun(script, nproc=nproc), job, env)
    assert code == 0
    return topics, job


def finish_launchers(procs: list[subprocess.Popen], timeout_s: float = 120.0) -> list[str]:
    """Each launcher's output once it exits; one still running after ``timeout_s`` (e.g. a
    peer node's rank died and it waits in the rendezvous) is stopped, SIGTERM then SIGKILL,
    so no launcher outlives the test, and its output is kept for the assertion message."""
    outputs = []
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            out = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                out = p.communicate(timeout=20)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0]
            out = (out or "") + f"\n[test: still running {timeout_s:.0f} s after training ended; stopped]"
        outputs.append(out or "")
    return outputs


def stored_jobs(settings) -> list[dict]:
    """The store's jobs; [] while there is no store yet."""
    try:
        return query(settings, "jobs")
    except NoStore:
        return []


def new_job(settings, before: set[str]) -> str | None:
    """The one job stored since ``before`` (None yet); several is a failure: the launchers split."""
    new = [j for j in stored_jobs(settings) if j["job"] not in before]
    assert len(new) <= 1, f"several new jobs: the launchers did not agree on one: {new}"
    return new[0]["job"] if new else None
