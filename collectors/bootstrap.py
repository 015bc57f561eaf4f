"""The bootstrap that attaches collectors in the processes ``perftracker launch`` starts.

Two ways in, one :func:`boot`:

* the installed one: ``perftracker_ml_attach.pth`` (:mod:`.autoattach`), in
  site-packages wherever the package is installed, so on every node of a
  multi-node launcher (``srun``) too; it does nothing unless
  ``PERFTRACKER_COLLECTOR_ATTACH=1``;
* where that file is not installed (a source tree, ``pip install --target``),
  ``launch`` writes :data:`SITECUSTOMIZE` into a temporary directory and puts it
  first on ``PYTHONPATH`` (this node only).

Both run the user's own ``sitecustomize`` first (the next one on ``sys.path``),
then :func:`boot`, which attaches a collector only where :func:`should_attach`
says so: in rank processes (``RANK`` set by the launcher, or a SLURM task of a
job step), or in a plain ``python`` child of ``launch``; never in torchrun's
agent or a ``perftracker`` command, and never in processes started by an
already instrumented rank (compile workers, spawned DataLoader workers,
subprocesses).

Environment used (all set by ``launch``):

* ``PERFTRACKER_COLLECTOR_ATTACH=1``: attach where appropriate;
* ``PERFTRACKER_COLLECTOR_LAUNCHER_PID``: pid of ``launch``;
* ``PERFTRACKER_COLLECTOR_ATTACHED_PID``: set by an attached process for its children;
* ``PERFTRACKER_COLLECTOR_JOB`` and every other ``PERFTRACKER_COLLECTOR_*`` /
  ``PERFTRACKER_KAFKA_*`` setting.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

PTH_NAME = "perftracker_ml_attach.pth"  # installed at the top of site-packages (setup.py)
ATTACH_ENV = "PERFTRACKER_COLLECTOR_ATTACH"
LAUNCHER_PID_ENV = "PERFTRACKER_COLLECTOR_LAUNCHER_PID"
ATTACHED_PID_ENV = "PERFTRACKER_COLLECTOR_ATTACHED_PID"

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "perftracker_ml.deploy.cli")
# launcher processes: torchrun's agent; a `perftracker` command (launch run per task under srun)
LAUNCHER_COMMANDS = ("torchrun", "perftracker")
# SLURM_STEP_ID of the steps that are not srun's tasks: the batch script, the extern and
# interactive steps (by name or by their numeric ids 0xfffffffe, 0xffffffff, 0xfffffffa)
NOT_TASK_STEPS = ("batch", "extern", "interactive", "4294967294", "4294967295", "4294967290")

_booted = False

SITECUSTOMIZE = '''\
# Written by `perftracker launch`: attach collectors, keep the user's own sitecustomize.
def _perftracker_sitecustomize():
    import os, sys, importlib.machinery, importlib.util, traceback
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        try:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
        except Exception:
            traceback.print_exc()
    try:
        from perftracker_ml.collectors.bootstrap import boot
        boot()
    except Exception as exc:
        sys.stderr.write("perftracker: collector bootstrap failed: %r\\n" % (exc,))

_perftracker_sitecustomize()
del _perftracker_sitecustomize
'''


def site_dirs() -> list[Path]:
    """The directories whose ``.pth`` files this interpreter runs at start-up."""
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [Path(d) for d in dirs]


def pth_installed() -> Path | None:
    """Where this interpreter's :data:`PTH_NAME` is, or None (a source tree on PYTHONPATH,
    ``pip install --target``, a build backend that left it out)."""
    for directory in site_dirs():
        if (directory / PTH_NAME).is_file():
            return directory / PTH_NAME
    return None


def is_launcher(cmdline: Sequence[str]) -> bool:
    """True for torchrun / ``python -m torch.distributed.run|launch`` (they start the ranks)
    and for a ``perftracker`` command (``srun perftracker launch -- ...`` runs one per task)."""
    for i, arg in enumerate(cmdline[:4]):
        if os.path.basename(arg) in LAUNCHER_COMMANDS:
            return True
        if arg == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] in LAUNCHER_MODULES:
            return True
    return False


def should_attach(env: Mapping[str, str], pid: int, ppid: int, cmdline: Sequence[str]) -> bool:
    if env.get(ATTACH_ENV) != "1":
        return False
    attached = env.get(ATTACHED_PID_ENV, "")
    if attached and attached != str(pid):
        return False  # started by an instrumented process
    if is_launcher(cmdline):
        return False
    if "RANK" in env or slurm_task(env):
        return True
    return env.get(LAUNCHER_PID_ENV, "") == str(ppid)


def slurm_task(env: Mapping[str, str]) -> bool:
    """A task ``srun`` started (``SLURM_PROCID`` in a job step), not the batch script's shell
    (``SLURM_PROCID`` without ``SLURM_STEP_ID``; tests/integration/slurm checks both)."""
    return "SLURM_PROCID" in env and env.get("SLURM_STEP_ID", "") not in ("", *NOT_TASK_STEPS)


def _cmdline() -> list[str]:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return list(getattr(sys, "orig_argv", sys.argv))


def boot() -> None:
    """Called from a sitecustomize (the installed finder's or ``launch``'s); once per process."""
    global _booted
    if _booted or os.environ.get(ATTACH_ENV) != "1":
        return
    _booted = True
    if not should_attach(os.environ, os.getpid(), os.getppid(), _cmdline()):
        return
    from .api import attach
    attach()
