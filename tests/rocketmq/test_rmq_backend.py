"""RocketMQBackend with the real librocketmq 2.1.0 against the embedded broker.

These drive the backend directly (handlers in place of the core's CheckDispatcher) so each
property of the client pool is checked on its own; tests/contract goes through the decorator
API on both backends.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rmq_helpers import Calls, create_topic, unique, wait_until
from txmsg_rocketmq import pool as pool_module

from tests.clockwork import advance_until, consumed, stored
from txmsg.executor import ExecutorConfig
from txmsg.listener import ListenerSpec
from txmsg.message import Message, OutgoingMessage
from txmsg.producer import TransactionalProducer
from txmsg.states import LocalTransactionState as S


def _send_unknown(pool: Any, topic: str, count: int) -> list[str]:
    keys = []
    for i in range(count):
        _, key, status, _ = pool.send_in_transaction(
            OutgoingMessage(topic=topic, body=f"m{i}".encode(), keys=f"k{i}"), lambda m: S.UNKNOW
        )
        assert status == "SEND_OK"
        keys.append(key)
    return keys


def test_every_instance_heartbeats_before_the_first_send(backend: Any, txmsg_broker: Any) -> None:
    """Check-backs need the broker to know each channel; a real broker learns it from
    heartbeats only, so the pool must heartbeat every instance itself (not wait 30 s)."""
    topic, group = unique("hb_topic"), unique("hb_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    pool = backend.create_transactional_sender(
        group, lambda m: S.COMMIT, check_concurrency=3, topics=[topic]
    )
    log = Path(txmsg_broker.log_dir, "broker.log").read_text()
    registered = re.findall(
        rf"HeartbeatThread_\d+ - new producer connected, group: {group} .*?clientId=([^,]+)", log
    )
    names = {inst.name for inst in pool.instances}
    assert len(names) == 3
    assert {cid.split("#", 1)[1] for cid in registered} == names


def test_check_backs_of_one_group_overlap_with_several_instances(
    backend: Any, txmsg_broker: Any
) -> None:
    topic, group = unique("ov_topic"), unique("ov_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    calls = Calls()

    def check(message: Message) -> S:
        start = time.monotonic()
        time.sleep(0.3)
        calls.record(message.transaction_key, start)
        return S.COMMIT

    pool = backend.create_transactional_sender(group, check, check_concurrency=4, topics=[topic])
    keys = _send_unknown(pool, topic, 8)
    wait_until(lambda: set(keys) <= calls.keys(), timeout=30)
    assert calls.threads() == 4  # one native check thread per instance
    assert calls.max_overlap() >= 2


def test_one_instance_checks_strictly_serially(backend: Any, txmsg_broker: Any) -> None:
    """The librocketmq limitation the pool exists for (control for the test above)."""
    topic, group = unique("serial_topic"), unique("serial_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    calls = Calls()

    def check(message: Message) -> S:
        start = time.monotonic()
        time.sleep(0.1)
        calls.record(message.transaction_key, start)
        return S.COMMIT

    pool = backend.create_transactional_sender(group, check, check_concurrency=1, topics=[topic])
    keys = _send_unknown(pool, topic, 4)
    wait_until(lambda: set(keys) <= calls.keys(), timeout=30)
    assert calls.max_overlap() == 1


def test_keys_are_str_and_the_transaction_key_is_uniq_key(backend: Any, txmsg_broker: Any) -> None:
    topic, group = unique("key_topic"), unique("key_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    seen: dict[str, Message] = {}

    def check(message: Message) -> S:
        seen["check"] = message
        return S.ROLLBACK

    def execute(message: Message) -> S:
        seen["execute"] = message
        return S.UNKNOW

    pool = backend.create_transactional_sender(group, check, check_concurrency=1, topics=[topic])
    msg_id, key, _, _ = pool.send_in_transaction(
        OutgoingMessage(topic=topic, body=b"b", keys="order-7", tags="t", properties={"p": "v"}),
        execute,
    )
    wait_until(lambda: "check" in seen, timeout=20)
    for message in (seen["execute"], seen["check"]):
        assert message.keys == "order-7"
        assert isinstance(message.keys, str)
        assert message.tags == "t"
        assert message.properties["p"] == "v"
        assert message.properties["UNIQ_KEY"] == key == message.transaction_key
    assert msg_id == key


@pytest.mark.txmsg_manual_clock(transaction_timeout_ms=1000, check_interval_ms=1000, check_max=3)
def test_an_exception_in_a_check_never_reaches_ctypes(
    backend: Any, txmsg_broker: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """The handler raising must answer UNKNOW (so the broker checks again), never COMMIT."""
    topic, group = unique("exc_topic"), unique("exc_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    calls: list[str | None] = []

    def check(message: Message) -> S:
        calls.append(message.transaction_key)
        if len(calls) == 1:
            raise RuntimeError("database down")
        if len(calls) == 2:
            raise SystemExit(1)
        return S.ROLLBACK

    pool = backend.create_transactional_sender(group, check, check_concurrency=1, topics=[topic])
    (key,) = _send_unknown(pool, topic, 1)
    # Checked again after each failure: the broker got UNKNOW twice, not a garbage COMMIT (the
    # broker's passes on its manual clock, each answer applied before the next)
    advance_until(txmsg_broker, lambda: len(calls) >= 3, message=lambda: f"3 checks, got {calls}")
    assert set(calls) == {key}
    assert "Exception ignored on calling ctypes callback" not in capfd.readouterr().err


def test_close_waits_for_check_callbacks_in_flight(backend: Any, txmsg_broker: Any) -> None:
    topic, group = unique("close_topic"), unique("close_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    started = threading.Event()
    finished: list[float] = []

    def check(message: Message) -> S:
        started.set()
        # in flight until close has begun (an event, not a 1 s sleep): close must wait for it
        wait_until(lambda: pool._closed, timeout=20, message="pool.close() to begin")
        finished.append(time.monotonic())
        return S.COMMIT

    pool = backend.create_transactional_sender(group, check, check_concurrency=2, topics=[topic])
    _send_unknown(pool, topic, 4)
    assert started.wait(20)
    pool.close(timeout=20)
    closed_at = time.monotonic()
    assert finished
    assert max(finished) <= closed_at
    assert all(s.shut_down and s.in_flight_checks == 0 for s in pool.stats())
    with pytest.raises(Exception, match="clos"):
        _send_unknown(pool, topic, 1)


def test_close_timeout_leaves_a_busy_instance_running_instead_of_crashing(
    backend: Any, txmsg_broker: Any
) -> None:
    topic, group = unique("busy_topic"), unique("busy_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    started, release = threading.Event(), threading.Event()

    def check(message: Message) -> S:
        started.set()
        release.wait(20)
        return S.COMMIT

    pool = backend.create_transactional_sender(group, check, check_concurrency=1, topics=[topic])
    _send_unknown(pool, topic, 1)
    assert started.wait(20)
    pool.close(timeout=0.2)
    assert [s.shut_down for s in pool.stats()] == [False]
    # kept alive by the module even if the application drops the pool: C++ still holds its thunks
    assert set(pool.instances) <= pool_module._STILL_RUNNING
    release.set()
    pool.close(timeout=20)  # a second close finishes the job once the check returned
    assert [s.shut_down for s in pool.stats()] == [True]
    assert not set(pool.instances) & pool_module._STILL_RUNNING


def test_consumer_handler_result_maps_to_ack_or_redelivery(backend: Any, txmsg_broker: Any) -> None:
    topic, group = unique("c_topic"), unique("c_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "MIXED")
    deliveries: dict[bytes, int] = {}
    lock = threading.Lock()

    def handle(message: Message) -> bool:
        with lock:
            deliveries[message.body] = deliveries.get(message.body, 0) + 1
            return message.body == b"ok" or deliveries[message.body] >= 3

    stop = backend.subscribe(topic, group, handle, concurrency=2)
    pool = backend.create_transactional_sender(
        unique("cp_group"), lambda m: S.COMMIT, check_concurrency=1
    )
    for body in (b"ok", b"flaky"):
        pool.send_in_transaction(OutgoingMessage(topic=topic, body=body), lambda m: S.COMMIT)
    wait_until(lambda: deliveries.get(b"flaky", 0) >= 3 and b"ok" in deliveries, timeout=60)
    stop()  # waits for the consume threads; the client commits its offsets as it shuts down
    assert deliveries == {b"ok": 1, b"flaky": 3}
    # nothing more could arrive (what a 1 s sleep hoped for): both False answers and no other were
    # sent back for redelivery, and True acknowledged - the group's offsets are past both messages
    # and both redeliveries
    assert stored(txmsg_broker.broker_addr, f"%RETRY%{group}") == 2
    assert consumed(txmsg_broker.broker_addr, group, topic) == 2
    assert consumed(txmsg_broker.broker_addr, group, f"%RETRY%{group}") == 2


def test_consumer_moves_a_message_to_the_dlq_after_max_reconsume(
    backend: Any, txmsg_broker: Any
) -> None:
    topic, group = unique("dlq_topic"), unique("dlq_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "MIXED")
    create_topic(txmsg_broker.namesrv_addr, f"%DLQ%{group}")
    attempts: list[int] = []
    dead: list[Message] = []
    backend.subscribe(
        topic, group, lambda m: attempts.append(m.reconsume_times) and False, max_reconsume=2
    )
    backend.subscribe(f"%DLQ%{group}", unique("dlq_reader"), lambda m: dead.append(m) or True)
    pool = backend.create_transactional_sender(
        unique("dp_group"), lambda m: S.COMMIT, check_concurrency=1
    )
    pool.send_in_transaction(
        OutgoingMessage(topic=topic, body=b"poison", keys="p-1", properties={"order": "9"}),
        lambda m: S.COMMIT,
    )
    wait_until(lambda: bool(dead), timeout=60)
    assert attempts == [0, 1, 2]
    (letter,) = dead
    assert letter.body == b"poison"
    assert letter.keys == "p-1"
    assert letter.properties["order"] == "9"
    assert letter.properties["RETRY_TOPIC"] == topic


def test_closing_a_group_with_a_deep_queue_of_re_checks(backend: Any, txmsg_broker: Any) -> None:
    """One slow instance, many pending transactions, 1 s check interval: the native check queue
    holds dozens of re-checks when close() runs.  librocketmq deletes the client factory before
    it stops the check thread, so this crashed the process before the keeper client existed."""
    topic, group = unique("deep_topic"), unique("deep_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    calls = Calls()

    def check(message: Message) -> S:
        start = time.monotonic()
        time.sleep(0.1)
        calls.record(message.transaction_key, start)
        return S.COMMIT

    pool = backend.create_transactional_sender(group, check, check_concurrency=1, topics=[topic])
    keys = _send_unknown(pool, topic, 30)
    # the broker has re-checked some transactions while their first check was still queued
    wait_until(lambda: len(calls.spans) > len(calls.keys()), timeout=30)
    pool.close(timeout=20)
    assert [s.shut_down for s in pool.stats()] == [True]
    assert calls.keys() <= set(keys)


def test_undeclared_topic_reaches_every_instance_then_threads_stick(
    backend: Any, txmsg_broker: Any
) -> None:
    """Without declared topics each instance learns the routes from a send of its own (then
    heartbeats through the announce producer); after that a thread keeps one instance."""
    topic, group = unique("rr_topic"), unique("rr_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    pool = backend.create_transactional_sender(group, lambda m: S.COMMIT, check_concurrency=3)
    for _ in range(9):
        pool.send_in_transaction(OutgoingMessage(topic=topic, body=b"x"), lambda m: S.COMMIT)
    sends = sorted(s.sends for s in pool.stats())
    assert sends[0] >= 1  # every instance sent at least once
    assert sends[-1] == 9 - 2  # the rest stuck to one instance
    names = {inst.name for inst in pool.instances}

    def announced() -> set[str]:
        log = Path(txmsg_broker.log_dir, "broker.log").read_text()
        found = re.findall(
            r"HeartbeatThread_\d+ - new producer connected, group: TXMSG_ANNOUNCE .*?clientId=([^,]+)",
            log,
        )
        return {cid.split("#", 1)[1] for cid in found}

    wait_until(lambda: names <= announced(), timeout=20)


class _Blocking:
    """check_local holds every check until released and records how many run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.running = 0
        self.most = 0
        self.keys: set[str | None] = set()

    def execute_local(self, message: Message, arg: Any) -> S:
        return S.UNKNOW

    def check_local(self, message: Message) -> S:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.keys.add(message.transaction_key)
        try:
            assert self.release.wait(60), "the test never released the checks"
            return S.ROLLBACK
        finally:
            with self.lock:
                self.running -= 1


def test_default_executor_opens_exactly_concurrency_instances_and_runs_that_many_checks(
    backend: Any, txmsg_broker: Any
) -> None:
    """The default ExecutorConfig (concurrency 8): the group opens exactly 8 client instances,
    8 check-backs run at once, none waits behind another and none is refused.  (Before 1.0 the
    defaults opened 16 instances and ran 8 checks at once.)"""
    topic, group = unique("conc_topic"), unique("conc_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    listener = _Blocking()
    spec = ListenerSpec(group=group, target=_Blocking, topics=(topic,))
    producer = TransactionalProducer.create(backend, spec, listener)
    try:
        n = ExecutorConfig().concurrency
        assert n == 8
        assert len(producer.sender.instances) == n  # no idle instance, no cap
        for i in range(2 * n):  # more pending transactions than instances
            assert producer.send_in_transaction(topic, f"m{i}").local_state is S.UNKNOW
        # Every instance's native thread ends up blocked in one check, so n run at once.
        wait_until(
            lambda: listener.running == n,
            timeout=60,
            message=lambda: f"{n} checks at once (running {listener.running})",
        )
        assert listener.most == n  # never more than the instances (and threads) allow
        s = producer.executor.stats()
        assert (s.threads, s.active, s.rejected, s.caller_ran) == (n, n, 0, 0)
        assert producer.dispatcher.stats().rejected == 0
    finally:
        listener.release.set()
        producer.close(timeout=30)


def test_check_concurrency_is_the_number_of_instances(backend: Any) -> None:
    for n in (1, 3):
        pool = backend.create_transactional_sender(
            unique("n_group"), lambda m: S.COMMIT, check_concurrency=n
        )
        assert len(pool.instances) == n
    assert not hasattr(backend, "max_instances_per_group")
    with pytest.raises(ValueError, match="check_concurrency must be"):
        backend.create_transactional_sender(
            unique("zero_group"), lambda m: S.COMMIT, check_concurrency=0
        )
