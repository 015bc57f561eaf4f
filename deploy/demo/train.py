"""A small data-parallel training job, the kind of script people run under torchrun.

Nothing here knows about perftracker: `perftracker launch` attaches the
collectors from outside. The demo's fault injection is the separate module
``inject_fault.py`` next to this file; this script only gives it four hooks
(``on_step``, the data loader's collate function, ``in_backward``, ``before_collective``), and
with ``PERFTRACKER_DEMO_FAULT`` unset those hooks do nothing.

    torchrun --nproc-per-node 4 train.py --steps 900
"""

from __future__ import annotations

import argparse
import time

import inject_fault  # demo only: see inject_fault.py
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.data.dataloader import default_collate
from train_common import init_distributed


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=900, help="optimizer steps to run")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--print-every-s", type=float, default=1.0)
    return p.parse_args()


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(128, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def make_loader(batch_size: int, rank: int, world: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8192, 128, generator=g), torch.randint(0, 10, (8192,), generator=g))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True,
                      collate_fn=inject_fault.collate(default_collate))


def main() -> None:
    args = parse_args()
    rank, world, device, _ = init_distributed()
    model = DistributedDataParallel(make_model(args.hidden).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = make_loader(args.batch_size, rank, world)
    fault = inject_fault.from_env(rank)
    step, epoch, last_print, last_step = 0, 0, time.monotonic(), 0
    while step < args.steps:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for x, y in loader:
            fault.on_step(step)
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = fault.in_backward(loss_fn(model(x), y))
            loss.backward()
            optimizer.step()
            reported = loss.detach().clone()
            fault.before_collective()
            dist.all_reduce(reported)  # mean loss for logging, as most training loops do
            step += 1
            now = time.monotonic()
            if rank == 0 and (now - last_print >= args.print_every_s or step == args.steps):
                print(f"step {step}/{args.steps} loss {reported.item() / world:.4f} "
                      f"{(now - last_print) * 1000 / (step - last_step):.1f} ms/step", flush=True)
                last_print, last_step = now, step
            if step >= args.steps:
                break
        epoch += 1
    fault.stop()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
