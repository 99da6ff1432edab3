"""Testing a transactional listener against the embedded broker (the ``txmsg_broker`` fixture).

Run it from the repository root:

    .venv/bin/python -m pytest docs/guide/examples/test_pay_order.py -q -p no:cacheprovider

The fixture starts a broker in a child process on free ports with short check timings
(transactionTimeOut 1 s, check interval 1 s, 3 checks), so a check-back happens within seconds.
Create the topic before the app starts, as an operator does before a deployment: a topic without
a route leaves the consumer and the producers' first heartbeat with no broker to talk to, and the
broker would find no producer to check back until librocketmq's next heartbeat (30 s).
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

from txmsg_broker.testing import create_topic

from txmsg import LocalTransactionState, Message, TxMsg, TxMsgConfig


def test_only_committed_orders_are_delivered(txmsg_broker: Any, tmp_path: Path) -> None:
    create_topic(txmsg_broker.namesrv_addr, "orders", message_type="TRANSACTION")
    paid: set[str] = set()  # stands for the business table
    checked = threading.Event()
    received: queue.Queue[Any] = queue.Queue()
    app = TxMsg(
        TxMsgConfig(name_server=txmsg_broker.namesrv_addr, client_log_dir=str(tmp_path / "client"))
    )

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
            if arg == "o-2":
                raise RuntimeError("payment declined")  # answered UNKNOW: the broker checks back
            paid.add(message.transaction_key or "")
            return LocalTransactionState.COMMIT

        def check_local(self, message: Message) -> LocalTransactionState:
            checked.set()
            if message.transaction_key in paid:
                return LocalTransactionState.COMMIT
            return LocalTransactionState.ROLLBACK

    @app.message_listener(topic="orders", group="points")
    def add_points(message: Message) -> None:
        received.put(message.json()["order"])

    with app:
        producer = app.producer("order-tx")
        first = producer.send_in_transaction("orders", {"order": "o-1"}, arg="o-1")
        second = producer.send_in_transaction("orders", {"order": "o-2"}, arg="o-2")
        assert first.local_state is LocalTransactionState.COMMIT
        assert second.local_state is LocalTransactionState.UNKNOW
        assert received.get(timeout=60) == "o-1"
        assert checked.wait(timeout=60), "the broker did not check back o-2"
        assert received.empty()  # o-2 was rolled back by its check-back: never delivered
