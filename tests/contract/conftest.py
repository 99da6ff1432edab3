"""Fixtures of the contract suite: every installed backend, on one embedded broker per test.

``backend_name`` runs over every entry point of ``txmsg.backends``; each needs a way to reach the
embedded broker (:data:`CONNECT`), and a backend installed without one fails loudly rather than
being skipped.  The broker speaks remoting and (``grpc_port=0``) RocketMQ 5 gRPC over one store, so
``rocketmq`` and ``rocketmq5`` meet the same broker with the same short timings (:data:`TIMINGS`).

With ``--real-remoting`` (and ``--real-grpc``) the suite runs against that real cluster instead
(``broker`` is then a :class:`~txmsg_broker.real_cluster.RealCluster`; the backend whose address was
not given is skipped); :func:`timings` gives the broker's own transaction timings, and checks that
read the broker's logs run only when ``--real-log-dir`` names them (:func:`broker_log`).

What a backend lacks is read from its declared :class:`~txmsg.backend.Capabilities`
(``capabilities`` fixture); :func:`needs` turns a missing one into a strict expected failure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.pytest_plugin import real_cluster
from txmsg_broker.testing import read_log, wait_until

from txmsg import TxMsg
from txmsg.app import backend_entry_points, load_backend_factory
from txmsg.backend import Capabilities, capabilities_of
from txmsg.config import TxMsgConfig

#: check every 0.5 s, transactions older than 0.5 s, discard after 3 checks: a check-back scenario
#: resolves in about a second, "unknown until discarded" in about two.  The broker (gRPC on) runs as
#: 5.3.3, which writes commit/rollback records in batches; 0 writes them at once (a 5.3.3 setting),
#: so the contract keeps the margin it always had on this busy machine (its 3000 ms default would
#: check finished transactions back, tests/broker/test_op_batch.py; even 100 ms was seen to check a
#: rolled-back one under load)
TIMINGS: dict[str, Any] = {
    "transaction_timeout_ms": 500,
    "check_interval_ms": 500,
    "check_max": 3,
    "transaction_op_batch_interval_ms": 0,
    "delay_scale": 0.001,
}

#: backend name -> its TxMsgConfig settings for a started broker fixture
CONNECT: dict[str, Callable[[Any, Path], dict[str, Any]]] = {
    "rocketmq": lambda broker, tmp: {
        "name_server": broker.namesrv_addr,
        "client_log_dir": str(tmp / "client-logs"),
        "instance_prefix": "contract",
    },
    "rocketmq5": lambda broker, tmp: {"endpoints": broker.grpc_endpoint},
}

BACKENDS = [ep.name for ep in backend_entry_points()]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name not in CONNECT:
        pytest.fail(
            f"backend {name!r} is installed but the contract suite cannot reach the broker with "
            "it: add its settings to CONNECT in tests/contract/conftest.py"
        )
    return name


@pytest.fixture(params=["sync", "async"])
def listener_style(request: pytest.FixtureRequest) -> str:
    """Every case that declares a listener runs with plain ``def`` listeners and with ``async
    def`` ones (issue 27: those run on the app's event loop, a thread of its own under ``with
    app:``)."""
    style: str = request.param
    return style


@pytest.fixture
def capabilities(backend_name: str) -> Capabilities:
    """What ``backend_name`` declares (its backend class's ``capabilities``)."""
    return capabilities_of(load_backend_factory(backend_name))


def needs(request: pytest.FixtureRequest, capabilities: Capabilities, name: str) -> None:
    """Mark the running test a strict expected failure when the backend lacks ``name``."""
    if not getattr(capabilities, name):
        request.applymarker(
            pytest.mark.xfail(
                strict=True,
                reason=f"declared: this backend's Capabilities.{name} is False",
            )
        )


def timings(broker: Any) -> dict[str, Any]:
    """The transaction timings ``broker`` runs with: :data:`TIMINGS` for the embedded one, the
    real broker's own configuration (GET_BROKER_CONFIG) for a real cluster."""
    if getattr(broker, "is_real", False):
        return {
            "transaction_timeout_ms": broker.transaction_timeout_ms,
            "check_interval_ms": broker.check_interval_ms,
            "check_max": broker.check_max,
        }
    return TIMINGS


def settle_s(broker: Any) -> float:
    """Two check intervals and a little: after it, a settled transaction has no check in flight."""
    return 2 * timings(broker)["check_interval_ms"] / 1000 + 0.3


def two_more_passes(broker: Any) -> None:
    """Return once two check passes that began after this call have ended: after them a settled
    transaction has no check in flight, so "nothing else happens" can be asserted.  An event,
    read from transaction.log (a pass begins with "Begin to check prepare message" and ends with
    "End to check prepare message", both INFO); where the log cannot be read here (a real cluster
    without ``--real-log-dir``), :func:`settle_s` of wall time."""
    log = broker_log(broker)
    if log is None:
        threading.Event().wait(settle_s(broker))
        return
    begun = log.count("Begin to check prepare message")

    def ended() -> int:
        return (broker_log(broker) or "").count("End to check prepare message")

    # the first ``begun`` passes end at most ``begun`` times: two more ends are two passes that
    # began after the count
    wait_until(
        lambda: ended() >= begun + 2,
        timeout=60,
        message=lambda: f"two more check passes ({ended()} ended, {begun} had begun)",
    )


def broker_log(broker: Any, name: str = "transaction.log") -> str | None:
    """The broker's log ``name``, or None when it cannot be read here (a real cluster without
    ``--real-log-dir``): the caller then leaves out the checks that need it."""
    if broker.log_dir is None:
        return None
    return read_log(broker.log_dir, name)


@pytest.fixture
def broker(request: pytest.FixtureRequest, txmsg_broker_factory: Any) -> Any:
    """The real cluster of ``--real-remoting`` if given; else the embedded broker, remoting and
    gRPC, with the contract's short timings; transaction.log at DEBUG, so every check-back it sends
    has its line (remoting logs them at DEBUG only)."""
    real = real_cluster(request.config)
    if real is not None:
        return real
    return txmsg_broker_factory(grpc_port=0, transaction_log_level="DEBUG", **TIMINGS)


@pytest.fixture
def make_app(backend_name: str, broker: Any, tmp_path: Path) -> Iterator[Callable[..., TxMsg]]:
    """``make_app(**config)``: a new TxMsg on ``backend_name`` at ``broker``; all closed at the end."""
    apps: list[TxMsg] = []

    connect = CONNECT[backend_name](broker, tmp_path)
    if None in connect.values():
        pytest.skip(
            f"the real cluster was given without an address for {backend_name} (--real-grpc)"
        )

    def make(**config: Any) -> TxMsg:
        settings = {"backend": backend_name, **connect, **config}
        app = TxMsg(TxMsgConfig(**settings))
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close(timeout=20)
