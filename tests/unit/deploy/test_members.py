"""Hand-started workers and sinks join the recorded stack; a dead broker is never silently replaced."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
from perftracker_ml.deploy import stack
from perftracker_ml.deploy.members import sink_member, worker_member
from perftracker_ml.deploy.output import format_status
from perftracker_ml.deploy.stack import StackError
from perftracker_ml.schemas.settings import KafkaSettings, Settings, StreamSettings
from perftracker_ml.schemas.stackfile import StackState, read_state


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path)


def record(settings: Settings, broker_pid: int, **fields) -> StackState:
    state = StackState(bootstrap="127.0.0.1:19092", broker_pid=broker_pid, **fields)
    state.save(settings.data_dir)
    return state


def test_worker_gets_a_free_loopback_port_by_default():
    streams = StreamSettings()
    assert streams.web_port == 0 and streams.web_host == "127.0.0.1"


def test_hand_started_worker_is_recorded_and_leaves_on_a_clean_stop(settings):
    record(settings, broker_pid=os.getpid(), worker_pids=[11], worker_ports=[1111])
    with pytest.raises(SystemExit), worker_member(settings) as worker_settings:
        port = worker_settings.streams.web_port
        assert port > 0
        state = read_state(settings.data_dir)
        assert state.worker_pids == [11, os.getpid()] and state.worker_ports == [1111, port]
        raise SystemExit(0)  # what a Faust worker does when stopped by SIGTERM
    assert read_state(settings.data_dir).worker_pids == [11]


def test_crashed_worker_stays_recorded_for_up_to_replace(settings):
    record(settings, broker_pid=os.getpid())
    with pytest.raises(SystemExit), worker_member(settings):
        raise SystemExit(1)
    assert read_state(settings.data_dir).worker_pids == [os.getpid()]


def test_worker_on_another_kafka_does_not_join(settings):
    record(settings, broker_pid=os.getpid())
    other = dataclasses.replace(settings, kafka=KafkaSettings(bootstrap_servers="kafka:9092"))
    with worker_member(other):
        assert read_state(settings.data_dir).worker_pids == []


def test_hand_started_sink_records_its_query_api_once_serving(settings):
    record(settings, broker_pid=os.getpid(), sink_pid=0, query_url="http://127.0.0.1:1")
    with sink_member(settings, None) as ready:
        assert read_state(settings.data_dir).sink_pid == os.getpid()
        assert read_state(settings.data_dir).query_url == ""  # the dead sink's address is forgotten
        ready.write_text(json.dumps({"query_url": "http://127.0.0.1:4242", "store": "chdb:///x"}))
        deadline = time.monotonic() + 5
        while read_state(settings.data_dir).query_url == "" and time.monotonic() < deadline:
            time.sleep(0.05)
    assert read_state(settings.data_dir).query_url == "http://127.0.0.1:4242"


def test_second_sink_is_refused_while_the_recorded_one_lives(settings):
    record(settings, broker_pid=os.getpid(), sink_pid=os.getppid())
    with pytest.raises(StackError, match=rf"already has a sink \(pid {os.getppid()}\)"), \
            sink_member(settings, None):
        pass


def test_dead_broker_is_refused_with_what_was_lost_and_how_to_go_on(settings, dead_pid):
    record(settings, broker_pid=dead_pid, sink_pid=os.getpid(), worker_pids=[os.getpid()], worker_ports=[1])
    with pytest.raises(StackError) as err:
        stack.up(settings)
    message = str(err.value)
    assert f"pid {dead_pid}, 127.0.0.1:19092) has stopped" in message
    assert "lost" in message and "`perftracker up --force`" in message and "`perftracker down`" in message
    assert read_state(settings.data_dir).broker_pid == dead_pid  # nothing was touched
    with pytest.raises(StackError, match="has stopped"), worker_member(settings):
        pass
    lines = format_status(stack.status(settings))
    assert "DOWN" in lines[1] and "`perftracker up` explains how to go on" in lines[-1]


def test_up_keeps_a_live_broker_on_its_port(settings):
    record(settings, broker_pid=os.getpid())
    with pytest.raises(StackError, match="runs at 127.0.0.1:19092 and is kept while it lives"):
        stack.up(settings, port=19093)
