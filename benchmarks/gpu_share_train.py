"""Ranks sharing one GPU over gloo with CUDA tensors; one rank adds GPU work (gpu_check part b).

An unmodified-looking DDP script (perftracker attaches from outside). Every rank trains a
small MLP on ``cuda:0`` (NCCL refuses two ranks on one GPU; gloo moves CUDA tensors itself).
From ``GPU_SHARE_FAULT_AT_S`` seconds on, rank ``GPU_SHARE_SLOW_RANK`` queues a spin kernel
(``torch.cuda._sleep``) of ``GPU_SHARE_SPIN_MS`` inside its model's forward: its host thread
launches it and moves on, so its CPU thread, like every peer's, ends each step waiting in
``loss.backward()`` for the gradient all-reduce, while its GPU runs late. The GPU is shared:
while the spin runs, the peers' kernels wait for their time slice too (processes sharing a
GPU without MPS take turns), so their device times grow a little; the check reports by how
much. (A stream stalled by a Python host function instead, ``cudaLaunchHostFunc``, was tried:
it deadlocks, the callback waiting for the GIL that the training thread holds while it waits
for that stream.) The onset is written to ``GPU_SHARE_ONSET`` (JSON) when it starts. Runs
``GPU_SHARE_SECONDS`` of training.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SLOW_RANK = int(os.environ.get("GPU_SHARE_SLOW_RANK", "2"))
FAULT_AT_S = float(os.environ.get("GPU_SHARE_FAULT_AT_S", "15"))
SECONDS = float(os.environ.get("GPU_SHARE_SECONDS", "60"))
SPIN_MS = float(os.environ.get("GPU_SHARE_SPIN_MS", "15"))
CLOCK_HZ = float(os.environ.get("GPU_SHARE_CLOCK_HZ", "1.5e9"))


class Net(nn.Module):
    def __init__(self, dim: int = 1024):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(),
                                  nn.Linear(dim, dim))
        self.extra_cycles = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_cycles:
            torch.cuda._sleep(self.extra_cycles)  # the slow rank's extra GPU work
        return self.body(x)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    net = Net().cuda()
    model = DDP(net, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device="cuda")
    start = time.monotonic()
    onset_written = False
    step = 0
    while time.monotonic() - start < SECONDS:
        if rank == SLOW_RANK and not onset_written and time.monotonic() - start >= FAULT_AT_S:
            net.extra_cycles = int(SPIN_MS * 1e-3 * CLOCK_HZ)
            onset_written = True
            path = os.environ.get("GPU_SHARE_ONSET")
            if path:
                with open(path, "w") as f:
                    json.dump({"rank": rank, "step": step, "wall_ns": time.time_ns(), "how": "spin"}, f)
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        step += 1
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
