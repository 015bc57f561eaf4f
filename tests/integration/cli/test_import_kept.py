"""`perftracker import-traces` keeps its result: `diagnose` and `report` read the imported job
afterwards, with the stack down (the data dir's chDB) and up (through its sink). The real CLI
in subprocesses, generated Kineto traces (benchmarks/kineto_trace.py) whose rank 2 reaches
4 of 6 all-reduces late; the progress display only on a terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from perftracker_ml.deploy.workloads.kineto import TraceJob, write_job

from ..stack.conftest import Stack, running_stack, stack_env
from .terminal import on_terminal

pytestmark = pytest.mark.integration

LATE = TraceJob(ranks=4, steps=6, layers=8, buckets=1, slow_rank=-1, slowdown=1.0, seed=1,
                late_rank=2, late_steps=(0, 1, 3, 4), late_us=11_000.0, noise_us=3000.0)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("traces")
    write_job(LATE, folder)
    return folder


def assert_rank_2_named(rows: list[dict]) -> None:
    (row,) = rows
    assert row["kind"] == "straggler" and row["cause"] == "slow_function" and row["ranks"] == [2]
    assert row["function"].startswith("comm:allreduce") and row["evidence"]["late_seqs"] == 4


def check_diagnose_and_report(s: Stack, job: str, tmp_path: Path) -> None:
    assert_rank_2_named(s.diagnose(job))
    text = s.cli("diagnose", "--job", job).stdout.splitlines()
    assert text[0] == f"job {job}: 1 root cause(s), most costly first"
    assert text[2].split()[:2] == ["slow_function", "2"] and "rank 2" in text[3]
    out = tmp_path / f"{job}.html"
    proc = s.cli("report", "--job", job, "--out", str(out))
    assert proc.stdout.splitlines()[0] == f"HTML report: {out}"
    assert_rank_2_named(json.loads(out.with_suffix(".json").read_text()))
    assert "rank 2" in out.read_text()


def test_import_with_the_stack_down_keeps_the_job_in_the_data_dir(tmp_path: Path, traces: Path) -> None:
    data = tmp_path / "data"
    s = Stack(data, stack_env(data))
    out = s.cli("import-traces", str(traces), "--job", "kept-1").stdout
    assert "imported 4 rank trace(s)" in out and "slow_function         2" in out
    assert f"stored in chdb://{data.resolve()}/chdb: " in out
    # generated traces are stamped 2023: older than the store keeps rows, so stored as of now
    assert "older than the store keeps (store.retention_days = 30): stored as of the import time" in out
    assert not (data / "stack.json").exists()  # no stack was started for it
    check_diagnose_and_report(s, "kept-1", tmp_path)
    unknown = s.cli("diagnose", "--job", "kept-2", check=False)
    assert unknown.returncode == 1
    assert unknown.stderr == "perftracker: error: no such job 'kept-2' (known: kept-1)\n"
    refused = s.cli("report", "--job", "kept-2", "--out", str(tmp_path / "x.html"), check=False)
    assert refused.returncode == 1 and "no such job 'kept-2'" in refused.stderr
    assert not (tmp_path / "x.html").exists()
    s.cli("import-traces", str(traces), "--job", "kept-1")  # again: the same incident, not a second
    assert_rank_2_named(s.diagnose("kept-1"))


def test_import_with_the_stack_up_writes_through_its_sink(tmp_path: Path, traces: Path) -> None:
    with running_stack(tmp_path / "data") as s:
        sink_pid = s.state()["sink_pid"]
        out = s.cli("import-traces", str(traces), "--job", "kept-up").stdout
        assert f"stored in the stack's sink (pid {sink_pid}): " in out
        check_diagnose_and_report(s, "kept-up", tmp_path)  # read through the sink's query API
    assert not (s.data_dir / "stack.json").exists()
    assert_rank_2_named(s.diagnose("kept-up"))  # stack down: the data dir's chDB holds it


def test_no_store_keeps_nothing(tmp_path: Path, traces: Path) -> None:
    data = tmp_path / "data"
    s = Stack(data, stack_env(data))
    proc = s.cli("import-traces", str(traces), "--job", "j", "--no-store", "--json")
    assert_rank_2_named(json.loads(proc.stdout))
    assert proc.stderr.strip().splitlines()[-1] == "not stored (--no-store)"
    assert not data.exists()
    proc = s.cli("diagnose", "--job", "j", check=False)
    assert proc.returncode == 1 and "stack not initialised" in proc.stderr


def test_missing_traces_are_a_runtime_failure_in_one_line(tmp_path: Path) -> None:
    s = Stack(tmp_path / "data", stack_env(tmp_path / "data"))
    proc = s.cli("import-traces", str(tmp_path / "nowhere"), "--job", "j", check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"perftracker: error: {tmp_path / 'nowhere'}: no such file or directory\n"


def test_progress_shows_on_a_terminal_only_and_never_with_json(tmp_path: Path, traces: Path) -> None:
    s = Stack(tmp_path / "data", stack_env(tmp_path / "data"))
    events = sum(len(json.loads(p.read_text())["traceEvents"]) for p in traces.glob("*.json"))
    code, screen, _ = on_terminal(s, "import-traces", str(traces), "--job", "p", "--no-store")
    assert code == 0
    assert f"4 file(s) parsed, {events:,} events" in screen and "\x1b[" in screen  # drawn, then erased
    assert "job p: 1 root cause(s)" in screen  # the command's own output stays
    piped = s.cli("import-traces", str(traces), "--job", "p", "--no-store").stdout
    assert "file(s) parsed" not in piped and "\x1b" not in piped
    code, screen, err = on_terminal(s, "import-traces", str(traces), "--job", "p", "--no-store", "--json")
    assert code == 0 and "\x1b" not in screen and "parsed" not in screen + err
    assert_rank_2_named(json.loads(screen.replace("\r\n", "\n")))
