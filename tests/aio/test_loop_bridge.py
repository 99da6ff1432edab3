"""``LoopBridge``: coroutines run on one loop for callers on other threads (no broker needed)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from txmsg import LifecycleError, LoopBridge


@pytest.fixture
def bridge() -> Iterator[LoopBridge]:
    own = LoopBridge.on_own_thread("txmsg-test-loop", slow_step=0.05)
    yield own
    own.close(5)


def test_results_and_exceptions_cross_threads(bridge: LoopBridge) -> None:
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    async def fail() -> None:
        raise ValueError("from the loop")

    assert bridge.run(double, 21, name="double") == 42
    with pytest.raises(ValueError, match="from the loop"):
        bridge.run(fail, name="fail")
    assert bridge.pending == 0


def test_waiting_on_the_loops_own_thread_is_refused(bridge: LoopBridge) -> None:
    async def nested() -> str:
        async def inner() -> str:
            return "never"

        try:
            bridge.run(inner, name="inner")
        except LifecycleError as exc:
            return str(exc)
        return "ran"

    assert "wait for itself forever" in bridge.run(nested, name="nested")


def test_cancellation_reaches_the_watched_coroutine(bridge: LoopBridge) -> None:
    cleaned = threading.Event()

    async def long() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    future = bridge.submit(long(), name="long")
    time.sleep(0.1)
    future.cancel()
    assert cleaned.wait(5)


def test_a_blocking_step_is_warned_once_with_the_listeners_name(
    bridge: LoopBridge, caplog: pytest.LogCaptureFixture
) -> None:
    async def blocks() -> None:
        time.sleep(0.1)  # the mistake: a blocking call inside async def
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="txmsg.aio"):
        bridge.run(blocks, name="shop.PayOrder.execute_local")
        bridge.run(blocks, name="shop.PayOrder.execute_local")
    warned = [r.getMessage() for r in caplog.records if r.name == "txmsg.aio"]
    assert len(warned) == 1
    assert "shop.PayOrder.execute_local held the event loop" in warned[0]
    assert bridge.slow_steps == {"shop.PayOrder.execute_local": 2}


def test_closed_bridge_refuses_and_stops_its_thread(bridge: LoopBridge) -> None:
    async def later() -> None:
        await asyncio.sleep(0)

    assert bridge.close(5)
    coro = later()
    with pytest.raises(LifecycleError, match="closed"):
        bridge.submit(coro, name="later")  # closed, never started: no "never awaited" warning
    assert not [t for t in threading.enumerate() if t.name == "txmsg-test-loop"]
