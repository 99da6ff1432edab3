"""Testing ``check_local`` without waiting for it: the broker's manual clock.

Run it from the repository root:

    .venv/bin/python -m pytest docs/guide/examples/test_check_local_manual_clock.py -q -p no:cacheprovider

The marker ``txmsg_manual_clock`` starts the fixture's broker with a clock that moves only when
the test says so, and with the real broker's timings (transactionTimeOut 6 s, check interval 60 s):
``txmsg_broker.advance(seconds)`` runs every check pass that falls due and returns once the
check-backs were answered, so the test asserts right after it, in milliseconds of wall time.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_topic

from txmsg import LocalTransactionState, Message, TxMsg, TxMsgConfig


@pytest.mark.txmsg_manual_clock
def test_check_local_settles_orders_whose_outcome_was_unknown(
    txmsg_broker: Any, tmp_path: Path
) -> None:
    create_topic(txmsg_broker.namesrv_addr, "orders", message_type="TRANSACTION")
    paid = {"o-1"}  # stands for the business table: o-1 was paid, o-2 was not
    checked: list[str] = []
    received: queue.Queue[Any] = queue.Queue()
    app = TxMsg(
        TxMsgConfig(name_server=txmsg_broker.namesrv_addr, client_log_dir=str(tmp_path / "client"))
    )

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
            raise TimeoutError("the database did not answer")  # UNKNOW: the broker checks back

        def check_local(self, message: Message) -> LocalTransactionState:
            order = message.json()["order"]
            checked.append(order)
            return LocalTransactionState.COMMIT if order in paid else LocalTransactionState.ROLLBACK

    @app.message_listener(topic="orders", group="points")
    def add_points(message: Message) -> None:
        received.put(message.json()["order"])

    with app:
        producer = app.producer("order-tx")
        for order in ("o-1", "o-2"):
            result = producer.send_in_transaction("orders", {"order": order})
            assert result.local_state is LocalTransactionState.UNKNOW

        # younger than transactionTimeOut: no check pass may ask about them yet
        assert txmsg_broker.advance(5).check_backs == 0
        assert checked == []

        # within one check interval the broker asks; advance returns once both were answered
        report = txmsg_broker.advance(60)
        assert report.check_backs == 2
        assert report.unanswered == ()
        assert sorted(checked) == ["o-1", "o-2"]

        assert received.get(timeout=30) == "o-1"  # committed by its check-back
        assert received.empty()  # o-2 was rolled back before advance returned: never delivered
