"""The manual clock (issue 36): the broker's time moves only when the test advances it.

Every test here asserts what must NOT happen before its time as well as what happens after: with
the manual clock both are decided by the broker's clock, not by how fast this machine runs, so
neither side needs a sleep.  Broker-side facts (a topic's max offset, the check-backs a request
reports) are read right after ``advance`` returns: it returns once what fell due has run.

The marker gives the real broker's timings: transactionTimeOut 6 s, check interval 60 s (4.9.8),
15 checks, real delay levels (level 3 = 10 s).  The first check pass is due one interval after the
broker started, i.e. at most 60 s after a send; a message's age is the time advanced since it was
sent (``txmsg_broker.clock``: the clock is raised to each stored message's birth).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from rocketmq.client import Message, TransactionStatus
from txmsg_broker.clock import ManualClock
from txmsg_broker.codec import (
    GET_MAX_OFFSET,
    LOCK_BATCH_MQ,
    REQUEST_CODE_NOT_SUPPORTED,
    SUCCESS,
)
from txmsg_broker.rawclient import call
from txmsg_broker.testing import Clients, create_topic, read_log, unique, wait_until
from txmsg_broker.time_control import TIME_CONTROL
from txmsg_broker.topics import OP_HALF_TOPIC

C, R, U = TransactionStatus.COMMIT, TransactionStatus.ROLLBACK, TransactionStatus.UNKNOWN


def max_offset(broker: Any, topic: str, queue_id: int = 0) -> int:
    response = call(broker.broker_addr, GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
    return int(response.ext_fields.get("offset", "0")) if response.code == SUCCESS else 0


def total(broker: Any, topic: str, queues: int = 4) -> int:
    return sum(max_offset(broker, topic, q) for q in range(queues))


def tx_message(topic: str, key: str, **props: str) -> Message:
    msg = Message(topic)
    msg.set_keys(key)
    msg.set_body(key.encode())
    for name, value in props.items():
        msg.set_property(name, value)
    return msg


@pytest.mark.txmsg_manual_clock(log_format=5)  # 5.x lines: one INFO line per check-back
def test_advance_runs_due_check_backs_in_order_and_none_early(txmsg_broker):
    topic = unique("ClockTx")
    create_topic(txmsg_broker.namesrv_addr, topic)
    checks: list[str] = []
    lock = threading.Lock()

    def checker(msg: Any) -> TransactionStatus:
        with lock:
            checks.append(msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys)
        return U

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(unique("ClockPG"), checker)
        for key in ("A", "B", "C"):
            producer.send_message_in_transaction(tx_message(topic, key), lambda m, a: U)
        clients.heartbeat(producer)

        # younger than transactionTimeOut (6 s) at every pass: "New arrived", nothing is checked
        assert txmsg_broker.advance(3).check_backs == 0
        assert checks == []
        # three check intervals in one advance: three passes, each at its own time, each checking
        # A, B, C back in half-queue order; all answered (UNKNOWN) before advance returned
        report = txmsg_broker.advance(3 * 60)
        assert report.check_backs == 9
        assert report.unanswered == ()
        assert sorted(checks) == ["A"] * 3 + ["B"] * 3 + ["C"] * 3
        lines = [
            line.split("uniqKey=")[1].split(",")[0]
            for line in read_log(txmsg_broker.log_dir).splitlines()
            if "Check transaction. real_topic=" in line
        ]
        assert len(lines) == 9
        assert lines[0:3] == lines[3:6] == lines[6:9]  # the same order in every pass
        assert len(set(lines[0:3])) == 3
        # nothing more before the next interval
        assert txmsg_broker.advance(30).check_backs == 0
        assert len(checks) == 9


@pytest.mark.txmsg_manual_clock
def test_check_now_runs_a_pass_at_once_and_transaction_timeout_follows_the_clock(txmsg_broker):
    topic = unique("ClockNow")
    create_topic(txmsg_broker.namesrv_addr, topic)
    checks: list[str] = []

    with Clients(txmsg_broker.namesrv_addr) as clients:
        consumer = clients.consumer(unique("ClockCG"), topic)
        producer = clients.transaction_producer(
            unique("ClockPG"), lambda m: checks.append("checked") or C
        )
        producer.send_message_in_transaction(tx_message(topic, "K"), lambda m, a: U)
        clients.heartbeat(producer)

        txmsg_broker.advance(3)
        report = txmsg_broker.check_now()  # age 3 s < transactionTimeOut 6 s: not yet
        assert (report.check_backs, checks) == (0, [])
        txmsg_broker.advance(4)
        report = txmsg_broker.check_now()  # age 7 s: checked back and committed
        assert (report.check_backs, report.unanswered, checks) == (1, (), ["checked"])
        assert total(txmsg_broker, topic) == 1  # committed before check_now returned
        wait_until(lambda: len(consumer) == 1, timeout=30, message="the committed message")


@pytest.mark.txmsg_manual_clock(check_interval_ms=5000)
def test_immunity_follows_the_clock(txmsg_broker):
    """CHECK_IMMUNITY_TIME_IN_SECONDS 20: passes inside the immunity re-put the message without a
    check-back (each uses up one check, apache/rocketmq#8311); the first pass after it checks back."""
    topic = unique("ClockImm")
    create_topic(txmsg_broker.namesrv_addr, topic)
    checks: list[str] = []

    with Clients(txmsg_broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(
            unique("ClockPG"), lambda m: checks.append("checked") or C
        )
        msg = tx_message(topic, "IMM", CHECK_IMMUNITY_TIME_IN_SECONDS="20")
        producer.send_message_in_transaction(msg, lambda m, a: U)
        clients.heartbeat(producer)

        assert txmsg_broker.advance(15).check_backs == 0  # ~3 passes, all inside the immunity
        assert checks == []
        report = txmsg_broker.advance(10)  # the pass after 20 s checks it back
        assert (report.check_backs, checks) == (1, ["checked"])
        assert total(txmsg_broker, topic) == 1


def test_op_batch_follows_the_clock(txmsg_broker_factory):
    """5.3.3 (transactionOpBatchInterval 3000): a commit's op record waits for the batch, which is
    written when the broker's clock says so - not before, however long the test takes."""
    broker = txmsg_broker_factory(broker_version="5.3.3", manual_clock=True)
    topic = unique("ClockOp")
    create_topic(broker.namesrv_addr, topic)
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(unique("ClockPG"), lambda m: C)
        producer.send_message_in_transaction(tx_message(topic, "OP"), lambda m, a: C)
        wait_until(lambda: total(broker, topic) == 1, timeout=30, message="the commit")
        broker.advance(1)
        assert max_offset(broker, OP_HALF_TOPIC) == 0  # the batch is not due yet
        broker.advance(6)  # at most two intervals after the first op
        assert max_offset(broker, OP_HALF_TOPIC) == 1


@pytest.mark.txmsg_manual_clock
def test_delay_levels_fire_on_advance_not_before(txmsg_broker):
    topic = unique("ClockDelay")
    create_topic(txmsg_broker.namesrv_addr, topic)
    with Clients(txmsg_broker.namesrv_addr) as clients:
        received = clients.consumer(unique("ClockCG"), topic)
        producer = clients.producer()
        msg = Message(topic)
        msg.set_keys("D")
        msg.set_body(b"later")
        msg.set_delay_time_level(3)  # 10 s
        producer.send_sync(msg)

        txmsg_broker.advance(9)
        assert total(txmsg_broker, topic) == 0  # still in SCHEDULE_TOPIC_XXXX
        assert received == []
        txmsg_broker.advance(1.5)
        assert total(txmsg_broker, topic) == 1  # handed to the push path when advance returned
        wait_until(lambda: [r.keys for r in received] == ["D"], timeout=30, message="delivery")


@pytest.mark.txmsg_manual_clock
def test_queue_locks_expire_on_the_clock(txmsg_broker):
    """rebalanceLockMaxLiveTime (60 s): a lock not renewed is free once the clock passed it."""
    group, topic = unique("LockG"), unique("LockT")
    mq = [{"topic": topic, "brokerName": "broker-a", "queueId": 0}]

    def lock(client: str) -> list[Any]:
        body = json.dumps({"consumerGroup": group, "clientId": client, "mqSet": mq}).encode()
        return list(
            json.loads(call(txmsg_broker.broker_addr, LOCK_BATCH_MQ, body=body).body)["lockOKMQSet"]
        )

    assert lock("c1") == mq
    txmsg_broker.advance(59)
    assert lock("c2") == []  # c1's lock still lives
    txmsg_broker.advance(2)
    assert lock("c2") == mq


def test_a_wall_clock_broker_has_no_time_control(txmsg_broker):
    response = call(txmsg_broker.broker_addr, TIME_CONTROL, {"action": "now"})
    assert response.code == REQUEST_CODE_NOT_SUPPORTED


def test_manual_clock_runs_waits_in_due_order_each_at_its_time() -> None:
    asyncio.run(_due_order())


async def _due_order() -> None:
    clock = ManualClock(start_ms=1_000_000)
    seen: list[tuple[str, int]] = []
    wake = asyncio.Event()

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        seen.append((name, clock.now()))

    async def waiter() -> None:
        woke = await clock.wait(wake, 100)
        seen.append((f"waiter {woke}", clock.now()))

    tasks = [
        asyncio.create_task(sleeper("b", 2)),
        asyncio.create_task(sleeper("a", 1)),
        asyncio.create_task(sleeper("c", 5)),
        asyncio.create_task(waiter()),
    ]
    await clock.advance(0.999)
    assert seen == []
    assert await clock.advance(3) == 1_003_999
    assert seen == [("a", 1_001_000), ("b", 1_002_000)]
    wake.set()
    await clock.settle()
    assert seen[-1] == ("waiter True", 1_003_999)
    clock.observe(500)  # an old birth never moves the clock back
    assert clock.now() == 1_003_999
    await clock.advance(10)
    assert seen[-1] == ("c", 1_005_000)
    await asyncio.gather(*tasks)


@pytest.mark.txmsg_manual_clock
def test_grpc_check_backs_are_answered_before_advance_returns(txmsg_grpc_broker, tmp_path):
    """The 5.x client (txmsg's rocketmq5 backend) as 5.3.3 (check interval 30 s): its check answer
    comes by the EndTransaction RPC, and advance waits for it as for a remoting one."""
    from txmsg import LocalTransactionState, TxMsg, TxMsgConfig  # noqa: PLC0415 - this test only

    topic, group = unique("ClockGrpc"), unique("ClockGrpcPG")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    checked: list[int] = []
    app = TxMsg(TxMsgConfig(backend="rocketmq5", endpoints=txmsg_grpc_broker.grpc_endpoint))

    @app.transactional_listener(group=group, topics=[topic])
    class Listener:
        def execute_local(self, message: Any, arg: Any) -> LocalTransactionState:
            raise TimeoutError("outcome unknown")

        def check_local(self, message: Any) -> LocalTransactionState:
            checked.append(message.json()["n"])
            return LocalTransactionState.ROLLBACK

    with app:
        producer = app.producer(group)
        producer.send_in_transaction(topic, {"n": 1})
        assert txmsg_grpc_broker.advance(3).check_backs == 0  # 5.x births: whole seconds
        report = txmsg_grpc_broker.advance(40)
        assert (report.check_backs, report.unanswered, checked) == (1, (), [1])
        assert txmsg_grpc_broker.advance(60).check_backs == 0  # rolled back: never again


def test_a_5x_check_pass_logs_how_far_it_got(txmsg_broker_factory):
    """5.3.3 writes ``After check, MessageQueue [topic=RMQ_SYS_TRANS_HALF_TOPIC, ...] msgOffset=N``
    after each pass (4.9.8 does not). ``msgOffset`` moves one per half message and one per half
    message put back for a check-back, so its progress minus the check-backs sent is the
    transactions begun: what the health job counts a 5.x broker's transactions by (real 5.3.3
    logs: 522 - 248 = 274). Here: 5 transactions, checked until the maximum (the test timings'
    op batch outlasts transactionTimeOut, so the committed ones are checked too, as on a real 5.x
    broker so configured: the count does not matter, the identity does)."""
    broker = txmsg_broker_factory(
        broker_version="5.3.3", log_format=5, check_max=3, manual_clock=True
    )
    marker = "After check, MessageQueue [topic=RMQ_SYS_TRANS_HALF_TOPIC"

    def after_lines() -> list[str]:
        log = read_log(broker.log_dir, "transaction.log")
        return [ln for ln in log.splitlines() if marker in ln]

    for _ in range(120):  # a first pass over the empty queue, as on a broker started earlier
        if after_lines():
            break
        broker.advance(1)
    topic = unique("ClockAfter")
    create_topic(broker.namesrv_addr, topic)
    with Clients(broker.namesrv_addr) as clients:
        producer = clients.transaction_producer(unique("ClockPG"), lambda m: U)
        for key, state in (("C1", C), ("C2", C), ("R1", R), ("U1", U), ("U2", U)):
            producer.send_message_in_transaction(tx_message(topic, key), lambda m, a, s=state: s)
        clients.heartbeat(producer)
        sent = 0
        for _ in range(240):  # one second at a time until both are discarded
            sent += broker.advance(1).check_backs
            if read_log(broker.log_dir).count("checked too many times") >= 5:
                break
        broker.advance(60)  # a pass after the last re-put
    after = after_lines()
    offsets = [int(ln.split(" msgOffset=")[1].split(" ", 1)[0]) for ln in after]
    checks = read_log(broker.log_dir).count("Check transaction. real_topic=")
    assert checks == sent > 0
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    assert offsets[-1] - offsets[0] - checks == 5
