"""Workers and sinks started by hand (`perftracker worker` / `sink`) join the recorded stack.

When ``<data_dir>/stack.json`` records a stack whose broker lives, and this
process uses that broker (no other Kafka configured), the process records
itself there, so `status` shows it, `down` stops it and `diagnose` finds the
sink's query API. `up`'s own children go through the same code; recording is
keyed by pid, so a child its parent already recorded changes nothing.

* A worker that stops on purpose (SIGTERM, Ctrl-C, exit 0) leaves the record:
  the consumer group just shrinks. One that crashes or is killed stays, shown
  as down, and the next `up` starts a new one in its place.
* The sink is one of a kind (chDB has one owner): a second one while the
  recorded sink lives is refused. Its query API is recorded once it serves.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..schemas.settings import Settings
from ..schemas.stackfile import StackState, pid_alive, read_state, update_state
from .stack import StackError, broker_lost_message
from .tansu import free_port

READY_POLL_S = 0.2


def joined_stack(settings: Settings) -> StackState | None:
    """The recorded stack this process joins: its broker is the Kafka in use (none configured, or
    the same address). Its broker having died is an error that says how to go on."""
    data_dir = settings.data_dir.resolve()
    state = read_state(data_dir)
    configured = settings.kafka.bootstrap_servers
    if state is None or (configured and configured != state.bootstrap):
        return None
    if not pid_alive(state.broker_pid):
        raise StackError(broker_lost_message(state, data_dir))
    return state


def with_web_port(settings: Settings) -> Settings:
    """``settings`` with a concrete worker web port: a free one when the setting is 0."""
    port = settings.streams.web_port or free_port(settings.streams.web_host)
    return dataclasses.replace(settings, streams=dataclasses.replace(settings.streams, web_port=port))


@contextmanager
def worker_member(settings: Settings) -> Iterator[Settings]:
    """Run a worker inside: yields its settings (web port resolved) and keeps its record."""
    settings = with_web_port(settings)
    data_dir, me, port = settings.data_dir.resolve(), os.getpid(), settings.streams.web_port
    joined = joined_stack(settings) is not None
    if joined:
        metrics = settings.streams.metrics_port
        update_state(data_dir, lambda s: s.record_worker(me, port, metrics))
    clean = False
    try:
        yield settings
        clean = True
    except SystemExit as exc:
        clean = exc.code in (0, None)
        raise
    except KeyboardInterrupt:
        clean = True
        raise
    finally:
        if joined and clean:
            update_state(data_dir, lambda s: s.forget_worker(me))


@contextmanager
def sink_member(settings: Settings, ready_file: Path | None) -> Iterator[Path | None]:
    """Run the sink inside: yields the ready file to write; records the sink and, once the
    ready file appears, its query API."""
    state = joined_stack(settings)
    if state is None:
        yield ready_file
        return
    data_dir, me = settings.data_dir.resolve(), os.getpid()
    if state.sink_pid != me and pid_alive(state.sink_pid):
        raise StackError(f"the stack in {data_dir} already has a sink (pid {state.sink_pid}), which owns "
                         "the store; stop it first (`perftracker down` stops the whole stack)")
    ready = ready_file or data_dir / "sink.ready"
    ready.unlink(missing_ok=True)
    update_state(data_dir, lambda s: s.record_sink(me, {}))
    served = threading.Event()
    threading.Thread(target=_record_when_ready, args=(data_dir, ready, me, served),
                     name="stack-record", daemon=True).start()
    try:
        yield ready
    finally:
        served.set()


def _record_when_ready(data_dir: Path, ready: Path, me: int, stop: threading.Event) -> None:
    """Wait for the sink's ready file, then record its query API (while the record is still ours)."""
    info = _wait_ready(ready, stop)
    if info is None:
        return

    def record(state: StackState) -> None:
        if state.sink_pid == me:
            state.record_sink(me, info)

    update_state(data_dir, record)


def _wait_ready(ready: Path, stop: threading.Event) -> dict | None:
    while not stop.wait(READY_POLL_S):
        try:
            return json.loads(ready.read_text())
        except (OSError, ValueError):
            continue
    return None
