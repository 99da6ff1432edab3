"""Fixtures of the asyncio tests: an app factory on each backend, at one embedded broker.

``backend_name`` runs every test on ``rocketmq`` (librocketmq, remoting) and ``rocketmq5`` (the
official 5.x client, gRPC); the broker speaks both over one store, with short check-back timings
so a check-back scenario resolves in about a second.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from txmsg_broker.testing import create_topic, unique

from txmsg import TxMsg, TxMsgConfig

TIMINGS: dict[str, Any] = {
    "transaction_timeout_ms": 500,
    "check_interval_ms": 500,
    # every 500 ms check counts, answered or not: 5 gave a loaded machine 2.5 s to answer one
    # (async PostgreSQL on a busy loop took longer once, and the half was discarded); no test
    # here is about the discard
    "check_max": 60,
    "transaction_op_batch_interval_ms": 100,
    "delay_scale": 0.001,
}

CONNECT: dict[str, Callable[[Any, Path], dict[str, Any]]] = {
    "rocketmq": lambda broker, tmp: {
        "name_server": broker.namesrv_addr,
        "client_log_dir": str(tmp / "client-logs"),
        "instance_prefix": "aio",
    },
    "rocketmq5": lambda broker, tmp: {"endpoints": broker.grpc_endpoint},
}


@pytest.fixture(params=sorted(CONNECT))
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def broker(txmsg_broker_factory: Any) -> Any:
    return txmsg_broker_factory(grpc_port=0, **TIMINGS)


@pytest.fixture
def make_app(backend_name: str, broker: Any, tmp_path: Path) -> Iterator[Callable[..., TxMsg]]:
    """``make_app(**config)``: a new TxMsg on ``backend_name``; closed at the end if still open
    (a test of ``async with app:`` closes its own)."""
    apps: list[TxMsg] = []

    def make(**config: Any) -> TxMsg:
        settings = {"backend": backend_name, **CONNECT[backend_name](broker, tmp_path), **config}
        app = TxMsg(TxMsgConfig(**settings))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close(timeout=20)


@pytest.fixture
def topic(broker: Any) -> str:
    """A fresh topic that takes transactional and normal messages."""
    name = unique("aio")
    create_topic(broker.namesrv_addr, name, message_type="TRANSACTION")
    return name


DATABASES = ["sqlite"] + (
    ["postgresql", "postgresql-asyncpg"] if os.environ.get("TXMSG_TEST_PG_URL") else []
)


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, and PostgreSQL (psycopg's async mode, and asyncpg) when
    ``TXMSG_TEST_PG_URL`` is set: tests sharing that database keep their rows apart with unique
    names."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'service.db'}"
    url = make_url(os.environ["TXMSG_TEST_PG_URL"])
    if request.param == "postgresql-asyncpg":  # the other async PostgreSQL driver (issue 27)
        url = url.set(drivername="postgresql+asyncpg")
    return url.render_as_string(hide_password=False)
