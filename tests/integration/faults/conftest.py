"""Fixtures of the fault tests: deployments on the session broker, a webhook receiver and a
ClickHouse server that a test can take down and bring back (see harness.py, servers.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from perftracker_ml.deploy.tansu import LocalBroker

from .harness import Deployment
from .servers import ClickHouseServer, Webhook


@pytest.fixture
def deployment(tmp_path: Path, kafka_broker: LocalBroker, unique: str) -> Iterator[Callable[..., Deployment]]:
    """deployment(bootstrap=None, **settings): a Deployment on ``tmp_path`` (the session broker by
    default); every process it started is stopped at teardown and its log tail printed."""
    made: list[Deployment] = []

    def make(bootstrap: str | None = None, **settings: str) -> Deployment:
        d = Deployment(tmp_path / f"deployment-{len(made)}", bootstrap or kafka_broker.bootstrap,
                       unique, **settings)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop_all()
        print(d.logs())


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    w = Webhook().start()
    yield w
    w.stop()


@pytest.fixture
def clickhouse(tmp_path: Path) -> Iterator[ClickHouseServer]:
    server = ClickHouseServer(tmp_path / "clickhouse", tmp_path / "clickhouse.log").start()
    yield server
    server.stop()
