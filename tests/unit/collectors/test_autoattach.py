"""The installed bootstrap (``perftracker_ml_attach.pth``), in real interpreters of this install.

Nothing on PYTHONPATH: a process attaches only through the ``.pth`` pip put in
site-packages, as a rank ``srun`` started on another node would. Its collector writes to a
spool (``spool:DIR``), which the test reads back. Without the switch, the ``.pth`` imports
nothing of perftracker. (Its cost at start-up is measured in docs/attach.md, not here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from perftracker_ml.collectors.bootstrap import PTH_NAME, pth_installed

from ...spooled import event_batches

ROOT = Path(__file__).resolve().parents[3]


def python(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PERFTRACKER_", "SLURM_")) and k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_the_install_has_the_pth_with_the_line_the_repository_ships():
    where = pth_installed()
    assert where is not None, (f"no {PTH_NAME} in this interpreter's site-packages: reinstall "
                               "(pip install -e '.[dev]'), setup.py adds it to the wheel")
    assert where.read_text() == (ROOT / "collectors" / PTH_NAME).read_text()


def test_a_rank_attaches_through_the_pth_alone(tmp_path):
    spool = tmp_path / "spool"
    out = python(tmp_path, "import sys; print(sorted(m for m in sys.modules if m.startswith('perftracker_ml')))",
                 PERFTRACKER_COLLECTOR_ATTACH="1", RANK="1", WORLD_SIZE="2", PERFTRACKER_COLLECTOR_JOB="pth-job",
                 PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"spool:{spool}")
    assert out.returncode == 0, out.stderr
    assert "perftracker_ml.collectors.api" in out.stdout  # attached before the script ran
    batches = event_batches(spool)
    assert batches and {(b["job"], b["rank"], b["world_size"]) for b in batches} == {("pth-job", 1, 2)}
    assert batches[-1]["final"]


def test_without_the_switch_nothing_of_perftracker_is_imported_or_sent(tmp_path):
    spool = tmp_path / "spool"
    out = python(tmp_path, "import sys, json; print(json.dumps(sorted(sys.modules)))", RANK="0",
                 PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"spool:{spool}")
    assert out.returncode == 0, out.stderr
    assert not [m for m in json.loads(out.stdout) if m.startswith("perftracker")]
    assert not spool.exists()


def test_the_users_sitecustomize_runs_first_and_a_helper_of_the_rank_does_not_attach(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    spool = tmp_path / "spool"
    helper = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    out = python(tmp_path, "import builtins, sitecustomize; print(builtins.USER_SITE_RAN, sitecustomize.__file__); "
                 + helper, PYTHONPATH=str(user), PERFTRACKER_COLLECTOR_ATTACH="1", RANK="0",
                 PERFTRACKER_COLLECTOR_JOB="pth-user", PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS=f"spool:{spool}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", str(user / "sitecustomize.py")]
    assert len({b["pid"] for b in event_batches(spool)}) == 1  # the rank's, not its helper's
