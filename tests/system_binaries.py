"""Debian programs the tests run (promtool, prometheus): found, or why not.

``python -m tests`` installs them (:func:`tests.__main__.ensure_system_packages`) when they
are missing and it runs as root with apt-get. So a test skips only where the program cannot
be there (not root, or no apt-get); anywhere else a missing program fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def require(program: str, package: str) -> str:
    """The path of ``program`` (Debian package ``package``); skips or fails as the module says."""
    path = shutil.which(program)
    if path:
        return path
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip(f"{program} missing and not installable here (needs root and apt-get): "
                    f"apt-get install {package}")
    pytest.fail(f"{program} missing: `python -m tests` installs it (apt-get install {package})")


def stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop a daemon the test started: SIGTERM, ``grace_s`` to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
