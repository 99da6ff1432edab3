"""``AsyncProducer`` and ``AsyncTransactionalProducer``: the producers' sends as coroutines that
never block the event loop.

::

    async with app:
        producer = app.async_transactional_producer("order-tx")
        result = await producer.send_in_transaction("orders", order, arg=order_id)
        await app.async_producer("notify").send("events", {"id": 1})

The two types are the sync side's two (:class:`~txmsg.Producer`,
:class:`~txmsg.TransactionalProducer`): a group with a transactional listener gets an
``AsyncTransactionalProducer``, a plain group (``app.add_producer``) an ``AsyncProducer``.

The backends' clients are blocking (librocketmq waits for the broker; the 5.x client's
transactional send calls the local executor in the sending thread), and rewriting them is not
the point: each send runs on a thread of the app's send pool (``async_send_threads`` threads,
:data:`txmsg.defaults.ASYNC_SEND_THREADS`) and the coroutine awaits it.  The loop's thread only
schedules and resumes.

A transactional send runs the half message on that thread; an ``async def execute_local`` then
runs as a coroutine **on the loop that awaits the send** (where the service's async database
engine lives) while the send's thread waits for its answer, and the thread ends the
transaction.  A plain ``def execute_local`` runs on the send's thread, off the loop.

Where the backend's client sends the half message and ends the transaction as separate
non-blocking calls (:class:`txmsg.backend.SplitTransactionalSender`: the rocketmq5 backend) and
``execute_local`` is ``async def``, the transactional send needs no thread at all: the half
message and the end are awaited on the loop and ``execute_local`` runs in the awaiting task
(``TransactionalProducer._transact_on_loop``).  Why: parking a pool thread for the whole
transaction costs four hand-overs between that thread and the loop per send
(``benchmarks/async_send``, docs/guide/async.md#measured).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, Unpack

from txmsg.aio.loop import LoopBridge
from txmsg.errors import ProducerClosedError
from txmsg.message import SendResult, TransactionSendResult
from txmsg.producer import Producer, ProducerStats, TransactionalProducer
from txmsg.sending import (
    BatchOptions,
    DelayOptions,
    OrderedOptions,
    TransactionOptions,
    check_keywords,
)

T = TypeVar("T")


class AsyncProducer:
    """Awaitable plain sends of one producer group (``app.async_producer(group)``).

    The same sends as :class:`~txmsg.Producer`, with the same options, errors and statistics
    (it drives that producer): :meth:`send`, :meth:`send_oneway`, :meth:`send_orderly`,
    :meth:`send_batch`.  The ``*_async`` methods of the sync producer (they return a
    ``concurrent.futures.Future``) have no twin here: ``asyncio.create_task(producer.send(...))``
    is that.  A group with a transactional listener gets an
    :class:`AsyncTransactionalProducer`, which also sends in transactions.

    Parameters:
        producer: the group's producer (started by the app).
        pool: the threads the blocking client calls run on.
        bridge: the app's loop bridge, reused when a send is awaited on that loop (so the app's
            close drains its ``execute_local`` coroutines too).
    """

    def __init__(
        self,
        producer: Producer,
        pool: ThreadPoolExecutor,
        *,
        bridge: LoopBridge | None = None,
    ) -> None:
        self.producer = producer
        """The sync producer this one drives (its statistics count these sends too)."""
        self._pool = pool
        self._bridge = bridge
        self._caller_bridge: LoopBridge | None = None

    @property
    def group(self) -> str:
        """The producer group."""
        return self.producer.group

    @property
    def transactional(self) -> bool:
        """False: a plain group (:class:`AsyncTransactionalProducer` says True)."""
        return False

    def stats(self) -> ProducerStats:
        """The group's figures (shared with the sync producer)."""
        return self.producer.stats()

    # ---- sends --------------------------------------------------------------------------------
    async def send(self, topic: str, payload: Any, **options: Unpack[DelayOptions]) -> SendResult:
        """:meth:`txmsg.Producer.send`, awaited (delays as there)."""
        return await self._off_loop(
            functools.partial(self.producer.send, topic, payload, **options)
        )

    async def send_oneway(self, topic: str, payload: Any, **options: Unpack[DelayOptions]) -> None:
        """:meth:`txmsg.Producer.send_oneway`, awaited (the client takes it; no answer)."""
        await self._off_loop(
            functools.partial(self.producer.send_oneway, topic, payload, **options)
        )

    async def send_orderly(
        self, topic: str, payload: Any, **options: Unpack[OrderedOptions]
    ) -> SendResult:
        """:meth:`txmsg.Producer.send_orderly`, awaited: await each send of a key before the
        next one, so that the key's order holds."""
        return await self._off_loop(
            functools.partial(self.producer.send_orderly, topic, payload, **options)
        )

    async def send_batch(
        self, topic: str, payloads: Iterable[Any], **options: Unpack[BatchOptions]
    ) -> SendResult:
        """:meth:`txmsg.Producer.send_batch`, awaited."""
        items = list(payloads)  # an iterator is consumed here, on the loop, not on a thread
        return await self._off_loop(
            functools.partial(self.producer.send_batch, topic, items, **options)
        )

    # ---- plumbing -----------------------------------------------------------------------------
    @property
    def caller_bridge(self) -> LoopBridge | None:
        """The bridge to the last loop the app does not run on where a send was awaited (its
        ``execute_local`` coroutines run there); the app's close cancels them past its timeout."""
        return self._caller_bridge

    def _bridge_here(self) -> LoopBridge:
        """The bridge to the loop awaiting this send: the app's when it is that loop."""
        loop = asyncio.get_running_loop()
        for bridge in (self._bridge, self._caller_bridge):
            if bridge is not None and bridge.loop is loop:
                return bridge
        self._caller_bridge = LoopBridge(loop)  # sends awaited on a loop the app does not run on
        return self._caller_bridge

    async def _off_loop(self, call: Callable[[], T]) -> T:
        """Run the blocking ``call`` on the send pool and await it, in the caller's context (its
        current span is the ``send <topic>`` span's parent; run_in_executor would drop it)."""
        if self.producer.closed:
            self.producer._check_open()  # raises ProducerClosedError with its message
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, contextvars.copy_context().run, call)
        except RuntimeError as exc:  # the pool is shut down: the app is closing
            raise ProducerClosedError(
                f"producer group {self.group!r} is closing; sends must happen before "
                "`await app.aclose()`"
            ) from exc
        return await future

    def __repr__(self) -> str:
        kind = "transactional" if self.transactional else "plain"
        return f"<{type(self).__name__} group={self.group!r} {kind} closed={self.producer.closed}>"


class AsyncTransactionalProducer(AsyncProducer):
    """An :class:`AsyncProducer` whose group has a transactional listener
    (``app.async_transactional_producer(group)``): it also sends in transactions
    (:meth:`send_in_transaction`), as :class:`~txmsg.TransactionalProducer` does.
    """

    producer: TransactionalProducer

    def __init__(
        self,
        producer: TransactionalProducer,
        pool: ThreadPoolExecutor,
        *,
        bridge: LoopBridge | None = None,
    ) -> None:
        super().__init__(producer, pool, bridge=bridge)

    @property
    def transactional(self) -> bool:
        """True: the group has a transactional listener."""
        return True

    async def send_in_transaction(
        self, topic: str, payload: Any, **options: Unpack[TransactionOptions]
    ) -> TransactionSendResult:
        """Send the half message, await ``execute_local(message, arg)``, end the transaction:
        :meth:`txmsg.TransactionalProducer.send_in_transaction`, awaited (module docstring).

        Raises: as the sync method.
        """
        check_keywords("send_in_transaction", options, TransactionOptions)
        producer = self.producer
        bridge = self._bridge_here()
        if producer.splits_sends:  # no thread needed (module docstring)
            return await producer._transact_on_loop(topic, payload, options, bridge)
        return await self._off_loop(
            functools.partial(producer._transact, topic, payload, options, bridge)
        )
