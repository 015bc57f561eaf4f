"""Fault onset -> anomaly, at the settings `perftracker up` gives: ``python -m benchmarks.latency --json``.

Starts the embedded stack (`perftracker up`'s defaults: 5 s windows, 3 s grace; nothing
overridden but the webhook URL) with a real local HTTP webhook receiver, then runs
``--runs`` real training jobs, one after the other: `perftracker launch --job ID --
torchrun --nproc-per-node 4` of the demo's unmodified training script (gloo, CPU), with
the demo's fault injection (``deploy/demo/inject_fault.py``) slowing one rank from a
random step on; the faulty rank writes the wall time its fault began. Each run ends once
the fault was named (rank and cause) both in the store (`perftracker diagnose`, polled
every ``--poll-s``) and at the webhook, or ``--timeout-s`` after the onset (a miss).

Prints one JSON object (``--json``; without it, a line per run first)::

    {"p50_s": ..., "p95_s": ..., "runs": ..., "webhook_p50_s": ..., "webhook_p95_s": ...,
     "missed": ..., "false_alarms": ..., "store_s": [...], "webhook_s": [...], ...}

p50_s / p95_s: onset -> the incident readable in the store; webhook_*: onset -> the
webhook's OPEN delivery received. Goal (docs/benchmarks.md): store p50 <= 10 s, p95 <= 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from perftracker_ml.deploy.demo.runner import (
    EXPECTED_CAUSE,
    FAULTS,
    TRAIN_SCRIPT,
    stop_process_group,
)
from perftracker_ml.deploy.stack import down, up
from perftracker_ml.schemas.settings import Settings
from perftracker_ml.schemas.settings_loader import load_settings
from perftracker_ml.sinks.client import diagnose

WEBHOOK_ENV = "PERFTRACKER_ALERTS_WEBHOOK_URL"


class WebhookReceiver:
    """A real local HTTP server recording (receive wall time, JSON body) of every POST."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                at = time.time()
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {}
                with outer._lock:
                    outer.received.append((at, doc))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def first_open(self, job: str, rank: int, cause: str) -> float | None:
        """Receive time of the first OPEN naming ``rank`` alone with ``cause`` for ``job``."""
        with self._lock:
            for at, doc in self.received:
                inc = doc.get("incident", {})
                if (doc.get("event") == "open" and inc.get("job") == job and inc.get("ranks") == [rank]
                        and inc.get("cause") == cause):
                    return at
        return None


@dataclass
class Run:
    job: str
    at_step: int
    onset: float | None = None
    store_s: float | None = None
    webhook_s: float | None = None
    false_alarms: list[dict] = field(default_factory=list)
    windows: int = 0  # windows the incident had been seen in when it opened
    after_window_s: float | None = None  # from the end of the window that opened it to the store

    def as_json(self) -> dict:
        return {"job": self.job, "at_step": self.at_step, "store_s": self.store_s, "webhook_s": self.webhook_s,
                "windows": self.windows, "after_window_s": self.after_window_s,
                "false_alarms": [f"{r['cause']} {r['ranks']}: {r['summary']}" for r in self.false_alarms]}


def one_run(settings: Settings, rx: WebhookReceiver, i: int, fault: str, rank: int, ranks: int,
            at_step: int, timeout_s: float, poll_s: float, work: Path) -> Run:
    run = Run(job=f"latency-{i}-{int(time.time())}", at_step=at_step)
    cause = EXPECTED_CAUSE[fault]
    assert cause is not None, "a fault that names a cause"
    onset_file = work / f"{run.job}.onset.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFTRACKER_")}  # defaults only
    env.update({"PERFTRACKER_DEMO_FAULT": fault, "PERFTRACKER_DEMO_RANK": str(rank),
                "PERFTRACKER_DEMO_AT_STEP": str(at_step), "PERFTRACKER_DEMO_ONSET_FILE": str(onset_file),
                "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "--data-dir", str(settings.data_dir.resolve()),
           "launch", "--job", run.job, "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={ranks}", str(TRAIN_SCRIPT), "--steps", "1000000"]
    with open(work / f"{run.job}.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        while proc.poll() is None:
            time.sleep(poll_s)
            now = time.time()
            if run.onset is None:
                if onset_file.exists():
                    run.onset = json.loads(onset_file.read_text())["wall_time"]
                continue
            if run.store_s is None:
                rows = diagnose(settings, run.job)
                named = [r for r in rows if r["ranks"] == [rank] and r["cause"] == cause]
                if named:
                    run.store_s = round(time.time() - run.onset, 2)
                    run.windows = named[0]["windows"]
                    end = _wall(named[0]["last_seen"])
                    run.after_window_s = round(time.time() - end, 2) if end is not None else None
                run.false_alarms = [r for r in rows if set(r["ranks"]) - {rank}]
            if run.webhook_s is None:
                at = rx.first_open(run.job, rank, cause)
                if at is not None:
                    run.webhook_s = round(at - run.onset, 2)
            if (run.store_s is not None and run.webhook_s is not None) or now - run.onset > timeout_s:
                break
        else:
            tail = (work / f"{run.job}.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"training of {run.job} exited with {proc.returncode}:\n{tail}")
    finally:
        stop_process_group(proc, interrupt_wait_s=15)
    return run


def _wall(value: object) -> float | None:
    """A store time (datetime, or ISO text; naive means UTC) as unix seconds."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 2) if xs else None


def summary(runs: list[Run], settings: Settings, fault: str) -> dict:
    store = [r.store_s for r in runs if r.store_s is not None]
    hook = [r.webhook_s for r in runs if r.webhook_s is not None]
    return {"p50_s": pct(store, 50), "p95_s": pct(store, 95), "runs": len(runs),
            "webhook_p50_s": pct(hook, 50), "webhook_p95_s": pct(hook, 95),
            "missed": sum(r.store_s is None for r in runs), "webhook_missed": sum(r.webhook_s is None for r in runs),
            "false_alarms": sum(len(r.false_alarms) for r in runs), "fault": fault,
            "window_s": settings.streams.window_s, "window_grace_s": settings.streams.window_grace_s,
            "persist_windows": settings.detection.persist_windows, "persist_steps": getattr(settings.detection, "persist_steps", None),
            "store_s": [r.store_s for r in runs], "webhook_s": [r.webhook_s for r in runs],
            "windows": [r.windows for r in runs], "after_window_s": [r.after_window_s for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="only the summary object")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--fault", default="slow-dataloader", choices=[f for f in FAULTS if EXPECTED_CAUSE[f]])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rank", type=int, default=2, help="the faulty rank")
    parser.add_argument("--at-steps", default="150-350", help="the fault starts at a random step in this range")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a run not named this long after onset is a miss")
    parser.add_argument("--poll-s", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lo, _, hi = args.at_steps.partition("-")
    rng = random.Random(args.seed)
    for key in [k for k in os.environ if k.startswith("PERFTRACKER_")]:
        del os.environ[key]  # `perftracker up`'s defaults, whatever this shell has set
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="pt-latency-") as tmp, WebhookReceiver() as rx:
        settings = load_settings(env={"PERFTRACKER_DATA_DIR": tmp})
        work = Path(tmp) / "latency"
        work.mkdir()
        try:
            up(settings, extra_env={WEBHOOK_ENV: rx.url})
            for i in range(args.runs):
                run = one_run(settings, rx, i, args.fault, args.rank, args.ranks, rng.randint(int(lo), int(hi or lo)),
                              args.timeout_s, args.poll_s, work)
                runs.append(run)
                if not args.json:
                    print(json.dumps(run.as_json()), flush=True)
        finally:
            down(settings)
    print(json.dumps(summary(runs, settings, args.fault)), flush=True)


if __name__ == "__main__":
    main()
