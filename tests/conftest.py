"""Session-wide fixtures: one real tansu broker per test session (per xdist worker) on a free port.

The suite runs on several pytest-xdist workers (``python -m tests``: ``-n 3 --dist loadgroup``).
:func:`pytest_collection_modifyitems` groups what must not be split or overlap: every e2e
test on one worker, one after the other (real torchrun jobs whose diagnoses depend on the
machine's load: two at once would contend for the same two cores); every fault test on
another (each kills and restarts components and times their recovery); each other
integration module on one worker (its module-scoped stack is started once). Unit tests go
wherever a worker is free.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from perftracker.deploy.tansu import LocalBroker, start_broker
from perftracker.schemas.redact import reset_redaction

from .registry_fake import registry  # noqa: F401 (a fixture: a fake schema registry on 127.0.0.1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith("tests/e2e/"):
            group = "e2e"
        elif path.startswith("tests/integration/faults/"):
            group = "faults"
        elif path.startswith("tests/integration/"):
            group = path
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    broker = start_broker(log_path=log)
    yield broker
    broker.stop()


@pytest.fixture
def kafka_conf(kafka_broker: LocalBroker) -> dict[str, str]:
    return {"bootstrap.servers": kafka_broker.bootstrap}


@pytest.fixture(autouse=True)
def _forget_configured_secrets() -> Iterator[None]:
    """Each test starts without the secrets and log redaction an earlier test configured
    (settings loaded in-process remember their secrets for redaction)."""
    yield
    reset_redaction()


@pytest.fixture
def unique() -> str:
    """A random suffix for topic prefixes, group ids and job ids."""
    return uuid.uuid4().hex[:8]
