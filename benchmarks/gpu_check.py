"""The GPU check: what perftracker claims about GPUs, proven on whatever GPU is lent.

``python -m benchmarks.gpu_check --json`` (a few minutes; no broker, no store: collectors
write a spool, ``perftracker record --spool`` makes a recording, the replay runs the
stream topology in process) runs:

a. ``contract``: the fake-vs-real CUDA contract tests and the GPU tests (pytest, ``-m gpu``
   files): the fake CI uses must behave as this GPU's runtime does;
b. ``shared_gpu_straggler``: 4 ranks sharing the GPU over gloo with CUDA tensors; one rank
   queues extra GPU work in its forward (``benchmarks/gpu_share_train.py``) while every CPU
   thread waits at the same line (``loss.backward()``). Passes when the replayed diagnosis
   names that rank, and only it, with GPU-side evidence, and the forward device time each
   peer gained after the onset is at most half of what the culprit's gained (ranks sharing a
   GPU take turns on it, so the peers' kernels wait a little too: the share is reported);
c. ``nccl_pending``: NCCL at world size 1 with a spin queued before a collective: the
   collective is an entry marker while pending, then one event with its device time (a
   pytest of part a, reported on its own);
d. ``overhead``: ``benchmarks.overhead_ab``: the demo transformer (tensor parallel x FSDP2,
   >= 50 ms steps) on NCCL at world size 1, in one process, blocks of steps without and with
   the collectors attached, alternating: the step-time ratio, its 95 % interval and
   half-width (goal ratio <= 1.005, half-width <= 0.5 %);
e. ``nvml``: every NVML field the hardware sampler reads, as read.

Without a GPU it runs part a on the fake (the real half skipped), reports b-e as skipped
with the reason, and exits 0. ``--out DIR`` keeps the recording, logs and pytest report
(the recording can be replayed anywhere: ``perftracker replay DIR/shared_gpu.ptrec``).
A part that fails is reported with its error; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("collectors", "schemas", "streams", "sinks", "grafana", "deploy")
TEST_FILES = ("tests/unit/collectors/test_cuda_contract.py", "tests/unit/collectors/test_cuda_paths.py",
              "tests/unit/collectors/test_gpu_paths.py")
SHARE_SCRIPT = ROOT / "benchmarks" / "gpu_share_train.py"
# part b: the device time a peer's forward gained after the onset, as a share of what the culprit's
# gained, at most (processes sharing a GPU take turns: a spin slows the others' kernels a little)
PEER_SHARE_MAX = 0.5
TRANSFORMER = ROOT / "deploy" / "demo" / "train_transformer.py"
# >= 50 ms steps on an H100/H200 at world size 1 (fp32); the check reports the step time it got
TRANSFORMER_ARGS = ("--tp", "1", "--dim", "1024", "--layers", "8", "--heads", "16", "--seq", "512",
                    "--batch-size", "16", "--vocab", "8192", "--print-every-s", "1e9")


def ensure_importable() -> None:
    """On a machine where perftracker is not installed (a lent GPU), re-run with a package
    view of this checkout on PYTHONPATH (the ranks inherit it)."""
    try:
        import perftracker_ml.collectors  # noqa: F401
        return
    except ImportError:
        if os.environ.get("PERFTRACKER_GPU_CHECK_PATH"):
            raise
    view = Path(tempfile.mkdtemp(prefix="perftracker-view-")) / "perftracker_ml"
    view.mkdir()
    for name in PACKAGE_DIRS:
        (view / name).symlink_to(ROOT / name)
    env = {**os.environ, "PERFTRACKER_GPU_CHECK_PATH": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(view.parent), str(ROOT),
                                                    os.environ.get("PYTHONPATH", "")) if p)}
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.gpu_check", *sys.argv[1:]], env)


def _has_gpu() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _skipped(why: str) -> dict[str, Any]:
    return {"status": "skipped", "why": why}


def _failed(exc: BaseException | str) -> dict[str, Any]:
    return {"status": "failed", "error": str(exc)[-2000:]}


# -- a. contract and GPU tests ------------------------------------------------------------
def run_contract(out: Path, gpu: bool) -> dict[str, Any]:
    report = out / "pytest.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={report}", "--rootdir", str(ROOT), *TEST_FILES]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    if not report.exists():
        return _failed(proc.stdout[-1500:] + proc.stderr[-1500:])
    cases = junit_cases(report)
    gpu_names = _gpu_marked()
    counts = Counter(state for _, state, _ in cases)
    result: dict[str, Any] = {"status": "ok" if not counts["failure"] and not counts["error"] else "failed",
                              "counts": dict(counts), "gpu": gpu}
    real = [(n, s) for n, s, _ in cases if "[real]" in n or (n in gpu_names)]
    result["real_cuda_cases"] = dict(Counter(s for _, s in real))
    bad = [f"{n}: {(f.get('message') or '')[:300]}" for n, s, f in cases if f is not None]
    if bad:
        result["failures"] = bad[:10]
    return result


def junit_cases(report: Path) -> list[tuple[str, str, Any]]:
    """(name, passed/failure/error/skipped, the failure element or None) of each test case."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        state = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                state = tag
        cases.append((case.get("name", ""), state, case.find("failure") if state == "failure" else None))
    return cases


def _gpu_marked() -> set[str]:
    """Names of the tests marked ``gpu`` in the test files (they need the real runtime)."""
    names = set()
    for rel in TEST_FILES:
        lines = (ROOT / rel).read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("def test_") and any("mark.gpu" in prev for prev in lines[max(0, i - 3):i]):
                names.add(line[4:line.index("(")])
    return names


def nccl_part(contract: dict[str, Any], out: Path) -> dict[str, Any]:
    """Part c: the NCCL tests of part a, on their own."""
    report = out / "pytest.xml"
    if contract.get("status") == "skipped" or not report.exists():
        return _skipped("part a did not run")
    names = ("test_an_nccl_collectives_future_completes_at_enqueue_while_it_is_still_pending[real]",
             "test_nccl_collective_queued_behind_a_spin_is_pending_then_completed")
    seen = {name: state for name, state, _ in junit_cases(report) if name in names}
    if not seen or any(s == "skipped" for s in seen.values()):
        return _skipped("no CUDA GPU") if not seen or all(s == "skipped" for s in seen.values()) else \
            {"status": "partial", "tests": seen}
    try:
        probe = nccl_probe()
    except Exception as exc:  # noqa: BLE001
        probe = _failed(exc)
    ok = all(s == "passed" for s in seen.values()) and probe.get("status") == "ok"
    return {"status": "ok" if ok else "failed", "tests": seen, "probe": probe}


def nccl_probe() -> dict[str, Any]:
    """What NCCL's Work and future say for a collective queued behind 200 ms of device work
    (world size 1): facts the collectors' design rests on, reported as seen."""
    import torch
    import torch.distributed as dist
    from perftracker_ml.deploy.tansu import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        hz = spin_clock_hz()
        torch.cuda._sleep(int(0.2 * hz))
        work = dist.all_reduce(x, async_op=True)
        fut = work.get_future()
        facts: dict[str, Any] = {"future_done_at_enqueue": fut.done(), "is_completed_at_enqueue": work.is_completed()}
        events: list[Any] = []

        def callback(f: Any) -> Any:
            ev = torch.cuda.Event()
            ev.record()
            events.append(ev)
            return f.value()

        fut.then(callback)
        facts["callback_ran_at_enqueue"] = bool(events)
        facts["callback_stream_event_pending_at_enqueue"] = bool(events) and not events[0].query()
        after = torch.cuda.Event()
        work.wait()
        after.record()
        facts["current_stream_after_wait_pending"] = not after.query()
        torch.cuda.synchronize()
        facts["is_completed_after_synchronize"] = work.is_completed()
        return {"status": "ok", "facts": facts}
    finally:
        dist.destroy_process_group()


# -- b. a straggler on a shared GPU -------------------------------------------------------
def run_shared_gpu(out: Path, seconds: float, fault_at_s: float, spin_ms: float, slow_rank: int = 2,
                   nproc: int = 4) -> dict[str, Any]:
    from perftracker_ml.deploy.record import record_spool
    from perftracker_ml.schemas.recording import Recording

    spool = out / "spool"
    onset = out / "onset.json"
    env = {**os.environ, "PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS": f"spool:{spool}",
           "GPU_SHARE_SLOW_RANK": str(slow_rank), "GPU_SHARE_FAULT_AT_S": str(fault_at_s),
           "GPU_SHARE_SECONDS": str(seconds), "GPU_SHARE_SPIN_MS": str(spin_ms),
           "GPU_SHARE_CLOCK_HZ": str(spin_clock_hz()), "GPU_SHARE_ONSET": str(onset),
           "PERFTRACKER_COLLECTOR_USER_CODE_PATHS": str(SHARE_SCRIPT.parent)}
    cmd = [sys.executable, "-m", "perftracker_ml.deploy.cli", "launch", "--job", "gpu-share", "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(SHARE_SCRIPT)]
    t0 = time.monotonic()
    with open(out / "shared_gpu.log", "w") as log:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              timeout=seconds + 120)
    train_s = time.monotonic() - t0
    if proc.returncode != 0:
        return _failed(f"training exited {proc.returncode}: {(out / 'shared_gpu.log').read_text()[-1500:]}")
    recording = out / "shared_gpu.ptrec"
    _, n = record_spool(spool, recording, "gpu-share",
                        note=f"gpu_check part b: {nproc} ranks share one GPU over gloo; rank {slow_rank} "
                             f"queues a {spin_ms} ms spin in its forward from {fault_at_s} s")
    result = judge_shared_gpu(list(Recording(recording).messages()), slow_rank, json.loads(onset.read_text()))
    result.update(train_s=round(train_s, 1), messages=n, recording=recording.name)
    return result


def spin_clock_hz(cuda: Any = None, cycles: int = 50_000_000) -> float:
    """Cycles per second of ``cuda._sleep`` (``torch.cuda`` by default), measured with an event
    pair around a spin of ``cycles`` after a warm-up one (the first spin loads the kernel)."""
    if cuda is None:
        import torch
        cuda = torch.cuda
    start, stop = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    cuda._sleep(1000)
    start.record()
    cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    return cycles / (start.elapsed_time(stop) * 1e-3)


def judge_shared_gpu(messages: list, slow_rank: int, onset: dict[str, Any]) -> dict[str, Any]:
    """The replayed diagnosis of part b, and every rank's forward device time around the onset."""
    from perftracker_ml.streams.replay import decode_inputs, replay

    result = replay(messages)
    last = {a["incident_id"]: a for a in result.anomalies}
    named = [{"ranks": a.get("ranks"), "cause": a.get("cause"), "function": a.get("function"),
              "status": a.get("status"), "summary": a.get("summary", "")[:600],
              "gpu_side": json.loads(a.get("evidence_json") or "{}").get("gpu_side")}
             for a in last.values()]
    culprit = [n for n in named if n["ranks"] == [slow_rank]]
    others = sorted({r for n in named for r in (n["ranks"] or []) if r != slow_rank})
    device_named = [n for n in culprit if n["cause"] in ("slow_gpu", "gpu_throttle") and n["gpu_side"]]
    step = int(onset.get("step", 0))
    forward = _device_forward(decode_inputs(messages, _policy(), Counter()), step)
    peers = [v["after_over_before"] for r, v in forward.items() if r != slow_rank and v.get("after_over_before")]
    culprit_added = _added(forward.get(slow_rank, {}))
    peer_added = [_added(v) for r, v in forward.items() if r != slow_rank]
    share = max(peer_added) / culprit_added if culprit_added and peer_added else None
    peers_apart = share is not None and share <= PEER_SHARE_MAX
    ok = bool(device_named) and not others and peers_apart
    return {"status": "ok" if ok else "failed", "incidents": named, "false_ranks": others,
            "culprit_named_with_gpu_evidence": bool(device_named),
            "forward_device_ms": forward,
            "peer_forward_after_over_before": round(max(peers), 3) if peers else None,
            "peer_added_over_culprit_added": round(share, 3) if share is not None else None,
            "peers_slowed_far_less": peers_apart, "how": onset.get("how"),
            "rejected": dict(result.rejected)}


def _policy() -> Any:
    from perftracker_ml.streams.detect import DetectionPolicy
    return DetectionPolicy()


def _added(row: dict[str, Any]) -> float:
    """Forward device time gained after the onset, ms (0 when unknown or less)."""
    if row.get("before") is None or row.get("after") is None:
        return 0.0
    return max(0.0, float(row["after"]) - float(row["before"]))


def _device_forward(decoded: list, onset_step: int, margin: int = 5) -> dict[int, dict[str, Any]]:
    """Median device time (ms) of each rank's forward before and after the onset step."""
    from perftracker_ml.collectors.cuda_timing import DEVICE_PREFIX
    from perftracker_ml.schemas.vocabulary import EVENT_BATCH, SpanKind

    by_rank: dict[int, tuple[list[float], list[float]]] = {}
    for _msg, records in decoded:
        for name, rec in records:
            if name != EVENT_BATCH:
                continue
            names, spans = rec["names"], rec["spans"]
            before, after = by_rank.setdefault(int(rec["rank"]), ([], []))
            for kind, idx, step, dur in zip(spans["kind"], spans["name"], spans["step"], spans["dur_ns"],
                                            strict=True):
                if kind != SpanKind.DEVICE or not names[idx].startswith(DEVICE_PREFIX) \
                        or not names[idx].endswith(".forward"):
                    continue
                if step < onset_step - margin:
                    before.append(dur / 1e6)
                elif step > onset_step + margin:
                    after.append(dur / 1e6)
    out: dict[int, dict[str, Any]] = {}
    for rank, (before, after) in sorted(by_rank.items()):
        row: dict[str, Any] = {"before": round(statistics.median(before), 3) if before else None,
                               "after": round(statistics.median(after), 3) if after else None}
        if before and after:
            row["after_over_before"] = round(statistics.median(after) / statistics.median(before), 3)
        out[rank] = row
    return out


# -- d. collector overhead on the transformer ---------------------------------------------
def run_overhead(out: Path, pairs: int, block: int) -> dict[str, Any]:
    """``benchmarks.overhead_ab`` in a process of its own: blocks with and without collectors."""
    cmd = [sys.executable, "-m", "benchmarks.overhead_ab", "--json", "--pairs", str(pairs), "--block", str(block),
           "--spool", str(out / "overhead-spool")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    (out / "overhead.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return _failed(f"overhead_ab exited {proc.returncode}: {proc.stderr[-1500:]}")
    return {"status": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])}


# -- e. NVML ------------------------------------------------------------------------------
def run_nvml() -> dict[str, Any]:
    from perftracker_ml.collectors.hardware import open_nvml, sample

    nvml = open_nvml(0)
    if nvml is None:
        return _failed("NVML could not be opened")
    nv, handle, index, uuid = nvml
    row = sample(nv, handle)
    extra = {}
    for name, fn in (("pcie_replay_counter", lambda: nv.nvmlDeviceGetPcieReplayCounter(handle)),
                     ("ecc_mode", lambda: nv.nvmlDeviceGetEccMode(handle)),
                     ("retired_pages_pending", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
                     ("name", lambda: nv.nvmlDeviceGetName(handle))):
        try:
            value = fn()
            extra[name] = value if isinstance(value, (int, str)) else str(value)
        except Exception as exc:  # noqa: BLE001
            extra[name] = f"unreadable: {type(exc).__name__}"
    unread = sorted(k for k, v in row.items() if v == -1)
    return {"status": "ok", "index": index, "uuid": uuid, "fields": row, "unreadable": unread, "extra": extra}


def device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.node()}
    try:
        import torch
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                        sms=props.multi_processor_count, cuda=torch.version.cuda,
                        nccl=".".join(map(str, torch.cuda.nccl.version())))
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = str(exc)
    return info


def main() -> None:
    ensure_importable()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--out", type=Path, default=None, help="keep the recording, logs and pytest report here")
    p.add_argument("--share-seconds", type=float, default=50.0, help="part b: seconds of training")
    p.add_argument("--fault-at-s", type=float, default=12.0, help="part b: the onset")
    p.add_argument("--spin-ms", type=float, default=15.0, help="part b: extra GPU work per forward")
    p.add_argument("--pairs", type=int, default=10, help="part d: pairs of blocks without / with collectors")
    p.add_argument("--block", type=int, default=15, help="part d: steps per block")
    p.add_argument("--skip", default="", help="comma-separated parts to skip (a,b,c,d,e)")
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    gpu = _has_gpu()
    started = time.monotonic()
    report: dict[str, Any] = {"device": device_info(), "gpu": gpu, "parts": {}}
    parts = report["parts"]

    def timed(name: str, fn: Any) -> None:
        t0 = time.monotonic()
        try:
            parts[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others
            parts[name] = _failed(f"{type(exc).__name__}: {exc}")
        parts[name]["seconds"] = round(time.monotonic() - t0, 1)
        print(f"gpu_check: {name}: {parts[name].get('status')} in {parts[name]['seconds']} s",
              file=sys.stderr, flush=True)

    no_gpu = _skipped("no CUDA GPU on this machine")
    timed("contract", (lambda: run_contract(out, gpu)) if "a" not in skip else lambda: _skipped("--skip"))
    timed("nccl_pending", lambda: nccl_part(parts["contract"], out) if gpu else dict(no_gpu))
    timed("nvml", (run_nvml if gpu and "e" not in skip else lambda: dict(no_gpu if not gpu else _skipped("--skip"))))
    timed("shared_gpu_straggler", (lambda: run_shared_gpu(out, a.share_seconds, a.fault_at_s, a.spin_ms))
          if gpu and "b" not in skip else lambda: dict(no_gpu if not gpu else _skipped("--skip")))
    timed("overhead", (lambda: run_overhead(out, a.pairs, a.block))
          if gpu and "d" not in skip else lambda: dict(no_gpu if not gpu else _skipped("--skip")))
    report["seconds"] = round(time.monotonic() - started, 1)
    report["out"] = str(out)
    failed = [k for k, v in parts.items() if v.get("status") == "failed"]
    report["status"] = "failed" if failed else "ok"
    if a.json:
        print(json.dumps(report, default=str))
    else:
        for name, part in parts.items():
            print(f"{name}: {part.get('status')}  {json.dumps({k: v for k, v in part.items() if k != 'status'}, default=str)[:300]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
