"""Everything is in pyproject.toml except one file: ``perftracker_ml_attach.pth``.

A ``.pth`` file works only at the top of site-packages, where no package-data setting puts
it. This adds ``collectors/perftracker_ml_attach.pth`` there in both wheels pip builds:

* the regular wheel (``pip install perftracker-ml``, ``pip wheel``): ``build_py`` copies it
  to the top of ``build_lib``, which becomes the wheel's root;
* the editable wheel (``pip install -e .``, PEP 660): setuptools maps the packages with a
  finder and puts nothing else of ``build_lib`` in the wheel, so the file is written into
  the wheel beside that finder.

Its one line attaches nothing unless ``PERFTRACKER_COLLECTOR_ATTACH=1`` (docs/attach.md);
``perftracker_ml.collectors.bootstrap.pth_installed`` tells ``perftracker launch`` whether
this interpreter has it, and tests/unit/collectors/test_autoattach.py checks the test
environment's install does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "perftracker_ml_attach.pth"
SOURCE = Path(__file__).resolve().parent / "collectors" / PTH


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(SOURCE), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


cmdclass: dict[str, Any] = {"build_py": BuildPyWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: no PEP 660 editable wheels
    pass
else:
    class _WithPth:
        """Wraps setuptools' editable strategy: its files, then the .pth at the wheel's root."""

        def __init__(self, inner: Any):
            self.inner = inner

        def __call__(self, wheel: Any, files: list[str], mapping: Any) -> None:
            self.inner(wheel, files, mapping)
            wheel.writestr(PTH, SOURCE.read_bytes())

        def __enter__(self) -> _WithPth:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> Any:
            return self.inner.__exit__(*exc)

    class EditableWheelWithPth(editable_wheel):
        def _select_strategy(self, *args: Any, **kwargs: Any) -> Any:
            return _WithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass)
