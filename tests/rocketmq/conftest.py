"""Fixtures for the RocketMQ backend tests: a RocketMQBackend, and TxMsg apps, on the embedded broker."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from txmsg_rocketmq.backend import RocketMQBackend

from txmsg import ListenerRegistry, TxMsg
from txmsg.config import TxMsgConfig

# tests/crash_kit.py (shared by test_orderly_crash and tests/rocketmq5/test_fifo_crash): this folder
# is no package, so its modules import helpers by basename; tests/ goes on the path for that one.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.append(_TESTS)


@pytest.fixture
def backend(txmsg_broker: Any, tmp_path: Path) -> Iterator[Any]:
    class Config:
        name_server = txmsg_broker.namesrv_addr
        client_log_dir = str(tmp_path / "client-logs")
        instance_prefix = "t"

    be = RocketMQBackend(Config())
    yield be
    be.close(timeout=20)


@pytest.fixture
def app_on(tmp_path: Path) -> Iterator[Callable[..., TxMsg]]:
    """``app_on(namesrv, registry=None)``: a TxMsg on backend rocketmq at the name server
    ``namesrv`` (client log under the test's tmp_path), ``registry`` included; every app made is
    closed at the end of the test, before the broker fixtures stop."""
    apps: list[TxMsg] = []

    def make(namesrv: str, registry: ListenerRegistry | None = None) -> TxMsg:
        config = TxMsgConfig(
            name_server=namesrv, client_log_dir=str(tmp_path / "client-logs"), instance_prefix="app"
        )
        app = TxMsg(config, backend="rocketmq")
        if registry is not None:
            app.include(registry)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close(timeout=20)


@pytest.fixture
def make_app(txmsg_broker: Any, app_on: Callable[..., TxMsg]) -> Callable[..., TxMsg]:
    """``make_app(registry=None)``: :func:`app_on` the test's embedded broker."""
    return functools.partial(app_on, txmsg_broker.namesrv_addr)
