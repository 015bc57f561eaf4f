"""Session-wide fixtures: one real tansu broker per test session (per xdist worker) on a free port.

The suite runs on several pytest-xdist workers (``python -m tests``: ``-n 4 --dist loadgroup``),
in work units (:func:`group_of`) that each run on one worker, one test after another: the e2e
tests whose verdict is a live diagnosis (never two at once: real torchrun jobs that would
contend for the same two cores), the other e2e tests (the collectors' data arriving), the
fault tests (one unit: xdist hands a worker another unit while its current one has two
tests or fewer left, so one-test modules of a minute and more would pile up on one worker),
the SLURM tests (one cluster for the package), and every other module on its own (its
module-scoped fixtures, e.g. a stack, started once).
The units go out in the order of :func:`pytest_collection_modifyitems` (longest first;
``--no-loadscope-reorder`` keeps xdist from re-sorting them by test count).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from perftracker_ml.deploy.tansu import LocalBroker, start_broker
from perftracker_ml.schemas.redact import reset_redaction

from .prometheus_server import prometheus  # noqa: F401 (a fixture: a real Prometheus on 127.0.0.1)
from .registry_fake import registry  # noqa: F401 (a fixture: a fake schema registry on 127.0.0.1)

# e2e tests whose verdict is a live diagnosis: never two at once (they would contend for the cores)
E2E_DIAGNOSIS = ("tests/e2e/demo/", "tests/e2e/test_two_nodes_diagnosis.py", "tests/e2e/test_job_end.py",
                 "tests/e2e/test_cluster_lab.py")
LONGEST_FIRST = ("e2e-collect", "faults", "e2e-diagnosis")


def group_of(nodeid: str) -> str:
    """The xdist work unit a test belongs to (see the module docstring)."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(E2E_DIAGNOSIS):
        return "e2e-diagnosis"
    if path.startswith("tests/e2e/"):
        return "e2e-collect"
    if path.startswith("tests/integration/faults/"):
        return "faults"  # one unit: xdist queues more units behind a unit of one long test
    if path.startswith("tests/integration/slurm/"):
        return "slurm"  # one unit: its modules share one SLURM cluster (a package-scoped fixture)
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest work units first (they start at once on their own workers while the short
    ones fill the others); otherwise collection order."""
    def rank(item: pytest.Item) -> int:
        group = group_of(item.nodeid)
        return next((i for i, g in enumerate(LONGEST_FIRST) if group.startswith(g)), len(LONGEST_FIRST))

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: whole work units (:func:`group_of`) to one worker each. xdist's own
    loadgroup reads ``xdist_group`` marks through a node id suffix that pytest 9 ignores, so
    the grouping is done here, on xdist's scope scheduler."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return Grouped(config, log)


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
