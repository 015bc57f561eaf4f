"""Small 4-rank trainings in the parallel styles of large models, with no perftracker code in them.

TRAIN_MODE picks the style:

* ``fsdp2``: FSDP2 ``fully_shard`` of every layer and the root over a 1-D ``dp`` mesh;
* ``tp``: tensor parallel (ColwiseParallel, RowwiseParallel) over ``tp`` and FSDP2
  over ``dp`` of a 2 x 2 DeviceMesh (the layout of issue 16);
* ``pp``: pipeline parallel, one stage per rank (``torch.distributed.pipelining``,
  GPipe, 4 micro-batches) over a 1-D ``pp`` mesh;
* ``compile``: a ``torch.compile``d model under DDP, and a compiled function averaging the
  loss with ``dist.all_reduce`` (Dynamo rewrites it into a functional collective).

TRAIN_STEPS (default 12), TRAIN_DEVICE (``cpu``, gloo; ``cuda``: NCCL, one GPU per
rank), TRAIN_REPORT (a path with ``{rank}``: each rank writes the graph breaks Dynamo
counted and its final loss there as JSON).
"""

import json
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HIDDEN = 64


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 16))


def main() -> None:
    device = os.environ.get("TRAIN_DEVICE", "cpu")
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mode = os.environ.get("TRAIN_MODE", "fsdp2")
    steps = int(os.environ.get("TRAIN_STEPS", "12"))
    data = TensorDataset(torch.randn(steps * 8, 16), torch.randn(steps * 8, 16))
    loader = DataLoader(data, batch_size=8, shuffle=False)
    run = {"fsdp2": fsdp2, "tp": tensor_parallel, "pp": pipeline, "compile": compiled}[mode]
    loss = run(loader, device, rank, world)
    report = os.environ.get("TRAIN_REPORT")
    if report:
        from torch._dynamo.utils import counters
        with open(report.format(rank=rank), "w") as f:
            json.dump({"graph_breaks": sum(counters["graph_break"].values()),
                       "break_reasons": sorted(counters["graph_break"]), "loss": loss}, f)
    dist.destroy_process_group()


def _train(model: nn.Module, loader: DataLoader, device: str,
           after_step: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """Train over ``loader``; ``after_step`` maps each step's detached loss (e.g. a mean over ranks)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.zeros(())
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if after_step is not None:
            loss = after_step(loss.detach().clone())
    return float(loss.detach().float().cpu())


def fsdp2(loader: DataLoader, device: str, rank: int, world: int) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (world,), mesh_dim_names=("dp",))
    model = mlp().to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _train(model, loader, device)


def tensor_parallel(loader: DataLoader, device: str, rank: int, world: int) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(device, (world // 2, 2), mesh_dim_names=("dp", "tp"))
    model = mlp().to(device)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return _train(model, loader, device)


def pipeline(loader: DataLoader, device: str, rank: int, world: int) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    mesh = init_device_mesh(device, (world,), mesh_dim_names=("pp",))
    stage_module = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).to(device)
    stage = PipelineStage(stage_module, rank, world, torch.device(device), group=mesh.get_group("pp"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.01)
    last = 0.0
    for x, y in loader:
        if rank == 0:
            schedule.step(x.to(device))
        elif rank == world - 1:
            losses: list[torch.Tensor] = []
            schedule.step(target=y.to(device), losses=losses)
            last = float(torch.stack(losses).mean())
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
    return last


def compiled(loader: DataLoader, device: str, rank: int, world: int) -> float:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.compile(mlp().to(device)))  # the compiled model under DDP (no DDP code traced)

    @torch.compile
    def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(value)
        return value / world

    return _train(model, loader, device, after_step=mean_over_ranks)


if __name__ == "__main__":
    main()
