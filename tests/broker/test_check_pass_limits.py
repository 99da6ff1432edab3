"""Two limits of Java's transaction check pass (``TransactionalMessageServiceImpl.check``, read at
``rocketmq-all-4.9.8`` and ``rocketmq-all-5.3.3``; docs/rocketmq-facts.md):

* ``needSkip``: a half message born more than ``fileReservedTime`` hours ago is discarded like one
  checked ``transactionCheckMax`` times, without a check-back;
* ``MAX_PROCESS_TIME_LIMIT``: one pass stops after 60 s and the next goes on where it stopped.

``fileReservedTime`` 0 makes every half message "old" at the first pass that reads it; the pass
limit is lowered through the broker's hidden ``--max-process-time-ms`` (a Java constant).
"""

from __future__ import annotations

import threading

from rocketmq.client import Message, TransactionStatus
from txmsg_broker.store import MessageStore
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until
from txmsg_broker.topics import CHECK_MAX_TIME_TOPIC

C, U = TransactionStatus.COMMIT, TransactionStatus.UNKNOWN


def _message(topic: str, key: str) -> Message:
    msg = Message(topic)
    msg.set_keys(key)
    msg.set_body(f"body-{key}".encode())
    return msg


def test_half_message_past_file_reserved_time_is_discarded_without_a_check(txmsg_broker_factory):
    # manual clock (issue 36): the passes run when the test advances it, not on a loaded machine's time
    broker = txmsg_broker_factory(broker_version="4.9.8", file_reserved_time=0, manual_clock=True)
    topic = unique("TxReserved")
    create_topic(broker.namesrv_addr, topic)
    checks: list[str] = []
    with Clients(broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("TxReservedCG"), topic)
        producer = clients.transaction_producer(
            unique("TxReservedPG"), lambda m: checks.append("check") or C
        )
        producer.send_message_in_transaction(_message(topic, "OLD"), lambda m, a: U)
        producer.send_message_in_transaction(_message(topic, "DONE"), lambda m, a: C)
        clients.heartbeat(producer)
        assert broker.advance(1.5).check_backs == 0  # the first pass discards OLD unchecked
        discarded = clients.consumer_when_routed(
            unique("TxReservedDiscardCG"), CHECK_MAX_TIME_TOPIC
        )
        wait_until(lambda: [r.keys for r in discarded] == ["OLD"], timeout=30)
        wait_until(lambda: [r.keys for r in delivered] == ["DONE"], timeout=10)
        # two more check intervals: no check-back (answered before advance returns), nothing moved
        assert broker.advance(2).check_backs == 0
        assert checks == []
        assert [r.keys for r in discarded] == ["OLD"]
        assert [r.keys for r in delivered] == ["DONE"]
    assert "Half message exceed file reserved time ,so skip it." in read_log(broker.log_dir)


def test_a_pass_stops_at_the_process_time_limit_and_the_next_goes_on(txmsg_broker_factory):
    # all 200 become due together (sent well within the 6-s timeout, even on a loaded machine),
    # so one pass has all of them to check and cannot finish within 1 ms (a quiet CI run checked
    # 40 of them in one pass of 1 ms, which the limit, "more than 1 ms", lets through)
    broker = txmsg_broker_factory(
        broker_version="4.9.8", max_process_time_ms=1, check_max=15, transaction_timeout_ms=6000
    )
    topic = unique("TxPassLimit")
    create_topic(broker.namesrv_addr, topic)
    keys = [f"K{n}" for n in range(200)]
    checked: set[str] = set()
    lock = threading.Lock()

    def checker(msg):
        key = msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys
        with lock:
            checked.add(key)
        return C

    with Clients(broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("TxPassLimitCG"), topic)
        producer = clients.transaction_producer(unique("TxPassLimitPG"), checker)
        for key in keys:
            producer.send_message_in_transaction(_message(topic, key), lambda m, a: U)
        clients.heartbeat(producer)
        wait_until(
            lambda: sorted(r.keys for r in delivered) == sorted(keys),
            timeout=90,
            message=lambda: f"every transaction checked and committed; {len(checked)} checked",
        )
    log = read_log(broker.log_dir)
    assert "process time reach max=1" in log
    # the limit split the work over several passes, each ended by it or by the end of the queue
    assert log.count("Begin to check prepare message") >= 2
    broker.stop()
    with MessageStore(broker.data_dir) as store:
        assert store.max_offset(CHECK_MAX_TIME_TOPIC, 0) == 0  # nothing discarded on the way
