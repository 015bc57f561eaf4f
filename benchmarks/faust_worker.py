"""The real worker's rate: a ``perftracker worker`` (Faust, aiokafka, all three agents) catching
up on a backlog of EventBatches already on the broker.

Used by ``python -m benchmarks.throughput --faust``: the worker is started after the
batches were produced; its ``/perftracker/stats/`` counters are polled every 0.1 s, and the
rate is the batches consumed between the first poll that saw any and the poll that saw
them all, times events per batch; ``drained_s`` runs on until the worker's compare and
diagnose agents have also consumed every record it produced until then (the pipeline's rate). ``worker_cpu_s`` is the worker process's CPU time over
the same span (from /proc), so the rate per CPU second can be compared on a shared host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perftracker_ml.deploy.stack import worker_stats
from perftracker_ml.deploy.tansu import free_port

POLL_S = 0.1


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc), 0 when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def start_worker(bootstrap: str, prefix: str, log: Path, app_id: str | None = None) -> tuple[subprocess.Popen, int]:
    """A ``perftracker worker`` on topics ``prefix.*``; ``app_id``: its consumer group (default: a new one)."""
    port = free_port()
    env = {**os.environ, "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "PERFTRACKER_KAFKA_TOPIC_PREFIX": prefix,
           "PERFTRACKER_STREAMS_WEB_PORT": str(port), "PERFTRACKER_STREAMS_APP_ID": app_id or f"{prefix}-{time.time_ns()}",
           "PERFTRACKER_DATA_DIR": tempfile.mkdtemp(prefix="pt-bench-worker-"), "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "perftracker_ml.deploy.cli", "worker"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, port


def counters(port: int) -> dict:
    return (worker_stats(port) or {}).get("counters", {})


def consumed(port: int) -> int:
    return int(counters(port).get("records_in.EventBatch", 0))


DOWNSTREAM = ("FunctionPattern", "RankWindow", "FunctionComparison")  # records the worker sends itself


def downstream(c: dict) -> tuple[int, int]:
    """(records the worker produced for its own compare and diagnose agents, records those consumed)."""
    return (sum(int(c.get(f"records_out.{n}", 0)) for n in DOWNSTREAM),
            sum(int(c.get(f"records_in.{n}", 0)) for n in DOWNSTREAM))


def _spy(pid: int, out: str) -> subprocess.Popen | None:
    """``py-spy record`` of ``pid`` into ``out`` (collapsed stacks), when py-spy is installed."""
    exe = Path(sys.executable).with_name("py-spy")
    if not exe.exists():
        return None
    return subprocess.Popen([str(exe), "record", "--pid", str(pid), "--format", "raw", "--rate", "100",
                             "--nonblocking", "--output", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _drained(port: int, pid: int, first: tuple[float, int, float], deadline: float) -> dict:
    """Once every batch is consumed: when the worker's compare and diagnose agents have consumed
    every pattern, window and comparison produced so far (the whole pipeline's share of the
    backlog; the windows still open then close a grace period later and are not counted):
    ``drained_s`` and ``drained_cpu_s`` from the same start, and the record counts."""
    produced, _ = downstream(counters(port))
    while time.monotonic() < deadline:
        taken = downstream(counters(port))[1]
        if taken >= produced:
            return {"drained_s": time.perf_counter() - first[0], "drained_cpu_s": _cpu_s(pid) - first[2],
                    "downstream_records": taken}
        time.sleep(POLL_S / 2)
    raise RuntimeError(f"the worker's own agents consumed {taken} of the {produced} records it produced")


def catch_up(bootstrap: str, prefix: str, batches: int, timeout_s: float = 600.0,
             spy_out: str | None = None) -> dict:
    """Start a worker on a backlog of ``batches`` and time it; stops the worker afterwards.
    ``spy_out``: also sample the worker with py-spy (collapsed stacks written there)."""
    log = Path(tempfile.mkdtemp(prefix="pt-bench-faust-")) / "worker.log"
    proc, port = start_worker(bootstrap, prefix, log)
    spy = _spy(proc.pid, spy_out) if spy_out else None
    try:
        deadline = time.monotonic() + timeout_s
        first: tuple[float, int, float] | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with code {proc.returncode}; see {log}")
            n, now = consumed(port), time.perf_counter()
            if n and first is None:
                first = (now, n, _cpu_s(proc.pid))
            if first and n >= batches:
                seconds, cpu_s = now - first[0], _cpu_s(proc.pid) - first[2]
                return {"batches": n - first[1], "seconds": seconds, "cpu_s": cpu_s,
                        **_drained(port, proc.pid, first, deadline)}
            time.sleep(POLL_S)
        raise RuntimeError(f"the worker consumed {consumed(port)} of {batches} batches in {timeout_s:.0f}s; see {log}")
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on interrupt
            spy.wait(60)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
