"""Optional parts started after the torch hooks: control follower, profiler window, NVML."""

from __future__ import annotations

from typing import Any


def start_optional_parts(collector: Any, torch: Any) -> None:
    """Placeholder filled by later modules (profiling windows, control, NVML)."""
    return None
