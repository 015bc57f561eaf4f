"""The package's one SLURM cluster (:mod:`.cluster`), started once for its tests
(``tests/conftest.py`` runs the package as one work unit, on one worker)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import Cluster, running_cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c
