"""perftracker's trace import beside Holistic Trace Analysis: ``python -m benchmarks.vs_hta --json``.

Runs both on the same PyTorch profiler traces and prints one JSON object per trace set, then
a totals line:

* **HTA** (PyPI ``holistictraceanalysis``): ``TraceAnalysis(trace_dir)`` (parse), then
  ``get_potential_stragglers`` (its straggler rule: the ranks whose communication kernel
  with the largest cross-rank spread starts latest; it always returns ``num_candidates``
  ranks, 2 by default), ``get_temporal_breakdown`` (GPU idle share per rank),
  ``get_comm_comp_overlap`` and ``get_idle_time_breakdown`` (GPU idle time by cause:
  ``host_wait`` = the GPU waited for the CPU to launch work, ``kernel_wait`` = short gaps
  between kernels). Its log lines go to stderr.
* **perftracker**: ``import_traces_with_report`` (the path of ``perftracker import-traces``),
  default policy; its findings (kind, cause, ranks, function, ms/step).

Trace sets: the real 8-rank DLRM step (``--dlrm PATH``, default ``$PERFTRACKER_DLRM_TRACES``;
a ``.tar.gz`` or a directory; left out, with a note, when absent) and traces this module
generates with :mod:`perftracker_ml.deploy.workloads.kineto` (GPU-shaped: NCCL all-reduce kernels, a compute
stream): a slow forward on one rank, a rank late into 4 of 6 all-reduces on a noisy host,
a rank late into every all-reduce, and noise alone. ``expected`` is the set of culprit
ranks a correct diagnosis names (none for noise); ``victims`` are ranks that must not be
named. A tool is ``correct`` on a set when it names every expected rank and no other
(HTA's top-k list always has k ranks, so on a one-culprit set its second candidate counts
against it; ``hta_top1_correct`` gives it the benefit of k = 1).

Without HTA installed the benchmark runs perftracker alone and says how to install HTA
(``pip install holistictraceanalysis``, or the ``hta`` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perftracker_ml.deploy.workloads.kineto import NCCL_KERNEL_PRE_2_19, TraceJob, write_job
from perftracker_ml.streams.traces.importer import import_traces_with_report

DLRM_ENV = "PERFTRACKER_DLRM_TRACES"
DLRM_SHIPPED = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "dlrm_kineto.tar.gz"
HTA_MISSING = "holistictraceanalysis is not installed: pip install holistictraceanalysis (or pip install -e '.[dev,hta]')"


@dataclass(frozen=True)
class TraceSet:
    name: str
    path: Path  # directory of one trace per rank
    expected: frozenset[int]
    victims: frozenset[int] = frozenset()
    note: str = ""


OLD = {"first_step": 10, "nccl_kernel": NCCL_KERNEL_PRE_2_19}  # ProfilerStep#10.., kernels named as HTA expects
GENERATED = {
    "slow-forward": (TraceJob(ranks=8, steps=4, layers=8, buckets=4, slow_rank=3, slowdown=1.3, **OLD), {3},
                     "rank 3's forward kernels 1.3x longer; the others wait in the all-reduces"),
    "late-4-of-6-noisy": (TraceJob(ranks=4, steps=6, layers=8, buckets=1, slow_rank=-1, slowdown=1.0, seed=1,
                                   late_rank=2, late_steps=(0, 1, 3, 4), late_us=11_000.0, noise_us=3000.0, **OLD),
                          {2}, "rank 2 reaches the all-reduce 11 ms late in 4 of 6 steps; every rank +0-3 ms noise"),
    "late-every-step": (TraceJob(ranks=8, steps=4, layers=8, buckets=1, slow_rank=-1, slowdown=1.0,
                                 late_rank=5, late_steps=(0, 1, 2, 3), late_us=4000.0, noise_us=500.0, **OLD),
                        {5}, "rank 5 reaches the all-reduce 4 ms late in every step; +0-0.5 ms noise"),
    "none-noisy": (TraceJob(ranks=4, steps=6, layers=8, buckets=1, slow_rank=-1, slowdown=1.0, seed=17,
                            noise_us=3000.0, **OLD), set(),
                   "no fault; +0-3 ms noise (by chance rank 2 is last into 4 of the 6 all-reduces)"),
    "late-every-step-nccl-2.19": (TraceJob(ranks=8, steps=4, layers=8, buckets=1, slow_rank=-1, slowdown=1.0,
                                           late_rank=5, late_steps=(0, 1, 2, 3), late_us=4000.0, noise_us=500.0,
                                           first_step=10),
                                  {5}, "late-every-step with the kernels named as NCCL >= 2.19 names them "
                                       "(ncclDevKernel_*)"),
}


def generated_sets(root: Path) -> list[TraceSet]:
    out = []
    for name, (job, expected, note) in GENERATED.items():
        write_job(job, root / name)
        out.append(TraceSet(name, root / name, frozenset(expected), note=note))
    return out


def dlrm_set(path: str, root: Path) -> TraceSet | None:
    """The DLRM step (extracted when given as an archive: HTA reads a directory)."""
    src = Path(path)
    if not path or not src.exists():
        return None
    if src.is_file():
        with tarfile.open(src) as tar:
            tar.extractall(root / "dlrm", filter="data")
        src = next(p.parent for p in sorted((root / "dlrm").rglob("*.json")))
    return TraceSet("dlrm", src, frozenset({7, 4, 5}), frozenset({1, 3}),
                    "real 8-rank DLRM step: rank 7 late into the all-to-alls, ranks 4/5 slow CPU-side backward; "
                    "1 and 3 are victims (docs/trace-import.md)")


def run_ours(ts: TraceSet) -> dict[str, Any]:
    t = time.perf_counter()
    rows, _report = import_traces_with_report(ts.path, ts.name)
    seconds = time.perf_counter() - t
    findings = [{"kind": r["kind"], "cause": r["cause"], "ranks": r["ranks"], "function": r["function"],
                 "impact_ms_per_step": round(r["impact_ms_per_step"], 2)} for r in rows]
    return {"seconds": round(seconds, 2), "findings": findings,
            "ranks": sorted({int(x) for r in rows for x in r["ranks"]})}


def _per_rank(df: Any, column: str) -> dict[str, float]:
    return {str(int(r)): round(float(v), 2) for r, v in zip(df["rank"], df[column], strict=True)}


def _idle_by_cause(idle: Any) -> dict[str, dict[str, float]]:
    """rank -> GPU idle us by category, summed over streams."""
    table = idle[0] if isinstance(idle, tuple) else idle
    sums = table.groupby(["rank", "idle_category"])["idle_time"].sum()
    out: dict[str, dict[str, float]] = {}
    for (rank, cat), v in sums.items():
        out.setdefault(str(int(rank)), {})[str(cat)] = round(float(v), 1)
    return out


def _timed(out: dict[str, Any], key: str, fn: Any) -> Any:
    """``fn()``, or None with the error under ``errors`` (one analysis failing leaves the others)."""
    try:
        return fn()
    except Exception as exc:  # HTA raises plain ValueError/KeyError on traces it does not expect
        out.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"[:200]
        return None


def run_hta(ts: TraceSet) -> dict[str, Any]:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return {"error": HTA_MISSING}
    logging.getLogger("hta").setLevel(logging.WARNING)
    out: dict[str, Any] = {}
    with contextlib.redirect_stdout(sys.stderr):
        t = time.perf_counter()
        analysis = TraceAnalysis(trace_dir=str(ts.path))
        out["parse_seconds"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        two = _timed(out, "stragglers", lambda: analysis.get_potential_stragglers(num_candidates=2))
        one = _timed(out, "top_straggler", lambda: analysis.get_potential_stragglers(num_candidates=1))
        out["stragglers"] = sorted(int(r) for r in two) if two is not None else None
        out["top_straggler"] = int(one[0]) if one else None
        breakdown = _timed(out, "temporal_breakdown", lambda: analysis.get_temporal_breakdown(visualize=False))
        out["idle_pct"] = _per_rank(breakdown, "idle_time_pctg") if breakdown is not None else None
        overlap = _timed(out, "comm_comp_overlap", lambda: analysis.get_comm_comp_overlap(visualize=False))
        out["overlap_pct"] = _per_rank(overlap, "comp_comm_overlap_pctg") if overlap is not None else None
        idle = _timed(out, "idle_time_breakdown", lambda: analysis.get_idle_time_breakdown(
            ranks=sorted(analysis.t.get_all_traces()), visualize=False))
        out["idle_us_by_cause"] = _idle_by_cause(idle) if idle is not None else None
        out["analysis_seconds"] = round(time.perf_counter() - t, 2)
    out["seconds"] = round(out["parse_seconds"] + out["analysis_seconds"], 2)
    return out


def compare(ts: TraceSet) -> dict[str, Any]:
    ours, hta = run_ours(ts), run_hta(ts)
    row: dict[str, Any] = {"traces": ts.name, "note": ts.note, "expected": sorted(ts.expected),
                           "victims": sorted(ts.victims), "perftracker": ours, "hta": hta,
                           "perftracker_correct": set(ours["ranks"]) == ts.expected}
    if "error" not in hta:
        named = set(hta["stragglers"] or [])
        row["hta_correct"] = named == ts.expected
        row["hta_top1_correct"] = hta["top_straggler"] is not None and {hta["top_straggler"]} == ts.expected
        row["hta_names_victim"] = bool(named & ts.victims)
    row["perftracker_names_victim"] = bool(set(ours["ranks"]) & ts.victims)
    return row


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"totals": True, "sets": len(rows),
                           "perftracker_correct": sum(r["perftracker_correct"] for r in rows),
                           "perftracker_seconds": round(sum(r["perftracker"]["seconds"] for r in rows), 2)}
    with_hta = [r for r in rows if "hta_correct" in r]
    if with_hta:
        out.update(hta_correct=sum(r["hta_correct"] for r in with_hta),
                   hta_top1_correct=sum(r["hta_top1_correct"] for r in with_hta),
                   hta_seconds=round(sum(r["hta"]["seconds"] for r in with_hta), 2))
    else:
        out["hta"] = HTA_MISSING
    out["machine"] = f"{os.cpu_count()} CPUs (shared)"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--json", action="store_true", help="one JSON object per line (the default output)")
    p.add_argument("--dlrm", default=os.environ.get(DLRM_ENV, "") or (str(DLRM_SHIPPED) if DLRM_SHIPPED.is_file() else ""),
                   help=f"DLRM traces (.tar.gz or directory); default ${DLRM_ENV}, else the ones the tests ship")
    p.add_argument("--only", default="", help="comma-separated trace set names")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vs-hta-") as tmp:
        root = Path(tmp)
        sets = generated_sets(root)
        dlrm = dlrm_set(args.dlrm, root)
        if dlrm is None:
            print(json.dumps({"traces": "dlrm", "skipped": f"no DLRM traces: pass --dlrm PATH or set ${DLRM_ENV}"}),
                  flush=True)
        else:
            sets.insert(0, dlrm)
        wanted = {s for s in args.only.split(",") if s}
        rows = []
        for ts in sets:
            if wanted and ts.name not in wanted:
                continue
            rows.append(compare(ts))
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps(totals(rows)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
