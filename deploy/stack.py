"""The embedded stack of `perftracker up`: tansu broker, one sink, N Faust workers.

Every process is started detached (its own session) and recorded by pid in
``<data_dir>/stack.json``; `down` stops exactly those, workers one at a time
(two group members leaving at the same instant can jam a tansu group), then
the sink (which flushes), then the broker. Data under ``data_dir`` is kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..schemas.errors import PerftrackerError
from ..schemas.kafka_admin import ensure_topics
from ..schemas.settings import Settings
from ..schemas.stackfile import STATE_FILE, StackState, pid_alive, read_state
from ..schemas.topics import all_topics
from .tansu import free_port, start_broker


class StackError(PerftrackerError):
    """The embedded stack could not be started, found or stopped."""


@dataclass(frozen=True)
class UpResult:
    state: StackState
    already_running: bool


def stack_running(state: StackState | None) -> bool:
    if state is None:
        return False
    return pid_alive(state.broker_pid) and pid_alive(state.sink_pid) and \
        all(pid_alive(p) for p in state.worker_pids)


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
        return subprocess.Popen([sys.executable, "-m", "perftracker.deploy.cli", *args], env=env,
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


def worker_stats(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/perftracker/stats/", timeout=1) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def up(settings: Settings, workers: int | None = None, port: int | None = None,
       ready_timeout_s: float = 90.0, extra_env: dict[str, str] | None = None) -> UpResult:
    """Start the stack unless it already runs; idempotent. Stops what it started if a step fails.
    ``extra_env``: PERFTRACKER_* settings for the started processes only (e.g. the demo's windows)."""
    data_dir = settings.data_dir.resolve()
    state = read_state(data_dir)
    if state is not None and stack_running(state):
        return UpResult(state, True)
    if state:  # half up: stop the leftovers first
        down(settings)
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    broker = start_broker(port=port, log_path=logs / "broker.log", detach=True)
    state = StackState(bootstrap=broker.bootstrap, broker_pid=broker.process.pid, started_at=time.time())
    state.save(data_dir)
    try:
        conf = {**settings.kafka.client_conf(), "bootstrap.servers": broker.bootstrap}
        ensure_topics(conf, all_topics(settings.kafka.topic_prefix, settings.kafka.partitions))
        _start_sink(settings, state, data_dir, extra_env or {})
        for i in range(workers or settings.streams.workers):
            _start_worker(settings, state, data_dir, i, ready_timeout_s, extra_env or {})
    except BaseException:
        down(settings)
        raise
    return UpResult(state, False)


def _start_sink(settings: Settings, state: StackState, data_dir: Path, extra_env: dict[str, str]) -> None:
    ready = data_dir / "sink.ready"
    ready.unlink(missing_ok=True)
    log = data_dir / "logs" / "sink.log"
    proc = _spawn(["sink", "--ready-file", str(ready)], _child_env(settings, state.bootstrap, **extra_env), log)
    state.sink_pid = proc.pid
    state.save(data_dir)
    info = _wait_for(lambda: _read_json(ready), "the sink", 60, proc, log)
    state.query_url = info.get("query_url", "")
    state.store_url = info.get("store", "")
    state.save(data_dir)


def _start_worker(settings: Settings, state: StackState, data_dir: Path, index: int,
                  timeout_s: float, extra_env: dict[str, str]) -> None:
    web_port, metrics_port = free_port(), free_port()
    log = data_dir / "logs" / f"worker-{index}.log"
    env = _child_env(settings, state.bootstrap, **extra_env, PERFTRACKER_STREAMS_WEB_PORT=str(web_port),
                     PERFTRACKER_STREAMS_METRICS_PORT=str(metrics_port), PERFTRACKER_LOG_FILE=str(log))
    proc = _spawn(["worker"], env, log)
    state.worker_pids.append(proc.pid)
    state.worker_ports.append(web_port)
    state.worker_metrics_ports.append(metrics_port)
    state.save(data_dir)
    _wait_for(lambda: (worker_stats(web_port) or {}).get("assigned"), f"worker {index}", timeout_s, proc, log)


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
    for pid in state.worker_pids:
        if _stop_pid(pid, 20):
            stopped.append(f"worker {pid}")
    if state.sink_pid and _stop_pid(state.sink_pid, 20):
        stopped.append(f"sink {state.sink_pid}")
    if _stop_pid(state.broker_pid, 10):
        stopped.append(f"broker {state.broker_pid}")
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    (data_dir / "sink.ready").unlink(missing_ok=True)
    return stopped


def status(settings: Settings) -> dict:
    state = read_state(settings.data_dir.resolve())
    if state is None:
        return {"running": False, "data_dir": str(settings.data_dir.resolve())}
    metrics = state.worker_metrics_ports or [0] * len(state.worker_pids)
    workers = [{"pid": pid, "alive": pid_alive(pid), "port": port,
                "metrics_url": f"http://127.0.0.1:{mport}/metrics" if mport else "",
                "stats": worker_stats(port) if pid_alive(pid) else None}
               for pid, port, mport in zip(state.worker_pids, state.worker_ports, metrics, strict=False)]
    return {
        "running": stack_running(state),
        "data_dir": str(settings.data_dir.resolve()),
        "broker": {"pid": state.broker_pid, "alive": pid_alive(state.broker_pid), "bootstrap": state.bootstrap},
        "sink": {"pid": state.sink_pid, "alive": pid_alive(state.sink_pid), "query_url": state.query_url,
                 "store": state.store_url},
        "workers": workers,
    }
