"""Fixtures of the rescue tests: an embedded broker on the manual clock with a short check horizon,
apps on either backend, and a producer group whose check-backs go unanswered until the test says.

The broker runs with the real broker's timings (``transactionTimeOut`` 6 s, check interval 60 s /
30 s as 5.3.3, real retry delay levels) except ``check_max=3``: a transaction left UNKNOW is
discarded into ``TRANS_CHECK_MAX_TIME_TOPIC`` after a few ``advance()`` calls, in wall seconds.
Its gRPC endpoint is on (the ``rocketmq5`` backend); op records are written at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_topic, has_route

from txmsg import LocalTransactionState, Message, TxMsg, TxMsgConfig
from txmsg.rescue import DISCARD_TOPIC

BACKENDS = ("rocketmq", "rocketmq5")
CHECK_MAX = 3


@dataclass
class Ledger:
    """Stands for the service's database: which transactions committed, which rolled back, and
    whether ``check_local`` can answer at all (``down``: it answers UNKNOW, as a service in an
    outage or a bad deploy whose check-backs go unanswered)."""

    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    down: bool = True
    raises: bool = False
    """While ``down``: raise from ``check_local`` instead of answering UNKNOW."""
    checked: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, message: Message) -> LocalTransactionState:
        key = str(message.transaction_key)
        with self.lock:
            self.checked.append(key)
            if self.down and self.raises:
                raise ConnectionError("the orders database is down")
            if self.down:
                return LocalTransactionState.UNKNOW
            if key in self.committed:
                return LocalTransactionState.COMMIT
            if key in self.rolled_back:
                return LocalTransactionState.ROLLBACK
            return LocalTransactionState.UNKNOW


def listener_class(ledger: Ledger) -> type:
    """A transactional listener on ``ledger``: ``execute_local(message, arg)`` records the
    outcome ``arg`` ("commit" / "rollback") and answers UNKNOW, as if its answer were lost."""

    class Orders:
        def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
            with ledger.lock:
                target = ledger.committed if arg == "commit" else ledger.rolled_back
                target.add(str(message.transaction_key))
            return LocalTransactionState.UNKNOW

        def check_local(self, message: Message) -> LocalTransactionState:
            return ledger.answer(message)

    return Orders


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def broker(txmsg_broker_factory: Any) -> Any:
    """The manual-clock broker (the test module marks its tests ``txmsg_manual_clock``)."""
    return txmsg_broker_factory(
        grpc_port=0, check_max=CHECK_MAX, transaction_op_batch_interval_ms=0
    )


@pytest.fixture
def make_app(backend_name: str, broker: Any, tmp_path: Path) -> Iterator[Callable[..., TxMsg]]:
    """``make_app(**config)``: a TxMsg on ``backend_name`` at ``broker``; closed at the end.
    The ``rocketmq5`` backend gets the broker's name server too (``name_server``), which is
    how it reaches the discard topic; ``name_server=None`` leaves it out."""
    apps: list[TxMsg] = []

    def make(**config: Any) -> TxMsg:
        if backend_name == "rocketmq":
            settings: dict[str, Any] = {
                "name_server": broker.namesrv_addr,
                "client_log_dir": str(tmp_path / "client-logs"),
            }
        else:
            settings = {
                "backend": "rocketmq5",
                "endpoints": broker.grpc_endpoint,
                "name_server": broker.namesrv_addr,
                "client_log_dir": str(tmp_path / "client-logs"),
            }
        settings.update(config)
        settings = {k: v for k, v in settings.items() if v is not None}
        app = TxMsg(TxMsgConfig(**settings))
        apps.append(app)
        return app

    yield make
    for app in reversed(apps):
        app.close(timeout=20)


def transaction_topic(broker: Any, topic: str) -> str:
    create_topic(broker.namesrv_addr, topic, message_type="TRANSACTION")
    return topic


def discard_pending(broker: Any, *, passes: int = 8) -> None:
    """Advance the broker's clock pass by pass until its check service has discarded what is
    pending (every check-back answered UNKNOW): ``CHECK_MAX`` checks, then the discard."""
    interval = 60
    for _ in range(passes):
        report = broker.advance(interval)
        assert report.unanswered == (), report
    assert has_route(broker.namesrv_addr, DISCARD_TOPIC)
