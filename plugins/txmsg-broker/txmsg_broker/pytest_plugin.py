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

Marker ``txmsg_manual_clock(**settings)``: the fixtures' broker runs on a manual clock
(:mod:`txmsg_broker.clock`) with the real broker's timings (``settings`` override them);
``txmsg_broker.advance(seconds)`` runs every check pass, op batch, delay level and lock expiry that
falls due and returns once it ran (check-backs answered), ``txmsg_broker.check_now()`` runs the next
check pass at once.  ``factory(manual_clock=True)`` does the same for one broker (with the short
``TEST_SETTINGS``).  See docs/guide/testing.md.

Option ``--txmsg-log-format 4|5`` (default 4): the transaction.log format of every fixture's broker for
remoting traffic - 4 = RocketMQ 4.9.8, 5 = a 5.1+ broker (unquoted ``EndTransactionRequestHeader``, no
``bname``, an INFO ``Check transaction. real_topic=...`` line per check-back). Run the same tests with
``--txmsg-log-format 5`` to get 5.x-format logs from live runs; ``log_format=`` in the factory wins.

Options ``--real-remoting HOST:PORT`` (the name server of a real RocketMQ 4.x/5.x cluster) and
``--real-grpc HOST:PORT`` (its 5.x proxy; needs ``--real-remoting`` too, for topic admin) point the
tests at an external cluster instead (``--real-log-dir DIR``: the broker's RocketMQ log directory,
for tests that read its transaction.log):

* ``txmsg_cluster`` - the real cluster when given (a :class:`~txmsg_broker.real_cluster.RealCluster`:
  ``.namesrv_addr``, ``.grpc_endpoint``, ``.log_dir``, ``.is_real``, the broker's transaction
  timings), else an embedded broker with its gRPC endpoint on.  Tests written against it run on
  either; topics and groups through ``txmsg_broker.testing.create_topic`` / ``create_group``.
* ``txmsg_real_cluster`` - the real cluster only; the test is skipped without the options.
* marker ``real_broker`` - a test that means a real cluster: skipped unless ``--real-remoting`` is
  given.  With a real cluster, ``txmsg_broker.testing.wait_until`` waits :data:`REAL_PATIENCE` times
  longer: the real broker's retry and check timings are seconds where the fixtures' are
  milliseconds.
  The plugin never starts, stops or kills a real cluster, and the default run never uses one.

Safe under pytest-xdist: every broker binds free ports itself (no probe handed over, so parallel
workers cannot race for one; below the ephemeral range, so a restart binds them again) and
keeps its data and logs under
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
from .real_cluster import ClusterUnreachable, RealCluster

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
    group = parser.getgroup("txmsg_real", "txmsg: tests against a real RocketMQ cluster")
    group.addoption(
        "--real-remoting",
        metavar="HOST:PORT",
        default=None,
        help="name server of a real RocketMQ 4.x/5.x cluster: txmsg_cluster yields it (rocketmq "
        "backend) and tests marked real_broker run; never stopped or restarted by the tests",
    )
    group.addoption(
        "--real-grpc",
        metavar="HOST:PORT",
        default=None,
        help="gRPC endpoint of that cluster's 5.x proxy (rocketmq5 backend); needs --real-remoting "
        "(topics and groups are created through the name server's brokers)",
    )
    group.addoption(
        "--real-log-dir",
        metavar="DIR",
        default=None,
        help="the real broker's RocketMQ log directory (transaction.log, broker.log) if readable "
        "here; tests that read broker logs skip those checks without it",
    )


#: how much longer ``wait_until`` waits when the tests target a real cluster: its retry delays
#: (10 s, 30 s, ...) and check timings are real, the embedded fixtures' are scaled down
REAL_PATIENCE = 4.0

_REAL = pytest.StashKey[RealCluster | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "txmsg_manual_clock(**settings): the txmsg broker fixtures start their broker with a manual "
        "clock (advance(seconds), check_now()) and the real broker's timings, overridden by settings",
    )
    config.addinivalue_line(
        "markers",
        "real_broker: needs the real RocketMQ cluster given by --real-remoting (and --real-grpc "
        "for the rocketmq5 backend); skipped without it",
    )
    namesrv = config.getoption("--real-remoting", default=None)
    grpc = config.getoption("--real-grpc", default=None)
    log_dir = config.getoption("--real-log-dir", default=None)
    if grpc and not namesrv:
        raise pytest.UsageError(
            "--real-grpc needs --real-remoting NAMESRV_HOST:PORT of the same cluster too: topics "
            "and consumer groups are created through its brokers' remoting admin requests"
        )
    if not namesrv:
        config.stash[_REAL] = None
        return
    try:
        config.stash[_REAL] = RealCluster.connect(namesrv, grpc, log_dir)
    except ClusterUnreachable as exc:
        raise pytest.UsageError(f"--real-remoting/--real-grpc: {exc}") from exc
    from . import testing  # noqa: PLC0415 - only for a run against a real cluster

    testing.set_timeout_scale(REAL_PATIENCE)


def real_cluster(config: pytest.Config) -> RealCluster | None:
    """The real cluster of this run (``--real-remoting``), or None: for conftest fixtures that
    yield the real cluster when given and an embedded broker with their own settings otherwise."""
    return config.stash.get(_REAL, None)


def pytest_report_header(config: pytest.Config) -> str | None:
    real = real_cluster(config)
    return None if real is None else f"txmsg real cluster: {real.describe()}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if real_cluster(config) is not None:
        return
    skip = pytest.mark.skip(reason="needs a real RocketMQ cluster: give --real-remoting HOST:PORT")
    for item in items:
        if item.get_closest_marker("real_broker") is not None:
            item.add_marker(skip)


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


def manual_clock_settings(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """The settings of a test marked ``txmsg_manual_clock``: a manual clock and the real broker's
    timings (``transactionTimeOut`` 6 s, check interval 60 s / 30 s, 15 checks, real delay levels:
    waiting costs nothing now), overridden by the marker's keywords; None without the marker."""
    marker = request.node.get_closest_marker("txmsg_manual_clock")
    return None if marker is None else {"manual_clock": True, **marker.kwargs}


@pytest.fixture
def txmsg_broker_factory(
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
    txmsg_client_log_dir: str,
    request: pytest.FixtureRequest,
) -> Iterator[BrokerFactory]:
    started: list[BrokerProcess | BrokerCluster] = []
    log_format = int(pytestconfig.getoption("--txmsg-log-format", default="4") or 4)
    defaults = manual_clock_settings(request) or TEST_SETTINGS

    def factory(*, brokers: int = 1, **settings: Any) -> Any:
        base = tmp_path_factory.mktemp("txmsg-broker")
        merged = {"log_format": log_format, **defaults, **settings}
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


@pytest.fixture
def txmsg_real_cluster(pytestconfig: pytest.Config) -> RealCluster:
    """The real cluster given by ``--real-remoting`` (and ``--real-grpc``); skips the test without."""
    real = real_cluster(pytestconfig)
    if real is None:
        pytest.skip("needs a real RocketMQ cluster: give --real-remoting HOST:PORT")
    return real


@pytest.fixture
def txmsg_cluster(
    pytestconfig: pytest.Config, txmsg_broker_factory: BrokerFactory
) -> RealCluster | BrokerProcess:
    """The real cluster when ``--real-remoting`` is given, else an embedded broker with the gRPC
    endpoint on: what a test needs to reach a cluster (``namesrv_addr``, ``grpc_endpoint``,
    ``log_dir``) either way.  A test that kills or restarts its broker uses ``txmsg_broker``."""
    real = real_cluster(pytestconfig)
    return real if real is not None else txmsg_broker_factory(grpc_port=0)
