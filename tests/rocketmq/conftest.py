"""Fixtures for the RocketMQ backend tests: a RocketMQBackend on the embedded broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txmsg_rocketmq.backend import RocketMQBackend


@pytest.fixture
def backend(txmsg_broker: Any, tmp_path: Path) -> Iterator[Any]:
    class Config:
        name_server = txmsg_broker.namesrv_addr
        client_log_dir = str(tmp_path / "client-logs")
        instance_prefix = "t"

    be = RocketMQBackend(Config())
    yield be
    be.close(timeout=20)

