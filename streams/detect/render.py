"""A window's findings placed and rendered, last: the typed fields first, the words from them.

:func:`placed` gives a finding the facts of where it is: the mesh coordinates of its one rank
(``mesh_coords``, also ``evidence.mesh_coords``), every named GPU's NVML UUID
(``evidence.gpu_uuids``: an index is unique only on its host) and, for a GPU cause about one
rank, the label of its GPU (``gpu_label``). :func:`rendered` then writes the final summary from
the finding's fields: its words (:func:`.findings.words_of`: the rule's ``summary``, then its
``onset``, ``cpu_note`` and ``hot_frame``), the rank's coordinates after the words that name it
(``subject``), or before them when they do not open with it, and the GPU label at the end. No
rule edits text another rule, or an earlier step of its own, wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...schemas.records import RankWindow
from .findings import Finding, words_of
from .layout import coords_of
from .rank_findings import GPU_CAUSES


def placed(f: Finding, rank_windows: Mapping[int, RankWindow]) -> Finding:
    """``f`` with its rank's mesh coordinates, its GPUs' UUIDs and its GPU label (fields and evidence)."""
    windows: Mapping[int, Mapping[str, Any]] = rank_windows
    evidence = dict(f.evidence)
    coords = coords_of(rank_windows.get(f.ranks[0])) if len(f.ranks) == 1 else {}
    if coords:
        evidence["mesh_coords"] = coords
    uuids = {str(r): str(windows.get(r, {}).get("gpu_uuid") or "") for r in f.ranks}
    uuids = {r: u for r, u in uuids.items() if u}
    label = ""
    if uuids:
        evidence["gpu_uuids"] = uuids
        if f.cause in GPU_CAUSES and len(f.ranks) == 1:
            rw = windows.get(f.ranks[0], {})
            label = f"GPU {int(rw.get('gpu', -1))} {uuids[str(f.ranks[0])]} on {rw.get('host', '?')}"
    if not coords and not uuids:
        return f
    return dataclasses.replace(f, evidence=evidence, mesh_coords=coords, gpu_label=label)


def summary_of(f: Finding) -> str:
    """The final summary of ``f`` from its fields (module docstring)."""
    text = words_of(f)
    if f.mesh_coords and len(f.ranks) == 1:
        where = ", ".join(f"{d}={i}" for d, i in f.mesh_coords.items())
        subject = f.subject if f.subject and text.startswith(f.subject) else ""
        rest = text[len(subject):]
        text = f"{subject} ({where}){rest}" if subject else f"rank {f.ranks[0]} ({where}): {text}"
    return text + (f" [{f.gpu_label}]" if f.gpu_label else "")


def rendered(f: Finding) -> Finding:
    """``f`` with its final summary (:func:`summary_of`)."""
    text = summary_of(f)
    return f if text == f.summary else dataclasses.replace(f, summary=text)
