"""Issue 14 point 3, the rocketmq5 backend's own side of check-backs (the 5.x client alone runs them one
at a time): every check that cannot be answered is logged, and the threads a group's checks occupy.
That ``concurrency`` checks run at once (a barrier all must reach together), never more, and that
close waits for checks in flight is the contract's (tests/contract/test_contract.py, every backend).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import pytest
from txmsg_broker.testing import Clients, create_topic, unique, wait_until
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg import ExecutorConfig, ListenerRegistry, LocalTransactionState, Message
from txmsg.message import OutgoingMessage

S = LocalTransactionState


@pytest.fixture
def txmsg_grpc_broker(txmsg_broker_factory: Any) -> Any:
    """The gRPC broker (5.x) with its op batches written well within the fixtures' 1 s
    ``transactionTimeOut``: these tests count checks of pending transactions, not the re-checks
    of finished ones that a 3000 ms batch causes (tests/broker/test_op_batch.py)."""
    return txmsg_broker_factory(grpc_port=0, transaction_op_batch_interval_ms=200)


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
        assert sender.check_concurrency == 2
        # the broker may store (and the consumer receive) the COMMIT before the sender has counted
        # its answer: the count follows the EndTransaction call's return
        wait_until(lambda: sender.stats()["checks_answered"] >= 1, timeout=10)
        stats = sender.stats()
        assert stats["checks_failed"] == 1
        assert stats["checks_answered"] >= 1
        failed = [r.getMessage() for r in caplog.records if "check-back failed" in r.getMessage()]
        assert failed
        assert key in failed[0]
        assert "RuntimeError: handler broke" in failed[0]
    finally:
        backend.close(timeout=10)


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

    @registry.transactional_listener(
        group=group, topics=[topic], executor=ExecutorConfig(concurrency=n)
    )
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
        # every delivery counts: the backend's synchronous pulls (hazard #5), consumed from the
        # first offset (#6; Clients' default)
        delivered = clients.consumer(unique("Tx5ThreadsCG"), topic, sync_pull=True)
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
        # a bound, not a timing assertion: the checking consumer is librocketmq's push consumer,
        # whose first rebalance runs on its own ~20 s timer when start-up was slow (CI, load 18)
        expected = {f"slow{i}".encode() for i in range(n)} | {b"while-checking"}
        wait_until(
            lambda: {r.body for r in delivered} == expected,
            timeout=60,
            message=lambda: f"every transaction delivered; got {sorted(r.body for r in delivered)}",
        )
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
        # one copy each, but for a re-check that came after its transaction's run had answered
        # and before the broker wrote that COMMIT: it starts a run of its own, whose COMMIT the
        # broker applies to the half message again, as RocketMQ's EndTransactionProcessor does
        # (soak run of 2026-11-29: slow1 and slow2 twice); at-least-once, never more copies than
        # such runs, never of the transaction committed at send
        bodies = Counter(r.body for r in delivered)
        assert set(bodies) == expected
        assert bodies[b"while-checking"] == 1
        assert sum(bodies.values()) - len(expected) <= runs - n, (bodies, runs)
