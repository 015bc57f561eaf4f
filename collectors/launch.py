"""``perftracker launch -- <command>``: run an unmodified command with collectors in every rank.

How the ranks attach depends on what starts them (:func:`route`):

* on this node (``python``, ``torchrun``, a script): the environment ``launch`` sets
  reaches them; the installed ``perftracker_ml_attach.pth`` (:mod:`.autoattach`) attaches
  them, or, where it is not installed, a ``sitecustomize.py`` in a temporary directory on
  ``PYTHONPATH``;
* ``srun``: it passes the environment to every task on every node (``--export=ALL``, its
  default), and the installed ``.pth`` attaches them there, so this needs the ``.pth``
  here (else refused, saying how) and the install on every node (a node without it cannot
  say so: ``perftracker status --job`` names the ranks that do not report);
* ``mpirun``/``mpiexec`` and remote shells (``ssh``, ``pdsh``, ``clush``): they do not
  pass the environment to other hosts, so ``launch`` refuses them and prints the form
  that works, ``launch`` run by the launcher on each host (``mpirun ... perftracker launch
  --job ID -- python train.py``).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ..schemas.errors import ConfigError
from .bootstrap import ATTACH_ENV, ATTACHED_PID_ENV, LAUNCHER_PID_ENV, SITECUSTOMIZE, pth_installed
from .job_agreement import PROVISIONAL_ENV, provisional_job, settled_job

MPI_LAUNCHERS = ("mpirun", "mpiexec", "mpiexec.hydra", "orterun", "prterun", "mpirun_rsh")
REMOTE_SHELLS = ("ssh", "rsh", "pdsh", "clush", "pssh", "parallel-ssh")
SRUN = "srun"


class LaunchRefused(ConfigError):
    """A command whose ranks ``launch`` cannot attach as written; the message shows the form
    that works."""


@dataclass(frozen=True)
class Route:
    """How the command's ranks attach: ``remote`` when they run on other nodes too (srun);
    ``sitecustomize``: write the temporary bootstrap (no installed .pth here)."""

    remote: bool
    sitecustomize: bool


def route(command: Sequence[str], env: Mapping[str, str], pth: bool, job: str) -> Route:
    """Decide how ``command``'s ranks attach, or raise :class:`LaunchRefused` saying what works.

    ``pth``: this interpreter has the installed ``perftracker_ml_attach.pth``."""
    name = os.path.basename(command[0]) if command else ""
    if name in MPI_LAUNCHERS or name in REMOTE_SHELLS:
        what = "starts ranks on other hosts without passing them the environment" if name in MPI_LAUNCHERS \
            else "runs the command on other hosts without this environment"
        raise LaunchRefused(f"`{name}` {what}, so `perftracker launch` cannot attach them from "
                            f"outside; let {name} run `perftracker launch` on each host instead: "
                            f"{per_task_form(command, job)}")
    if name == SRUN:
        export = _srun_export(command, env)
        if export is not None and "ALL" not in {v.strip().upper() for v in export.split(",")}:
            raise LaunchRefused(f"`srun --export={export}` does not pass perftracker's environment "
                                "to the tasks; add ALL (--export=ALL,...) or run `perftracker launch` "
                                f"in each task: {per_task_form(command, job, name_job=False)}")
        if not pth:
            raise LaunchRefused("`srun` starts ranks on other nodes, which attach through "
                                "perftracker_ml_attach.pth in their Python's site-packages, and this "
                                "install has none (a source tree on PYTHONPATH, pip --target?): install "
                                "the package with pip on every node, or run `perftracker launch` in each "
                                f"task: {per_task_form(command, job, name_job=False)}")
        return Route(remote=True, sitecustomize=False)
    return Route(remote=False, sitecustomize=not pth)


def _program_index(args: Sequence[str]) -> int | None:
    """Where the program starts in a launcher's arguments (after its options), best guess:
    the first python, torchrun, perftracker or ``*.py`` argument."""
    for i, arg in enumerate(args):
        base = os.path.basename(arg)
        if base.startswith("python") or base in ("torchrun", "perftracker") or base.endswith(".py"):
            return i
    return None


def per_task_form(command: Sequence[str], job: str, name_job: bool = True) -> str:
    """``command`` with ``perftracker launch --job ID --`` in front of its program: the form
    in which the launcher runs ``launch`` on each host or task. ``name_job``: give every
    host's launch the same id (a fresh one unless ``job`` or the command names one); srun's
    tasks share ``SLURM_JOB_ID`` without it."""
    job = job or job_from_command(command, {}) or (provisional_job({}) if name_job else "")
    inject = ["perftracker", "launch", *(["--job", job] if job else []), "--"]
    i = _program_index(command[1:])
    if i is None:
        return f"{shlex.join(command[:1])} <its options> {shlex.join(inject)} python train.py"
    i += 1
    if command[i] == "perftracker":
        return shlex.join(command)
    return shlex.join([*command[:i], *inject, *command[i:]])


def _srun_export(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """srun's ``--export`` value (its options only, before the program), else
    ``SLURM_EXPORT_ENV``; None when neither is given (srun's default, ALL)."""
    end = _program_index(command[1:])
    options = command[1:] if end is None else command[1:end + 1]
    for i, arg in enumerate(options):
        if arg.startswith("--export="):
            return arg.split("=", 1)[1]
        if arg == "--export" and i + 1 < len(options):
            return options[i + 1]
    return env.get("SLURM_EXPORT_ENV")


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


def child_env(base: Mapping[str, str], job: str, bootstrap_dir: Path | None, settings: Any) -> dict[str, str]:
    """The command's environment: the attach switch, the temporary bootstrap on PYTHONPATH
    (``bootstrap_dir``, only where no .pth is installed), the job (or, when no launcher names
    one, this launcher's provisional id for rank 0 to share), and the Kafka settings."""
    env = dict(base)
    env.pop(ATTACHED_PID_ENV, None)
    if bootstrap_dir is not None:
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


def run(command: list[str], job: str | None, settings: Any, relay: bool = False) -> int:
    """Run ``command`` with collectors injected; return its exit code (128+N if killed by N).
    Raises :class:`LaunchRefused` for a command whose ranks it cannot attach (:func:`route`).
    ``relay``: run this host's relay (:mod:`.relay_server`) for the command's ranks meanwhile."""
    if not command:
        raise ValueError("launch needs a command, e.g. perftracker launch -- torchrun ... train.py")
    job = job or job_from_command(command, os.environ)
    how = route(command, os.environ, pth_installed() is not None, job)
    if relay and how.remote:
        raise LaunchRefused("`--relay` runs one relay on this host, and srun starts ranks on other nodes too: "
                            "run `perftracker launch --relay` in each node's task instead: "
                            f"{per_task_form(command, job, name_job=False)}")
    with tempfile.TemporaryDirectory(prefix="perftracker-boot-") as tmp:
        boot_dir = Path(tmp)
        if how.sitecustomize:
            (boot_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = child_env(os.environ, job, boot_dir if how.sitecustomize else None, settings)
        relay_proc = start_relay(boot_dir / "relay.sock", env) if relay else None
        if relay_proc is not None:
            env["PERFTRACKER_COLLECTOR_RELAY_SOCKET"] = str(boot_dir / "relay.sock")
        try:
            return _run_command(command, env, job, how)
        finally:
            if relay_proc is not None:
                stop_relay(relay_proc)


def start_relay(path: Path, env: Mapping[str, str], wait_s: float = 10.0) -> subprocess.Popen | None:
    """``perftracker relay`` on ``path`` with the command's Kafka settings, once its socket is bound
    (None, said on stderr, when it does not start: the ranks then send to Kafka directly)."""
    if not env.get("PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS"):
        print("perftracker: no Kafka broker, so no relay", file=sys.stderr, flush=True)
        return None
    proc = subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", "relay", "--socket", str(path)],
                            env=dict(env), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None and not path.exists():
        time.sleep(0.05)
    if not path.exists():
        print("perftracker: the relay did not start; the ranks send to Kafka directly", file=sys.stderr, flush=True)
        stop_relay(proc)
        return None
    return proc


def stop_relay(proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    """SIGTERM: the relay sends what waits, then exits (killed past ``timeout_s``)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _run_command(command: list[str], env: dict[str, str], job: str, how: Route) -> int:
    """Start ``command`` and wait for it, forwarding signals; its exit code (128+N if killed by N)."""
    target = env["PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS"] or "no broker (events counted, not sent)"
    if job:
        named = job
    elif how.remote:
        named = "SLURM_JOB_ID of the allocation srun makes"
    else:
        named = f"agreed by the ranks at start-up (rank 0's launcher proposes {env[PROVISIONAL_ENV]})"
    print(f"perftracker: job {named} -> {target}", file=sys.stderr, flush=True)
    if how.remote:
        print("perftracker: ranks on other nodes attach where perftracker-ml is installed in the "
              "Python they run; `perftracker status --job <job>` names the ranks that do not report",
              file=sys.stderr, flush=True)
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
