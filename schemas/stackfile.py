"""Where the embedded stack runs: ``<data_dir>/stack.json`` written by `perftracker up`.

The file is the contract between `perftracker up` (which writes it) and every
process that finds the embedded broker or the sink's query API through it
(collectors, stream workers, the sink, the CLI's queries). Workers and sinks
started by hand join it too (see ``deploy/members.py``), so every change goes
through :func:`update_state`, which holds ``stack.lock`` while it reads, changes
and writes the file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .settings import Settings

STATE_FILE = "stack.json"
LOCK_FILE = "stack.lock"


@dataclass
class StackState:
    bootstrap: str
    broker_pid: int
    worker_pids: list[int] = field(default_factory=list)
    worker_ports: list[int] = field(default_factory=list)
    worker_metrics_ports: list[int] = field(default_factory=list)  # each worker's GET /metrics
    sink_pid: int = 0
    query_url: str = ""  # the sink's local query API (chDB owner)
    store_url: str = ""
    started_at: float = 0.0

    def save(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = data_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(data_dir / STATE_FILE)


    def record_sink(self, pid: int, ready: dict) -> None:
        """Record sink ``pid`` and what its ready file says (query API, store); {} while it starts."""
        self.sink_pid = pid
        self.query_url = ready.get("query_url", "")
        self.store_url = ready.get("store", "")

    def forget_worker(self, pid: int) -> None:
        """Drop worker ``pid`` (and its web and metrics ports) from the record."""
        metrics = self.worker_metrics_ports or [0] * len(self.worker_pids)
        keep = [(p, port, m) for p, port, m in zip(self.worker_pids, self.worker_ports, metrics, strict=False)
                if p != pid]
        self.worker_pids = [p for p, _, _ in keep]
        self.worker_ports = [port for _, port, _ in keep]
        self.worker_metrics_ports = [m for _, _, m in keep]

    def record_worker(self, pid: int, port: int, metrics_port: int = 0) -> None:
        """Record worker ``pid`` serving its stats on ``port`` and its metrics on ``metrics_port``
        (0 = none); recording twice changes nothing."""
        self.forget_worker(pid)
        self.worker_pids.append(pid)
        self.worker_ports.append(port)
        self.worker_metrics_ports.append(metrics_port)


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_state(data_dir: Path, change: Callable[[StackState], None]) -> StackState | None:
    """Read the record under ``stack.lock``, apply ``change`` and write it back; None (and
    nothing written) when no stack is recorded."""
    with _locked(data_dir):
        state = read_state(data_dir)
        if state is not None:
            change(state)
            state.save(data_dir)
        return state


def create_state(data_dir: Path, state: StackState) -> None:
    """Record a new stack (under ``stack.lock``)."""
    with _locked(data_dir):
        state.save(data_dir)


def remove_state(data_dir: Path) -> None:
    """Forget the recorded stack (under ``stack.lock``)."""
    with _locked(data_dir):
        (data_dir / STATE_FILE).unlink(missing_ok=True)


def read_state(data_dir: Path) -> StackState | None:
    try:
        data = json.loads((data_dir / STATE_FILE).read_text())
        return StackState(**data)
    except (OSError, ValueError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def resolve_bootstrap(settings: Settings) -> str:
    """The configured Kafka, else the embedded broker recorded by `perftracker up`, else ''."""
    if settings.kafka.bootstrap_servers:
        return settings.kafka.bootstrap_servers
    state = read_state(settings.data_dir)
    if state and pid_alive(state.broker_pid):
        return state.bootstrap
    return ""
