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
from typing import Any

import pytest
from txmsg_broker.testing import unique

from txmsg import LocalTransactionState, LoopBridge, Message, TxMsg
from txmsg.safety import run_execute_local

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
        producer = app.async_producer(group)
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
