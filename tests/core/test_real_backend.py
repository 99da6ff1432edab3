"""The core over the real backend (librocketmq 2.1.0) and the embedded broker: one contract check.

Everything else in tests/core uses the test double; this makes sure the double's shape matches
the real thing: arg by closure, UNKNOW at send then a check-back on the listener's executor,
a consumer receiving both messages with the same transaction key.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from txmsg_broker.testing import create_topic, wait_until

from txmsg import LocalTransactionState as S
from txmsg import Message, TxMsg, TxMsgConfig

pytest.importorskip("txmsg_rocketmq")


def test_send_check_and_consume_end_to_end(txmsg_broker: Any) -> None:
    # the consumer starts before the first send: create the topic first, as on a real cluster
    create_topic(txmsg_broker.namesrv_addr, "CoreE2E")
    config = TxMsgConfig(
        name_server=txmsg_broker.namesrv_addr,
        client_log_dir=os.environ.get("ROCKETMQ_CLIENT_LOG_DIR", "var/rocketmq-client"),
    )
    app = TxMsg(config)
    marker = object()
    seen_args: list[object] = []
    checks: list[tuple[str | None, str]] = []
    consumed: list[tuple[bytes, str | None]] = []

    @app.transactional_listener(
        group="core-e2e-tx", topics=["CoreE2E"], executor={"concurrency": 2}
    )
    class Listener:
        def execute_local(self, message: Message, arg: object) -> S:
            seen_args.append(arg)
            return S.UNKNOW if message.body == b"later" else S.COMMIT

        def check_local(self, message: Message) -> S:
            checks.append((message.transaction_key, threading.current_thread().name))
            return S.COMMIT

    @app.message_listener(topic="CoreE2E", group="core-e2e-consumer")
    def consume(message: Message) -> None:
        consumed.append((message.body, message.transaction_key))

    with app:
        producer = app.producer()
        now = producer.send_in_transaction("CoreE2E", b"now", arg=marker)
        later = producer.send_in_transaction("CoreE2E", b"later", arg=marker)
        assert (now.local_state, later.local_state) == (S.COMMIT, S.UNKNOW)
        assert seen_args == [marker, marker]
        wait_until(
            lambda: len(consumed) >= 2,
            timeout=60,
            message=lambda: f"both messages; consumed {consumed}",
        )
    assert sorted(consumed) == sorted(
        [(b"now", now.transaction_key), (b"later", later.transaction_key)]
    )
    assert checks
    assert checks[0][0] == later.transaction_key
    assert checks[0][1].startswith("txmsg-core-e2e-tx")
