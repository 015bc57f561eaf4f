"""The live fault suite: faults nobody staged for the demo, diagnosed live at default settings.

``python -m benchmarks.live_faults --json [--scenarios a,b] [--budget-s 60]``

Starts the embedded stack as `perftracker up` does (tansu, the sink with chDB, a Faust
worker; every PERFTRACKER_* variable of this shell dropped, nothing overridden), then runs
each scenario as a real job, one after the other: ``perftracker launch --job ID -- torchrun
--standalone --nproc-per-node 4 benchmarks/live_faults_train.py`` (4 gloo DDP ranks, CPU),
or, for ``two-nodes-*``, two launchers of ``torchrun --nnodes 2 --node-rank {0,1}
--nproc-per-node 2`` with the hosts node-0 and node-1 (as tests/e2e/test_two_nodes_diagnosis.py).
The training script (its own, not the demo's) injects the scenario's fault from
``--onset-s`` seconds after its start on the culprit rank(s) and writes the onset's wall time.
``killed`` freezes the culprit's process (SIGSTOP, all its threads, the collector's
included): under torchrun a SIGKILLed worker makes the agent stop every other worker at
once (and gloo peers fail on the closed socket), so nothing would be left to wait; a frozen
process is, to the pipeline, a rank that stopped reporting while its peers wait for it,
which is what a lost node looks like to the peers of a multi-node job.
The store is polled (``perftracker diagnose``'s rows) every ``--poll-s`` until the expected
diagnosis is there (plus ``--linger-s`` to catch what comes with it) or the scenario's
budget after the onset is spent; scenarios that expect no alert watch the whole budget.

One JSON object per scenario::

    {"scenario", "culprit_correct", "cause_correct", "location_correct", "seconds_to_detect",
     "false_ranks", "expected": {...}, "found": [{"cause", "ranks", "hosts", "summary"}, ...], ...}

and a last line of totals: ``culprits_pct``, ``causes_pct``, ``locations_pct``,
``false_ranks_total``, ``p50_s``, ``p95_s``, the same two ``_without_hangs`` (a hang is named no
sooner than ``hang_floor_s``, 30 s: its own bound), ``scenarios``, ``missed``, the load average.
Goals (issue 14): culprits 100 %, causes >= 95 %, 0 false ranks, p50 <= 10 s.
Scoring is :func:`score` (pure; tests/unit/benchmarks/test_live_faults.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perftracker_ml.deploy.workloads.faults import FAULTS
from perftracker_ml.schemas.vocabulary import is_advice

TRAIN_SCRIPT = Path(__file__).with_name("live_faults_train.py")
HANG = "hang"
DEAD = "hang:dead"  # a hang naming the rank as dead (process gone / stopped reporting)


@dataclass(frozen=True)
class Expect:
    """What a correct diagnosis says. ``culprits``: rank -> cause (``DEAD`` for a hang naming
    the rank dead); ``job_cause``: a cause with no rank blamed (a job-wide regression); neither:
    nothing may be reported. ``location``: the fault's marker in the training script whose
    ``file:line`` an incident naming a culprit must give (None: no location expected)."""

    culprits: Mapping[int, str] = field(default_factory=dict)
    job_cause: str | None = None
    location: str | None = None
    clears: bool = False  # the fault stops: each culprit's incident must be RESOLVED "cleared" while the job runs

    @property
    def alerts(self) -> bool:
        return bool(self.culprits or self.job_cause)


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    expect: Expect
    ranks: tuple[int, ...] = ()  # culprit ranks given to the script (default: the expected culprits)
    nodes: int = 1
    hang: bool = False  # needs hang_floor_s (30 s) + a window before it can be named
    extra_budget_s: float = 0.0  # watched this much longer (a regression needs 4+ windows by design)
    fault_for_s: float = 0.0  # the fault stops this long after its onset (0: it never does)
    onset_s: float | None = None  # the fault starts this long after training starts (None: --onset-s)

    @property
    def culprit_ranks(self) -> tuple[int, ...]:
        return self.ranks or tuple(sorted(self.expect.culprits))


def expect(fault: str, *ranks: int, **kw: Any) -> Expect:
    """What a correct diagnosis of ``fault`` on ``ranks`` says, from the fault table
    (:data:`perftracker_ml.deploy.workloads.faults.FAULTS`): its cause on each rank (a frozen
    process: named dead), or its job-wide cause, or nothing."""
    spec = FAULTS[fault]
    if spec.cause is None:
        return Expect(**kw)
    if spec.job_wide:
        return Expect(job_cause=spec.cause.value, **kw)
    return Expect({r: DEAD if fault == "killed" else spec.cause.value for r in ranks}, **kw)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("slow-optimizer", "slow-optimizer", expect("slow-optimizer", 1)),
    Scenario("slow-backward-hook", "slow-backward-hook", expect("slow-backward-hook", 2)),
    Scenario("slow-forward-submodule", "slow-forward-submodule", expect("slow-forward-submodule", 3)),
    Scenario("host-copies", "host-copies", expect("host-copies", 1, location="host-copies")),
    Scenario("cpu-contention", "cpu-contention", expect("cpu-contention", 2)),
    # two faults at once (the script's "two-culprits"): rank 0's data loader, rank 3's optimizer step
    Scenario("two-culprits", "two-culprits",
             Expect({**expect("slow-dataloader", 0).culprits, **expect("slow-optimizer", 3).culprits})),
    Scenario("stall-before-forward", "stall-before-forward", expect("stall-before-forward", 1, location="stall"),
             hang=True),
    Scenario("subgroup-hang", "subgroup-hang", expect("subgroup-hang", 1, location="stall"), hang=True),
    Scenario("killed", "killed", expect("killed", 3), hang=True),
    Scenario("checkpoint", "checkpoint", expect("checkpoint", 2, location="checkpoint")),
    Scenario("data-imbalance", "data-imbalance", expect("data-imbalance", 0)),
    Scenario("gradual-creep", "gradual-creep", expect("gradual-creep", 1)),
    Scenario("one-off-spike", "one-off-spike", expect("one-off-spike"), ranks=(2,)),
    Scenario("job-wide-slowdown", "job-wide-slowdown", expect("job-wide-slowdown"), extra_budget_s=30.0),
    Scenario("none", "none", expect("none")),
    Scenario("two-nodes-slow-backward-hook", "slow-backward-hook", expect("slow-backward-hook", 3), nodes=2),
    Scenario("gc-storm", "gc-storm", expect("gc-storm", 1)),
    Scenario("intermittent-straggler", "intermittent-straggler", expect("intermittent-straggler", 1)),
    Scenario("untimed-sleep", "untimed-sleep", expect("untimed-sleep", 3, location="untimed-sleep")),
    Scenario("two-slow-ranks", "slow-optimizer", expect("slow-optimizer", 1, 2)),
    Scenario("slow-loader-workers", "slow-loader-workers", expect("slow-loader-workers", 2)),
    Scenario("long-pause", "long-pause", expect("long-pause"), ranks=(1,)),
    Scenario("fault-clears", "slow-optimizer", expect("slow-optimizer", 1, clears=True), fault_for_s=20.0,
             extra_budget_s=45.0),
    Scenario("slow-from-start", "slow-optimizer", expect("slow-optimizer", 3), onset_s=0.0, extra_budget_s=20.0),
    Scenario("noisy-none", "jitter", expect("jitter"), onset_s=0.0, extra_budget_s=20.0),
    Scenario("gil-thread", "gil-thread", expect("gil-thread", 2, location="gil-thread")),
    Scenario("eval-passes", "eval-passes", expect("eval-passes")),
)}


# ---- scoring (pure) --------------------------------------------------------------------

def _text(row: Mapping[str, Any]) -> str:
    ev = row.get("evidence") or {}
    return " ".join([str(row.get("summary", "")), json.dumps(ev.get("location", "")), json.dumps(ev.get("stacks", ""))])


def _cause_matches(expected: str, row: Mapping[str, Any], rank: int) -> bool:
    if expected == DEAD:
        return row.get("cause") == HANG and rank in ((row.get("evidence") or {}).get("dead_ranks") or [])
    return row.get("cause") == expected


def score(expect: Expect, rows: Iterable[Mapping[str, Any]], location: str | None = None) -> dict[str, Any]:
    """Expected vs found. ``rows``: every incident seen (diagnosis rows: cause, ranks,
    summary, evidence); ``location``: the ``file:line`` text a correct location holds.

    * culprit_correct: every culprit is named and no other rank is (nothing expected: no rank
      blamed);
    * cause_correct: every row naming a culprit has that culprit's cause (a wrong cause shown
      first is wrong too); job-wide: a row of that cause naming no rank; nothing expected:
      no row at all;
    * location_correct: None when no location is expected, else whether a row naming a
      culprit gives ``location``;
    * detected: what the latency clock stops on: every culprit named with its cause, or the
      job-wide row (never for scenarios that expect no alert);
    * false_ranks: ranks blamed that are not culprits;
    Advice is left out of every field (:func:`incidents`).

    * false_alarms: incidents that should not exist, job-wide ones included: every incident
      when nothing is expected, else those naming neither a culprit nor the expected job-wide
      cause (an incident is one ``incident_id``, however many states of it were seen);
    * cleared: None unless the fault stops (``expect.clears``), else whether every culprit's
      incident was seen RESOLVED with the reason "cleared" (not the job's end).
    """
    rows = incidents(rows)
    culprits = set(expect.culprits)
    blamed = {int(r) for row in rows for r in row.get("ranks", [])}
    false_ranks = sorted(blamed - culprits)
    naming = {c: [row for row in rows if c in row.get("ranks", [])] for c in culprits}
    if culprits:
        culprit_correct = all(naming.values()) and not false_ranks
        cause_correct = all(naming[c] and all(_cause_matches(expect.culprits[c], row, c) for row in naming[c])
                            for c in culprits)
        detected = all(any(_cause_matches(expect.culprits[c], row, c) for row in naming[c]) for c in culprits)
    elif expect.job_cause:
        culprit_correct = not blamed
        detected = any(row.get("cause") == expect.job_cause and not row.get("ranks") for row in rows)
        cause_correct = detected and all(row.get("cause") == expect.job_cause for row in rows)
    else:
        culprit_correct, cause_correct, detected = not blamed, not rows, False
    location_correct = None
    if expect.location is not None:
        location_correct = bool(location) and any(
            location in _text(row) for c in culprits for row in naming[c])
    cleared = None
    if expect.clears:
        cleared = all(any(row.get("status") == "RESOLVED" and row.get("resolved_reason") == "cleared"
                          for row in naming[c]) for c in culprits)
    return {"culprit_correct": bool(culprit_correct), "cause_correct": bool(cause_correct),
            "location_correct": location_correct, "detected": bool(detected), "false_ranks": false_ranks,
            "cleared": cleared, "false_alarms": false_alarms(expect, rows)}


def _incident(row: Mapping[str, Any]) -> Any:
    return row.get("incident_id") or (row.get("cause"), tuple(row.get("ranks", [])))


def incidents(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows that are incidents: advice (``kind`` "advice": a pipeline's stage imbalance or
    an inefficiency every rank shares, seen from the job's start) is about the job's shape,
    never paged, so it is neither right nor a false alarm."""
    return [r for r in rows if not is_advice(r)]


def false_alarms(expect: Expect, rows: Iterable[Mapping[str, Any]]) -> int:
    """Incidents that should not exist (see :func:`score`)."""
    rows = incidents(rows)
    culprits = set(expect.culprits)

    def right(row: Mapping[str, Any]) -> bool:
        if expect.job_cause and row.get("cause") == expect.job_cause and not row.get("ranks"):
            return True
        return bool(culprits & {int(r) for r in row.get("ranks", [])})

    every = {_incident(r) for r in rows}
    return len(every - {_incident(r) for r in rows if right(r)}) if expect.alerts else len(every)


def totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The last line: shares of right culprits / causes / locations, false ranks, latency."""
    import numpy as np

    n = len(results)
    times = [r["seconds_to_detect"] for r in results if r["seconds_to_detect"] is not None]
    # a hang can be named no sooner than hang_floor_s (30 s) after it starts: its own bound
    quick = [r["seconds_to_detect"] for r in results if r["seconds_to_detect"] is not None
             and not (r["scenario"] in SCENARIOS and SCENARIOS[r["scenario"]].hang)]
    located = [r["location_correct"] for r in results if r["location_correct"] is not None]

    def pct(xs: list[bool]) -> float | None:
        return round(100.0 * sum(xs) / len(xs), 1) if xs else None

    return {"totals": True, "scenarios": n, "culprits_pct": pct([r["culprit_correct"] for r in results]),
            "causes_pct": pct([r["cause_correct"] for r in results]), "locations_pct": pct(located),
            "false_ranks_total": sum(len(r["false_ranks"]) for r in results),
            "false_alarms": sum(r.get("false_alarms", 0) for r in results),
            "p50_s": round(float(np.percentile(times, 50)), 1) if times else None,
            "p95_s": round(float(np.percentile(times, 95)), 1) if times else None,
            "p50_s_without_hangs": round(float(np.percentile(quick, 50)), 1) if quick else None,
            "p95_s_without_hangs": round(float(np.percentile(quick, 95)), 1) if quick else None,
            "missed": [r["scenario"] for r in results if r["expected"]["alerts"] and r["seconds_to_detect"] is None],
            "wrong": [r["scenario"] for r in results
                      if not (r["culprit_correct"] and r["cause_correct"] and r["location_correct"] is not False
                              and r.get("cleared") is not False)]}


def marker_lines(script: Path = TRAIN_SCRIPT) -> dict[str, str]:
    """``# LF:<name>`` markers of the training script -> ``'live_faults_train.py:<line>'``."""
    out = {}
    for i, line in enumerate(script.read_text().splitlines(), 1):
        m = re.search(r"# LF:([\w-]+)", line)
        if m:
            out.setdefault(m.group(1), f"{script.name}:{i}")
    return out


# ---- running a scenario ----------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(data_dir: Path, job: str, scenario: Scenario, env: dict[str, str], log: Path) -> list[subprocess.Popen]:
    base = [sys.executable, "-m", "perftracker_ml.deploy.cli", "--data-dir", str(data_dir), "launch", "--job", job,
            "--", sys.executable, "-m", "torch.distributed.run"]
    if scenario.nodes == 1:
        commands = [(base + ["--standalone", "--nproc-per-node=4", str(TRAIN_SCRIPT)], env)]
    else:
        port = _free_port()
        commands = [(base + ["--nnodes=2", f"--node-rank={n}", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                             f"--master-port={port}", str(TRAIN_SCRIPT)],
                     {**env, "PERFTRACKER_COLLECTOR_HOST": f"node-{n}"}) for n in range(scenario.nodes)]
    procs = []
    for i, (cmd, e) in enumerate(commands):
        with open(log.with_suffix(f".{i}.log"), "wb") as out:
            procs.append(subprocess.Popen(cmd, env=e, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
    return procs


def _note(seen: dict[tuple, dict], rows: list[dict]) -> None:
    """Keep every distinct version of each incident (an UPDATE that names other ranks, or a wrong
    cause shown for a while, counts in the score as much as the last version)."""
    for row in rows:
        seen.setdefault((row["incident_id"], row["status"], row["cause"], tuple(row["ranks"]), row["summary"]), row)


def run_scenario(settings: Any, scenario: Scenario, work: Path, onset_s: float, budget_s: float,
                 poll_s: float, linger_s: float, delay_ms: float) -> dict[str, Any]:
    from perftracker_ml.deploy.demo.runner import stop_process_group
    from perftracker_ml.sinks.client import diagnose

    job = f"lf-{scenario.name}-{int(time.time())}"
    onset_s = scenario.onset_s if scenario.onset_s is not None else onset_s
    onset_file, run_file = work / f"{job}.onset.json", work / f"{job}.run"
    run_file.write_text("training runs while this file exists")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFTRACKER_", "TORCHELASTIC_"))}
    env.update({"LF_FAULT": scenario.fault, "LF_RANKS": ",".join(map(str, scenario.culprit_ranks)),
                "LF_ONSET_S": str(onset_s), "LF_DELAY_MS": str(delay_ms), "LF_ONSET_FILE": str(onset_file),
                "LF_RUN_FILE": str(run_file), "LF_MAX_S": str(onset_s + budget_s + 120),
                "LF_FOR_S": str(scenario.fault_for_s), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    location = marker_lines().get(scenario.expect.location or "", None)
    budget = budget_s + (45.0 if scenario.hang else 0.0) + scenario.extra_budget_s
    started = time.time()
    procs = _launch(settings.data_dir.resolve(), job, scenario, env, work / job)
    seen: dict[tuple, dict] = {}  # every version of every incident, in the order first seen
    onset = detected_at = None
    info: dict[str, Any] = {}
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(poll_s)
            if onset is None:
                if onset_file.exists():
                    info = json.loads(onset_file.read_text())
                    onset = float(info["wall_time"])
                elif time.time() - started > onset_s + 180:
                    break  # never started
                continue
            _note(seen, diagnose(settings, job, include_resolved=scenario.expect.clears))
            now = time.time()
            scored = score(scenario.expect, seen.values(), location)
            if detected_at is None and scored["detected"]:
                detected_at = now
            done = detected_at is not None and now - detected_at >= linger_s
            if scenario.expect.clears:  # and watched on until its incidents clear
                done = done and bool(scored["cleared"])
            if now - onset > budget or done:
                break
    finally:
        run_file.unlink(missing_ok=True)
        if scenario.fault == "killed" and info.get("pid"):
            try:
                os.kill(int(info["pid"]), signal.SIGCONT)
            except ProcessLookupError:
                pass
        deadline = time.time() + 30
        for p in procs:
            try:
                p.wait(max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            stop_process_group(p, interrupt_wait_s=10)
    try:
        _note(seen, diagnose(settings, job, include_resolved=True))
    except Exception as exc:  # noqa: BLE001 - a job that never reached the store
        info["diagnose_error"] = str(exc)
    result = score(scenario.expect, seen.values(), location)  # every version of every incident seen
    last = {r["incident_id"]: r for r in seen.values()}
    rows = sorted(last.values(), key=lambda r: str(r.get("first_seen")))
    detected = result.pop("detected")
    return {"scenario": scenario.name, **result,
            "seconds_to_detect": round(detected_at - onset, 1) if detected and detected_at and onset else None,
            "expected": {"culprits": {str(k): v for k, v in scenario.expect.culprits.items()},
                         "job_cause": scenario.expect.job_cause, "location": location,
                         "alerts": scenario.expect.alerts},
            "found": [{"cause": r["cause"], "ranks": r["ranks"], "hosts": r["hosts"], "status": r["status"],
                       "summary": r["summary"], "location": (r.get("evidence") or {}).get("location")}
                      for r in rows],
            "versions": len(seen),
            "job": job, "onset_step": info.get("step"), "exit_codes": [p.returncode for p in procs],
            "seconds_total": round(time.time() - started, 1)}


@contextmanager
def default_stack(prefix: str, keep: bool = False) -> Iterator[tuple[Any, Path]]:
    """`perftracker up` at its defaults (every PERFTRACKER_* variable of this shell dropped) on a
    temporary data dir: (settings, a work folder in it); `down` after, the dir removed unless
    ``keep`` (then printed on stderr)."""
    for key in [k for k in os.environ if k.startswith("PERFTRACKER_")]:
        del os.environ[key]  # `perftracker up`'s defaults, whatever this shell has set

    from perftracker_ml.deploy.stack import down, up
    from perftracker_ml.schemas.settings_loader import load_settings

    tmp = tempfile.mkdtemp(prefix=prefix)
    settings = load_settings(env={"PERFTRACKER_DATA_DIR": tmp})
    work = Path(tmp) / "work"
    work.mkdir()
    try:
        up(settings)
        yield settings, work
    finally:
        down(settings)
        if keep:
            print(f"data dir kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON lines only (the default output is the same)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    parser.add_argument("--onset-s", type=float, default=20.0, help="fault onset, seconds after training starts")
    parser.add_argument("--budget-s", type=float, default=45.0,
                        help="per scenario: watch this long after the onset (hangs: 45 s more)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="size of the injected delays")
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--linger-s", type=float, default=5.0, help="keep watching this long after detection")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (printed on stderr)")
    args = parser.parse_args()
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}: choose from {', '.join(SCENARIOS)}")
    results = []
    with default_stack("pt-live-faults-", args.keep) as (settings, work):
        for name in names:
            result = run_scenario(settings, SCENARIOS[name], work, args.onset_s, args.budget_s, args.poll_s,
                                  args.linger_s, args.delay_ms)
            results.append(result)
            print(json.dumps(result), flush=True)
    print(json.dumps({**totals(results), "load_avg_1m": round(os.getloadavg()[0], 1),
                      "window_s": settings.streams.window_s, "cpus": os.cpu_count(),
                      "onset_s": args.onset_s, "delay_ms": args.delay_ms}), flush=True)


if __name__ == "__main__":
    main()
