"""pytest plugin (entry point ``pytest11``): an embedded broker per test, on free ports.

Fixtures:

* ``txmsg_broker`` - a started :class:`~txmsg_broker.app.BrokerProcess` with short check timings
  (``TEST_SETTINGS``), temp data/log dirs; use ``.namesrv_addr``, ``.log_dir``, ``.data_dir``,
  ``.restart()``, ``.kill()`` (SIGKILL), ``.start()``, ``.stop()``.
* ``txmsg_grpc_broker`` - the same with the RocketMQ 5 gRPC endpoint on (``.grpc_endpoint``).
* ``txmsg_broker_factory`` - ``factory(**settings)`` for custom settings (any ``txmsg broker`` option,
  e.g. ``flush="sync"``, ``check_max=5``, ``transaction_log_level="DEBUG"``, ``log_format=5``). All are
  stopped at teardown.  ``factory(brokers=2, **settings)`` starts a
  :class:`~txmsg_broker.cluster.BrokerCluster` instead: a name server process and one process per broker
  (``.brokers``, ``.broker("broker-b")`` - each a ``BrokerProcess`` to ``kill()``/``start()`` alone;
  ``.namesrv_addr``; the gRPC endpoint on broker-a only).  ``factory(acl=...)`` enforces RocketMQ 4.9
  ACL: a plain_acl.yml path, or its content as a dict (``{"accounts": [{"accessKey": ...}]}``).

Option ``--txmsg-log-format 4|5`` (default 4): the transaction.log format of every fixture's broker for
remoting traffic - 4 = RocketMQ 4.9.8, 5 = a 5.1+ broker (unquoted ``EndTransactionRequestHeader``, no
``bname``, an INFO ``Check transaction. real_topic=...`` line per check-back). Run the same tests with
``--txmsg-log-format 5`` to get 5.x-format logs from live runs; ``log_format=`` in the factory wins.

Safe under pytest-xdist: every broker listens on free ports (0) and keeps its data and logs under
``tmp_path_factory`` (per worker), the client log directory is per session; nothing is shared
between workers.  Any timer of the real broker can be shortened per broker, its default unchanged,
e.g. ``factory(rebalance_lock_max_live_time_ms=25_000)`` (``rocketmq.broker.rebalance.lockMaxLiveTime``).

The broker runs as a child process so a test can ``kill -9`` it and so librocketmq's threads never share
an interpreter with the broker's event loop. ``ROCKETMQ_CLIENT_LOG_DIR`` is pointed at a temp dir unless
already set, so the real client does not write to ``~/logs`` - only while a broker fixture is in use
(``txmsg_client_log_dir``): the plugin loads wherever txmsg-broker is installed, and a pytest run that
uses none of its fixtures must not see its environment changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal, Protocol, cast, overload

import pytest

from .acl_config import write_acl
from .app import BrokerProcess
from .cluster import BrokerCluster

#: short timings so the whole transaction outcome table runs in seconds
TEST_SETTINGS: dict[str, Any] = {
    "transaction_timeout_ms": 1000,
    "check_interval_ms": 1000,
    "check_max": 3,
    "delay_scale": 0.001,
}


class BrokerFactory(Protocol):
    """``factory(**settings)`` → a :class:`BrokerProcess`; ``factory(brokers=2, **settings)`` → a
    :class:`~txmsg_broker.cluster.BrokerCluster` (name server process + broker-a, broker-b processes)."""

    @overload
    def __call__(self, *, brokers: Literal[1] = 1, **settings: Any) -> BrokerProcess: ...

    @overload
    def __call__(self, *, brokers: int, **settings: Any) -> BrokerCluster: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("txmsg_broker").addoption(
        "--txmsg-log-format",
        choices=("4", "5"),
        default="4",
        help="transaction.log format of the txmsg_broker fixtures' remoting traffic: "
        "4 = RocketMQ 4.9.8 (default), 5 = RocketMQ 5.1+",
    )


@pytest.fixture(scope="session")
def txmsg_client_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``ROCKETMQ_CLIENT_LOG_DIR`` for the session, unless already set, so the real client does
    not write to ``~/logs``; restored at the end.  Used by the broker fixtures: a pytest run that
    uses none of them sees no change to its environment."""
    before = os.environ.get("ROCKETMQ_CLIENT_LOG_DIR")
    if before is not None:
        yield before
        return
    path = str(tmp_path_factory.mktemp("rocketmq-client-logs"))
    os.environ["ROCKETMQ_CLIENT_LOG_DIR"] = path
    try:
        yield path
    finally:
        os.environ.pop("ROCKETMQ_CLIENT_LOG_DIR", None)


@pytest.fixture
def txmsg_broker_factory(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config, txmsg_client_log_dir: str
) -> Iterator[BrokerFactory]:
    started: list[BrokerProcess | BrokerCluster] = []
    log_format = int(pytestconfig.getoption("--txmsg-log-format", default="4") or 4)

    def factory(*, brokers: int = 1, **settings: Any) -> Any:
        base = tmp_path_factory.mktemp("txmsg-broker")
        merged = {**TEST_SETTINGS, "log_format": log_format, **settings}
        if isinstance(merged.get("acl"), dict):  # acl={...}: the plain_acl.yml content
            merged["acl"] = write_acl(base / "plain_acl.yml", merged["acl"])
        if brokers > 1:
            cluster = BrokerCluster(base / "data", base / "logs", brokers=brokers, **merged)
            started.append(cluster)
            return cluster.start()
        proc = BrokerProcess(base / "data", base / "logs", **merged)
        started.append(proc)
        return proc.start()

    yield cast(BrokerFactory, factory)
    for proc in started:
        try:
            proc.stop(timeout=10)
        except Exception:  # noqa: BLE001 - teardown: whatever went wrong, the process must go
            proc.kill()


@pytest.fixture
def txmsg_broker(txmsg_broker_factory: BrokerFactory) -> BrokerProcess:
    return txmsg_broker_factory()


@pytest.fixture
def txmsg_grpc_broker(txmsg_broker_factory: BrokerFactory) -> BrokerProcess:
    """Like ``txmsg_broker`` plus the RocketMQ 5 gRPC endpoint: ``.grpc_endpoint`` ("127.0.0.1:port")
    for ``rocketmq.ClientConfiguration`` of the official 5.x client (needs the ``grpc`` extra)."""
    return txmsg_broker_factory(grpc_port=0)
