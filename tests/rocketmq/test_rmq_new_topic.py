"""Issue 12's real-broker failure, on the embedded broker: a transactional listener whose topic does
not exist before the service starts (the first send auto-creates it), every local transaction left
UNKNOW, a short check interval and 3 checks at most.

On a real Apache RocketMQ 4.9.8 broker txmsg lost all 64 such transactions: the start-up announcement
subscribed a consumer to a topic without a route, so no heartbeat reached the broker, nothing
announced the group after the first send either, and every check-back failed with ``Check
transaction failed, channel table is empty`` until librocketmq's 30 s heartbeat - after the broker
had discarded them.  The embedded broker used to create the topic on the route query, which hid it.
"""

from __future__ import annotations

import threading
from typing import Any

from rmq_helpers import unique, wait_until
from txmsg_broker.testing import read_log

from txmsg import ExecutorConfig, LocalTransactionState, Message

S = LocalTransactionState


def test_unknow_transactions_on_a_topic_created_by_the_first_send_are_all_checked(
    txmsg_broker_factory: Any, app_on: Any
) -> None:
    # the scenario of real-broker-observations: interval 2 s, timeout 2 s, check max 3 (here 1 s)
    broker = txmsg_broker_factory(transaction_timeout_ms=1000, check_interval_ms=1000, check_max=3)
    app = app_on(broker.namesrv_addr)
    topic, group = unique("nt_topic"), unique("pg_nt")
    checked: set[str] = set()
    lock = threading.Lock()

    @app.transactional_listener(group=group, topics=[topic], executor=ExecutorConfig(concurrency=4))
    class Later:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        def check_local(self, message: Message) -> S:
            with lock:
                checked.add(message.transaction_key or "")
            return S.COMMIT

    def failures() -> str:
        missed = read_log(broker.log_dir, "broker.log").count(
            f"Check transaction failed, channel table is empty. groupId={group}"
        )
        discarded = read_log(broker.log_dir).count("has been checked too many times")
        return (
            f"check_local for all {len(keys)} UNKNOW transactions ({len(keys - checked)} never reached "
            f"it; the broker found no channel of {group} {missed} times and discarded {discarded})"
        )

    with app:
        producer = app.producer(group)
        keys = {
            producer.send_in_transaction(topic, f"m{i}".encode()).transaction_key for i in range(16)
        }
        wait_until(lambda: keys <= checked, timeout=20, message=failures)
        # the close may land near librocketmq's first route refresh (~3 s after start): the
        # backend's own guard (txmsg_rocketmq.timers.when_quiet) shuts each factory down outside
        # its timers' windows, so the test needs no sleep of its own to get past it
    log = read_log(broker.log_dir, "broker.log")
    assert f"Check transaction failed, channel table is empty. groupId={group}" not in log, (
        failures()
    )
