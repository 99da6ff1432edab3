"""Closing an app while ``async def`` listener coroutines still run (issue 27).

A coroutine the close cancels never finished, so whether its local transaction committed is
unknown: txmsg must leave the transaction to the check-back (UNKNOW), whatever exception state
the listener declared, and the close must stay bounded by its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import unique

from txmsg import ClosedError, LocalTransactionState, LoopBridge, Message, NotStartedError, TxMsg
from txmsg.consumer import build_consumer_spec
from txmsg.safety import run_execute_local
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.parking import parked_keys

S = LocalTransactionState


@dataclass(frozen=True)
class Spec:
    group: str = "pay-tx"
    on_exception: LocalTransactionState = S.ROLLBACK


def test_execute_local_cancelled_by_the_close_answers_unknow_not_the_exception_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ``async def execute_local`` waited for by a client thread and cancelled by the bridge's
    close (its drain timed out) answers UNKNOW, even with ``execute_exception_state=ROLLBACK``:
    it may have committed just before, and a ROLLBACK would lose that message."""
    bridge = LoopBridge.on_own_thread("txmsg-test-loop")
    entered = threading.Event()

    class Pay:
        async def execute_local(self, message: Message, arg: Any) -> S:
            entered.set()
            await asyncio.sleep(60)  # a commit the close interrupts
            return S.COMMIT

    answers: list[S] = []
    message = Message(topic="orders", body=b"{}", keys="k1", message_id="m1")
    waiter = threading.Thread(
        target=lambda: answers.append(run_execute_local(Pay(), message, None, Spec(), bridge))
    )
    waiter.start()
    assert entered.wait(10)
    with caplog.at_level(logging.WARNING, logger="txmsg.transaction"):
        assert not bridge.close(0.1)  # cancelled, not finished
        waiter.join(10)
    assert answers == [S.UNKNOW]
    logged = [r.getMessage() for r in caplog.records if r.name == "txmsg.transaction"]
    assert any("cancelled" in text and "check_local" in text for text in logged), logged


def test_close_lets_cancelled_coroutines_finish_before_stopping_its_loop() -> None:
    """A coroutine the close cancels (its drain timed out) runs its cleanup on the loop, awaits
    included (an awaited rollback, a connection given back), before the bridge stops its own
    loop; not destroyed pending when the loop closes."""
    bridge = LoopBridge.on_own_thread("txmsg-test-loop")
    entered, cleaned = threading.Event(), threading.Event()

    async def holds() -> None:
        try:
            entered.set()
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)  # an awaited rollback
            cleaned.set()

    future = bridge.submit(holds(), name="holds")
    assert entered.wait(10)
    assert not bridge.close(0.1)
    assert future.cancelled()
    assert cleaned.is_set()


@pytest.mark.parametrize("backend_name", ["rocketmq"])  # the pool path: a thread waits
def test_aclose_is_bounded_when_an_awaited_sends_execute_local_never_returns(
    make_app: Callable[..., TxMsg], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``aclose(timeout)`` while an awaited send's ``async def execute_local`` never returns:
    the close cancels it after ``timeout`` instead of waiting for the send pool forever, and
    the send ends UNKNOW (the check-back decides)."""
    app, group = make_app(), unique("pg_hang")

    class Hangs:
        def __init__(self) -> None:
            self.entered = asyncio.Event()

        async def execute_local(self, message: Message, arg: Any) -> S:
            self.entered.set()
            await asyncio.Event().wait()  # never set: a lock never released
            return S.COMMIT

        async def check_local(self, message: Message) -> S:
            return S.UNKNOW

    listener = Hangs()
    app.add_transactional_listener(
        listener, group=group, topics=[topic], execute_exception_state=S.ROLLBACK
    )

    async def main() -> S | None:
        await app.astart()
        producer = app.async_transactional_producer(group)
        send = asyncio.create_task(producer.send_in_transaction(topic, "x"))
        await listener.entered.wait()
        # generous: without the fix the close waits for the send pool forever
        await asyncio.wait_for(app.aclose(timeout=1), 120)
        result = await asyncio.wait_for(send, 60)
        return result.local_state

    with caplog.at_level(logging.WARNING):
        state = asyncio.run(asyncio.wait_for(main(), 240))
    assert state is S.UNKNOW
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "awaited send" in logged
    assert "execute_local" in logged


def test_orderly_delivery_cancelled_by_the_close_is_handed_again_not_parked(
    tmp_path: Path,
) -> None:
    """An ``async def`` orderly listener whose coroutine the close cancels (its drain timed out)
    was interrupted, not failed: the message is handed again later and its key is not parked
    (the retries then met the closed loop and parked a healthy key at every slow shutdown);
    nor is one delivered once the loop refuses coroutines."""
    engine = create_engine(f"sqlite:///{tmp_path / 'orderly.db'}")
    create_tables(engine)
    sessions = make_session_factory(engine)
    entered = threading.Event()

    async def settle(message: Message) -> None:
        entered.set()
        await asyncio.sleep(60)  # a slow refund call the close interrupts

    spec = build_consumer_spec(
        settle,
        topic="refunds",
        group="cg-refunds",
        orderly=True,
        session_factory=sessions,
        max_orderly_retries=2,
        orderly_retry_delay=0.01,
    )
    bridge = LoopBridge.on_own_thread("txmsg-test-loop")
    handler = spec.safe_handler(bridge=bridge)
    message = Message(
        topic="refunds", body=b"r1", keys="r1", message_id="m1", sharding_key="order-7", queue_id=0
    )
    answers: list[bool] = []
    consumer = threading.Thread(target=lambda: answers.append(handler(message)))
    try:
        consumer.start()
        assert entered.wait(10)
        bridge.close(0.1)
        consumer.join(10)
        assert answers == [False]  # handed again later
        later = Message(
            topic="refunds",
            body=b"r2",
            keys="r2",
            message_id="m2",
            sharding_key="order-8",
            queue_id=1,
        )
        assert handler(later) is False  # delivered after the close: the loop refuses it
        assert parked_keys(sessions, "cg-refunds") == []
    finally:
        bridge.close(5)
        getattr(handler, "close", lambda: None)()
        engine.dispose()


@pytest.mark.parametrize("backend_name", ["rocketmq5"])
def test_astart_cancelled_while_starting_leaves_nothing_running(
    make_app: Callable[..., TxMsg], topic: str
) -> None:
    """``astart()`` (``async with app:``) cancelled while the clients start on their thread (a
    server shut down during its startup): the start cannot stop midway, so what it started is
    closed once it ends, instead of an app left running, unbound from the loop, that nobody
    closes."""
    app, group = make_app(), unique("pg_start")
    constructing, proceed = threading.Event(), threading.Event()

    class Pay:
        def __init__(self) -> None:  # created by the start, on its thread
            constructing.set()
            proceed.wait(30)

        async def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        async def check_local(self, message: Message) -> S:
            return S.COMMIT

    app.add_transactional_listener(Pay, group=group, topics=[topic])

    async def main() -> None:
        starting = asyncio.create_task(app.astart())
        assert await asyncio.to_thread(constructing.wait, 30)
        starting.cancel()
        proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await starting
        for _ in range(1200):  # the start ends on its thread, then what it started is closed
            try:
                app.producer(group)
            except ClosedError:
                return
            except NotStartedError:
                pass
            await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(main(), 120))
    with pytest.raises(ClosedError):
        app.producer(group)


@pytest.mark.parametrize("backend_name", ["rocketmq"])  # the pool path: a thread waits
def test_close_is_bounded_for_sends_awaited_on_a_loop_the_app_does_not_run_on(
    make_app: Callable[..., TxMsg], topic: str
) -> None:
    """``with app:`` (the app's own loop) and sends awaited on a service's loop in another
    thread: their ``execute_local`` runs on that loop, and a close past its timeout cancels it
    there too (the send ends UNKNOW) instead of waiting for the send pool forever."""
    app, group = make_app(), unique("pg_hang")
    entered = threading.Event()

    class Hangs:
        async def execute_local(self, message: Message, arg: Any) -> S:
            entered.set()
            await asyncio.Event().wait()  # never set
            return S.COMMIT

        async def check_local(self, message: Message) -> S:
            return S.UNKNOW

    app.add_transactional_listener(Hangs(), group=group, topics=[topic])
    states: list[S | None] = []

    def service() -> None:
        async def main() -> S | None:
            result = await app.async_transactional_producer(group).send_in_transaction(topic, "x")
            return result.local_state

        states.append(asyncio.run(main()))

    app.start()
    serving = threading.Thread(target=service, daemon=True)
    serving.start()
    assert entered.wait(30)
    closing = threading.Thread(target=app.close, args=(1,), daemon=True)
    closing.start()
    closing.join(120)  # generous: without the fix it waits for the send pool forever
    assert not closing.is_alive()
    serving.join(60)
    assert states == [S.UNKNOW]
