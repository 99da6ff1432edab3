"""Issue 27: ``async def`` listeners on the app's event loop, awaitable sends, on both backends.

Each test runs on ``rocketmq`` and ``rocketmq5`` against the embedded broker, through the public
API.  Waits are on observable events (a delivery, a check-back), bounded generously; none
asserts a duration.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from txmsg_broker.testing import create_topic, unique, wait_until

from txmsg import (
    LifecycleError,
    LocalTransactionState,
    LoopBlockingWarning,
    Message,
    TxMsg,
)

S = LocalTransactionState


class AsyncGot:
    """An ``async def`` message listener recording what it got, and on which thread it ran."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.threads: set[str] = set()

    async def __call__(self, message: Message) -> None:
        await asyncio.sleep(0)
        self.threads.add(threading.current_thread().name)
        self.messages.append(message)

    def keys(self) -> set[str]:
        return {m.keys or "" for m in list(self.messages)}


class AsyncPay:
    """``async def execute_local`` answering from ``arg``; ``async def check_local`` answering
    COMMIT (ROLLBACK for the key "rollback"), as the transaction's record would."""

    def __init__(self) -> None:
        self.executed: list[str] = []
        self.checked: list[str] = []
        self.loops: set[int] = set()

    async def execute_local(self, message: Message, arg: Any) -> S:
        await asyncio.sleep(0.01)  # an awaited database write would be here
        self.loops.add(id(asyncio.get_running_loop()))
        self.executed.append(message.keys or "")
        return arg  # type: ignore[no-any-return]

    async def check_local(self, message: Message) -> S:
        await asyncio.sleep(0.01)
        self.loops.add(id(asyncio.get_running_loop()))
        self.checked.append(message.keys or "")
        # answers as a database would: a rolled-back one stays rolled back (a 5.x broker may
        # check a finished transaction back before its op record is written)
        return S.ROLLBACK if message.keys == "rollback" else S.COMMIT


def test_async_with_app_runs_async_listeners_on_the_running_loop(
    make_app: Callable[..., TxMsg], topic: str
) -> None:
    """``async with app:``: async execute_local (awaited between half message and commit),
    async check_local (an UNKNOW answer checked back), an async consumer, all on the loop that
    serves the app; the awaited send answers as the sync one does."""
    app, pay, got = make_app(), AsyncPay(), AsyncGot()
    group = unique("pg_aio")
    app.add_transactional_listener(pay, group=group, topics=[topic])
    app.add_message_listener(got, topic=topic, group=unique("cg_aio"), concurrency=2)

    async def main() -> tuple[list[Any], int]:
        async with app:
            producer = app.async_transactional_producer(group)
            results = await asyncio.gather(
                producer.send_in_transaction(topic, {"n": 1}, arg=S.COMMIT, keys="commit"),
                producer.send_in_transaction(topic, {"n": 2}, arg=S.ROLLBACK, keys="rollback"),
                producer.send_in_transaction(topic, {"n": 3}, arg=S.UNKNOW, keys="unknown"),
            )
            while got.keys() != {"commit", "unknown"}:  # "unknown" arrives after its check
                await asyncio.sleep(0.05)
            return list(results), id(asyncio.get_running_loop())

    results, loop_id = asyncio.run(asyncio.wait_for(main(), 240))
    assert [r.local_state for r in results] == [S.COMMIT, S.ROLLBACK, S.UNKNOW]
    assert all(r.send_status == "SEND_OK" for r in results)
    assert sorted(pay.executed) == ["commit", "rollback", "unknown"]
    assert "unknown" in pay.checked
    assert pay.loops == {loop_id}
    assert got.keys() == {"commit", "unknown"}  # the rolled-back one never arrives
    assert got.threads == {threading.main_thread().name}  # asyncio.run's loop: this thread
    assert not app.started
    stats = app.stats()[group]
    assert (stats.committed, stats.rolled_back, stats.unknown) == (1, 1, 1)


def test_with_app_runs_async_and_sync_listeners_mixed(
    make_app: Callable[..., TxMsg], broker: Any, topic: str
) -> None:
    """Plain ``with app:``: the async listeners run on the app's own loop thread, the plain
    ones as before, in one app; the sync producer sends to both."""
    app, pay, got = make_app(), AsyncPay(), AsyncGot()
    sync_got: list[Message] = []
    async_group, sync_group = unique("pg_aio"), unique("pg_sync")

    class SyncPay:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app.add_transactional_listener(pay, group=async_group, topics=[topic])
    sync_topic = unique("aio_sync")  # RocketMQ 5 routes check-backs by topic: one group each
    create_topic(broker.namesrv_addr, sync_topic, message_type="TRANSACTION")
    app.add_transactional_listener(SyncPay(), group=sync_group, topics=[sync_topic])
    app.add_message_listener(got, topic=topic, group=unique("cg_aio"))
    app.add_message_listener(sync_got.append, topic=sync_topic, group=unique("cg_sync"))
    with app:
        assert app.bridge is not None
        assert app.bridge.owns_loop
        a = app.transactional_producer(async_group).send_in_transaction(
            topic, "a", arg=S.COMMIT, keys="from-async"
        )
        b = app.transactional_producer(sync_group).send_in_transaction(
            sync_topic, "b", keys="from-sync"
        )
        assert (a.local_state, b.local_state) == (S.COMMIT, S.COMMIT)
        wait_until(lambda: got.keys() == {"from-async"}, timeout=120)
        # a set: a duplicate delivery (RocketMQ's at-least-once) would never equal one copy
        wait_until(lambda: {m.keys for m in sync_got} == {"from-sync"}, timeout=120)
    assert got.threads == {"txmsg-loop"}
    assert app.bridge is None  # closed with the app: its loop thread is gone
    assert not [t for t in threading.enumerate() if t.name == "txmsg-loop"]


def test_async_producer_plain_sends_never_block_the_loop(
    make_app: Callable[..., TxMsg], broker: Any
) -> None:
    """send / send_orderly / send_batch / send_oneway, awaited; a ticker on the same loop keeps
    ticking while they wait for the broker (the loop's thread never waits on it).

    The ticker yields with ``sleep(0)``, so it runs whenever the loop is free: a send that
    suspends lets it tick at least once before the send resumes, however fast the broker
    answers; a send that blocked the loop's thread would let it tick not at all.  (It slept 1 ms
    per tick and the test wanted more than 10 ticks in all, which a fast broker answering the
    three sends and four deliveries within 8 ms failed: CI of 2026-11-29.)"""
    topic = unique("aio_plain")
    create_topic(broker.namesrv_addr, topic, message_type="NORMAL")
    app, got, group = make_app(), AsyncGot(), unique("pg_plain")
    app.add_producer(group=group)
    app.add_message_listener(got, topic=topic, group=unique("cg_plain"))

    async def main() -> int:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        async with app:
            task = asyncio.create_task(ticker())
            producer = app.async_producer(group)
            assert not producer.transactional
            await asyncio.sleep(0)  # the ticker's first tick
            before = ticks
            one = await producer.send(topic, "one", keys="k-send")
            assert one.send_status == "SEND_OK"
            after_send = ticks
            batch = await producer.send_batch(topic, ["b1", "b2"], keys="k-batch")
            assert batch.send_status == "SEND_OK"
            after_batch = ticks
            await producer.send_oneway(topic, "oneway", keys="k-oneway")
            # the loop ran the ticker while each answered send waited for the broker
            assert after_send > before
            assert after_batch > after_send
            assert not hasattr(producer, "send_in_transaction")
            with pytest.raises(LookupError, match="no transactional listener"):
                app.async_transactional_producer(group)
            while len(got.messages) < 4:
                await asyncio.sleep(0.05)
            stop.set()
            await task
        return ticks

    ticks = asyncio.run(asyncio.wait_for(main(), 240))
    assert ticks > 2
    assert sorted(m.body for m in got.messages) == [b"b1", b"b2", b"one", b"oneway"]
    assert app.stats()[group].plain_sent == 4


def test_blocking_calls_on_the_loop_are_refused_or_warned(
    make_app: Callable[..., TxMsg], broker: Any, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input, each with a message naming the fix and nothing lost: a sync transactional
    send on the app's loop with an async execute_local (refused, nothing sent); a sync send on
    the loop (LoopBlockingWarning naming async_producer); close() on the loop (refused: use
    aclose); a listener blocking the loop (a WARNING naming it)."""
    app, got, got_plain = make_app(), AsyncGot(), AsyncGot()
    group, plain, plain_topic = unique("pg_aio"), unique("pg_plain"), unique("aio_plain")
    create_topic(broker.namesrv_addr, plain_topic, message_type="NORMAL")

    class Blocking:
        async def execute_local(self, message: Message, arg: Any) -> S:
            import time  # noqa: PLC0415 - the mistake under test: a blocking call in async def

            time.sleep(0.3)
            return S.COMMIT

        async def check_local(self, message: Message) -> S:
            return S.COMMIT

    app.add_transactional_listener(Blocking(), group=group, topics=[topic])
    app.add_producer(group=plain)
    app.add_message_listener(got, topic=topic, group=unique("cg_aio"))
    app.add_message_listener(got_plain, topic=plain_topic, group=unique("cg_plain"))

    async def main() -> None:
        async with app:
            with pytest.raises(
                LifecycleError, match=r"async_transactional_producer\(.*send_in_transaction"
            ):
                app.transactional_producer(group).send_in_transaction(topic, "x", keys="never")
            with pytest.warns(LoopBlockingWarning, match="async_producer"):
                app.producer(plain).send(plain_topic, "blocking", keys="blocked-loop")
            with pytest.raises(LifecycleError, match="aclose"):
                app.close()
            assert app.started
            with caplog.at_level(logging.WARNING, logger="txmsg.aio"):
                result = await app.async_transactional_producer(group).send_in_transaction(
                    topic, "slow", keys="slow"
                )
            assert result.local_state is S.COMMIT
            while got.keys() != {"slow"} or got_plain.keys() != {"blocked-loop"}:
                await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(main(), 240))
    assert "never" not in got.keys()  # noqa: SIM118 - AsyncGot.keys() is not a dict
    assert app.stats()[group].sent == 1  # the refused send never reached the broker
    warned = [r.getMessage() for r in caplog.records if r.name == "txmsg.aio"]
    assert any("Blocking.execute_local held the event loop" in w for w in warned), warned


def test_plain_start_on_a_running_loop_warns_and_names_async_with(
    make_app: Callable[..., TxMsg], topic: str
) -> None:
    """``with app:`` / ``app.start()`` inside a coroutine, with async listeners: they would run on
    txmsg's own loop thread, not the service's (where an asyncpg pool bound to the service's loop
    fails), and the start blocks the loop: a LoopBlockingWarning names ``async with app:``.  The
    app still starts and works as a plain start does."""
    app, pay = make_app(), AsyncPay()
    group = unique("pg_aio")
    app.add_transactional_listener(pay, group=group, topics=[topic])

    async def main() -> None:
        with pytest.warns(LoopBlockingWarning, match=r"async with app"):
            app.start()
        try:
            assert app.bridge is not None
            assert app.bridge.owns_loop  # the listeners run on txmsg-loop, not on this loop
            result = await app.async_transactional_producer(group).send_in_transaction(
                topic, "x", arg=S.COMMIT, keys="k"
            )
            assert result.local_state is S.COMMIT
        finally:
            await asyncio.to_thread(app.close)

    asyncio.run(asyncio.wait_for(main(), 240))
    assert pay.executed == ["k"]


def test_coroutine_returned_by_a_plain_def_is_an_error_nothing_lost(
    make_app: Callable[..., TxMsg], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain ``def`` returning a coroutine (an ``async def`` nobody awaited): check_local's
    answer is UNKNOW with an ERROR naming the fix (the broker asks again; a fixed answer then
    commits); a consumer's delivery is not acknowledged (redelivered), never silently lost."""
    app = make_app()
    group = unique("pg_aio")
    attempts: list[int] = []
    fixed = threading.Event()

    class Forgot:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        async def _look_up(self) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> Any:
            if fixed.is_set():
                return S.COMMIT
            fixed.set()
            return self._look_up()  # forgot `await` (and `async def`)

    async def later(message: Message) -> None:
        return None

    def consumer(message: Message) -> Any:
        attempts.append(message.reconsume_times)
        return later(message) if len(attempts) == 1 else None  # first delivery: the mistake

    app.add_transactional_listener(Forgot(), group=group, topics=[topic])
    app.add_message_listener(consumer, topic=topic, group=unique("cg_aio"))
    with caplog.at_level(logging.ERROR), app:
        result = app.transactional_producer(group).send_in_transaction(topic, "x", keys="forgot")
        assert result.local_state is S.UNKNOW
        # the first delivery handed again (a loaded machine may deliver a second copy first: a
        # COMMIT whose op record came after the next check pass is committed twice, as on a real
        # broker; that copy comes with reconsume_times 0 and is acknowledged)
        wait_until(
            lambda: any(times >= 1 for times in attempts[1:]),
            timeout=120,
            message=lambda: f"the redelivery; deliveries so far: {attempts}",
        )
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("check_local returned coroutine" in e and "async def" in e for e in errors), errors
    assert any("consumer" in e and "nobody awaited" in e for e in errors), errors
    assert attempts[0] == 0  # the first delivery, not acknowledged: handed again, nothing lost


def test_async_checks_bounded_by_concurrency_and_drained_on_close(
    make_app: Callable[..., TxMsg], topic: str
) -> None:
    """Six transactions left UNKNOW, checked back by an async check_local at concurrency 2: never
    more than 2 coroutines at once (and 2 do overlap); ``aclose()`` while checks still run waits
    for them to finish (the drain) instead of cancelling them."""
    app, group = make_app(), unique("pg_bound")
    active = 0
    most = 0
    started = asyncio.Event()
    finished: list[str] = []

    class Slow:
        async def execute_local(self, message: Message, arg: Any) -> S:
            return S.UNKNOW

        async def check_local(self, message: Message) -> S:
            nonlocal active, most
            active += 1  # one loop: no lock needed
            most = max(most, active)
            started.set()
            try:
                await asyncio.sleep(0.4)
            finally:
                active -= 1
            finished.append(message.transaction_key or "")
            return S.COMMIT

    app.add_transactional_listener(Slow(), group=group, topics=[topic], executor={"concurrency": 2})

    async def main() -> int:
        async with app:
            producer = app.async_transactional_producer(group)
            await asyncio.gather(*(producer.send_in_transaction(topic, str(i)) for i in range(6)))
            await started.wait()
            while most < 2 and len(finished) < 6:
                await asyncio.sleep(0.05)
            in_flight = active
        return in_flight  # aclose() returned: whatever ran then has finished

    in_flight = asyncio.run(asyncio.wait_for(main(), 240))
    assert most == 2
    assert in_flight >= 1
    assert active == 0  # drained: every started check ran to its end, none was cancelled
    assert len(finished) >= in_flight
