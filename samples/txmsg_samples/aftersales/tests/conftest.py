"""Fixtures of the after-sales sample's broker tests: the embedded broker (remoting and gRPC),
each service's database, and the settings of a backend to reach the broker with."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from txmsg_broker.pytest_plugin import real_cluster

from txmsg.sqla import make_session_factory
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.app import open_db
from txmsg_samples.aftersales.cases import CasesBase

#: backend -> its TxMsgConfig settings for a started broker fixture (as tests/contract does)
CONNECT: dict[str, Callable[[Any, Path], dict[str, Any]]] = {
    "rocketmq": lambda broker, tmp: {
        "name_server": broker.namesrv_addr,
        "client_log_dir": str(tmp / "client-logs"),
    },
    "rocketmq5": lambda broker, tmp: {"endpoints": broker.grpc_endpoint},
}
PLUGIN = {"rocketmq": "txmsg_rocketmq.backend", "rocketmq5": "txmsg_rocketmq5.backend"}


@pytest.fixture(params=sorted(CONNECT))
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if importlib.util.find_spec(PLUGIN[name]) is None:
        pytest.skip(f"backend {name} is not installed")
    real = real_cluster(request.config)
    if real is not None and name == "rocketmq5" and real.grpc_endpoint is None:
        pytest.skip("the real cluster was given without its 5.x proxy (--real-grpc)")
    return name


@pytest.fixture
def broker(request: pytest.FixtureRequest, txmsg_broker_factory: Any) -> Any:
    """The real cluster of ``--real-remoting`` (and ``--real-grpc``) when given; else the
    embedded broker with its gRPC endpoint too (both backends reach the same store);
    consumer retries after ~0.1 s; an orderly queue lock a dead consumer held comes free 25 s after
    its last renewal (the real broker's ``rocketmq.broker.rebalance.lockMaxLiveTime``: 60 s;
    librocketmq renews every 20 s, so live consumers keep theirs)."""
    real = real_cluster(request.config)
    if real is not None:
        return real
    return txmsg_broker_factory(
        grpc_port=0, delay_scale=0.01, rebalance_lock_max_live_time_ms=25_000
    )


@dataclass
class Dbs:
    cases: sessionmaker[Session]
    settlement: sessionmaker[Session]
    cases_url: str
    settlement_url: str


@pytest.fixture
def dbs(tmp_path: Path) -> Iterator[Dbs]:
    """One database per service, as in production (SQLite files)."""
    cases_url = f"sqlite:///{tmp_path / 'cases.db'}"
    settlement_url = f"sqlite:///{tmp_path / 'settlement.db'}"
    engines: list[Engine] = [
        open_db(cases_url, CasesBase),
        open_db(settlement_url, settlement.SettlementBase),
    ]
    yield Dbs(
        cases=make_session_factory(engines[0]),
        settlement=make_session_factory(engines[1]),
        cases_url=cases_url,
        settlement_url=settlement_url,
    )
    for engine in engines:
        engine.dispose()
