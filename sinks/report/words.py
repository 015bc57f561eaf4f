"""Plain words for causes and evidence: what an on-call engineer reads on an incident card."""

from __future__ import annotations

from typing import Any

CAUSE_TITLES: dict[str, str] = {
    "slow_dataloader": "Slow data loader",
    "host_cpu_contention": "CPU contention on the host",
    "gc_pause": "Garbage-collection pauses",
    "slow_link": "Slow link / late collective",
    "slow_gpu": "Slow GPU",
    "gpu_throttle": "GPU throttling",
    "stage_imbalance": "Pipeline stage imbalance",
    "data_imbalance": "Data imbalance",
    "shared_inefficiency": "Inefficiency shared by all ranks",
    "regression": "Step time regression",
    "hang": "Hang",
    "slow_function": "Slow function",
    "straggler": "Straggler",
}

CAUSE_EXPLANATIONS: dict[str, str] = {
    "slow_dataloader": "Fetching the next batch takes longer on {who} than on its peers, so {who} "
                       "reaches the gradient all_reduce last and every other rank waits for it.",
    "host_cpu_contention": "{who} gets less CPU than its peers (another process competes for its "
                           "core), so its Python and compute run slower and the others wait.",
    "gc_pause": "Python's garbage collector pauses {who} for long stretches; the pauses delay its "
                "arrival at the collectives and every other rank waits.",
    "slow_link": "{who} enters the collective late or moves data slowly; the other ranks spend the "
                 "difference waiting inside the call.",
    "slow_gpu": "Kernels run slower on {who}'s GPU than on identical peers.",
    "gpu_throttle": "{who}'s GPU runs below its normal clocks (throttling), so its kernels are slow.",
    "stage_imbalance": "Pipeline stages carry unequal work; {who} does more per step.",
    "data_imbalance": "{who} gets larger or harder batches than its peers.",
    "shared_inefficiency": "Every rank spends more time here than expected; this is not one bad rank.",
    "regression": "The job's step time rose above its recent best.",
    "hang": "{who} never reached the pending collective; the others are stuck waiting.",
    "slow_function": "A function on {who} takes longer than on its peers.",
}

_UNITS = (("_ms_per_step", " (ms/step)"), ("_ms", " (ms)"), ("_ns", " (ns)"), ("_pct", " (%)"),
          ("_s", " (s)"), ("_mhz", " (MHz)"), ("_c", " (°C)"), ("_w", " (W)"))


def who(ranks: list[int], hosts: list[str]) -> str:
    if not ranks:
        return "all ranks"
    names = ", ".join(str(r) for r in ranks[:6]) + ("…" if len(ranks) > 6 else "")
    where = f" on {', '.join(hosts[:3])}" if hosts else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {names}{where}"


def cause_title(cause: str) -> str:
    return CAUSE_TITLES.get(cause, cause.replace("_", " ").capitalize())


def explain(incident: dict[str, Any]) -> str:
    template = CAUSE_EXPLANATIONS.get(incident.get("cause", ""), "{who} differs from its peers.")
    return template.format(who=who(list(incident.get("ranks") or []), []))


def label(key: str) -> str:
    """``peer_median_ms`` -> ``peer median (ms)``."""
    for suffix, unit in _UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)].replace("_", " ") + unit
    return key.replace("_", " ")


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value[:12]) + (" …" if len(value) > 12 else "")
    if isinstance(value, dict):
        return "; ".join(f"{label(str(k))}: {value_text(v)}" for k, v in list(value.items())[:8])
    return str(value)


def evidence_lines(evidence: Any) -> list[tuple[str, str]]:
    """(label, value) pairs of an incident's evidence object, in its own order."""
    if not isinstance(evidence, dict):
        return [("evidence", value_text(evidence))] if evidence else []
    return [(label(str(k)), value_text(v)) for k, v in evidence.items()]
