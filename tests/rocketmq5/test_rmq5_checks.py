"""Issue 14 point 3: a group's check-backs run ``concurrency`` at once on the rocketmq5 backend (the
5.x client alone runs them one at a time), every check that cannot be answered is logged, and close
waits for checks in flight.  Proven by events (a barrier all checks must reach together), not timings.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from txmsg_broker.testing import AllAtOnce, Clients, create_topic, unique, wait_until
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg import ExecutorConfig, ListenerRegistry, LocalTransactionState, Message
from txmsg.message import OutgoingMessage

S = LocalTransactionState


def test_check_backs_of_one_group_run_concurrently(make_app: Any, txmsg_grpc_broker: Any) -> None:
    n = 4
    topic, group = unique("Tx5Conc"), unique("pg5_conc")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    together = AllAtOnce(n)
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic], executor=ExecutorConfig(concurrency=n))
    class AllTogether:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        def check_local(self, message: Message) -> S:
            # returns only when n checks are inside check_local at once
            return S.COMMIT if together.arrive(message.transaction_key or "") else S.UNKNOW

    with make_app(registry) as app:
        producer = app.producer(group)
        keys = [producer.send_in_transaction(topic, f"m{i}").transaction_key for i in range(n)]
        wait_until(lambda: together.arrived() >= n, timeout=40, message="n checks")
        assert together.broken == []
        assert sorted(together.passed) == sorted(keys)
        sender = producer.sender
        assert sender.check_concurrency == n
        assert sender.stats()["checks_failed"] == 0


def test_a_failed_check_is_logged_and_never_answered_for_check_local(
    txmsg_grpc_broker: Any, caplog: Any
) -> None:
    """The backend below the core: a handler that raises (the core's never does) is logged at
    ERROR and no answer is sent; the broker checks again and the next answer resolves it."""
    caplog.set_level(logging.ERROR, logger="txmsg.rocketmq5")
    topic = unique("Tx5Fail")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    calls: list[str] = []

    def handler(message: Message) -> S:
        calls.append(message.transaction_key or "")
        if len(calls) == 1:
            raise RuntimeError("handler broke")
        return S.COMMIT

    class Config:
        endpoints = txmsg_grpc_broker.grpc_endpoint

    backend = RocketMQ5Backend(Config())
    try:
        with Clients(txmsg_grpc_broker.namesrv_addr) as clients:
            delivered = clients.consumer(unique("Tx5FailCG"), topic)
            sender = backend.create_transactional_sender(
                unique("pg5_fail"), handler, check_concurrency=2, topics=[topic]
            )
            _, key, _, _ = sender.send_in_transaction(
                OutgoingMessage(topic=topic, body=b"once"), lambda m: S.UNKNOW
            )
            wait_until(lambda: len(delivered) == 1, timeout=20, message="the second check's COMMIT")
        assert calls[:2] == [key, key]
        stats = sender.stats()
        assert stats["checks_failed"] == 1
        assert stats["checks_answered"] >= 1
        failed = [r.getMessage() for r in caplog.records if "check-back failed" in r.getMessage()]
        assert failed
        assert key in failed[0]
        assert "RuntimeError: handler broke" in failed[0]
    finally:
        backend.close(timeout=10)


def test_close_waits_for_a_check_in_flight(make_app: Any, txmsg_grpc_broker: Any) -> None:
    topic, group = unique("Tx5Close"), unique("pg5_close")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    inside, release = threading.Event(), threading.Event()
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic])
    class Slow:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        def check_local(self, message: Message) -> S:
            inside.set()
            release.wait(20)
            return S.COMMIT

    with Clients(txmsg_grpc_broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("Tx5CloseCG"), topic)
        app = make_app(registry)
        app.start()
        app.producer(group).send_in_transaction(topic, b"in-flight")
        assert inside.wait(15)
        closing = threading.Thread(target=app.close, kwargs={"timeout": 20})
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()  # close waits for the running check ...
        release.set()
        closing.join(20)
        assert not closing.is_alive()
        # ... whose COMMIT reached the broker before the client shut down
        wait_until(lambda: [r.body for r in delivered] == [b"in-flight"], timeout=10, message="delivery")


def test_a_groups_checks_occupy_only_its_executor_threads(
    make_app: Any, txmsg_grpc_broker: Any
) -> None:
    """The review's finding: the sender ran check-backs on a pool of ``concurrency`` threads of
    its own, each blocked in the dispatcher while the listener's executor ran check_local, so a
    group held 2 x concurrency threads, half of them waiting.  Now n slow checks of a group occupy
    exactly n threads named after it, all the listener's executor's; the client's I/O loop stays
    free (a send completes while every check is blocked); the broker's re-checks of the blocked
    transactions (every second here) join them, and each check_local run is answered once."""
    n = 3
    topic, group = unique("Tx5Threads"), unique("pg5_threads")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, message_type="TRANSACTION")
    lock = threading.Lock()
    ran_on: list[str] = []
    release = threading.Event()
    registry = ListenerRegistry()

    @registry.transactional_listener(group=group, topics=[topic], executor=ExecutorConfig(concurrency=n))
    class Slow:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT if arg == "commit" else S.UNKNOW

        def check_local(self, message: Message) -> S:
            with lock:
                ran_on.append(threading.current_thread().name)
            assert release.wait(30)
            return S.COMMIT

    def group_threads() -> list[str]:
        return sorted(t.name for t in threading.enumerate() if group in t.name)

    with Clients(txmsg_grpc_broker.namesrv_addr) as clients:
        delivered = clients.consumer(unique("Tx5ThreadsCG"), topic)
        app = make_app(registry)
        app.start()
        producer = app.transactional_producer(group)
        try:
            for i in range(n):
                producer.send_in_transaction(topic, f"slow{i}".encode())
            wait_until(lambda: len(ran_on) >= n, timeout=40, message="n checks running")
            # the client's I/O loop is not held by the checks: a send round-trips through it
            producer.send_in_transaction(topic, b"while-checking", arg="commit")
            threads = group_threads()
            assert len(threads) == n, threads  # was 2 * n: n txmsg5-check-* waiting on n txmsg-*
            assert all(name.startswith(f"txmsg-{group}-") for name in threads), threads
            assert sorted(ran_on) == threads  # one check per executor thread, none elsewhere
            dispatcher = producer.dispatcher
            wait_until(
                lambda: dispatcher.stats().deduplicated >= 1,
                timeout=10,
                message="a re-check joining a running check",
            )
        finally:
            release.set()
        wait_until(lambda: len(delivered) == n + 1, timeout=20, message="n + 1 deliveries")
        sender = producer.sender
        wait_until(
            lambda: sender.stats()["checks_running"] == sender.stats()["answers_pending"] == 0,
            timeout=10,
            message="answers settled",
        )
        stats = sender.stats()
        with lock:
            runs = len(ran_on)
        assert stats["checks_failed"] == 0
        assert stats["checks_answered"] == runs  # one answer per check_local run
        assert stats["checks_coalesced"] == dispatcher.stats().deduplicated >= 1
        assert sorted(r.body for r in delivered) == sorted(
            [f"slow{i}".encode() for i in range(n)] + [b"while-checking"]
        )
