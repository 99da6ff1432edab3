"""A first transactional listener, end to end, on the embedded broker.

Run it from the repository root (after `make demo` or `make test` set up .venv):

    .venv/bin/python docs/guide/examples/first_listener.py

It starts an embedded broker in a child process on free ports, creates the topic (as an operator
does before a deployment), pays one order through the real RocketMQ client and prints what the
consumer received.  Against a real cluster, use its name server address and create the topic with
its own tools (`mqadmin updateTopic`).
"""

from __future__ import annotations

import queue
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import Any

from txmsg_broker import EmbeddedBroker
from txmsg_broker.testing import create_topic

from txmsg import ExecutorConfig, LocalTransactionState, Message, TxMsg, TxMsgConfig

WORK = Path(tempfile.mkdtemp(prefix="txmsg-first-"))

# The "business database": check_local must answer from durable state written by execute_local,
# never from memory (after a restart the check-back reaches a new process).
db = sqlite3.connect(WORK / "orders.db", check_same_thread=False, isolation_level=None)
db.execute("CREATE TABLE paid (order_id TEXT PRIMARY KEY, transaction_key TEXT UNIQUE)")
db_lock = threading.Lock()

received: queue.Queue[Any] = queue.Queue()


def build_app(name_server: str) -> TxMsg:
    app = TxMsg(TxMsgConfig(name_server=name_server, client_log_dir=str(WORK / "client-logs")))

    @app.transactional_listener(
        group="order-tx", topics=["orders"], executor=ExecutorConfig(concurrency=4)
    )
    class PayOrder:
        def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
            # runs in the sending thread, right after the broker stored the half message
            with db_lock:
                db.execute("INSERT INTO paid VALUES (?, ?)", (arg, message.transaction_key))
            return LocalTransactionState.COMMIT  # ROLLBACK / UNKNOW; raising = UNKNOW

        def check_local(self, message: Message) -> LocalTransactionState:
            # the broker asks again for transactions left UNKNOW (or whose answer was lost)
            with db_lock:
                row = db.execute(
                    "SELECT 1 FROM paid WHERE transaction_key = ?", (message.transaction_key,)
                ).fetchone()
            return LocalTransactionState.COMMIT if row else LocalTransactionState.UNKNOW

    @app.message_listener(topic="orders", group="points")
    def add_points(message: Message) -> None:  # return = consumed, raise = redelivered
        received.put(message.json())

    return app


def main() -> None:
    broker = EmbeddedBroker.spawn(WORK / "broker-data", WORK / "broker-logs")
    try:
        # before the app starts: its consumer and the producers' first heartbeat need the route
        create_topic(broker.namesrv_addr, "orders", message_type="TRANSACTION")
        with build_app(broker.namesrv_addr) as app:  # start(); close() on exit
            result = app.transactional_producer("order-tx").send_in_transaction(
                "orders", {"order": "o-1", "amount_cents": 1250}, arg="o-1", keys="o-1"
            )
            print("local transaction:", result.local_state, "key:", result.transaction_key)
            print("consumed:", received.get(timeout=60))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
