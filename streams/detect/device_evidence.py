"""GPU-side evidence: is a rank's extra time on its GPU, or on its host?

On a CUDA rank the collectors time each phase (forward, backward, optimizer step) twice:
on the host (the Python call: launching the kernels, and any wait for the device inside it)
and on the device, between CUDA events on the rank's stream (``SpanKind.DEVICE``, named
``cuda:<the host span's name>``). Against its peers, a rank then shows per phase a host
excess and a device excess, and they tell apart:

* **a slow GPU**: the device runs the phase longer while the host, which only launches it,
  does not: device excess without host excess in that phase. The host may wait for its
  late device later, at a synchronizing point (the end of backward, where DDP waits for the
  gradients' all-reduce; an ``.item()``): a host excess in another phase, never larger than
  the device's (a host cannot wait for its device longer than the device is behind);
* **a slow or starved host**: the device waits for the launches, so its time of the phase
  grows with the host's: device and host excess alike, no device-only part.

So the GPU-side evidence of a rank is its **device-only excess**: per phase, the device
excess beyond the host excess of the same phase, summed. It is evidence when it reaches the
cost floor of a finding and the host's excess over all compute phases is not larger than the
device's (``explains_share`` of it at least: a host waits for its device only as long as
the device is behind; a host slower than its device is host-bound). A rank whose host and
device phases are slow alike (a host-bound rank, or a GPU-bound phase that synchronizes
inside itself) has no device-only excess: only kernel busy times (a profiling window) could
tell those apart, and the finding says so.

What ranks show: a CPU rank (gloo on CPU tensors) has no device spans, so never GPU-side
evidence. A GPU rank whose device lags (slower kernels, a throttled clock, a co-tenant on
the GPU, extra kernels) shows device-only excess in the phase doing the work, often with
its host waiting in backward. A GPU rank whose launch thread is starved or runs slow Python
shows both times grown in the same phases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...schemas.vocabulary import SpanKind
from .facts import Outlier

DEVICE_PREFIX = "cuda:"  # collectors.cuda_timing.DEVICE_PREFIX (the stream side does not import collectors)


@dataclass(frozen=True)
class PhaseExcess:
    """One phase of one rank: its extra time per step over its peers, on the device and host."""

    function: str  # the host span's name, or the phase's ("forward") for a device aggregate
    phase: int  # its SpanKind (forward, backward, optimizer); -1 unknown
    device_ms: float  # device excess, ms/step (0 when not an outlier)
    host_ms: float  # host excess of the same phase, ms/step
    device_value_ms: float  # the rank's device time, ms/step
    device_peer_ms: float  # its peers' median device time, ms/step
    device_ratio: float

    @property
    def device_only_ms(self) -> float:
        return max(0.0, self.device_ms - self.host_ms)

    @property
    def host_only_ms(self) -> float:
        return max(0.0, self.host_ms - self.device_ms)


@dataclass(frozen=True)
class GpuSide:
    """A rank's GPU-side evidence (:func:`gpu_side`)."""

    device_only_ms: float  # summed over phases, ms/step
    host_only_ms: float
    top: PhaseExcess  # the phase with the largest device-only excess

    def evidence(self) -> dict[str, Any]:
        t = self.top
        return {"basis": "device time (CUDA events) against peers",
                "device_only_excess_ms_per_step": round(self.device_only_ms, 3),
                "host_only_excess_ms_per_step": round(self.host_only_ms, 3),
                "phase": t.function, "device_ms_per_step": round(t.device_value_ms, 3),
                "peer_device_ms_per_step": round(t.device_peer_ms, 3), "device_ratio": round(t.device_ratio, 3),
                "host_excess_ms_per_step": round(t.host_ms, 3)}

    def words(self) -> str:
        t = self.top
        host = "its host time there is unchanged" if t.host_ms <= 0 else \
            f"its host time there grew only {t.host_ms:.1f} ms/step"
        return (f"its GPU runs {t.function} {t.device_value_ms:.1f} ms/step vs {t.device_peer_ms:.1f} ms on its "
                f"peers' GPUs (device time, {t.device_ratio:.2f}x); {host}")


# per-phase aggregates of a rank's device spans (every GPU rank reports them, so they are
# compared as soon as the window closes, whatever the phases' own names: pipeline stages,
# experts and compiled regions name their modules differently on different ranks)
DEVICE_AGGREGATES = {int(SpanKind.FORWARD): "kind:device.forward", int(SpanKind.BACKWARD): "kind:device.backward",
                     int(SpanKind.OPTIMIZER): "kind:device.optimizer"}


def is_device(outlier: Outlier) -> bool:
    return int(outlier.kind) == SpanKind.DEVICE or str(outlier.function).startswith(DEVICE_PREFIX)


def phase_kind(name: str) -> int:
    """The host phase a span name belongs to, as the collectors name them: ``<module>.forward``,
    ``torch.autograd.backward`` (or any ``.backward``), ``<optimizer>.step``; -1 for anything else."""
    if name.endswith(".forward"):
        return int(SpanKind.FORWARD)
    if name.endswith(".backward"):
        return int(SpanKind.BACKWARD)
    if name.endswith(".step") or name.endswith(".optimizer"):
        return int(SpanKind.OPTIMIZER)
    return -1


def device_phase(name: str) -> int:
    """The phase of a device span or aggregate name (``cuda:<host name>``, ``kind:device.<phase>``)."""
    return phase_kind(name[len(DEVICE_PREFIX):] if name.startswith(DEVICE_PREFIX) else name)


COMPUTE_HOST = (int(SpanKind.FORWARD), int(SpanKind.BACKWARD), int(SpanKind.OPTIMIZER))


def _host_by_phase(outs: list[Outlier]) -> dict[int, float]:
    """Host excess per compute phase (ms/step): its largest outlier, aggregate or named (they
    measure the same time)."""
    out: dict[int, float] = {}
    for o in outs:
        k = int(o.kind)
        if k in COMPUTE_HOST and not is_device(o):
            out[k] = max(out.get(k, 0.0), float(o.cost_ms_per_step))
    return out


def phases(outliers: Iterable[Outlier]) -> list[PhaseExcess]:
    """Per phase with a device-timed outlier: its device excess (the largest of its named
    device spans and its device aggregate: the same time) beside the host excess of that phase."""
    outs = list(outliers)
    host = _host_by_phase(outs)
    best: dict[Any, Outlier] = {}
    for o in outs:
        if not is_device(o):
            continue
        name = str(o.function)
        phase = device_phase(name)
        key: Any = phase if phase >= 0 else name  # a device span of no known phase: on its own
        kept = best.get(key)
        named = name.startswith(DEVICE_PREFIX)
        if kept is None or float(o.cost_ms_per_step) > float(kept.cost_ms_per_step) or \
                (named and float(o.cost_ms_per_step) == float(kept.cost_ms_per_step)):
            best[key] = o
    out = []
    for key, o in best.items():
        name = str(o.function)
        label = name[len(DEVICE_PREFIX):] if name.startswith(DEVICE_PREFIX) else name.rpartition(".")[2]
        phase = key if isinstance(key, int) else -1
        out.append(PhaseExcess(label, phase, float(o.cost_ms_per_step), host.get(phase, 0.0),
                               float(o.value_ms_per_step), float(o.peer_median_ms_per_step), float(o.ratio)))
    return out


def host_only_excess(outliers: Iterable[Outlier], per_phase: list[PhaseExcess] | None = None) -> float:
    """Host excess of the compute phases beyond the device excess of the same phase (ms/step);
    ``per_phase``: :func:`phases` of the same outliers, when already computed."""
    outs = list(outliers)
    device: dict[int, float] = {}
    for p in phases(outs) if per_phase is None else per_phase:
        device[p.phase] = device.get(p.phase, 0.0) + p.device_ms
    return sum(max(0.0, h - device.get(k, 0.0)) for k, h in _host_by_phase(outs).items())


def gpu_side(outliers: Iterable[Outlier], min_cost_ms: float, share: float) -> GpuSide | None:
    """The rank's GPU-side evidence, or None: its device-only excess reaches ``min_cost_ms``, and
    its host's excess over all compute phases is no more than its device's over ``share`` (the
    host can wait for its device only as long as the device is behind; ``share`` < 1 leaves
    room for measurement noise) (module docstring)."""
    outs = list(outliers)
    per_phase = phases(outs)
    if not per_phase:
        return None
    device_only = sum(p.device_only_ms for p in per_phase)
    device_total = sum(p.device_ms for p in per_phase)
    host_total = sum(_host_by_phase(outs).values())
    if device_only < min_cost_ms or device_total < share * host_total:
        return None
    return GpuSide(device_only, host_only_excess(outs, per_phase), max(per_phase, key=lambda p: p.device_only_ms))
