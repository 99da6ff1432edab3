"""Awaited transactional sends without a thread (``SplitTransactionalSender``, rocketmq5).

The rocketmq5 backend sends the half message and ends the transaction as separate non-blocking
calls, so ``await producer.send_in_transaction(...)`` with an ``async def execute_local`` runs
that coroutine in the awaiting task itself.  librocketmq's transactional send is one blocking
call: there the send runs on the app's send pool and ``execute_local`` in a task of its own.
Each test runs on both backends and says what each must do; waits are on observable events.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import Any

import pytest
from txmsg_broker.testing import unique

from txmsg import InvalidMessageError, LocalTransactionState, Message, SendError, TxMsg

S = LocalTransactionState
REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="")


class Recorder:
    """``async def execute_local`` that records its task and the caller's context, and may wait
    for ``release`` or raise; ``check_local`` answers COMMIT and records the key."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[Any] | None] = {}
        self.requests: dict[str, str] = {}
        self.checked: list[str] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.wait_for_release = False
        self.raise_error = False

    async def execute_local(self, message: Message, arg: Any) -> S:
        key = message.keys or ""
        self.tasks[key] = asyncio.current_task()
        self.requests[key] = REQUEST.get()
        self.entered.set()
        if self.wait_for_release:
            await self.release.wait()
        if self.raise_error:
            raise RuntimeError("the database is down")
        return S.COMMIT

    async def check_local(self, message: Message) -> S:
        self.checked.append(message.keys or "")
        return S.COMMIT


def test_execute_local_runs_in_the_awaiting_task_where_the_client_allows(
    make_app: Callable[..., TxMsg], topic: str, backend_name: str
) -> None:
    """rocketmq5: in the very task that awaited the send (no send-pool thread); rocketmq: in a
    task of its own, with the caller's context either way."""
    app, listener = make_app(), Recorder()
    group = unique("pg_split")
    app.add_transactional_listener(listener, group=group, topics=[topic])

    async def main() -> tuple[Any, asyncio.Task[Any] | None]:
        async with app:
            REQUEST.set("request-1")
            result = await app.async_transactional_producer(group).send_in_transaction(
                topic, {"n": 1}, keys="k1"
            )
            return result, asyncio.current_task()

    result, caller = asyncio.run(asyncio.wait_for(main(), 120))
    assert (result.local_state, result.send_status) == (S.COMMIT, "SEND_OK")
    assert listener.requests == {"k1": "request-1"}
    in_caller = listener.tasks["k1"] is caller
    assert in_caller == (backend_name == "rocketmq5")
    stats = app.stats()[group]
    assert (stats.sent, stats.committed, stats.failed) == (1, 1, 0)


def test_a_send_cancelled_inside_execute_local_is_left_to_the_check_back(
    make_app: Callable[..., TxMsg], topic: str, backend_name: str
) -> None:
    """The awaiting task is cancelled while ``execute_local`` waits.  rocketmq5 (the coroutine is
    the task's): nothing ends the transaction, so the broker checks it back and ``check_local``'s
    COMMIT resolves it; rocketmq (a task of its own): ``execute_local`` goes on and commits.
    Either way the message is committed once, and the app closes without waiting on the send."""
    app, listener = make_app(), Recorder()
    listener.wait_for_release = True
    group = unique("pg_split")
    app.add_transactional_listener(listener, group=group, topics=[topic])
    consumed: list[str] = []
    app.add_message_listener(
        lambda m: consumed.append(m.keys or ""), topic=topic, group=unique("cg_split")
    )

    async def main() -> None:
        async with app:
            producer = app.async_transactional_producer(group)
            send = asyncio.ensure_future(producer.send_in_transaction(topic, {"n": 1}, keys="c1"))
            await listener.entered.wait()
            send.cancel()
            with pytest.raises(asyncio.CancelledError):
                await send
            listener.release.set()  # rocketmq: the bridge's task finishes and commits
            while consumed != ["c1"]:
                await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(main(), 120))
    assert consumed == ["c1"]
    if backend_name == "rocketmq5":
        assert "c1" in listener.checked  # resolved by the check-back, not by the cancelled send


def test_execute_local_raising_leaves_the_transaction_to_the_check_back(
    make_app: Callable[..., TxMsg], topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception in ``async def execute_local`` answers ``on_exception`` (UNKNOW), logged
    with the listener's error; the check-back then commits it: nothing lost."""
    app, listener = make_app(), Recorder()
    listener.raise_error = True
    group = unique("pg_split")
    app.add_transactional_listener(listener, group=group, topics=[topic])
    consumed: list[str] = []
    app.add_message_listener(
        lambda m: consumed.append(m.keys or ""), topic=topic, group=unique("cg_split")
    )

    async def main() -> Any:
        async with app:
            result = await app.async_transactional_producer(group).send_in_transaction(
                topic, {"n": 1}, keys="e1"
            )
            while consumed != ["e1"]:
                await asyncio.sleep(0.05)
            return result

    with caplog.at_level(logging.ERROR, logger="txmsg"):
        result = asyncio.run(asyncio.wait_for(main(), 120))
    assert result.local_state is S.UNKNOW
    assert "e1" in listener.checked
    assert any("the database is down" in r.getMessage() for r in caplog.records)


def test_a_failed_half_message_raises_send_error_and_runs_nothing(
    make_app: Callable[..., TxMsg], backend_name: str
) -> None:
    """A topic the broker does not have.  rocketmq5 (a proxy creates no topic): ``SendError``
    naming what to check, ``execute_local`` never runs, the group counts the failure.  rocketmq:
    the remoting broker creates the topic on the first send (``autoCreateTopicEnable``, a 4.x
    broker's default), so the send commits."""
    app, listener = make_app(), Recorder()
    group = unique("pg_split")
    missing = unique("no_such_topic")
    app.add_transactional_listener(listener, group=group, topics=[missing])

    async def main() -> Any:
        async with app:
            producer = app.async_transactional_producer(group)
            if backend_name == "rocketmq":
                return await producer.send_in_transaction(missing, {"n": 1}, keys="f1")
            with pytest.raises(SendError, match="doctor"):
                await producer.send_in_transaction(missing, {"n": 1}, keys="f1")
            return None

    result = asyncio.run(asyncio.wait_for(main(), 120))
    if backend_name == "rocketmq":
        assert result.local_state is S.COMMIT
        return
    assert listener.tasks == {}
    assert app.stats()[group].failed == 1


def test_a_client_without_the_split_steps_takes_the_pool_path(
    make_app: Callable[..., TxMsg], topic: str, backend_name: str
) -> None:
    """A 5.x client release that renamed a step of the split send (``splits_sends`` False):
    the awaited send still works, on the send pool (``execute_local`` in a task of its own),
    counted once.  The rocketmq backend never splits."""
    app, listener = make_app(), Recorder()
    group = unique("pg_split")
    app.add_transactional_listener(listener, group=group, topics=[topic])

    async def main() -> tuple[Any, asyncio.Task[Any] | None]:
        async with app:
            sender: Any = app.producer(group).sender  # type: ignore[attr-defined]
            if backend_name == "rocketmq5":
                sender.producer.__dict__["splits_sends"] = False  # the cached answer
            result = await app.async_transactional_producer(group).send_in_transaction(
                topic, {"n": 1}, keys="p1"
            )
            return result, asyncio.current_task()

    result, caller = asyncio.run(asyncio.wait_for(main(), 120))
    assert result.local_state is S.COMMIT
    assert listener.tasks["p1"] is not caller
    stats = app.stats()[group]
    assert (stats.sent, stats.committed, stats.failed) == (1, 1, 0)


def test_sends_cancelled_at_any_moment_leave_nothing_in_flight(
    make_app: Callable[..., TxMsg], topic: str, backend_name: str
) -> None:
    """Twenty awaited sends, each cancelled after 0 to 3 ms: before its half message went out,
    while it travels, or after it was stored (its answer on the way to the loop).  Every one
    ends: the sender counts nothing in flight afterwards, so closing does not wait, and every
    stored half is resolved (here: COMMIT, by ``execute_local`` or by the check-back)."""
    app, listener = make_app(), Recorder()
    group = unique("pg_split")
    app.add_transactional_listener(listener, group=group, topics=[topic])

    async def main() -> int:
        async with app:
            producer = app.async_transactional_producer(group)
            for n in range(20):
                send = asyncio.ensure_future(
                    producer.send_in_transaction(topic, {"n": n}, keys=f"x{n}")
                )
                await asyncio.sleep((n % 4) / 1000)
                send.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await send
            sender: Any = app.producer(group).sender  # type: ignore[attr-defined]
            in_flight = -1
            for _ in range(200):  # the answers of the last sends are still coming
                in_flight = sender.stats()["sends_in_flight"] if backend_name == "rocketmq5" else 0
                if in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            return in_flight

    assert asyncio.run(asyncio.wait_for(main(), 120)) == 0


def test_an_empty_body_is_refused_as_invalid_before_anything_is_sent(
    make_app: Callable[..., TxMsg], topic: str, backend_name: str
) -> None:
    """rocketmq5 refuses an empty body (RocketMQ 5 does) before anything is sent:
    ``InvalidMessageError``, as its sync send raises, not a ``SendError`` about the endpoints;
    nothing runs and nothing stays in flight.  librocketmq's own validator refuses it inside
    its send (a ``SendError`` quoting it), also before the local transaction."""
    app, listener = make_app(), Recorder()
    group = unique("pg_split")
    app.add_transactional_listener(listener, group=group, topics=[topic])

    async def main() -> None:
        async with app:
            producer = app.async_transactional_producer(group)
            if backend_name == "rocketmq":
                with pytest.raises(SendError, match="body is empty"):
                    await producer.send_in_transaction(topic, b"", keys="b1")
                return
            with pytest.raises(InvalidMessageError, match="empty"):
                await producer.send_in_transaction(topic, b"", keys="b1")
            sender: Any = app.producer(group).sender  # type: ignore[attr-defined]
            assert sender.stats()["sends_in_flight"] == 0

    asyncio.run(asyncio.wait_for(main(), 120))
    assert listener.tasks == {}
