"""`perftracker demo`: a real multi-process training with an injected fault, diagnosed live.

The product is used exactly as a user would: the embedded stack (`up`), then
`perftracker launch --job ID -- torchrun ... train.py` of the shipped, unmodified
training script, while the terminal shows progress and the diagnosis as it forms.
The fault is chosen by PERFTRACKER_DEMO_* variables read only by the demo's
``inject_fault.py`` (never by perftracker's own code).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...schemas.errors import PerftrackerError
from ...schemas.settings import Settings
from ..workloads.faults import cause_of

TRAIN_SCRIPT = Path(__file__).with_name("train.py")
# --model: the training script and its arguments. ``transformer``: a GPT-style model, 2-way
# tensor parallel x FSDP2 over a (dp, tp) DeviceMesh; ``transformer-pp``: two pipeline stages
# x data parallel; ``transformer-fsdp2``: FSDP2 alone (deploy/demo/train_transformer.py)
MODELS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "mlp": (TRAIN_SCRIPT, ()),
    "transformer": (Path(__file__).with_name("train_transformer.py"), ("--parallel", "tp-fsdp")),
    "transformer-pp": (Path(__file__).with_name("train_transformer.py"), ("--parallel", "pp")),
    "transformer-fsdp2": (Path(__file__).with_name("train_transformer.py"), ("--parallel", "fsdp2")),
}
FAULTS = ("slow-dataloader", "cpu-contention", "slow-collective", "gc-storm", "slow-backward-hook",
          "periodic-stall", "none")
EXPECTED_CAUSE = {f: cause_of(f) for f in FAULTS}  # from the fault table (deploy/workloads/faults.py)
# the demo's workers compare 3-second windows and open an incident after two of them (not
# after 50 steps, the default): its CPU-only gloo ranks share a small machine with the whole
# stack, where one window of noise can look like a straggler (docs/detection.md, "Known
# failure cases"); a fault is still named within ~10-14 s of its onset
DEMO_STREAM_ENV = {"PERFTRACKER_STREAMS_WINDOW_S": "3", "PERFTRACKER_STREAMS_WINDOW_GRACE_S": "2",
                   "PERFTRACKER_DETECTION_PERSIST_STEPS": "0"}
STEP_LINE = re.compile(r"step (\d+)/(\d+) .* ([0-9.]+) ms/step")


class DemoError(PerftrackerError):
    """The demo cannot run as asked; the message says what to do."""


@dataclass
class DemoResult:
    job: str
    fault: str
    fault_rank: int
    model: str = "mlp"
    rows: list[dict] = field(default_factory=list)
    onset_wall: float | None = None
    detected_wall: float | None = None
    seconds_total: float = 0.0
    report_html: Path | None = None
    report_json: Path | None = None

    @property
    def seconds_to_detect(self) -> float | None:
        if self.onset_wall is None or self.detected_wall is None:
            return None
        return round(max(0.0, self.detected_wall - self.onset_wall), 1)

    def naming_fault(self, rows: list[dict]) -> list[dict]:
        """The rows that name the injected fault: its rank alone, with the expected cause."""
        cause = EXPECTED_CAUSE[self.fault]
        return [r for r in rows if cause is not None and r["ranks"] == [self.fault_rank] and r["cause"] == cause]

    @property
    def culprit_correct(self) -> bool:
        """Right rank and cause named, and nobody else blamed (for `none`: nothing at all)."""
        if EXPECTED_CAUSE[self.fault] is None:
            return not self.rows
        wrong = [r for r in self.rows if set(r["ranks"]) - {self.fault_rank}]
        return bool(self.naming_fault(self.rows)) and not wrong


def validate(fault: str, ranks: int, steps: int, model: str = "mlp") -> None:
    if fault not in FAULTS:
        raise DemoError(f"unknown fault {fault!r}: choose one of {', '.join(FAULTS)}")
    if model not in MODELS:
        raise DemoError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    if model != "mlp" and ranks % 2:
        raise DemoError(f"--ranks {ranks}: the {model} model splits the ranks in two (tensor parallel or "
                        "pipeline stages): use an even number")
    limit = max(4, 4 * (os.cpu_count() or 1))
    if not 2 <= ranks <= limit:
        raise DemoError(f"--ranks {ranks}: this machine ({os.cpu_count()} cores) runs 2..{limit} ranks")
    if steps < 150:
        raise DemoError(f"--steps {steps}: use at least 150 so the fault has time to show")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DemoError("the demo trains with PyTorch: pip install torch==2.13.0 (CPU build)") from None


def _no_phase(text: str) -> None:
    return None


def run_demo(settings: Settings, fault: str = "slow-dataloader", ranks: int = 4, steps: int = 900,
             echo: Callable[[str], None] = print, fault_rank: int = 2,
             phase: Callable[[str], None] = _no_phase, model: str = "mlp", relay: bool = False) -> DemoResult:
    """Start the stack if needed, train with the fault injected a third of the way in, show the
    live diagnosis, write the report. Ctrl-C stops the ranks and leaves the stack running.
    ``phase`` hears what it is doing now (the CLI's progress display): stack up, training
    (step, ms/step, root causes so far), waiting for the diagnosis, writing the report.
    ``model``: one of :data:`MODELS` (the MLP under DDP by default); ``relay``: the ranks send through
    a relay on this host (``launch --relay``)."""
    from ..stack import up

    validate(fault, ranks, steps, model)
    fault_rank = min(fault_rank, ranks - 1)
    started = time.time()
    phase("starting the stack (broker, sink, workers)")
    state = up(settings, extra_env=DEMO_STREAM_ENV)
    echo(f"stack {'already running' if state.already_running else 'started'}: broker "
         f"{state.state.bootstrap}, query API {state.state.query_url}")
    result = DemoResult(job=f"demo-{fault}-{int(started)}", fault=fault, fault_rank=fault_rank, model=model)
    work = settings.data_dir.resolve() / "demo"
    work.mkdir(parents=True, exist_ok=True)
    onset_file = work / f"{result.job}.onset.json"
    log_path = work / f"{result.job}.log"
    phase(f"starting {ranks} training ranks (torchrun)")
    proc = _start_training(settings, result, ranks, steps, onset_file, log_path, relay)
    echo(f"job {result.job}: {model} model, {ranks} ranks, {steps} steps, fault {fault!r} on rank {fault_rank} "
         f"from step {steps // 3}; training log {log_path}")
    try:
        _watch(settings, proc, result, onset_file, log_path, echo, phase)
    except KeyboardInterrupt:
        stop_process_group(proc)
        raise DemoError(f"interrupted: the ranks of {result.job} were stopped; the stack is still up "
                        "(`perftracker down` stops it)") from None
    if proc.returncode != 0:
        raise DemoError(f"the training exited with code {proc.returncode} (log {log_path}); "
                        f"{training_failure(log_path.read_text(errors='replace'))}")
    phase("training finished: waiting for the diagnosis of the last windows")
    _settle(settings, result, echo)
    result.seconds_total = round(time.time() - started, 1)
    phase("writing the report")
    _write_reports(settings, result, work, echo)
    return result


def _start_training(settings: Settings, result: DemoResult, ranks: int, steps: int,
                    onset_file: Path, log_path: Path, relay: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PERFTRACKER_DEMO_FAULT": result.fault, "PERFTRACKER_DEMO_RANK": str(result.fault_rank),
           "PERFTRACKER_DEMO_AT_STEP": str(steps // 3), "PERFTRACKER_DEMO_ONSET_FILE": str(onset_file),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           # the demo's scripts lie inside the perftracker package; they stand in for the user's code
           "PERFTRACKER_COLLECTOR_USER_CODE_PATHS": str(Path(__file__).parent) + os.sep,
           "PYTHONFAULTHANDLER": "1"}  # a rank that crashes prints every thread's Python stack
    script, args = MODELS[result.model]
    cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "--data-dir", str(settings.data_dir.resolve()),
           "launch", "--job", result.job, *(["--relay"] if relay else []), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           str(script), "--steps", str(steps), *args]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def training_failure(log: str, limit: int = 3000) -> str:
    """What a failed training's log shows of its failure: the first crashed rank's Python
    stacks (``Fatal Python error``, written by faulthandler) when there is one, its end else."""
    at = log.find("Fatal Python error")
    if at >= 0:
        return "a rank crashed; its Python stacks:\n" + log[at:at + limit]
    return "last lines of its log:\n" + log[-limit:]


def _watch(settings: Settings, proc: subprocess.Popen, result: DemoResult, onset_file: Path,
           log_path: Path, echo: Callable[[str], None], phase: Callable[[str], None] = _no_phase) -> None:
    """Poll the training log, the onset file and the diagnosis once a second until the job ends."""
    from ...sinks.client import diagnose

    t0 = time.time()
    shown: set[str] = set()
    last_line = 0.0
    while proc.poll() is None:
        time.sleep(1.0)
        if result.onset_wall is None and onset_file.exists():
            result.onset_wall = json.loads(onset_file.read_text())["wall_time"]
            echo(f"[{time.time() - t0:5.1f}s] fault injected: {result.fault} on rank {result.fault_rank}")
        rows = diagnose(settings, result.job)
        for r in rows:
            if r["incident_id"] not in shown:
                shown.add(r["incident_id"])
                if result.detected_wall is None and result.naming_fault([r]):
                    result.detected_wall = time.time()
                since = f" {result.seconds_to_detect:.1f}s after the fault" if result.seconds_to_detect else ""
                echo(f"[{time.time() - t0:5.1f}s] DIAGNOSED{since}: {r['summary']}")
        where = f"{_progress(log_path)}; open root causes: {len(rows)}"
        phase(f"training {result.job}: {where}" + ("" if result.detected_wall or result.onset_wall is None
                                                   else "; waiting for the diagnosis"))
        if time.time() - last_line >= 5:
            last_line = time.time()
            echo(f"[{time.time() - t0:5.1f}s] {where}")
    result.rows = diagnose(settings, result.job)


def _progress(log_path: Path) -> str:
    matches = STEP_LINE.findall(log_path.read_text(errors="replace")[-4000:]) if log_path.exists() else []
    if not matches:
        return "starting ranks"
    step, total, ms = matches[-1]
    return f"step {step}/{total}, {float(ms):.1f} ms/step"


def _settle(settings: Settings, result: DemoResult, echo: Callable[[str], None], wait_s: float = 12.0) -> None:
    """The last windows close a few seconds after the job ends: wait for them once."""
    from ...sinks.client import diagnose

    deadline = time.time() + wait_s
    while time.time() < deadline and not (result.detected_wall or result.fault == "none"):
        time.sleep(1.0)
        result.rows = diagnose(settings, result.job)
        if result.naming_fault(result.rows):
            result.detected_wall = time.time()
    if result.fault == "none":
        time.sleep(min(wait_s, 6.0))
        result.rows = diagnose(settings, result.job)
    echo(f"training finished; {len(result.rows)} root cause(s) for {result.job}")


def stop_process_group(proc: subprocess.Popen, interrupt_wait_s: float = 10) -> None:
    """Stop the process group ``proc`` leads: SIGINT, then SIGTERM, then SIGKILL, each given
    its wait (``interrupt_wait_s`` for SIGINT, 5 s for the others)."""
    for sig, wait in ((signal.SIGINT, interrupt_wait_s), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def _write_reports(settings: Settings, result: DemoResult, work: Path, echo: Callable[[str], None]) -> None:
    """The HTML report (fault onset and detection marked) and the JSON diagnosis beside it."""
    from ...sinks.report import json_path_for, write_report

    markers = [{"t": t, "kind": kind, "label": label} for t, kind, label in (
        (result.onset_wall, "fault", f"{result.fault} injected on rank {result.fault_rank}"),
        (result.detected_wall, "detected", "diagnosed")) if t is not None]
    out = work / f"{result.job}.html"
    try:
        result.report_html = write_report(settings, result.job, out, markers=markers,
                                          title=f"perftracker demo: {result.fault}")
        result.report_json = json_path_for(out)
    except PerftrackerError as exc:
        echo(f"(report not written: {exc})")
