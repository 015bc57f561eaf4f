"""Fixtures shared by the collector unit tests."""

import os

import pytest
import torch.distributed as dist
from perftracker_ml.deploy.tansu import free_port


@pytest.fixture
def world_of_one():
    """A real one-rank gloo process group on a free port, destroyed afterwards."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
