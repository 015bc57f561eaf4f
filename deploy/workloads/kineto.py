"""Synthetic PyTorch profiler (Kineto, Chrome JSON) traces of a data-parallel transformer job.

Shape follows real Kineto output (one file per rank, ``distributedInfo``, events laid out
over several lines each, float microsecond timestamps as PyTorch 2 writes them). Per
profiled step of each rank: ``ProfilerStep#N``, ``## zero_grad ##``, ``## forward ##``,
``## backward ##``, ``## optimizer ##`` annotations; per layer and pass a fixed list of
aten ops, each a CPU op with child ops (``aten::empty``, ``aten::t``, ``aten::as_strided``,
...) and ``Input Dims``/``Input type`` args, launching one kernel through
``cudaLaunchKernel`` (correlation ids, ``ac2g`` flow start/end events, kernels with the
usual launch args on the compute stream); backward ops run on the autograd thread; DDP
gradient buckets as ``nccl:all_reduce`` annotations around ``record_param_comms`` (with
the collective's recorded metadata) launching ``ncclDevKernel_AllReduce`` kernels on the
communication stream; one fused AdamW kernel; a host-to-device memcpy per step; metadata
and instant events. ``slow_rank``'s forward compute is ``slowdown`` times longer, so its
peers wait in the all-reduces; ``late_rank`` reaches them ``late_us`` later in ``late_steps``
only, and ``noise_us`` jitters every rank's arrival. With the defaults a rank's step is ~4,000 events, ~1 MB.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

T0_US = 1_700_000_000_000_000.0
FWD_OPS = ("aten::layer_norm", "aten::linear", "aten::_scaled_dot_product_flash_attention", "aten::linear",
           "aten::add", "aten::layer_norm", "aten::linear", "aten::gelu", "aten::linear", "aten::add")
CHILDREN = ("aten::empty", "aten::t", "aten::as_strided")
KERNELS = {
    "aten::layer_norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>"
                        "(int, float, float const*, float const*, float const*, float*, float*, float*)",
    "aten::linear": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
                    "segment_k_off_kernel__5x_cublas",
    "aten::_scaled_dot_product_flash_attention": "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_"
                                                 "kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
                                                 "pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::"
                                                 "bfloat16_t> >, false, true, false, false, true, true, false>("
                                                 "pytorch_flash::Flash_fwd_params)",
    "aten::add": "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
                 "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
                 "at::detail::Array<char*, 3>)",
    "aten::gelu": "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::"
                  "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                  "operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, ...)",
}
NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_KERNEL_PRE_2_19 = "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)"
ADAM_KERNEL = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
               "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
               "<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, "
               "bool, double*, double*>(...)")


@dataclass(frozen=True)
class TraceJob:
    """A profiled job: ``ranks`` traces of ``steps`` steps each."""

    ranks: int = 16
    steps: int = 8
    layers: int = 24
    buckets: int = 8  # DDP gradient buckets (all-reduces) per step
    slow_rank: int = 3
    slowdown: float = 1.3
    seed: int = 0
    late_rank: int = -1  # this rank reaches its all-reduces ``late_us`` later ...
    late_steps: tuple[int, ...] = ()  # ... in these steps (no compute of its own is slower)
    late_us: float = 0.0
    noise_us: float = 0.0  # every rank reaches each step's all-reduces up to this much later (busy host)
    first_step: int = 0  # number of the first ProfilerStep (a profiler schedule skips wait/warmup steps)
    nccl_kernel: str = ""  # the all-reduce kernel's name; default NCCL_KERNEL (NCCL >= 2.19 names)


class _Writer:
    """Writes one rank's trace, one event at a time, laid out as Kineto does."""

    def __init__(self, out: TextIO, rank: int, pid: int):
        self.out, self.rank, self.pid = out, rank, pid
        self.first = True
        self.ext = self.corr = 0

    def event(self, e: dict[str, Any]) -> None:
        head = {k: v for k, v in e.items() if k != "args"}
        text = "  {\n    " + json.dumps(head)[1:-1]
        if "args" in e:
            text += ',\n    "args": {\n      ' + json.dumps(e["args"])[1:-1] + "\n    }"
        self.out.write(("" if self.first else ",\n") + text + "\n  }")
        self.first = False

    def op(self, name: str, tid: int, ts: float, dur: float, dims: list, **args: Any) -> None:
        self.ext += 1
        self.event({"ph": "X", "cat": "cpu_op", "name": name, "pid": self.pid, "tid": tid, "ts": round(ts, 3),
                    "dur": round(dur, 3), "args": {"External id": self.ext, "Record function id": 0,
                                                   "Ev Idx": self.ext - 1, "Input Dims": dims,
                                                   "Input type": ["c10::BFloat16"] * len(dims), **args}})

    def launch(self, kernel: str, tid: int, ts: float, k_ts: float, k_dur: float, stream: int,
               **kargs: Any) -> None:
        """cudaLaunchKernel at ``ts`` and its kernel at ``k_ts``, linked by correlation and flow events."""
        self.corr += 1
        c = self.corr
        self.event({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.pid, "tid": tid,
                    "ts": round(ts, 3), "dur": 4.1, "args": {"External id": self.ext, "cbid": 211, "correlation": c}})
        self.event({"ph": "s", "id": c, "pid": self.pid, "tid": tid, "ts": round(ts, 3), "cat": "ac2g", "name": "ac2g"})
        self.event({"ph": "X", "cat": "kernel", "name": kernel, "pid": self.rank, "tid": stream,
                    "ts": round(k_ts, 3), "dur": round(k_dur, 3),
                    "args": {"External id": self.ext, "queued": 0, "device": self.rank, "context": 1,
                             "stream": stream, "correlation": c, "registers per thread": 168,
                             "shared memory": 81920, "blocks per SM": 1.0, "warps per SM": 4.0,
                             "grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 6, **kargs}})
        self.event({"ph": "f", "id": c, "pid": self.pid, "tid": tid, "ts": round(ts, 3), "cat": "ac2g",
                    "name": "ac2g", "bp": "e"})

    def annotation(self, name: str, tid: int, ts: float, dur: float, **args: Any) -> None:
        self.ext += 1
        self.event({"ph": "X", "cat": "user_annotation", "name": name, "pid": self.pid, "tid": tid,
                    "ts": round(ts, 3), "dur": round(dur, 3),
                    "args": {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ext - 1, **args}})


FWD_GPU_US = (60.0, 350.0, 500.0, 120.0, 40.0, 60.0, 450.0, 80.0, 450.0, 40.0)  # per FWD_OPS entry
BWD_NAMES = {"aten::layer_norm": "NativeLayerNormBackward0", "aten::linear": "AddmmBackward0",
             "aten::_scaled_dot_product_flash_attention": "ScaledDotProductFlashAttentionBackward0",
             "aten::add": "AddBackward0", "aten::gelu": "GeluBackward0"}
CPU_OP_US, CHILD_US, GPU_START_US, TRANSFER_US = 30.0, 4.0, 200.0, 900.0
COMPUTE_STREAM, COMM_STREAM = 7, 20


@dataclass
class _Timeline:
    """GPU-side times shared by every rank (the all-reduces end together), per step."""

    step_start: list[float]
    fwd_layer: list  # [rank][step][layer] GPU us of one forward layer
    comm_start: list  # [rank][step][bucket]
    comm_end: list  # [step][bucket]
    delay: list  # [rank][step] us between forward and backward (late rank, host noise)


def _timeline(job: TraceJob) -> _Timeline:
    rng = random.Random(job.seed)
    per = max(job.layers // job.buckets, 1)
    fwd = [[[sum(FWD_GPU_US) * rng.lognormvariate(0, 0.03) * (job.slowdown if r == job.slow_rank else 1.0)
              for _ in range(job.layers)] for _ in range(job.steps)] for r in range(job.ranks)]
    comm_start: list[list[list[float]]] = [[[] for _ in range(job.steps)] for _ in range(job.ranks)]
    starts: list[float] = []
    comm_end: list[list[float]] = []
    delay = [[0.0] * job.steps for _ in range(job.ranks)]
    t = T0_US
    for s in range(job.steps):
        starts.append(t)
        ready = []
        for r in range(job.ranks):
            cursor = t + GPU_START_US + sum(fwd[r][s])
            marks = []
            delay[r][s] = _delay_us(job, rng, r, s)
            cursor += delay[r][s]
            for i, layer in enumerate(reversed(range(job.layers))):
                cursor += 2 * fwd[r][s][layer] / (job.slowdown if r == job.slow_rank else 1.0)
                if (i + 1) % per == 0 or i == job.layers - 1:
                    marks.append(cursor)
            ready.append(marks)
        ends, prev = [], 0.0
        for b in range(len(ready[0])):
            begins = [max(ready[r][b], prev) for r in range(job.ranks)]
            prev = max(begins) + TRANSFER_US
            ends.append(prev)
            for r in range(job.ranks):
                comm_start[r][s].append(begins[r])
        comm_end.append(ends)
        t = ends[-1] + 1000.0  # optimizer kernel and step tail, the same on every rank
    return _Timeline(starts, fwd, comm_start, comm_end, delay)


def _delay_us(job: TraceJob, rng: random.Random, rank: int, step: int) -> float:
    """Uninstrumented time between a rank's forward and backward (on the CPU and so on the GPU):
    host noise, plus the late rank's delay."""
    noise = rng.uniform(0.0, job.noise_us) if job.noise_us > 0 else 0.0
    return noise + (job.late_us if rank == job.late_rank and step in job.late_steps else 0.0)


def _forward(w: _Writer, tl: _Timeline, job: TraceJob, step: int, cpu: float, tid: int) -> tuple[float, float]:
    """Forward ops from CPU time ``cpu``; returns (CPU end, GPU end)."""
    gpu = tl.step_start[step] + GPU_START_US
    for layer in range(job.layers):
        scale = tl.fwd_layer[w.rank][step][layer] / sum(FWD_GPU_US)
        for op, base in zip(FWD_OPS, FWD_GPU_US, strict=True):
            w.op(op, tid, cpu, CPU_OP_US, [[8, 2048, 4096], [4096, 4096]])
            for i, child in enumerate(CHILDREN):
                w.op(child, tid, cpu + 2 + i * (CHILD_US + 1), CHILD_US, [[4096, 4096]])
            w.launch(KERNELS[op], tid, cpu + CPU_OP_US - 8, gpu, base * scale, COMPUTE_STREAM)
            gpu += base * scale
            cpu += CPU_OP_US + 15
    return cpu, gpu


def _backward(w: _Writer, tl: _Timeline, job: TraceJob, step: int, cpu: float, gpu: float, tid: int) -> float:
    """Backward ops and the DDP all-reduces on the autograd thread; returns its CPU end."""
    per, bucket = max(job.layers // job.buckets, 1), 0
    slow = job.slowdown if w.rank == job.slow_rank else 1.0
    for i, layer in enumerate(reversed(range(job.layers))):
        scale = 2 * tl.fwd_layer[w.rank][step][layer] / slow / sum(FWD_GPU_US)
        for op, base in zip(reversed(FWD_OPS), reversed(FWD_GPU_US), strict=True):
            w.op(f"autograd::engine::evaluate_function: {BWD_NAMES[op]}", tid, cpu, CPU_OP_US + 5, [])
            w.op(BWD_NAMES[op], tid, cpu + 2, CPU_OP_US, [[8, 2048, 4096]])
            w.launch(KERNELS[op], tid, cpu + CPU_OP_US - 6, gpu, base * scale, COMPUTE_STREAM)
            gpu += base * scale
            cpu += CPU_OP_US + 15
        if (i + 1) % per == 0 or i == job.layers - 1:
            start, end = tl.comm_start[w.rank][step][bucket], tl.comm_end[step][bucket]
            w.annotation("nccl:all_reduce", tid, cpu, 40.0, **{"Input Dims": [[25 << 19]], "Input type": ["c10::BFloat16"]})
            w.op("record_param_comms", tid, cpu + 3, 30.0, [[25 << 19]], **{
                "Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 25 << 19,
                "Out msg nelems": 25 << 19, "Group size": job.ranks, "Process Group Name": "0",
                "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(range(job.ranks))), "Rank": w.rank})
            w.launch(job.nccl_kernel or NCCL_KERNEL, tid, cpu + 20, start, end - start, COMM_STREAM)
            cpu += 50
            bucket += 1
    return cpu


def _step(w: _Writer, tl: _Timeline, job: TraceJob, step: int) -> None:
    main, bwd = w.pid, w.pid + 117
    t0 = tl.step_start[step]
    end = tl.comm_end[step][-1] + 1000.0
    w.annotation(f"ProfilerStep#{job.first_step + step}", main, t0, end - 20 - t0)
    w.annotation("## zero_grad ##", main, t0 + 5, 60.0)
    w.op("aten::zero_", main, t0 + 10, 40.0, [[4096, 4096]])
    w.corr += 1
    w.event({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": w.pid, "tid": main,
             "ts": round(t0 + 80, 3), "dur": 12.5, "args": {"External id": w.ext, "cbid": 41, "correlation": w.corr}})
    w.event({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": w.rank,
             "tid": COMPUTE_STREAM, "ts": round(t0 + 100, 3), "dur": 42.0,
             "args": {"External id": w.ext, "device": w.rank, "context": 1, "stream": COMPUTE_STREAM,
                      "correlation": w.corr, "bytes": 1 << 20, "memory bandwidth (GB/s)": 24.9}})
    fwd0 = t0 + 150
    cpu, gpu = _forward(w, tl, job, step, fwd0, main)
    w.annotation("## forward ##", main, fwd0, cpu - fwd0)
    cpu, gpu = cpu + tl.delay[w.rank][step], gpu + tl.delay[w.rank][step]  # uninstrumented gap
    cpu_b = _backward(w, tl, job, step, cpu + 20, gpu, bwd)
    w.annotation("## backward ##", main, cpu + 10, tl.comm_end[step][-1] + 15 - cpu)
    opt = tl.comm_end[step][-1] + 30
    w.annotation("## optimizer ##", main, opt, 900.0)
    w.op("aten::_fused_adamw_", main, opt + 10, 860.0, [[], [], [], [], []])
    w.launch(ADAM_KERNEL, main, opt + 800, max(opt + 810, cpu_b), 150.0, COMPUTE_STREAM)


def _metadata(w: _Writer) -> Iterator[dict]:
    yield {"name": "process_name", "ph": "M", "ts": T0_US, "pid": w.pid, "tid": 0, "args": {"name": "python3"}}
    yield {"name": "process_name", "ph": "M", "ts": T0_US, "pid": w.rank, "tid": 0, "args": {"name": f"GPU {w.rank}"}}
    for tid, label in ((w.pid, "thread 1 (python3)"), (w.pid + 117, "thread 2 (pt_autograd_0)")):
        yield {"name": "thread_name", "ph": "M", "ts": T0_US, "pid": w.pid, "tid": tid, "args": {"name": label}}
    for stream in (COMPUTE_STREAM, COMM_STREAM):
        yield {"name": "thread_name", "ph": "M", "ts": T0_US, "pid": w.rank, "tid": stream,
               "args": {"name": f"stream {stream}"}}


def write_rank(job: TraceJob, tl: _Timeline, rank: int, path: Path) -> int:
    """One rank's trace file; returns its size in bytes."""
    top = {"schemaVersion": 1, "deviceProperties": [{"id": i, "name": "NVIDIA H100 80GB HBM3",
                                                     "totalGlobalMem": 85029158912, "computeMajor": 9,
                                                     "computeMinor": 0, "numSms": 132} for i in range(8)],
           "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": job.ranks, "pg_count": 1,
                               "nccl_version": "2.21.5"},
           "record_shapes": 1}
    with open(path, "w") as out:
        out.write(json.dumps(top, indent=2)[:-2] + ',\n  "traceEvents": [\n')
        w = _Writer(out, rank, 40_000 + rank)
        for e in _metadata(w):
            w.event(e)
        for step in range(job.steps):
            _step(w, tl, job, step)
        w.event({"ph": "X", "cat": "Trace", "ts": T0_US, "dur": tl.comm_end[-1][-1] + 1000 - T0_US,
                 "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}})
        w.event({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                 "ts": tl.comm_end[-1][-1] + 1000})
        out.write(f'\n  ],\n  "traceName": "rank{rank}.pt.trace.json"\n}}\n')
    return path.stat().st_size


def write_job(job: TraceJob, directory: Path) -> list[Path]:
    """Every rank's trace under ``directory`` (``rank<N>.pt.trace.json``)."""
    directory.mkdir(parents=True, exist_ok=True)
    tl = _timeline(job)
    paths = []
    for rank in range(job.ranks):
        path = directory / f"rank{rank}.pt.trace.json"
        write_rank(job, tl, rank, path)
        paths.append(path)
    return paths
