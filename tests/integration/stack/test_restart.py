"""`perftracker up` restarts only what died and keeps the broker; hand-started parts join the stack.

One embedded stack for the module (issue 13, item 0): a worker killed with
SIGKILL is replaced while the broker keeps its pid, its port and its topics
(a dead letter produced before is still readable); a worker and a sink started
by hand are recorded, shown and reached; a dead broker is refused with what was
lost, and `up --force` starts afresh on the same port, stopping the hand-started
processes with the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from perftracker_ml.schemas.stackfile import pid_alive

from ..waiting import wait_for
from .conftest import Stack, running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("restart")) as s:
        yield s


def status(stack: Stack) -> dict:
    return json.loads(stack.cli("status", "--json", check=False).stdout)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 10)


def hand_started(stack: Stack, command: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", command], env=stack.env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def produce_marker(bootstrap: str, topic: str) -> bytes:
    marker = f"marker-{uuid.uuid4().hex}".encode()
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=marker, value=marker)
    assert producer.flush(10) == 0
    return marker


def topic_holds(bootstrap: str, topic: str, marker: bytes, timeout_s: float = 30) -> bool:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         "fetch.wait.max.ms": 500})
    consumer.subscribe([topic])
    try:
        def seen() -> bool:
            msg = consumer.poll(0.5)
            return msg is not None and not msg.error() and msg.value() == marker
        return bool(wait_for(seen, timeout_s, every_s=0))
    finally:
        consumer.close()


def test_killed_worker_is_restarted_and_the_broker_keeps_its_pid_port_and_topics(stack: Stack):
    before = stack.state()
    marker = produce_marker(before["bootstrap"], "pt.deadletter")
    [old_worker] = before["worker_pids"]
    kill(old_worker)
    assert stack.cli("status", check=False).returncode == 1

    out = stack.cli("up", timeout=180).stdout
    assert "restarted worker (broker kept)" in out
    after = stack.state()
    assert (after["broker_pid"], after["bootstrap"], after["sink_pid"]) == \
        (before["broker_pid"], before["bootstrap"], before["sink_pid"])
    [new_worker] = after["worker_pids"]
    assert new_worker != old_worker and pid_alive(new_worker)
    info = status(stack)
    assert info["running"] and info["workers"][0]["stats"]["assigned"]
    assert topic_holds(after["bootstrap"], "pt.deadletter", marker)


def test_hand_started_worker_and_sink_join_the_stack(stack: Stack):
    logs = stack.data_dir / "logs"
    worker = hand_started(stack, "worker", logs / "hand-worker.log")
    sink = None
    try:
        wait_for(lambda: worker.pid in stack.state()["worker_pids"], 60, describe=stack.state)
        wait_for(lambda: all((w["stats"] or {}).get("assigned") for w in status(stack)["workers"]), 90,
                 describe=lambda: status(stack))
        assert f"pid {worker.pid:>7}  up" in stack.cli("status").stdout
        worker.send_signal(signal.SIGTERM)  # stopped on purpose: it leaves the record
        assert worker.wait(60) == 0
        assert worker.pid not in stack.state()["worker_pids"]

        old = stack.state()
        kill(old["sink_pid"])
        sink = hand_started(stack, "sink", logs / "hand-sink.log")
        wait_for(lambda: stack.state()["sink_pid"] == sink.pid and stack.state()["query_url"] not in
                 ("", old["query_url"]), 60, describe=stack.state)
        assert status(stack)["running"]
        proc = stack.cli("diagnose", "--job", "nobody", check=False)  # answered by the hand-started sink
        assert proc.returncode == 1
        assert proc.stderr.startswith("perftracker: error: no such job 'nobody' (known:")
    finally:
        stop(worker)
        # the hand-started sink stays as the stack's sink: `down` stops it at the end


def test_dead_broker_is_refused_then_force_starts_afresh_on_the_same_port(stack: Stack):
    before = stack.state()
    worker = hand_started(stack, "worker", stack.data_dir / "logs" / "hand-worker-2.log")
    try:
        wait_for(lambda: worker.pid in stack.state()["worker_pids"], 60, describe=stack.state)
        # running, not still starting: a worker that has not yet read the broker's address from the
        # stack's state exits when that broker is gone (no Kafka to connect to), as it should
        wait_for(lambda: all((w["stats"] or {}).get("assigned") for w in status(stack)["workers"]), 90,
                 describe=lambda: status(stack))
        kill(before["broker_pid"])
        proc = stack.cli("up", check=False)
        assert proc.returncode == 1
        assert "has stopped" in proc.stderr and "lost" in proc.stderr and "up --force" in proc.stderr
        assert stack.state()["broker_pid"] == before["broker_pid"] and worker.poll() is None

        stack.cli("up", "--force", timeout=240)
        assert worker.wait(30) is not None  # `down` stopped the hand-started worker too
        after = stack.state()
        assert after["bootstrap"] == before["bootstrap"] and after["broker_pid"] != before["broker_pid"]
        assert worker.pid not in after["worker_pids"] and status(stack)["running"]
    finally:
        stop(worker)
