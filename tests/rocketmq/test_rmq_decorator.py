"""The decorator API end to end: @registry.transactional_listener / @registry.message_listener
on a module-style ListenerRegistry, included into a TxMsg (``app.include(registry)``), on the real
client (librocketmq 2.1.0) and the embedded broker (check interval 1 s, 3 checks at most)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from rmq_helpers import Calls, create_topic, unique, wait_until

from txmsg import ExecutorConfig, ListenerRegistry, LocalTransactionState, Message

S = LocalTransactionState


class Deliveries:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.bodies.append(message.body)

    def count(self, body: bytes) -> int:
        with self.lock:
            return self.bodies.count(body)


def _topic_and_consumer(txmsg_broker: Any, registry: ListenerRegistry) -> tuple[str, Deliveries]:
    topic = unique("dec_topic")
    create_topic(txmsg_broker.namesrv_addr, topic, "MIXED")
    deliveries = Deliveries()
    registry.add_message_listener(deliveries, topic=topic, group=unique("cg_dec"))
    return topic, deliveries


def test_commit_rollback_and_unknown_then_check(make_app: Any, txmsg_broker: Any) -> None:
    registry = ListenerRegistry()
    topic, deliveries = _topic_and_consumer(txmsg_broker, registry)
    checked: list[tuple[str | None, bytes]] = []
    group = unique("pg_paths")

    @registry.transactional_listener(group=group, topics=[topic])
    class Paths:
        def execute_local(self, message: Message, arg: Any) -> S:
            return {"commit": S.COMMIT, "rollback": S.ROLLBACK}.get(arg, S.UNKNOW)

        def check_local(self, message: Message) -> S:
            checked.append((message.transaction_key, message.body))
            return S.COMMIT if message.body == b"later" else S.ROLLBACK

    with make_app(registry) as app:
        producer = app.producer(group)
        committed = producer.send_in_transaction(topic, b"now", arg="commit")
        rolled = producer.send_in_transaction(topic, b"never", arg="rollback")
        pending = producer.send_in_transaction(topic, b"later", arg="unknown")
        assert (committed.local_state, rolled.local_state, pending.local_state) == (
            S.COMMIT,
            S.ROLLBACK,
            S.UNKNOW,
        )
        assert committed.send_status == "SEND_OK"
        wait_until(lambda: deliveries.count(b"later") == 1, timeout=30)
        assert deliveries.count(b"now") == 1
        # the check carried the send's transaction key; only the UNKNOW one was checked
        assert (pending.transaction_key, b"later") in checked
        assert {key for key, _ in checked} == {pending.transaction_key}
    assert deliveries.count(b"never") == 0


def test_check_backs_of_one_listener_run_concurrently(make_app: Any, txmsg_broker: Any) -> None:
    registry = ListenerRegistry()
    topic = unique("dec_ov")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    calls = Calls()
    group = unique("pg_ov")

    @registry.transactional_listener(
        group=group,
        topics=[topic],
        executor=ExecutorConfig(concurrency=4),
    )
    class Slow:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        def check_local(self, message: Message) -> S:
            start = time.monotonic()
            time.sleep(0.3)
            calls.record(message.transaction_key, start)
            return S.COMMIT

    with make_app(registry) as app:
        producer = app.producer(group)
        keys = {producer.send_in_transaction(topic, f"m{i}").transaction_key for i in range(8)}
        wait_until(lambda: keys <= calls.keys(), timeout=30)
    assert calls.max_overlap() >= 2
    assert calls.max_overlap() <= 4


def test_a_raising_check_local_answers_unknow_and_nothing_reaches_ctypes(
    make_app: Any, txmsg_broker: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    registry = ListenerRegistry()
    topic, deliveries = _topic_and_consumer(txmsg_broker, registry)
    group = unique("pg_raise")
    attempts: list[float] = []

    @registry.transactional_listener(group=group, topics=[topic])
    class Flaky:
        def execute_local(self, message: Message, arg: Any) -> Any:
            raise ValueError("local failure")  # -> UNKNOW (execute_exception_state)

        def check_local(self, message: Message) -> Any:
            attempts.append(time.monotonic())
            if len(attempts) == 1:
                raise RuntimeError("db down")
            if len(attempts) == 2:
                return "definitely"  # not a state: UNKNOW
            return S.COMMIT

    with make_app(registry) as app:
        result = app.producer(group).send_in_transaction(topic, b"flaky")
        assert result.local_state == S.UNKNOW
        wait_until(lambda: deliveries.count(b"flaky") == 1, timeout=30)
        assert len(attempts) == 3  # two UNKNOW answers made the broker ask again
    assert "Exception ignored on calling ctypes callback" not in capfd.readouterr().err


def test_close_with_checks_in_flight_waits_for_them(make_app: Any, txmsg_broker: Any) -> None:
    registry = ListenerRegistry()
    topic = unique("dec_close")
    create_topic(txmsg_broker.namesrv_addr, topic, "TRANSACTION")
    started = threading.Event()
    finished: list[float] = []
    group = unique("pg_close")

    @registry.transactional_listener(
        group=group, topics=[topic], executor=ExecutorConfig(concurrency=2)
    )
    class Slow:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        def check_local(self, message: Message) -> S:
            started.set()
            time.sleep(0.8)
            finished.append(time.monotonic())
            return S.ROLLBACK

    app = make_app(registry).start()
    producer = app.producer(group)
    for i in range(4):
        producer.send_in_transaction(topic, f"m{i}")
    assert started.wait(20)
    app.close(timeout=20)
    closed_at = time.monotonic()
    assert finished
    assert max(finished) <= closed_at
    assert all(s.shut_down for s in producer.sender.stats())


def test_a_failing_consumer_goes_to_the_dlq_after_max_reconsume(
    make_app: Any, txmsg_broker: Any
) -> None:
    registry = ListenerRegistry()
    topic, group = unique("dec_dlq"), unique("cg_dlq")
    create_topic(txmsg_broker.namesrv_addr, topic, "MIXED")
    create_topic(txmsg_broker.namesrv_addr, f"%DLQ%{group}")
    attempts: list[int] = []
    dead: list[Message] = []

    @registry.message_listener(topic=topic, group=group, max_reconsume=1)
    def always_fails(message: Message) -> None:
        attempts.append(message.reconsume_times)
        raise RuntimeError("cannot handle")

    registry.add_message_listener(dead.append, topic=f"%DLQ%{group}", group=unique("cg_dlq_reader"))

    @registry.transactional_listener(group=unique("pg_dlq"), topics=[topic])
    class Commit:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    with make_app(registry) as app:
        app.producer().send_in_transaction(topic, {"order": 1}, keys="o-1")
        wait_until(lambda: bool(dead), timeout=60)
    assert attempts == [0, 1]
    assert dead[0].json() == {"order": 1}
    assert dead[0].keys == "o-1"
