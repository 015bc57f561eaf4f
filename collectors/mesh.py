"""The rank's coordinates in its DeviceMesh: ``{dim name: index}`` in every EventBatch.

``DeviceMesh.__init__`` is wrapped: when a root mesh (not a slice or a flattened
view of one) with named dimensions is built and this rank is in it, its
coordinate per dimension name (``dp``, ``tp``, ``pp``, ``ep``...) is merged into
the batch builder's ``mesh_coords``, which every later batch header carries
(EventBatch v5; the stream worker copies it into RankWindow v4). A job that
builds several root meshes reports the union (a later mesh's value wins for a
name both use). Unnamed dimensions are reported as ``dim0``, ``dim1``...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .patching import Patches
from .safety import ErrorBudget


def coordinates_of(mesh: Any) -> dict[str, int]:
    """``{dim name: index}`` of this rank in ``mesh``; {} for a slice or a mesh without this rank."""
    if getattr(mesh, "_root_mesh", None) is not None:
        return {}
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return {}
    names = getattr(mesh, "mesh_dim_names", None) or tuple(f"dim{i}" for i in range(len(coordinate)))
    return {str(name): int(c) for name, c in zip(names, coordinate, strict=False)}


def install_mesh(module: Any, patches: Patches, errors: ErrorBudget,
                 publish: Callable[[dict[str, int]], None]) -> None:
    """Wrap ``module.DeviceMesh.__init__`` (``torch.distributed.device_mesh``)."""
    cls = getattr(module, "DeviceMesh", None)
    if cls is None:
        return

    def make_init(orig: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            try:
                coords = coordinates_of(self)
                if coords:
                    publish(coords)
            except Exception as exc:  # noqa: BLE001 - never into the training script
                errors.caught("device mesh", exc)
        return __init__

    patches.replace(cls, "__init__", make_init)
