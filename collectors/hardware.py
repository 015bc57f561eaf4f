"""NVML sampling of this rank's GPU into HardwareBatch records on ``pt.hardware``.

1 Hz by default, ``nvml_profile_interval_s`` during a profiling window. A
reading NVML cannot give is -1. Without NVML (CPU machines, no driver) it
switches itself off with one log line. Counters that NVML reports as running
totals (NVLink throughput, NVLink CRC errors, ECC) are sent as read; the
stream side takes differences. XID comes from an NVML event set where the
driver allows it (0 = none seen).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .identity import RankIdentity
from .safety import ErrorBudget

log = logging.getLogger("perftracker_ml.collectors")

SEND_EVERY_S = 5.0
FIELDS = ("wall_ns", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "util_gpu_pct",
          "util_mem_pct", "temp_c", "power_w", "power_limit_w", "throttle_reasons", "pcie_gen",
          "pcie_width", "pcie_tx_kbps", "pcie_rx_kbps", "nvlink_tx_kbps", "nvlink_rx_kbps",
          "nvlink_errors", "ecc_uncorrected", "xid")


def open_nvml(local_rank: int) -> tuple[Any, Any, int, str] | None:
    """(pynvml, handle, device index, uuid) of this rank's GPU, or None (logged once)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [v for v in visible.split(",") if v.strip()]
        index = int(ids[local_rank]) if ids and local_rank < len(ids) and ids[local_rank].isdigit() else local_rank
        if index >= pynvml.nvmlDeviceGetCount():
            index = index % max(1, pynvml.nvmlDeviceGetCount())
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        return pynvml, handle, index, uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception as exc:  # noqa: BLE001
        log.info("perftracker: NVML not available (%s); GPU hardware sampling is off", type(exc).__name__)
        return None


def _read(fn: Callable[[], Any], default: Any = -1) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - NVML raises for unsupported readings
        return default


def sample(nv: Any, h: Any) -> dict[str, Any]:
    """One reading of every field (``-1`` where unsupported)."""
    clock = nv.NVML_CLOCK_SM
    util = _read(lambda: nv.nvmlDeviceGetUtilizationRates(h), None)
    return {
        "wall_ns": time.time_ns(),
        "sm_clock_mhz": _read(lambda: nv.nvmlDeviceGetClockInfo(h, clock)),
        "sm_clock_max_mhz": _read(lambda: nv.nvmlDeviceGetMaxClockInfo(h, clock)),
        "mem_clock_mhz": _read(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        "util_gpu_pct": util.gpu if util is not None else -1,
        "util_mem_pct": util.memory if util is not None else -1,
        "temp_c": _read(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        "power_w": float(_read(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)),
        "power_limit_w": float(_read(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)),
        "throttle_reasons": _read(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        "pcie_gen": _read(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        "pcie_width": _read(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "pcie_tx_kbps": _read(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES)),
        "pcie_rx_kbps": _read(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)),
        "nvlink_tx_kbps": _nvlink_field(nv, h, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"),
        "nvlink_rx_kbps": _nvlink_field(nv, h, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"),
        "nvlink_errors": _nvlink_field(nv, h, "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        "ecc_uncorrected": _read(lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
        "xid": 0,
    }


def _nvlink_field(nv: Any, h: Any, field_name: str) -> int:
    field_id = getattr(nv, field_name, None)
    if field_id is None:
        return -1

    def read() -> int:
        value = nv.nvmlDeviceGetFieldValues(h, [field_id])[0]
        if value.nvmlReturn != 0:
            return -1
        return int(value.value.ullVal)

    return int(_read(read))


def _xid_event_set(nv: Any, handle: Any) -> Any:
    """An NVML event set for critical XID errors, or None where not permitted."""
    try:
        events = nv.nvmlEventSetCreate()
        nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
        return events
    except Exception:  # noqa: BLE001
        return None


class HardwareSampler(threading.Thread):
    """Samples NVML and sends one HardwareBatch every ``SEND_EVERY_S``."""

    def __init__(self, nvml: tuple[Any, Any, int, str], identity: RankIdentity,
                 send: Callable[[dict], None], interval_s: float, fast_interval_s: float,
                 errors: ErrorBudget):
        super().__init__(name="perftracker-nvml", daemon=True)
        self.nv, self.handle, _index, _uuid = nvml
        self.identity = identity
        self.send = send
        self.interval_s = interval_s
        self.fast_interval_s = fast_interval_s
        self.errors = errors
        self.fast = False
        self.seq = 0
        self._rows: dict[str, list] = {f: [] for f in FIELDS}
        self._stop_event = threading.Event()
        self._last_send = time.monotonic()
        self._xid_events = _xid_event_set(self.nv, self.handle)
        self.last_xid = 0

    def set_fast(self, fast: bool) -> None:
        self.fast = fast

    def run(self) -> None:
        while not self._stop_event.wait(self.fast_interval_s if self.fast else self.interval_s):
            try:
                reading = sample(self.nv, self.handle)
                reading["xid"] = self._poll_xid()
                for key, value in reading.items():
                    self._rows[key].append(value)
                if time.monotonic() - self._last_send >= SEND_EVERY_S:
                    self.flush()
            except Exception as exc:  # noqa: BLE001
                self.errors.caught("nvml", exc)

    def _poll_xid(self) -> int:
        """Last XID error seen (0 when none), read without blocking."""
        if self._xid_events is not None:
            try:
                data = self.nv.nvmlEventSetWait_v2(self._xid_events, 0)
                self.last_xid = int(data.eventData)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: no new event
                pass
        return self.last_xid

    def flush(self) -> None:
        if not self._rows["wall_ns"]:
            return
        ident = self.identity
        record = {"job": ident.job, "rank": ident.rank, "host": ident.host, "gpu": ident.gpu,
                  "gpu_uuid": ident.gpu_uuid, "seq": self.seq, **self._rows}
        self._rows = {f: [] for f in FIELDS}
        self.seq += 1
        self._last_send = time.monotonic()
        self.send(record)

    def close(self) -> None:
        self._stop_event.set()
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001
            self.errors.caught("nvml flush", exc)
