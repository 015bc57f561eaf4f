"""The bootstrap ``perftracker launch`` injects into every Python process it starts.

``launch`` writes :data:`SITECUSTOMIZE` into a temporary directory and puts it
first on ``PYTHONPATH``. Python imports it at start-up in every process of the
command (torchrun itself, its workers, their helpers). It first runs the
user's own ``sitecustomize`` (the next one on ``sys.path``), then calls
:func:`boot`, which attaches a collector only where :func:`should_attach`
says so: in rank processes (``RANK`` set by the launcher) or in a plain
``python`` child of ``launch``; never in torchrun's agent, and never in
processes started by an already instrumented rank (compile workers, spawned
DataLoader workers, subprocesses).

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

ATTACH_ENV = "PERFTRACKER_COLLECTOR_ATTACH"
LAUNCHER_PID_ENV = "PERFTRACKER_COLLECTOR_LAUNCHER_PID"
ATTACHED_PID_ENV = "PERFTRACKER_COLLECTOR_ATTACHED_PID"

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")

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


def is_launcher(cmdline: Sequence[str]) -> bool:
    """True for torchrun / ``python -m torch.distributed.run|launch`` (they start the ranks)."""
    for i, arg in enumerate(cmdline[:4]):
        if os.path.basename(arg) == "torchrun":
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
    if "RANK" in env:
        return True
    return env.get(LAUNCHER_PID_ENV, "") == str(ppid)


def _cmdline() -> list[str]:
    try:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return list(getattr(sys, "orig_argv", sys.argv))


def boot() -> None:
    """Called from the injected sitecustomize."""
    if os.environ.get(ATTACH_ENV) != "1":
        return
    if not should_attach(os.environ, os.getpid(), os.getppid(), _cmdline()):
        return
    from .api import attach
    attach()
