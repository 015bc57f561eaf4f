"""A plain 4-rank gloo DDP training script with no perftracker code in it.

Environment knobs (all optional): TRAIN_STEPS (default 60), TRAIN_EPOCHS (1),
TRAIN_HIDDEN (256), TRAIN_BATCH (32), TRAIN_REPORT (a path: rank 0 writes its
mean step time, training seconds, CPU time and peak RSS there as JSON),
TRAIN_HOLD_FILE (a path: after the epochs, more epochs run while rank 0 sees
this file; every rank learns rank 0's decision through a broadcast), TRAIN_STALL
("RANK:STEP:SECONDS": that rank sleeps in plain Python before that step's forward;
TRAIN_STALL_FILE: a path it writes the stall's start time, time.time(), to).

Faults of the two-node tests (each launcher's environment is its node's):
TRAIN_SLOW_LOAD ("RANK:MS": that global rank's data loader sleeps MS ms in its collate
function on every batch, so DataLoader.__next__ is slow on that rank alone);
TRAIN_CPU_HOGS (N: every rank started with it pins itself to the last CPU core and starts
N busy-looping processes pinned to that core; on one node's launcher only, both ranks of
that "host" wait for a CPU: host-level CPU contention).
"""

import os
import time

import torch
import torch.distributed as dist
from perftracker_ml.deploy.demo.train_common import write_train_report
from perftracker_ml.deploy.workloads import inject
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    steps = int(os.environ.get("TRAIN_STEPS", "60"))
    hidden = int(os.environ.get("TRAIN_HIDDEN", "256"))
    batch = int(os.environ.get("TRAIN_BATCH", "32"))
    data = TensorDataset(torch.randn(steps * batch, 64), torch.randn(steps * batch, 8))
    loader = DataLoader(data, batch_size=batch, shuffle=False, collate_fn=_collate(rank))
    hogs = inject.pin_with_hogs(int(os.environ.get("TRAIN_CPU_HOGS") or 0))
    model = DDP(nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                              nn.ReLU(), nn.Linear(hidden, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    cpu_start, thread_start = time.process_time(), time.thread_time()
    hold = os.environ.get("TRAIN_HOLD_FILE")
    epochs = int(os.environ.get("TRAIN_EPOCHS", "1"))
    epoch = 0
    stall_rank, stall_step, stall_s = (os.environ.get("TRAIN_STALL") or "-1:-1:0").split(":")
    step = 0
    while epoch < epochs or (hold and _held(hold, rank)):
        epoch += 1
        last = time.perf_counter()
        for x, y in loader:
            if rank == int(stall_rank) and step == int(stall_step):
                inject.stall(float(stall_s), os.environ.get("TRAIN_STALL_FILE"))
            step += 1
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
    cpu_s = time.process_time() - cpu_start  # all threads of this rank, the loop only
    thread_s = time.thread_time() - thread_start  # the training thread alone
    dist.barrier()
    report = os.environ.get("TRAIN_REPORT")
    if report and rank == 0:
        write_train_report(report, times, cpu_s, thread_s)
    inject.stop_hogs(hogs)
    dist.destroy_process_group()


def _collate(rank: int):
    slow_rank, slow_ms = (os.environ.get("TRAIN_SLOW_LOAD") or "-1:0").split(":")
    delay_s = float(slow_ms) / 1000 if rank == int(slow_rank) else 0.0

    def collate(batch):
        if delay_s:
            time.sleep(delay_s)
        return default_collate(batch)

    return collate


def _held(path: str, rank: int) -> bool:
    flag = torch.tensor([1 if rank == 0 and os.path.exists(path) else 0])
    dist.broadcast(flag, src=0)
    return bool(flag.item())


if __name__ == "__main__":
    main()
