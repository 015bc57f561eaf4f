"""Job layout: data x tensor x pipeline parallel ranks on hosts of 8 GPUs.

Rank order follows Megatron: tensor-parallel index fastest, then data, then pipeline:
``rank = (p * DP + d) * TP + t``; ``host = rank // 8``; ``gpu = rank % 8``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GPUS_PER_HOST = 8


@dataclass(frozen=True)
class Layout:
    dp: int = 8
    tp: int = 1
    pp: int = 1

    @property
    def ranks(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p, d, t) of every rank."""
        r = np.arange(self.ranks)
        return r // (self.dp * self.tp), (r // self.tp) % self.dp, r % self.tp

    def host_of(self, rank: int) -> int:
        return rank // GPUS_PER_HOST

    def ranks_of_host(self, host: int) -> list[int]:
        return [r for r in range(host * GPUS_PER_HOST, (host + 1) * GPUS_PER_HOST) if r < self.ranks]

    def ranks_of_stage(self, p: int) -> list[int]:
        n = self.dp * self.tp
        return list(range(p * n, (p + 1) * n))

    def grid(self, x: np.ndarray) -> np.ndarray:
        """Per-rank array -> (pp, dp, tp) view."""
        return x.reshape(self.pp, self.dp, self.tp)
