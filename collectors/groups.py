"""Process-group identity and per-group sequence numbers that match across members.

A group's id is built from what every member knows identically: c10d's group
name (assigned by a creation counter that advances in the same order on every
rank, since ``new_group`` is collective) and a CRC of the sorted member ranks.
Collectives advance one counter per group; point-to-point calls advance one
counter per (group, sender, receiver), so a send and its matching recv carry
the same number on both sides.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from .events import GroupRef


@dataclass
class GroupState:
    ref: GroupRef
    seq: int = -1  # last sequence number handed out


def group_ref(group_name: str, ranks: list[int], mesh_dim: str = "") -> GroupRef:
    """``pg<name>-<size>-<crc of the ranks>``, plus ``.<dim>`` for a DeviceMesh dimension's group."""
    ordered = tuple(sorted(ranks))
    crc = zlib.crc32(",".join(map(str, ordered)).encode())
    suffix = f".{mesh_dim}" if mesh_dim else ""
    return GroupRef(f"pg{group_name}-{len(ordered)}-{crc:08x}{suffix}", ordered)


MESH_DESC_PREFIX = "mesh_"  # DeviceMesh describes a dimension's groups as mesh_<dim name>


def mesh_dim_of(group: Any) -> str:
    """The DeviceMesh dimension a group was created for (its ``group_desc``), or ''."""
    desc = getattr(group, "group_desc", "") or ""
    if isinstance(desc, str) and desc.startswith(MESH_DESC_PREFIX) and desc != "mesh_default":
        return desc[len(MESH_DESC_PREFIX):]
    return ""


def pair_ref(parent: GroupRef, src: int, dst: int) -> GroupRef:
    return GroupRef(f"{parent.group_id}:p2p:{src}>{dst}", (src, dst))


class GroupRegistry:
    """Caches group ids and hands out sequence numbers (training thread)."""

    def __init__(self, dist: Any):
        self._dist = dist
        self._groups: dict[Any, GroupState] = {}
        self._pairs: dict[tuple[str, int, int], GroupState] = {}
        self._names: dict[Any, GroupState] = {}  # c10d group name -> state (functional collectives)
        self._uncounted: set[int] = set()  # ids of process groups without a sequence number of their own
        self._rank = -1
        self.default: GroupState | None = None  # the default group's state, once resolved

    def resolve(self, group: Any) -> GroupState:
        if group is None:
            if self.default is not None:
                return self.default
            group = self._dist.distributed_c10d._get_default_group()
            self.default = self.resolve(group)
            return self.default
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = GroupState(self._describe(group))
        return state

    def _describe(self, group: Any) -> GroupRef:
        ranks = list(self._dist.get_process_group_ranks(group))
        name = getattr(group, "group_name", "") or "?"
        return group_ref(str(name), ranks, mesh_dim_of(group))

    def resolve_name(self, group_name: Any) -> GroupState:
        """The state of the group c10d registered as ``group_name`` (functional collectives
        name their group; a ProcessGroup object is accepted too)."""
        state = self._names.get(group_name)
        if state is None:
            group: Any = group_name
            if isinstance(group_name, str):
                from torch.distributed import distributed_c10d
                group = distributed_c10d._resolve_process_group(group_name)  # type: ignore[arg-type]
            state = self._names[group_name] = self.resolve(group)
        return state

    def catch_up(self) -> None:
        """Each group's counter up to c10d's own count of the group's collectives
        (``_get_sequence_number_for_group``, the same on every member; functional collectives
        advance it too), never down: numbers handed out while some collectives went unseen
        (step gating, :mod:`.functional`) stay those of the same collectives on every rank. A
        group without that count keeps its counter and is not asked again (a failing call
        costs tens of microseconds)."""
        for group, state in list(self._groups.items()):
            if id(group) in self._uncounted:
                continue
            try:
                issued = int(group._get_sequence_number_for_group())
            except Exception:  # noqa: BLE001 - a process group without the count
                self._uncounted.add(id(group))
                continue
            if issued - 1 > state.seq:
                state.seq = issued - 1

    def next_seq(self, state: GroupState) -> int:
        state.seq += 1
        return state.seq

    def pair(self, group: Any, peer: int | None, sending: bool) -> GroupState:
        """The (sender, receiver) pair state of a p2p call; ``peer`` is a global rank or None."""
        parent = self.resolve(group).ref
        me = self.my_rank()
        peer = -1 if peer is None else peer
        src, dst = (me, peer) if sending else (peer, me)
        key = (parent.group_id, src, dst)
        state = self._pairs.get(key)
        if state is None:
            state = self._pairs[key] = GroupState(pair_ref(parent, src, dst))
        return state

    def my_rank(self) -> int:
        if self._rank < 0:
            self._rank = int(self._dist.get_rank())
        return self._rank

    def reset(self) -> None:
        """After ``destroy_process_group``: groups and counters start afresh."""
        self._groups.clear()
        self._pairs.clear()
        self._names.clear()
        self._uncounted.clear()
        self._rank = -1
        self.default = None
