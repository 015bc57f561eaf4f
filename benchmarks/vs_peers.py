"""perftracker beside NVIDIA's straggler detector on one real training: ``python -m benchmarks.vs_peers --json``.

The same 4-rank torchrun job (``benchmarks/vs_peers_train.py``: a DDP MLP on gloo, one rank's
``forward`` slowed by ``--delay-ms`` from ``--fault-at-s`` on) runs three times, one after the
other:

* ``bare``: no tool, the reference step time;
* ``nvrx``: NVIDIA's straggler detector (PyPI ``nvidia-resiliency-ext``, its
  ``straggler.Detector``) used as documented: each phase in a ``detection_section``, a report
  every ``--report-interval-s`` (5 s, as perftracker's default window), default thresholds;
* ``perftracker``: the unmodified script under ``perftracker launch`` against the embedded
  stack at ``perftracker up``'s defaults.

Printed (``--json``: one object per tool, then a summary line): the median wall ms and
training-thread CPU ms per step before the fault (after a warm-up), the ratio to ``bare``,
and the verdict: which ranks each tool names after the onset, whether the slow rank is among
them, who else is named (``false_ranks``), the seconds from onset to the first naming, and
what it says about where and why.

NVRx on a machine without CUDA: its CUPTI extension loads (the ``nvidia-cuda-cupti-cu12``
wheel's ``libcupti.so.12``, put on ``LD_LIBRARY_PATH`` here) but kernel profiling needs a GPU
driver, so the sections are timed with ``profile_cuda=False`` and ``torch.cuda.synchronize``
and the CUPTI results are stubbed in the training script (see its docstring); the section
scores it computes are its real CPU-side code path. Install: ``pip install -e '.[dev,peers]'``
(kept out of ``dev``: it pulls the deprecated ``pynvml`` package). Without it this benchmark
says so and runs the other two.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perftracker_ml.deploy.demo.runner import stop_process_group
from perftracker_ml.deploy.stack import down, up
from perftracker_ml.schemas.settings import Settings
from perftracker_ml.schemas.settings_loader import load_settings
from perftracker_ml.sinks.client import diagnose

TRAIN = Path(__file__).resolve().parent / "vs_peers_train.py"
NVRX_MISSING = "nvidia-resiliency-ext is not installed: pip install -e '.[dev,peers]'"


@dataclass
class ToolRun:
    tool: str
    step_ms: float | None = None
    cpu_ms: float | None = None
    steps: int = 0
    onset: float | None = None
    named: list[int] = field(default_factory=list)  # every rank named after the onset
    first_named_s: float | None = None  # onset -> first naming of the slow rank
    says: list[str] = field(default_factory=list)
    error: str | None = None

    def view(self, slow_rank: int, bare_ms: float | None, bare_cpu: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.tool, "step_ms": self.step_ms, "thread_cpu_ms_per_step": self.cpu_ms,
                               "steps": self.steps}
        if bare_ms and self.step_ms:
            out["step_time_ratio"] = round(self.step_ms / bare_ms, 4)
        if bare_cpu and self.cpu_ms:
            out["thread_cpu_ratio"] = round(self.cpu_ms / bare_cpu, 4)
        if self.tool != "bare":
            out.update({"culprit_named": slow_rank in self.named, "false_ranks": sorted(set(self.named) - {slow_rank}),
                        "seconds_to_detect": self.first_named_s, "says": self.says[:6]})
        if self.error:
            out["error"] = self.error
        return out


def nvrx_env(python: str) -> dict[str, str] | str:
    """The environment that lets NVRx's CUPTI extension load, or why it cannot run."""
    probe = ("import os, nvidia_resiliency_ext.straggler\n"
             "try:\n import nvidia.cuda_cupti as c; print(os.path.join(list(c.__path__)[0], 'lib'))\n"
             "except ImportError: print('')")
    res = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if res.returncode:
        return NVRX_MISSING if "No module named 'nvidia_resiliency_ext" in res.stderr else res.stderr.strip()[-500:]
    env = dict(os.environ)
    lib = res.stdout.strip()
    if lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH", "")) if p)
    check = subprocess.run([python, "-c", "import nvrx_cupti_module"], capture_output=True, text=True, env=env)
    if check.returncode:
        return f"NVRx's CUPTI extension does not load: {check.stderr.strip().splitlines()[-1]}"
    return env


def steady(run_dir: Path, onset: float | None, warmup_s: float) -> tuple[float | None, float | None, int]:
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines() if line.strip()] \
        if (run_dir / "steps.jsonl").exists() else []
    if not rows:
        return None, None, 0
    t0 = rows[0][0]
    pick = [r for r in rows if r[0] - t0 >= warmup_s and (onset is None or r[0] < onset)]
    if not pick:
        return None, None, len(rows)
    return round(statistics.median(r[1] for r in pick), 3), round(statistics.median(r[2] for r in pick), 3), len(rows)


def run_tool(tool: str, args: argparse.Namespace, work: Path, settings: Settings | None,
             env: dict[str, str] | None) -> ToolRun:
    run = ToolRun(tool)
    run_dir = work / tool
    run_dir.mkdir()
    job = f"vs-peers-{int(time.time())}"
    train = [sys.executable if tool != "nvrx" else args.nvrx_python, "-m", "torch.distributed.run", "--standalone",
             f"--nproc-per-node={args.ranks}", str(TRAIN), "--run-dir", str(run_dir), "--seconds", str(args.seconds),
             "--fault-at-s", str(args.fault_at_s), "--slow-rank", str(args.slow_rank), "--delay-ms", str(args.delay_ms),
             "--report-interval-s", str(args.report_interval_s), "--tool", "nvrx" if tool == "nvrx" else "none"]
    cmd = train
    if tool == "perftracker":
        assert settings is not None
        cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "--data-dir", str(settings.data_dir.resolve()),
               "launch", "--job", job, "--", *train]
    run_env = dict(env if env is not None else os.environ)
    run_env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    log = (run_dir / "log.txt").open("wb")
    proc = subprocess.Popen(cmd, env=run_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + args.seconds + 120
    try:
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
            if run.onset is None and (run_dir / "onset.json").exists():
                run.onset = json.loads((run_dir / "onset.json").read_text())["wall_time"]
            if tool == "perftracker" and run.onset is not None and settings is not None:
                note_perftracker(run, diagnose(settings, job), args.slow_rank)
        if tool == "perftracker" and settings is not None and run.onset is not None:
            note_perftracker(run, diagnose(settings, job, include_resolved=True), args.slow_rank)
        if proc.returncode not in (0, None):
            run.error = f"exited {proc.returncode}: " + (run_dir / "log.txt").read_text(errors="replace")[-800:]
    finally:
        stop_process_group(proc, interrupt_wait_s=15)
        log.close()
    if run.onset is None and (run_dir / "onset.json").exists():
        run.onset = json.loads((run_dir / "onset.json").read_text())["wall_time"]
    run.step_ms, run.cpu_ms, run.steps = steady(run_dir, run.onset, args.warmup_s)
    if tool == "nvrx":
        note_nvrx(run, run_dir / "nvrx.jsonl", args.slow_rank)
    return run


def note_perftracker(run: ToolRun, rows: list[dict], slow_rank: int) -> None:
    for row in rows:
        ranks = [int(r) for r in row.get("ranks") or []]
        for r in ranks:
            if r not in run.named:
                run.named.append(r)
        if slow_rank in ranks and run.first_named_s is None and run.onset is not None:
            run.first_named_s = round(time.time() - run.onset, 2)
        line = f"{row.get('cause')} {ranks}: {row.get('summary')}"
        if line not in run.says:
            run.says.append(line)


def note_nvrx(run: ToolRun, path: Path, slow_rank: int) -> None:
    if not path.exists() or run.onset is None:
        return
    for line in path.read_text().splitlines():
        rep = json.loads(line)
        if rep["wall_time"] < run.onset:
            continue
        ranks: set[int] = set(rep["gpus_relative"])
        for section, rs in rep["sections_relative"].items():
            ranks |= set(rs)
            run.says.append(f"+{rep['wall_time'] - run.onset:.1f} s: section {section!r} relative straggler(s) {rs} "
                            f"(scores {rep['section_scores'].get(section)})")
        for r in sorted(ranks):
            if r not in run.named:
                run.named.append(r)
        if slow_rank in ranks and run.first_named_s is None:
            run.first_named_s = round(rep["wall_time"] - run.onset, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--delay-ms", type=float, default=15.0)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--fault-at-s", type=float, default=25.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--report-interval-s", type=float, default=5.0)
    parser.add_argument("--tools", default="bare,nvrx,perftracker", help="which of bare,nvrx,perftracker to run")
    parser.add_argument("--keep", metavar="DIR", help="keep the run directories (logs, steps, reports) here")
    parser.add_argument("--nvrx-python", default=sys.executable,
                        help="the Python with nvidia-resiliency-ext and torch (default: this one)")
    args = parser.parse_args()
    for key in [k for k in os.environ if k.startswith("PERFTRACKER_")]:
        del os.environ[key]  # `perftracker up`'s defaults
    nvrx = nvrx_env(args.nvrx_python)
    runs: list[ToolRun] = []
    tools = set(args.tools.split(","))
    with tempfile.TemporaryDirectory(prefix="pt-vs-peers-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "bare" in tools:
            runs.append(run_tool("bare", args, work, None, None))
        if "nvrx" in tools:
            runs.append(run_tool("nvrx", args, work, None, nvrx) if isinstance(nvrx, dict) else ToolRun("nvrx", error=nvrx))
        if "perftracker" in tools:
            settings = load_settings(env={"PERFTRACKER_DATA_DIR": str(work / "data")})
            try:
                up(settings)
                runs.append(run_tool("perftracker", args, work, settings, None))
            finally:
                down(settings)
    bare = next((r for r in runs if r.tool == "bare"), ToolRun("bare"))
    views = [r.view(args.slow_rank, bare.step_ms, bare.cpu_ms) for r in runs]
    for v in views:
        print(json.dumps(v), flush=True)
    by: dict[str, dict[str, Any]] = {v["tool"]: v for v in views}
    by.setdefault("nvrx", {})
    by.setdefault("perftracker", {})
    print(json.dumps({"summary": True, "slow_rank": args.slow_rank, "delay_ms": args.delay_ms, "ranks": args.ranks,
                      "nvrx_overhead_ratio": by["nvrx"].get("step_time_ratio"),
                      "perftracker_overhead_ratio": by["perftracker"].get("step_time_ratio"),
                      "nvrx_correct": by["nvrx"].get("culprit_named") and not by["nvrx"].get("false_ranks"),
                      "perftracker_correct": by["perftracker"].get("culprit_named") and not by["perftracker"].get("false_ranks"),
                      "nvrx_error": by["nvrx"].get("error"), "load": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
