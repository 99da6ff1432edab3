"""Closing an app while ``async def`` listener coroutines still run (issue 27).

A coroutine the close cancels never finished, so whether its local transaction committed is
unknown: txmsg must leave the transaction to the check-back (UNKNOW), whatever exception state
the listener declared, and the close must stay bounded by its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from txmsg import LocalTransactionState, LoopBridge, Message
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
