"""How long the collectors hold a training job's exit up, with profiling windows in flight.

``python -m benchmarks.exit_delay --json`` runs the live fault suite's 4-rank gloo training
(``benchmarks/live_faults_train.py``, no fault) under ``perftracker launch`` with
duty-cycle profiling windows of ``--profile-duration-s`` every ``--profile-every-s``, so
that when the job is told to stop one window is still running and the one before it is
being summarized (turning a trace into op summaries takes seconds to a minute of Python
on a loaded host). After ``--seconds`` of training the
benchmark removes the job's run file (every rank stops at the same step, then exits) and
measures the time from that moment to the launcher's exit:

``{"exit_s": [...], "exit_s_median": ..., "runs": ..., ...}``

What a job's exit should cost is its own teardown (a barrier, destroying the process group:
~1-3 s here) plus at most ``exit_flush_s`` (2 s) per rank for the collectors. No broker is
started: the collectors count their batches instead of sending them, which does not change
the exit path measured (the sender's last flush and the profile summaries). Before the
summaries moved off the sender thread and its exit flush stopped waiting for its tasks,
this took ~45 s longer (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN_SCRIPT = Path(__file__).resolve().parent / "live_faults_train.py"


def one_run(seconds: float, every_s: float, duration_s: float, timeout_s: float) -> dict:
    """Train ``seconds``, stop the job through its run file, time the exit."""
    with tempfile.TemporaryDirectory(prefix="pt-exit-delay-") as tmp:
        work = Path(tmp)
        run_file = work / "run"
        run_file.touch()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFTRACKER_", "TORCHELASTIC_"))}
        env.update({"PERFTRACKER_COLLECTOR_PROFILE_EVERY_S": str(every_s),
                    "PERFTRACKER_COLLECTOR_PROFILE_DURATION_S": str(duration_s),
                    "LF_RUN_FILE": str(run_file), "LF_MAX_S": str(seconds + timeout_s)})
        cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "--data-dir", str(work / "stack"), "launch",
               "--job", f"exit-delay-{os.getpid()}", "--", sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node=4", str(TRAIN_SCRIPT)]
        with open(work / "job.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                time.sleep(seconds)
                stopped = time.monotonic()
                run_file.unlink()
                rc = proc.wait(timeout_s)
                exit_s = time.monotonic() - stopped
            except subprocess.TimeoutExpired:
                proc.kill()
                rc, exit_s = proc.wait(), float("inf")
        text = (work / "job.log").read_text(errors="replace")
        return {"exit_s": round(exit_s, 2), "rc": rc, "profile_windows_stopped": text.count("profiler_stop")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output is the same)")
    parser.add_argument("--seconds", type=float, default=30.0, help="train this long before stopping the job")
    parser.add_argument("--profile-every-s", type=float, default=10.0)
    parser.add_argument("--profile-duration-s", type=float, default=14.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=180.0, help="give up on an exit after this long")
    args = parser.parse_args(argv)
    runs = [one_run(args.seconds, args.profile_every_s, args.profile_duration_s, args.timeout_s)
            for _ in range(args.repeat)]
    exits = [r["exit_s"] for r in runs]
    print(json.dumps({"exit_s": exits, "exit_s_median": round(statistics.median(exits), 2), "runs": len(runs),
                      "rc": [r["rc"] for r in runs],
                      "profile_windows_stopped": [r["profile_windows_stopped"] for r in runs],
                      "seconds": args.seconds, "profile_every_s": args.profile_every_s,
                      "profile_duration_s": args.profile_duration_s, "ranks": 4, "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
