"""The ClickHouse sink: batched, column-oriented inserts into the store's tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..deploy.config import StoreSettings
from .base import BatchingSink
from .schema import TABLES, migrate
from .store import Store


class ClickHouseSink(BatchingSink):
    def __init__(self, store: Store, settings: StoreSettings):
        super().__init__({name: t.column_names for name, t in TABLES.items()},
                         settings.flush_rows, settings.flush_interval_s, settings.max_backlog_rows)
        self.store = store
        self.settings = settings

    def setup(self) -> None:
        migrate(self.store, self.settings.retention_days, self.settings.incident_retention_days)

    def write(self, table: str, columns: list[str], rows: list[Sequence[Any]]) -> None:
        self.store.insert(table, columns, list(zip(*rows, strict=True)))  # column-oriented: fastest
