"""Collector overhead inside one training process: blocks of steps with and without collectors.

``python -m benchmarks.overhead_ab --json`` trains the demo transformer
(``deploy/demo/train_transformer.py``'s model: tensor parallel x FSDP2 over a DeviceMesh) in
this one process at world size 1 (NCCL on a GPU, gloo on CPU), and alternates blocks of
``--block`` steps without and with the collectors attached (``perftracker_ml.collectors.api``:
``attach()`` installs every hook and starts the sender thread, ``detach()`` removes them;
messages go to a spool directory, no broker). Each block is timed from a device
synchronize to a device synchronize, so the ratio of a with-block to the without-block
beside it is the step time the collectors add, with everything else (clocks, heat, the
machine's load) alike within the pair. Prints the geometric mean of the pair ratios and its
95 % t interval (goal: ratio <= 1.005, half-width <= 0.5 %), and the full (generation 2)
garbage collections inside the timed blocks of each arm: the collectors allocate a tuple per
event, and a full collection of a large model's heap is a stall of its own.

What it leaves out, by design: the start-up (the launcher, each attach: threads, NVML, the
first flush) and the exit flush, which are once per job: after every switch, in both arms,
``settle`` steps run untimed; ``benchmarks.collector_overhead`` measures whole runs under
``perftracker launch``, start-up included. The first pair is a warm-up and not counted.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "deploy" / "demo"
GPU_MODEL = {"dim": 1024, "layers": 8, "heads": 16, "seq": 512, "vocab": 8192, "batch_size": 16}  # >= 50 ms steps
CPU_MODEL = {"dim": 128, "layers": 2, "heads": 4, "seq": 64, "vocab": 512, "batch_size": 8}


def _ci95(ratios: list[float]) -> tuple[float, list[float]]:
    from benchmarks.collector_overhead import _ci95 as ci
    return ci(ratios)


def run(pairs: int, block: int, spool: Path, model_args: dict[str, int] | None = None,
        settle: int = 3) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    sys.path.insert(0, str(DEMO))
    import train_transformer as tt  # the demo's model, as the demo trains it
    from perftracker_ml.collectors import api

    use_cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        from perftracker_ml.deploy.tansu import free_port
        os.environ["MASTER_PORT"] = str(free_port())
    os.environ["PERFTRACKER_KAFKA_BOOTSTRAP_SERVERS"] = f"spool:{spool}"
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=0, world_size=1,
                            **({"device_id": torch.device("cuda", 0)} if use_cuda else {}))
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    a = SimpleNamespace(tp=1, **(model_args or (GPU_MODEL if use_cuda else CPU_MODEL)))
    torch.manual_seed(0)
    mesh = init_device_mesh("cuda" if use_cuda else "cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    with torch.device(device):
        model = tt.tp_fsdp(tt.GPT(a), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, a.vocab, (a.batch_size, a.seq + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize()

    def steps(n: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = tt.lm_loss(model(x), y)
            loss.backward()
            opt.step()
            reported = loss.detach().clone()
            dist.all_reduce(reported)
        sync()
        return (time.perf_counter() - t0) / n * 1e3

    steps(3)  # compile kernels, fill the allocator
    plain: list[float] = []
    instrumented: list[float] = []
    errors = events = 0
    gen2 = {False: 0, True: 0}  # full GC collections inside the timed blocks, per arm
    try:
        for i in range(pairs + 1):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {}
            for flag in order:
                if flag:
                    api.attach(f"overhead-ab-{i}")
                steps(settle)  # after each switch, in both arms: the attach's once-per-job costs settle
                before = gc.get_stats()[2]["collections"]
                got[flag] = steps(block)
                gen2[flag] += gc.get_stats()[2]["collections"] - before
                if flag:
                    stats = api.stats()
                    if stats is not None:
                        errors += stats.errors_caught
                        events += stats.events_sent + stats.events_dropped + stats.events_buffered
                    api.detach()
            if i:  # the first pair warms up the collectors' own first-use costs
                plain.append(got[False])
                instrumented.append(got[True])
    finally:
        api.detach()
        dist.destroy_process_group()
    ratios = [w / p for w, p in zip(instrumented, plain, strict=True)]
    geo, ci = _ci95(ratios)
    half = 100 * (ci[1] - ci[0]) / 2 / geo if ci else math.inf
    return {"device": torch.cuda.get_device_name(0) if use_cuda else "cpu", "pairs": pairs, "block_steps": block, "settle_steps": settle,
            "step_ms_plain_median": round(statistics.median(plain), 3),
            "step_ms_with_median": round(statistics.median(instrumented), 3),
            "step_time_ratio": round(geo, 5), "step_time_ratio_ci95": ci, "half_width_pct": round(half, 3),
            "pair_ratios": [round(r, 4) for r in ratios], "collector_errors": errors,
            "gc_gen2_without": gen2[False], "gc_gen2_with": gen2[True],
            "events_per_step": round(events / max(1, (pairs + 1) * block), 1),
            "goal": "ratio <= 1.005, half-width <= 0.5 %",
            "meets_goal": bool(ci and geo <= 1.005 and half <= 0.5)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--block", type=int, default=15, help="steps per block")
    p.add_argument("--spool", type=Path, default=None)
    a = p.parse_args()
    spool = a.spool or Path(tempfile.mkdtemp(prefix="overhead-ab-"))
    result = run(a.pairs, a.block, spool)
    print(json.dumps(result) if a.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
