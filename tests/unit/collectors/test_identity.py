"""Rank identity: the configured machine name wins over the (pod's) hostname."""

from __future__ import annotations

import socket

from perftracker_ml.collectors.config import load_attach_settings
from perftracker_ml.collectors.identity import identity_from_env

ENV = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}


def test_hostname_when_no_host_is_configured() -> None:
    ident = identity_from_env("j", ENV)
    assert (ident.rank, ident.local_rank, ident.world_size, ident.host) == (3, 1, 4, socket.gethostname())


def test_collector_host_setting_names_the_machine() -> None:
    settings = load_attach_settings({**ENV, "PERFTRACKER_COLLECTOR_HOST": "node-17"})
    assert identity_from_env("j", ENV, settings.collector.host).host == "node-17"
