"""Layout-aware peer groups: who may be compared with whom, from each rank's mesh coordinates.

The collectors report a rank's coordinates in its ``DeviceMesh`` (``mesh_coords``, e.g.
``{"dp": 1, "tp": 0}`` or ``{"pp": 1, "dp": 0}``). Ranks of different pipeline stages
(``pp``) run different layers: one stage being slower is stage imbalance, not a faulty
rank, so they are never peers. Ranks of the same stage and the same tensor-parallel position
(``tp``) run the same shard of the same layers: they are peers, and one of them far above the
others is a slow TP shard.

With a small data-parallel degree the groups of same stage *and* TP position are too small
to score (a 2 x 2 (dp, tp) mesh gives groups of two, and a robust z needs ``min_peers``):
then the TP position is dropped from the key and the ranks of one stage are peers. The TP
shards of Colwise/Rowwise-parallel layers do the same work (equal shards), so comparing them
is sound; a layout with uneven shards needs a larger ``dp`` or explicit ``peer_groups``.

Pure: numpy-free, no I/O. Configured ``peer_groups`` take precedence over the layout (the
comparator only asks for it when none are set); no coordinates at all: empty map, every
rank keeps its structural signature as its peer key (the behaviour without a mesh).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

LAYOUT_DIMS = ("pp", "tp")  # mesh dimensions that split the work unevenly between ranks
PREFIX = "layout:"


def coords_of(record: Mapping[str, Any] | None) -> dict[str, int]:
    """A record's ``mesh_coords`` as {dimension: index}; malformed entries left out."""
    raw = (record or {}).get("mesh_coords") or {}
    out: dict[str, int] = {}
    if not isinstance(raw, Mapping):
        return out
    for dim, idx in raw.items():
        try:
            out[str(dim)] = int(idx)
        except (TypeError, ValueError):
            continue
    return out


def layout_peer_map(coords: Mapping[int, Mapping[str, int]], min_peers: int = 3,
                    dims: tuple[str, ...] = LAYOUT_DIMS) -> dict[int, str]:
    """{rank: peer key} from each rank's mesh coordinates (see the module's docstring).

    Ranks without coordinates are left out (the caller falls back to their signature);
    no rank with a ``pp`` or ``tp`` coordinate: empty (every rank does the same work)."""
    known = {int(r): c for r, c in coords.items() if c}
    used = [d for d in dims if any(d in c for c in known.values())]
    if not used:
        return {}
    fine = {r: _key(c, used) for r, c in known.items()}
    if "tp" in used and min(Counter(fine.values()).values()) < min_peers:
        coarse = [d for d in used if d != "tp"]
        return {r: _key(c, coarse) for r, c in known.items()}
    return fine


def stage_of(coords: Mapping[str, int]) -> int | None:
    """The pipeline stage of a rank (None: no ``pp`` coordinate)."""
    return int(coords["pp"]) if "pp" in coords else None


def _key(c: Mapping[str, int], dims: list[str]) -> str:
    return PREFIX + (",".join(f"{d}={int(c.get(d, -1))}" for d in dims) or "all")
