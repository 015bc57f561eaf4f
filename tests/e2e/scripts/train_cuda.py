"""A plain NCCL DDP training script on CUDA with no perftracker code in it.

One process per GPU (torchrun sets LOCAL_RANK). Environment knobs: TRAIN_STEPS
(default 40), TRAIN_HIDDEN (2048). The input batch is copied to the GPU every
step (a host-to-device memcpy); every 10 steps the loss is all-reduced
explicitly, next to DDP's own bucket all-reduces.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(0)
    steps = int(os.environ.get("TRAIN_STEPS", "40"))
    hidden = int(os.environ.get("TRAIN_HIDDEN", "2048"))
    data = TensorDataset(torch.randn(steps * 64, 512), torch.randn(steps * 64, 16))
    loader = DataLoader(data, batch_size=64, shuffle=False, pin_memory=True)
    model = DDP(nn.Sequential(nn.Linear(512, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                              nn.ReLU(), nn.Linear(hidden, 16)).to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step % 10 == 9:
            dist.all_reduce(loss.detach())
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
