"""Where the embedded stack runs: ``<data_dir>/stack.json`` written by `perftracker up`.

The file is the contract between `perftracker up` (which writes it) and every
process that finds the embedded broker or the sink's query API through it
(collectors, stream workers, the sink, the CLI's queries).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .settings import Settings

STATE_FILE = "stack.json"


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
