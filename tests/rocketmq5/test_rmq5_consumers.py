"""Issue 14 point 4: @message_listener on the rocketmq5 backend (5.x SimpleConsumer + txmsg's loop):
transactional sends consumed once, retries then the DLQ after max_reconsume, graceful close."""

from __future__ import annotations

import threading
from typing import Any

from txmsg_broker.testing import create_topic, read_log, unique, wait_until

from txmsg import ListenerRegistry, LocalTransactionState, Message

S = LocalTransactionState


def test_committed_messages_reach_a_message_listener_once(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group, cg = unique("Tx5Cons"), unique("pg5_cons"), unique("cg5_cons")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    got: list[tuple[bytes, str | None, int]] = []
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Tx:
        def execute_local(self, message: Message, arg: S) -> S:
            return arg

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    @registry.message_listener(topic=topic, group=cg, concurrency=2)
    def on_message(message: Message) -> None:
        got.append((message.body, message.tags, message.reconsume_times))

    with make_app(registry) as app:
        producer = app.producer(group)
        producer.send_in_transaction(topic, b"now", arg=S.COMMIT, tags="A")
        producer.send_in_transaction(topic, b"never", arg=S.ROLLBACK, tags="A")
        producer.send_in_transaction(topic, b"later", arg=S.UNKNOW, tags="A")  # committed by the check
        wait_until(lambda: len(got) >= 2, timeout=30, message="two deliveries")
    assert sorted(got) == [(b"later", "A", 0), (b"now", "A", 0)]


def test_retries_then_dead_letter_after_max_reconsume(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group, cg = unique("Tx5Retry"), unique("pg5_retry"), unique("cg5_retry")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    attempts: list[int] = []
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Tx:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    @registry.message_listener(topic=topic, group=cg, max_reconsume=2)
    def always_fails(message: Message) -> None:
        attempts.append(message.reconsume_times)
        raise RuntimeError("poison")

    with make_app(registry) as app:
        key = app.producer(group).send_in_transaction(topic, b"poison").transaction_key
        log_line = f"send msg to DLQ %DLQ%{cg}"
        wait_until(lambda: log_line in read_log(txmsg_grpc_broker.log_dir, "broker.log"), timeout=60,
                   message="the DLQ copy")
    assert attempts == [0, 1, 2]  # first delivery + max_reconsume redeliveries, then the DLQ
    assert key in read_log(txmsg_grpc_broker.log_dir, "broker.log").split(log_line, 1)[1].splitlines()[0]


def test_close_waits_for_a_running_handler(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group, cg = unique("Tx5ConsClose"), unique("pg5_cclose"), unique("cg5_cclose")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    inside, release, finished = threading.Event(), threading.Event(), threading.Event()
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Tx:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    @registry.message_listener(topic=topic, group=cg)
    def slow(message: Message) -> None:
        inside.set()
        release.wait(20)
        finished.set()

    app = make_app(registry)
    app.start()
    app.producer(group).send_in_transaction(topic, b"slow")
    assert inside.wait(30)
    closing = threading.Thread(target=app.close, kwargs={"timeout": 20})
    closing.start()
    closing.join(0.5)
    assert closing.is_alive()
    assert not finished.is_set()
    release.set()
    closing.join(20)
    assert not closing.is_alive()
    assert finished.is_set()
