"""Shared by the demo's e2e tests: where artifacts (screenshots, reports) are kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """``$PERFTRACKER_TEST_ARTIFACTS`` or ``<repo>/test-artifacts`` (git-ignored, kept by CI)."""
    path = Path(os.environ.get("PERFTRACKER_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path
