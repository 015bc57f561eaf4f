"""``perftracker launch -- <command>``: run an unmodified command with collectors in every rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .bootstrap import ATTACH_ENV, ATTACHED_PID_ENV, LAUNCHER_PID_ENV, SITECUSTOMIZE
from .job_agreement import PROVISIONAL_ENV, provisional_job, settled_job

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def job_from_command(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The job id every node's launcher shares: torchrun's ``--rdzv-id``, else a launcher
    variable (:func:`.job_agreement.settled_job`); '' when the ranks must agree on one."""
    for i, arg in enumerate(command):
        for flag in ("--rdzv-id", "--rdzv_id"):
            if arg == flag and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return settled_job("", env)


def child_env(base: Mapping[str, str], job: str, bootstrap_dir: Path, settings: Any) -> dict[str, str]:
    """The command's environment: bootstrap on PYTHONPATH, the job (or, when no launcher
    names one, this launcher's provisional id for rank 0 to share), and the Kafka settings."""
    env = dict(base)
    env.pop(ATTACHED_PID_ENV, None)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(bootstrap_dir) + (os.pathsep + path if path else "")
    env[ATTACH_ENV] = "1"
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    if job:
        env["PERFTRACKER_COLLECTOR_JOB"] = job
    else:
        env[PROVISIONAL_ENV] = provisional_job(base)
    env.update(_kafka_env(settings))
    return env


def _kafka_env(settings: Any) -> dict[str, str]:
    """Every Kafka setting that differs from its default (TLS, SASL, pass-through, registry)."""
    from ..schemas.settings_loader import section_env
    from ..schemas.stackfile import resolve_bootstrap

    return {**section_env(settings.kafka, "kafka"),
            "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": resolve_bootstrap(settings),
            "PERFTRACKER_KAFKA_TOPIC_PREFIX": settings.kafka.topic_prefix,
            "PERFTRACKER_KAFKA_SECURITY_PROTOCOL": settings.kafka.security_protocol}


def _forward_signals(proc: subprocess.Popen) -> dict[int, Any]:
    def forward(signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous: dict[int, Any] = {}
    signals = list(FORWARDED)
    if not _interactive():
        signals.append(signal.SIGINT)  # a terminal's Ctrl-C already reaches the whole group
    for sig in signals:
        previous[sig] = signal.signal(sig, forward)
    if signal.SIGINT not in previous:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: None)
    return previous


def _interactive() -> bool:
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run(command: list[str], job: str | None, settings: Any) -> int:
    """Run ``command`` with collectors injected; return its exit code (128+N if killed by N)."""
    if not command:
        raise ValueError("launch needs a command, e.g. perftracker launch -- torchrun ... train.py")
    job = job or job_from_command(command, os.environ)
    with tempfile.TemporaryDirectory(prefix="perftracker-boot-") as tmp:
        boot_dir = Path(tmp)
        (boot_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = child_env(os.environ, job, boot_dir, settings)
        target = env["PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS"] or "no broker (events counted, not sent)"
        named = job or f"agreed by the ranks at start-up (rank 0's launcher proposes {env[PROVISIONAL_ENV]})"
        print(f"perftracker: job {named} -> {target}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.Popen(command, env=env)
        except OSError as exc:
            print(f"perftracker: cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
            return 127
        previous = _forward_signals(proc)
        try:
            code = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return 128 - code if code < 0 else code
