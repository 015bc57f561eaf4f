"""What the demo's training scripts share (``train.py``, ``train_transformer.py``), and the step
report the overhead benchmark reads from them and from ``tests/e2e/scripts/train_ddp.py``.

Plain torch and the standard library: the training scripts import it as a sibling module
(torchrun puts a script's directory on ``sys.path``), never through perftracker.
"""

from __future__ import annotations

import json
import os
import resource

import torch
import torch.distributed as dist


def init_distributed() -> tuple[int, int, torch.device, bool]:
    """The process group (NCCL on a GPU, gloo otherwise) and this rank's device:
    ``(rank, world, device, use_cuda)``; seeds torch so every rank starts alike."""
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    return dist.get_rank(), dist.get_world_size(), device, use_cuda


def write_train_report(path: str, times: list[float], cpu_s: float, thread_s: float) -> None:
    """Step-time figures of one run (the first fifth of the steps left out as warm-up) as JSON
    at ``path``: what ``benchmarks.collector_overhead`` compares with and without collectors."""
    warm = times[len(times) // 5:] or times
    ranked = sorted(warm)
    with open(path, "w") as f:
        json.dump({"step_ms": 1000 * sum(warm) / len(warm), "steps": len(times),
                   "step_p50_ms": 1000 * ranked[len(ranked) // 2],
                   "step_p99_ms": 1000 * ranked[min(len(ranked) - 1, len(ranked) * 99 // 100)],
                   "train_s": sum(times), "cpu_ms_per_step": 1000 * cpu_s / len(times),
                   "thread_ms_per_step": 1000 * thread_s / len(times), "cpu_s": cpu_s,
                   "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, f)
