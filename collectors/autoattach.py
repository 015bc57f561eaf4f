"""The installed bootstrap: what ``perftracker_ml_attach.pth`` starts in every Python process.

Importing this module installs the finder below: only that ``.pth`` line imports it
(``launch`` asks :func:`.bootstrap.pth_installed` whether the file is there).

pip puts :data:`.bootstrap.PTH_NAME` into site-packages with the package (``setup.py`` adds it to
the wheel and to the editable wheel). Python runs its one line in every interpreter at
start-up; the line only compares one environment variable and, unless
``PERFTRACKER_COLLECTOR_ATTACH=1`` (set by ``perftracker launch``), imports nothing, so a
process that does not attach pays well under a millisecond (docs/attach.md gives the
measured figure). So every node that has the install can attach the ranks a launcher
started there (``perftracker launch -- srun ...``), with no file written on that node.

When it attaches, this module does not attach at once: ``site`` is still adding
directories to ``sys.path`` and the user's own ``sitecustomize`` has not run. It
installs a one-shot finder for the module ``sitecustomize``, which ``site`` imports
last: the finder runs the user's own ``sitecustomize`` (the next one on ``sys.path``,
nothing clobbered) and then :func:`.bootstrap.boot`, the same point and the same
decisions (:func:`.bootstrap.should_attach`) as the ``sitecustomize.py`` that
``launch`` writes where this file is not installed.
"""

from __future__ import annotations

import sys
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import Any


class _SiteCustomize(MetaPathFinder, Loader):
    """Finds ``sitecustomize`` once: runs the user's own, then the bootstrap."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != "sitecustomize":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return ModuleSpec(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        import traceback

        user = PathFinder.find_spec("sitecustomize", sys.path)
        if user is not None and user.loader is not None:
            try:
                from importlib.util import module_from_spec

                own = module_from_spec(user)
                sys.modules["sitecustomize"] = own  # the import returns the user's module
                user.loader.exec_module(own)
            except Exception:  # noqa: BLE001 - as site.py does: print, go on
                traceback.print_exc()
        try:
            from .bootstrap import boot

            boot()
        except Exception as exc:  # noqa: BLE001 - attaching must never stop the process
            sys.stderr.write(f"perftracker: collector bootstrap failed: {exc!r}\n")


def install() -> None:
    """Run the bootstrap after the user's ``sitecustomize`` (at once if that already ran)."""
    if "sitecustomize" in sys.modules:  # a .pth read late (site.addsitedir at run time)
        from .bootstrap import boot

        boot()
        return
    if not any(isinstance(f, _SiteCustomize) for f in sys.meta_path):
        sys.meta_path.insert(0, _SiteCustomize())


install()
