"""The embedded stack of `perftracker up`: tansu broker, one sink, N Faust workers.

Every process is started detached (its own session) and recorded by pid in
``<data_dir>/stack.json``; `down` stops exactly those, workers one at a time
(two group members leaving at the same instant can jam a tansu group), then
the sink (which flushes), then the broker. Data under ``data_dir`` is kept.

`up` on a recorded stack restarts only what died. The broker is never
restarted while it lives: its topics are in its memory and running collectors
know only its address. A recorded broker that died is refused with what was
lost and how to go on (`down` then `up`, or `up --force`). Workers and a sink
started by hand join the record themselves (``members.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..schemas.errors import PerftrackerError
from ..schemas.http_auth import auth_headers
from ..schemas.kafka_admin import ensure_topics
from ..schemas.settings import Secret, Settings
from ..schemas.stackfile import (
    StackState,
    create_state,
    pid_alive,
    read_state,
    remove_state,
    update_state,
)
from ..schemas.topics import all_topics
from .tansu import free_port, port_open, start_broker


class StackError(PerftrackerError):
    """The embedded stack could not be started, found or stopped."""


@dataclass(frozen=True)
class UpResult:
    state: StackState
    already_running: bool  # nothing had to be started
    started: list[str] = field(default_factory=list)  # what this call started: broker, sink, worker


def stack_running(state: StackState | None) -> bool:
    """Broker and sink alive, and at least one worker, every recorded one alive."""
    if state is None:
        return False
    return pid_alive(state.broker_pid) and pid_alive(state.sink_pid) and \
        bool(state.worker_pids) and all(pid_alive(p) for p in state.worker_pids)


def _child_env(settings: Settings, bootstrap: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    env["PERFTRACKER_DATA_DIR"] = str(settings.data_dir.resolve())
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _wait_for(check, what: str, timeout_s: float, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{what} exited with code {proc.returncode} during start-up; see {log}")
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise StackError(f"{what} was not ready within {timeout_s:.0f}s; see {log}")


def worker_stats(port: int, host: str = "127.0.0.1", token: Secret | None = None) -> dict | None:
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # a wildcard bind answers on loopback
    req = urllib.request.Request(f"http://{host}:{port}/perftracker/stats/",
                                 headers=auth_headers(token or Secret("")))
    try:
        with urllib.request.urlopen(req, timeout=1) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def up(settings: Settings, workers: int | None = None, port: int | None = None,
       ready_timeout_s: float = 90.0, extra_env: dict[str, str] | None = None,
       force: bool = False) -> UpResult:
    """Start the stack, or restart only what died of a recorded one; idempotent.

    A live broker is never restarted (its topics live in its memory, and running
    collectors know only its address). A recorded broker that died is refused
    (its data is gone) unless ``force``: then the leftovers are stopped and a
    fresh stack starts, on the old broker port when it is free. A fresh start
    stops what it started if a step fails.
    ``extra_env``: PERFTRACKER_* settings for the started processes only (e.g. the demo's windows)."""
    data_dir = settings.data_dir.resolve()
    state = read_state(data_dir)
    if state is not None and not pid_alive(state.broker_pid):
        if not force:
            raise StackError(broker_lost_message(state, data_dir))
        down(settings)
        old_port = int(state.bootstrap.rsplit(":", 1)[-1])
        if port is None and not port_open("127.0.0.1", old_port):
            port = old_port  # the same address: running collectors reconnect by themselves
        state = None
    if state is None:
        return _start_fresh(settings, data_dir, workers, port, ready_timeout_s, extra_env or {})
    if port is not None and state.bootstrap.rsplit(":", 1)[-1] != str(port):
        raise StackError(f"the stack's broker runs at {state.bootstrap} and is kept while it lives; "
                         "`perftracker down` first to move it to another --port")
    return _restart_dead(settings, data_dir, state, workers, ready_timeout_s, extra_env or {})


def broker_lost_message(state: StackState, data_dir: Path) -> str:
    return (f"the broker of the stack in {data_dir} (pid {state.broker_pid}, {state.bootstrap}) has stopped. "
            "It kept its topics in memory: the events, dead letters and open windows it held are lost, "
            f"and running collectors still send to {state.bootstrap}. `perftracker up --force` stops the "
            "rest and starts a fresh stack on the same port (when free), where running collectors "
            "reconnect; or `perftracker down` then `perftracker up` for a fresh stack on a new port "
            "(restart the training jobs to reach it).")


def _start_fresh(settings: Settings, data_dir: Path, workers: int | None, port: int | None,
                 ready_timeout_s: float, extra_env: dict[str, str]) -> UpResult:
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    broker = start_broker(port=port, host=settings.kafka.embedded_listen_host, log_path=logs / "broker.log",
                          detach=True, advertised_host=settings.kafka.embedded_advertised_host)
    state = StackState(bootstrap=broker.bootstrap, broker_pid=broker.process.pid, started_at=time.time())
    create_state(data_dir, state)
    count = workers or settings.streams.workers
    try:
        _ensure_topics(settings, state)
        _start_sink(settings, state, data_dir, extra_env)
        for _ in range(count):
            _start_worker(settings, state, data_dir, ready_timeout_s, extra_env)
    except BaseException:
        down(settings)
        raise
    return UpResult(_current(data_dir, state), False, ["broker", "sink", *["worker"] * count])


def _restart_dead(settings: Settings, data_dir: Path, state: StackState, workers: int | None,
                  ready_timeout_s: float, extra_env: dict[str, str]) -> UpResult:
    """Keep the broker and every live process; start a new sink and workers in place of dead ones."""
    started: list[str] = []
    _ensure_topics(settings, state)
    if not pid_alive(state.sink_pid):
        _start_sink(settings, state, data_dir, extra_env)
        started.append("sink")
    dead = [pid for pid in state.worker_pids if not pid_alive(pid)]

    def forget_dead(s: StackState) -> None:
        for pid in dead:
            s.forget_worker(pid)

    update_state(data_dir, forget_dead)
    wanted = workers or max(len(state.worker_pids), settings.streams.workers)
    for _ in range(len(state.worker_pids) - len(dead), wanted):
        _start_worker(settings, state, data_dir, ready_timeout_s, extra_env)
        started.append("worker")
    return UpResult(_current(data_dir, state), not started, started)


def _current(data_dir: Path, fallback: StackState) -> StackState:
    return read_state(data_dir) or fallback


def _ensure_topics(settings: Settings, state: StackState) -> None:
    conf = {**settings.kafka.client_conf(), "bootstrap.servers": state.bootstrap}
    ensure_topics(conf, all_topics(settings.kafka.topic_prefix, settings.kafka.partitions))


def _start_sink(settings: Settings, state: StackState, data_dir: Path, extra_env: dict[str, str]) -> None:
    ready = data_dir / "sink.ready"
    ready.unlink(missing_ok=True)
    log = data_dir / "logs" / "sink.log"
    proc = _spawn(["sink", "--ready-file", str(ready)], _child_env(settings, state.bootstrap, **extra_env), log)
    update_state(data_dir, lambda s: s.record_sink(proc.pid, {}))
    info = _wait_for(lambda: _read_json(ready), "the sink", 60, proc, log)
    update_state(data_dir, lambda s: s.record_sink(proc.pid, info))


def _start_worker(settings: Settings, state: StackState, data_dir: Path, timeout_s: float,
                  extra_env: dict[str, str]) -> None:
    """Start one worker on free web and metrics ports, record it, wait until it has partitions.
    Its log is ``logs/worker-<pid>.log`` (a restarted worker never writes into a live one's log):
    the worker logs to stderr only (``log_file = -``), which is that file."""
    web_port, metrics_port = free_port(settings.streams.web_host), free_port(settings.streams.metrics_host)
    starting = data_dir / "logs" / f"worker-starting-{os.getpid()}-{web_port}.log"
    env = _child_env(settings, state.bootstrap, **extra_env, PERFTRACKER_STREAMS_WEB_PORT=str(web_port),
                     PERFTRACKER_STREAMS_METRICS_PORT=str(metrics_port), PERFTRACKER_LOG_FILE="-")
    proc = _spawn(["worker"], env, starting)
    log = starting.with_name(f"worker-{proc.pid}.log")
    starting.replace(log)  # the child keeps writing through its open descriptor
    update_state(data_dir, lambda s: s.record_worker(proc.pid, web_port, metrics_port))
    _wait_for(lambda: (worker_stats(web_port, settings.streams.web_host, settings.http_token) or {}).get("assigned"),
              f"worker {proc.pid}", timeout_s, proc, log)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stop_pid(pid: int, timeout_s: float) -> bool:
    """SIGTERM, wait, then SIGKILL. True when the process is gone."""
    if not pid_alive(pid):
        return True
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive_not_zombie(pid):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    time.sleep(0.2)
    return not _alive_not_zombie(pid)


def _alive_not_zombie(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap it when it is our own child
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    return pid_alive(pid)


def down(settings: Settings) -> list[str]:
    """Stop what `up` recorded, workers one at a time; keep the data. Returns what was stopped."""
    data_dir = settings.data_dir.resolve()
    state = read_state(data_dir)
    if state is None:
        return []
    stopped = []
    for what, pid, timeout_s in [*(("worker", pid, 20) for pid in state.worker_pids),
                                 ("sink", state.sink_pid, 20), ("broker", state.broker_pid, 10)]:
        if pid_alive(pid) and _stop_pid(pid, timeout_s):
            stopped.append(f"{what} {pid}")
    remove_state(data_dir)
    (data_dir / "sink.ready").unlink(missing_ok=True)
    return stopped


def status(settings: Settings) -> dict:
    state = read_state(settings.data_dir.resolve())
    if state is None:
        return {"running": False, "data_dir": str(settings.data_dir.resolve())}
    host = settings.streams.web_host
    metrics = state.worker_metrics_ports or [0] * len(state.worker_pids)
    workers = [{"pid": pid, "alive": pid_alive(pid), "port": port,
                "metrics_url": f"http://{settings.streams.metrics_host}:{mport}/metrics" if mport else "",
                "stats": worker_stats(port, host, settings.http_token) if pid_alive(pid) else None}
               for pid, port, mport in zip(state.worker_pids, state.worker_ports, metrics, strict=False)]
    return {
        "running": stack_running(state),
        "data_dir": str(settings.data_dir.resolve()),
        "broker": {"pid": state.broker_pid, "alive": pid_alive(state.broker_pid), "bootstrap": state.bootstrap},
        "sink": {"pid": state.sink_pid, "alive": pid_alive(state.sink_pid), "query_url": state.query_url,
                 "store": state.store_url},
        "workers": workers,
    }
