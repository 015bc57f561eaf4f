"""DDP's gradient all-reduce: captured through a comm hook registered automatically.

DDP's C++ reducer calls the process group directly, past any Python patch. At
a DDP model's first forward, unless the user registered a comm hook of their
own, a timed hook (:meth:`.comm.CommTimer.ddp_allreduce_hook`: the arithmetic of
DDP's built-in path, the process group called directly, one event per bucket
when its all-reduce completes) is registered. A user's own hook is left alone
(its Python collectives are still timed by the wrappers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .patching import Patches
from .safety import ErrorBudget

USER_HOOK_FLAG = "_perftracker_user_comm_hook"


def install_ddp(torch: Any, patches: Patches, errors: ErrorBudget, hook: Callable[[Any, Any], Any]) -> None:
    """Register ``hook`` (state: the model's process group) at each DDP model's first forward."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_register = DDP.register_comm_hook

    def first_forward(module: Any, args: Any) -> None:
        try:
            module._perftracker_first_forward.remove()
            if not getattr(module, USER_HOOK_FLAG, False):
                original_register(module, module.process_group, hook)
        except Exception as exc:  # noqa: BLE001
            errors.caught("ddp comm hook", exc)

    def make_init(orig: Callable) -> Callable:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            try:
                self._perftracker_first_forward = self.register_forward_pre_hook(first_forward)
            except Exception as exc:  # noqa: BLE001
                errors.caught("ddp init", exc)
        return __init__

    def make_mark(orig: Callable) -> Callable:
        def mark(self: Any, *args: Any, **kwargs: Any) -> Any:
            object.__setattr__(self, USER_HOOK_FLAG, True)
            return orig(self, *args, **kwargs)
        return mark

    patches.replace(DDP, "__init__", make_init)
    patches.replace(DDP, "register_comm_hook", make_mark)
    patches.replace(DDP, "_register_builtin_comm_hook", make_mark)
