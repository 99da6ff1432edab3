"""Issue 14 points 1-2, what only the rocketmq5 backend does: its send errors (a 5.x proxy creates no
topic on a send and refuses an empty body itself), RocketMQ 5's system topic names, its configuration
(``endpoints``).  The transaction outcome table, exception mapping, shared topics and check-backs of
undeclared topics are the contract's (tests/contract/test_contract.py, run on every backend).
"""

from __future__ import annotations

from typing import Any

import pytest
from txmsg_broker.testing import create_topic, unique
from txmsg_rocketmq5.client import _SEND_STEPS, CheckingProducer

from txmsg import (
    InvalidMessageError,
    InvalidNameError,
    ListenerRegistry,
    LocalTransactionState,
    Message,
    ProducerClosedError,
    SendError,
)
from txmsg.config import load_config

S = LocalTransactionState


def test_send_errors_map_as_on_the_rocketmq_backend(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group = unique("Tx5Err"), unique("pg5_err")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    ran: list[str] = []
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Listener:
        def execute_local(self, message: Message, arg: Any) -> S:
            ran.append(message.topic)
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app = make_app(registry)
    with app:
        producer = app.producer(group)
        with pytest.raises(SendError, match="local transaction did not run"):
            producer.send_in_transaction(unique("NoSuchTopic5"), "x")
        with pytest.raises(InvalidMessageError, match="empty message body"):
            producer.send_in_transaction(topic, b"")
        with pytest.raises(InvalidNameError, match="at most 127"):
            producer.send_in_transaction("t" * 128, "x")
        assert ran == []
        assert producer.stats().failed == 2  # refused by the backend: counted as failed sends
    with pytest.raises(ProducerClosedError):
        producer.send_in_transaction(topic, "late")


def test_names_and_config_select_the_backend(make_app: Any, txmsg_grpc_broker: Any) -> None:
    app = make_app()
    with pytest.raises(InvalidNameError, match="system topic"):
        app.add_transactional_listener(_Committer(), group="pg5_names", topics=["rmq_sys_x"])
    config = load_config(
        env={"TXMSG_BACKEND": "rocketmq5", "TXMSG_ENDPOINTS": txmsg_grpc_broker.grpc_endpoint}
    )
    assert (config.backend, config.endpoints) == ("rocketmq5", txmsg_grpc_broker.grpc_endpoint)


class _Committer:
    def execute_local(self, message: Message, arg: Any) -> S:
        return S.COMMIT

    def check_local(self, message: Message) -> S:
        return S.COMMIT


def test_the_installed_client_has_the_steps_of_a_split_send() -> None:
    """The split (threadless) awaited send drives name-mangled steps of the 5.x client's
    ``Producer``; a release that renamed one would silently fall back to the send pool, so the
    pinned client must have them all (docs/guide/async.md, "Awaitable sends")."""
    missing = [name for name in _SEND_STEPS if not hasattr(CheckingProducer, f"_Producer__{name}")]
    assert missing == []
