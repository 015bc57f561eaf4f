"""A small GPT-style transformer trained the way large models are: tensor parallel x FSDP2.

Nothing here knows about perftracker: `perftracker launch` attaches the collectors from
outside. Like ``train.py`` it gives the demo's fault injection (``inject_fault.py``) its four
hooks (``on_step``, the data loader's collate function, ``in_backward``, ``before_collective``); with
``PERFTRACKER_DEMO_FAULT`` unset they do nothing.

Layouts (``--parallel``):
- ``tp-fsdp`` (default): a DeviceMesh ("dp", "tp") of shape (world/tp, tp); every block's
  attention and MLP are split over ``tp`` (``ColwiseParallel`` for q/k/v and the first MLP
  layer, ``RowwiseParallel`` for the output projections: one all-reduce each in forward and
  backward), then each block and the whole model are sharded with FSDP2 (``fully_shard``)
  over ``dp`` (all-gathers before forward/backward, reduce-scatters after backward);
- ``fsdp2``: FSDP2 alone: every block and the whole model sharded with ``fully_shard`` over
  all ranks (a one-dimensional DeviceMesh "dp"): all-gathers before forward and backward,
  reduce-scatters after backward, nothing else;
- ``pp``: a DeviceMesh ("pp", "dp") of shape (2, world/2); the blocks are split in two
  pipeline stages (``torch.distributed.pipelining``, GPipe schedule, 4 micro-batches) and the
  gradients of each stage are all-reduced over ``dp`` (stage 0 holds the embeddings, stage 1
  the head: the stages do unequal work, as real pipelines do).

gloo on CPU, NCCL when CUDA is available.

    torchrun --nproc-per-node 4 train_transformer.py --steps 300 [--parallel pp]

``TRAIN_REPORT`` (a path, optional): rank 0 writes its step time, CPU time (all threads
and the training thread) and peak RSS there as JSON (the overhead benchmark reads it).
"""

from __future__ import annotations

import argparse
import os
import time

import inject_fault  # demo only: see inject_fault.py
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.data.dataloader import default_collate
from train_common import init_distributed, write_train_report


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600, help="optimizer steps to run")
    p.add_argument("--parallel", choices=("tp-fsdp", "fsdp2", "pp"), default="tp-fsdp")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (tp-fsdp)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per data-parallel rank and step")
    p.add_argument("--print-every-s", type=float, default=1.0)
    return p.parse_args()


# ---- the model -------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # under tensor parallel q/k/v hold this rank's heads only: infer the count from the width
        q, k, v = (f(x).view(b, t, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim), MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    def __init__(self, vocab: int, dim: int, seq: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.ln, self.out = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    def __init__(self, a: argparse.Namespace):
        super().__init__()
        self.embed = Embed(a.vocab, a.dim, a.seq)
        self.blocks = nn.ModuleList(Block(a.dim, a.heads) for _ in range(a.layers))
        self.head = Head(a.vocab, a.dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- layouts ---------------------------------------------------------------------------

def tp_fsdp(model: GPT, mesh: DeviceMesh) -> nn.Module:
    """Tensor parallel over mesh["tp"] inside every block, then FSDP2 over mesh["dp"]."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def fsdp2(model: GPT, mesh: DeviceMesh) -> nn.Module:
    """FSDP2 alone over mesh["dp"]: each block, then the whole model."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


class Pipeline:
    """One pipeline stage of the GPT (GPipe over mesh["pp"]) with its gradients all-reduced
    over mesh["dp"]."""

    MICROBATCHES = 4

    def __init__(self, model: GPT, mesh: DeviceMesh, device: torch.device):
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        self.stage_idx, stages = mesh.get_local_rank("pp"), mesh.size(0)
        blocks = list(model.blocks)
        per = -(-len(blocks) // stages)
        mine = blocks[self.stage_idx * per:(self.stage_idx + 1) * per]
        parts: list[nn.Module] = ([model.embed] if self.stage_idx == 0 else []) + mine \
            + ([model.head] if self.stage_idx == stages - 1 else [])
        self.module = nn.Sequential(*parts).to(device)
        self.dp_group = mesh.get_group("dp")
        self.first, self.last = self.stage_idx == 0, self.stage_idx == stages - 1
        stage = PipelineStage(self.module, self.stage_idx, stages, device, group=mesh.get_group("pp"))
        self.schedule = ScheduleGPipe(stage, n_microbatches=self.MICROBATCHES, loss_fn=lm_loss)

    def parameters(self):
        return self.module.parameters()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        if self.first:
            self.schedule.step(x)
        elif self.last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if grads and dist.get_world_size(self.dp_group) > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.dp_group)
            flat /= dist.get_world_size(self.dp_group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        loss = torch.stack(losses).mean() if losses else torch.zeros(())
        return loss.to(x.device)


# ---- training --------------------------------------------------------------------------

def make_loader(a: argparse.Namespace, dp_rank: int, dp_size: int, steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = max(64, min(steps, 256) * a.batch_size * dp_size)
    tokens = torch.randint(0, a.vocab, (n, a.seq + 1), generator=g)
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    sampler: DistributedSampler = DistributedSampler(data, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=0)
    return DataLoader(data, batch_size=a.batch_size, sampler=sampler, drop_last=True,
                      collate_fn=inject_fault.collate(default_collate))


def main() -> None:
    a = parse_args()
    rank, world, device, use_cuda = init_distributed()
    dev_type = "cuda" if use_cuda else "cpu"
    if a.parallel == "pp":
        if world % 2:
            raise SystemExit(f"--parallel pp needs an even number of ranks, not {world}")
        mesh = init_device_mesh(dev_type, (2, world // 2), mesh_dim_names=("pp", "dp"))
        with torch.device(device):
            runner = Pipeline(GPT(a), mesh, device)
        params = list(runner.parameters())
    elif a.parallel == "fsdp2":
        mesh = init_device_mesh(dev_type, (world,), mesh_dim_names=("dp",))
        with torch.device(device):
            model = fsdp2(GPT(a), mesh)
        params = list(model.parameters())
    else:
        if world % a.tp or a.heads % a.tp:
            raise SystemExit(f"--tp {a.tp} must divide the ranks ({world}) and the heads ({a.heads})")
        mesh = init_device_mesh(dev_type, (world // a.tp, a.tp), mesh_dim_names=("dp", "tp"))
        with torch.device(device):
            model = tp_fsdp(GPT(a), mesh)
        params = list(model.parameters())
    dp_rank, dp_size = mesh.get_local_rank("dp"), mesh.size((mesh.mesh_dim_names or ()).index("dp"))
    optimizer = torch.optim.AdamW(params, lr=3e-4)
    loss_ranks = dp_size if a.parallel == "pp" else world  # ranks whose loss is not zero
    loader = make_loader(a, dp_rank, dp_size, a.steps)
    fault = inject_fault.from_env(rank)
    times: list[float] = []
    step, epoch, last_print, last_step = 0, 0, time.monotonic(), 0
    cpu_start, thread_start = time.process_time(), time.thread_time()
    while step < a.steps:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        last = time.perf_counter()
        for x, y in loader:
            fault.on_step(step)
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            if a.parallel == "pp":
                loss = runner.train_step(x, y)
            else:
                loss = fault.in_backward(lm_loss(model(x), y))
                loss.backward()
            optimizer.step()
            reported = loss.detach().clone()
            fault.before_collective()
            dist.all_reduce(reported)  # mean loss for logging, as most training loops do
            step += 1
            now = time.perf_counter()
            times.append(now - last)
            last = now
            mono = time.monotonic()
            if rank == 0 and (mono - last_print >= a.print_every_s or step == a.steps):
                print(f"step {step}/{a.steps} loss {reported.item() / loss_ranks:.4f} "
                      f"{(mono - last_print) * 1000 / (step - last_step):.1f} ms/step", flush=True)
                last_print, last_step = mono, step
            if step >= a.steps:
                break
        epoch += 1
    cpu_s, thread_s = time.process_time() - cpu_start, time.thread_time() - thread_start
    fault.stop()
    dist.barrier()
    if rank == 0 and os.environ.get("TRAIN_REPORT"):
        write_train_report(os.environ["TRAIN_REPORT"], times, cpu_s, thread_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
