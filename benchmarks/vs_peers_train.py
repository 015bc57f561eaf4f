"""The training job of ``benchmarks.vs_peers``: a data-parallel MLP under torchrun (gloo on CPU,
NCCL on GPU) with one slow rank, run bare, under NVIDIA's straggler detector, or under
``perftracker launch``.

    torchrun --nproc-per-node 4 benchmarks/vs_peers_train.py --run-dir DIR [--tool nvrx]

Every phase is a named Python function (``load_batch``, ``forward``, ``backward``,
``optimizer_step``). From ``--fault-at-s`` seconds after the first step on, rank
``--slow-rank`` sleeps ``--delay-ms`` inside ``forward`` (a slow forward on one rank; DDP's
all-reduce in ``backward`` makes the other ranks wait for it) and writes the wall time it
began to ``DIR/onset.json``.

``--tool nvrx`` is how NVIDIA's detector is used (nvidia-resiliency-ext's documented
usage): ``Detector.initialize``, each phase wrapped in ``Detector.detection_section``, and
a report every ``--report-interval-s`` through ``generate_report()`` called at the same step
on every rank (rank 0 decides and broadcasts; the detector's own
``generate_report_if_interval_elapsed`` puts its interval on the CUDA device and so cannot
run without a GPU); rank 0 appends each report's ``identify_stragglers()`` (default
thresholds) to ``DIR/nvrx.jsonl``. Without CUDA the detector's kernel profiling cannot run
(CUPTI needs a GPU driver), so sections are timed with ``profile_cuda=False`` and two calls
that assume a GPU are made safe first: ``torch.cuda.synchronize`` (called unconditionally by
``generate_report``) becomes a no-op and the CUPTI results read as empty. Its section timing
and scoring are then exactly what it does on a GPU for CPU-side sections.

Rank 0 writes every step's (wall end, wall ms, training-thread CPU ms) to ``DIR/steps.jsonl``
for the overhead figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--tool", choices=("none", "nvrx"), default="none",
                   help="nvrx: NVIDIA's straggler detector in the loop (perftracker attaches from outside)")
    p.add_argument("--seconds", type=float, default=40.0, help="train this long")
    p.add_argument("--fault-at-s", type=float, default=20.0, help="the slow rank's fault starts this long after step 1 (<0: never)")
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--delay-ms", type=float, default=15.0)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--report-interval-s", type=float, default=5.0, help="NVRx report interval")
    return p.parse_args()


class NoTool:
    def section(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def after_step(self, report_now: bool) -> None:
        return None


class Nvrx:
    """NVIDIA's straggler detector wrapped around each phase (its documented usage)."""

    def __init__(self, rank: int, out: Path, interval_s: float, cuda: bool):
        import nvidia_resiliency_ext.straggler as straggler

        if not cuda:
            torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
        self.detector = straggler.Detector
        self.detector.initialize(scores_to_compute="all", gather_on_rank0=True, report_time_interval=interval_s)
        if not cuda:
            manager = self.detector.cupti_manager
            manager.get_results = lambda: {}  # type: ignore[method-assign]
            manager.reset_results = lambda: None  # type: ignore[method-assign]
        self.cuda, self.rank, self.out = cuda, rank, out

    def section(self, name: str) -> contextlib.AbstractContextManager[Any]:
        return self.detector.detection_section(name, profile_cuda=self.cuda)

    def after_step(self, report_now: bool) -> None:
        if not report_now:
            return
        report = self.detector.generate_report()  # collective: every rank calls it at the same step
        if report is None or self.rank != 0:
            return
        found = report.identify_stragglers()
        line = {"wall_time": time.time(),
                "gpus_relative": sorted(s.rank for s in found["straggler_gpus_relative"]),
                "sections_relative": {k: sorted(s.rank for s in v) for k, v in found["straggler_sections_relative"].items()},
                "sections_individual": {k: sorted(s.rank for s in v) for k, v in found["straggler_sections_individual"].items()},
                "section_scores": {k: {str(r): round(v, 3) for r, v in scores.items()}
                                   for k, scores in report.section_relative_perf_scores.items()},
                "report_s": report.generate_report_elapsed_time}
        with self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")


def batches(batch_size: int, rank: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(rank)
    xs, ys = torch.randn(64, batch_size, 256, generator=g), torch.randint(0, 10, (64, batch_size), generator=g)
    i = 0
    while True:
        yield xs[i % 64].to(device), ys[i % 64].to(device)
        i += 1


def load_batch(it: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return next(it)


def forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, slow_s: float) -> torch.Tensor:
    if slow_s:
        time.sleep(slow_s)  # the injected fault: a slow forward on one rank
    return nn.functional.cross_entropy(model(x), y)


def backward(loss: torch.Tensor) -> None:
    loss.backward()  # DDP's bucket all-reduces run in here


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    args = parse_args()
    run_dir = Path(args.run_dir)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    h = args.hidden
    model = DistributedDataParallel(nn.Sequential(nn.Linear(256, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                                                  nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tool: NoTool | Nvrx = Nvrx(rank, run_dir / "nvrx.jsonl", args.report_interval_s, cuda) if args.tool == "nvrx" else NoTool()
    data = batches(args.batch_size, rank, device)
    steps_log = (run_dir / "steps.jsonl").open("a") if rank == 0 else None
    slow_s, start, step = 0.0, None, 0
    control = torch.zeros(2)  # [stop, report now]
    last_report = time.perf_counter()
    while True:
        t0, c0 = time.perf_counter(), time.thread_time()
        if start is None:
            start = t0
        elif not slow_s and args.fault_at_s >= 0 and rank == args.slow_rank and t0 - start >= args.fault_at_s:
            slow_s = args.delay_ms / 1000.0
            (run_dir / "onset.json").write_text(json.dumps({"wall_time": time.time(), "rank": rank, "step": step}))
        with tool.section("load_batch"):
            x, y = load_batch(data)
        with tool.section("forward"):
            loss = forward(model, x, y, slow_s)
        with tool.section("backward"):
            backward(loss)
        with tool.section("optimizer_step"):
            optimizer_step(optimizer)
        if cuda:
            torch.cuda.synchronize()
        step += 1
        t1 = time.perf_counter()
        if steps_log is not None:
            steps_log.write(json.dumps([round(time.time(), 4), round((t1 - t0) * 1e3, 4),
                                        round((time.thread_time() - c0) * 1e3, 4)]) + "\n")
        if step % 10 == 0:  # rank 0 decides, every rank acts at the same step: stop, or NVRx's report
            if rank == 0:
                control[0] = float(t1 - start >= args.seconds)
                control[1] = float(t1 - last_report >= args.report_interval_s)
            dist.broadcast(control, 0)
            if control[1].item():
                last_report = t1
                tool.after_step(True)
            if control[0].item():
                break
    if steps_log is not None:
        steps_log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
