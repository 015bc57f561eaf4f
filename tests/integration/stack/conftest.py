"""A real embedded stack (`perftracker up`) per module, on a temp data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Stack:
    data_dir: Path
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "perftracker_ml.deploy.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"perftracker {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def state(self) -> dict:
        return json.loads((self.data_dir / "stack.json").read_text())

    def diagnose(self, job: str) -> list[dict]:
        """The job's diagnosis so far: [] while nothing of it is stored yet (`diagnose` then
        refuses the job as unknown, exit 1)."""
        proc = self.cli("diagnose", "--job", job, "--json", check=False)
        if proc.returncode == 1 and proc.stderr.startswith(f"perftracker: error: no such job '{job}'"):
            return []
        if proc.returncode != 0:
            raise AssertionError(f"perftracker diagnose failed ({proc.returncode}):\n{proc.stderr}")
        return json.loads(proc.stdout)


def stack_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    env.update({"PERFTRACKER_DATA_DIR": str(data_dir), "PERFTRACKER_STREAMS_WINDOW_S": "5",
                "PERFTRACKER_STREAMS_WINDOW_GRACE_S": "2", **extra})
    return env


@contextmanager
def running_stack(data_dir: Path, show_logs: bool = False) -> Iterator[Stack]:
    """`perftracker up` on ``data_dir`` for the block, `down` after it (log tails printed if asked)."""
    s = Stack(data_dir, stack_env(data_dir))
    s.cli("up", timeout=180)
    try:
        yield s
    finally:
        s.cli("down", check=False)
        for log in sorted((data_dir / "logs").glob("*.log")) if show_logs else []:
            tail = log.read_text(errors="replace")[-3000:]
            print(f"----- {log.name} (tail) -----\n{tail}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack"), show_logs=True) as s:
        yield s
