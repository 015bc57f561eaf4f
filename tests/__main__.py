"""`python -m tests`: the whole check CI runs — lint, then unit, integration and e2e suites.

``python -m tests --quick``: the inner loop — ruff, then the unit suite (the recorded runs'
replays included), without mypy, the broker, the stack or torchrun. Other arguments go to
pytest in place of the default ones (``python -m tests tests/unit/streams -x``).

Installs the Debian packages some tests run (chromium for the report browser test;
prometheus for promtool and the Prometheus server, prometheus-alertmanager) when one is
missing and this user may install packages (root with apt-get); exits non-zero on any
failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["collectors", "schemas", "streams", "sinks", "grafana", "deploy"]


# Debian package -> the programs of it the tests run (absent: install the package)
SYSTEM_PACKAGES = {
    "chromium": ("chromium",),  # the report browser test
    "prometheus": ("promtool", "prometheus"),  # rule checks and tests, the scrape integration test
    "prometheus-alertmanager": ("prometheus-alertmanager",),  # Alertmanager delivery tests
}


def can_install_packages() -> bool:
    """Whether the test runner may install Debian packages: root, with apt-get."""
    return bool(shutil.which("apt-get")) and os.geteuid() == 0


def ensure_system_packages() -> None:
    """apt-get install the packages of :data:`SYSTEM_PACKAGES` whose programs are missing."""
    missing = [pkg for pkg, programs in SYSTEM_PACKAGES.items()
               if not all(shutil.which(p) for p in programs)]
    if not missing or not can_install_packages():
        return
    print(f"tests: installing Debian's {', '.join(missing)} for the tests that run them", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.call(["apt-get", "update", "-qq"], env=env, stdout=subprocess.DEVNULL)
    subprocess.call(["apt-get", "install", "-y", "-qq", *missing],
                    env=env, stdout=subprocess.DEVNULL)


def typecheck() -> int:
    """mypy over the packages as they are imported, ``perftracker_ml.<folder>``.

    Run on the bare folders, mypy names modules ``streams.detect.x`` and cannot resolve a
    ``from ...schemas`` import two levels down (it becomes ``Any``), hiding real errors;
    a temporary ``perftracker_ml/`` tree of links to the folders gives it the real names.
    """
    with tempfile.TemporaryDirectory(prefix="pt-mypy-") as tmp:
        tree = Path(tmp) / "perftracker_ml"
        tree.mkdir()
        for package in PACKAGES:
            (tree / package).symlink_to(ROOT / package, target_is_directory=True)
        return subprocess.call(
            [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
             "--cache-dir", str(ROOT / ".mypy_cache"), "--explicit-package-bases", "perftracker_ml"],
            cwd=tmp)


def quick() -> int:
    ensure_system_packages()
    lint = subprocess.call([sys.executable, "-m", "ruff", "check", "."])
    suite = subprocess.call([sys.executable, "-m", "pytest", "tests/unit", "-q", "-rsEf", "--durations=5"])
    return lint or suite


def main() -> int:
    os.chdir(ROOT)
    if sys.argv[1:] == ["--quick"]:
        return quick()
    ensure_system_packages()
    lint = subprocess.call([sys.executable, "-m", "ruff", "check", "."])
    if lint:
        print("tests: ruff found problems", flush=True)
    types = typecheck()
    if types:
        print("tests: mypy found problems", flush=True)
    lint = lint or types
    # four xdist workers (the suite mostly waits on real components: ~1.2 of 2 cores busy with three),
    # in the work units tests/conftest.py defines;
    # failures listed last: CI shows the tail
    args = sys.argv[1:] or ["tests", "-q", "-rsEf", "--durations=25", "-n", "4", "--dist", "loadgroup",
                             "--no-loadscope-reorder"]
    suite = subprocess.call([sys.executable, "-m", "pytest", *args])
    return lint or suite


if __name__ == "__main__":
    sys.exit(main())
