"""The receive loop both rocketmq5 consumers run over a 5.x ``SimpleConsumer``.

Why one base class: the concurrent consumer (:mod:`.consumer`) and the FIFO consumer
(:mod:`.fifo`) differ in what they do with a received message and in how they count what they
hold, not in how they receive or stop.  Both must receive only while they have room, back off
while the proxy is unreachable (it may be restarting) without giving up, and stop with a bounded
wait that leaves unhandled messages to come back after their invisible time.  Keeping that in one
place keeps the two consumers' close and retry behaviour the same.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from ._client import AckMessageEntry, AckMessageRequest, Code, SimpleConsumer
from .client import shut_down
from .routes import fetch_routes_on_their_thread

log = logging.getLogger("txmsg.rocketmq5")

INVISIBLE_S = 60
"""How long a received message stays invisible while it waits for and runs its handler (then it
is redelivered)."""
AWAIT_S = 5
"""Long-polling time of one receive (the proxy's minimum).  close() does not wait for it: the
receive is asynchronous and a stopping loop abandons it (see :meth:`ReceiveLoop._receive`)."""
MAX_BACKOFF_S = 5.0
"""The longest pause between failed receives (doubling from 0.2 s)."""


class QuietSimpleConsumer(SimpleConsumer):  # type: ignore[misc]
    """The 5.x ``SimpleConsumer``, without the traceback its shutdown logs for an abandoned receive.

    Why: ``shutdown()`` stops the client's callback executor (and sets it to None) before it
    closes the channels; closing cancels the long-polling receive a stopping :class:`ReceiveLoop`
    abandoned, and the client's done-callback then submits to the executor it has just dropped,
    so ``concurrent.futures`` logged an ``AttributeError`` traceback at ERROR on every close of a
    consumer.  Nobody waits for that receive any more (:meth:`ReceiveLoop._receive` returned None,
    its messages come back after their invisible time), so its result is dropped here.

    Its routes are fetched on a route thread (:mod:`.routes`), as every client's of this backend.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fetch_routes_on_their_thread(self)

    def _submit_callback(self, callback_result: Any) -> None:
        try:
            super()._submit_callback(callback_result)
        except AttributeError:
            if getattr(self, "_Client__client_callback_executor", True) is not None:
                raise  # not the shut-down executor: a real error
            log.debug("a receive ended after the 5.x client shut down; its result is dropped")


class ReceiveLoop:
    """One consumer group on one topic: receive while there is room, hand each message on.

    A subclass sets the attributes below in its ``__init__`` (then starts ``_loop``) and says how
    much room it has (:meth:`_room`), what to do with a message (:meth:`_dispatch`) and how many
    handlers still run (:meth:`_running_handlers`).
    """

    CANCEL_QUEUED: ClassVar[bool] = True
    """Whether stop() cancels work queued on the pool but not started yet."""

    group: str
    topic: str
    client: Any
    _lock: threading.Condition
    _stopping: threading.Event
    _pool: ThreadPoolExecutor
    _loop: threading.Thread

    def _room(self) -> int:
        """How many messages the next receive may bring (called holding ``_lock``); <= 0: wait."""
        raise NotImplementedError

    def _dispatch(self, raw: Any) -> None:
        """Hand one received message on (in the receive thread, not holding ``_lock``)."""
        raise NotImplementedError

    def _running_handlers(self) -> int:
        """How many handlers stop() still waits for (called holding ``_lock``)."""
        raise NotImplementedError

    # ---- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            with self._lock:
                while self._room() <= 0 and not self._stopping.is_set():
                    self._lock.wait(0.5)
                free = self._room()
            if self._stopping.is_set():
                return
            try:
                received = self._receive(free)
                if received is None:  # stopping: the receive in flight is abandoned
                    return
                backoff = 0.0
            except Exception as exc:  # noqa: BLE001 - keep consuming; the proxy may be restarting
                if self._stopping.is_set():
                    return
                backoff = min(MAX_BACKOFF_S, backoff * 2 or 0.2)
                log.warning(
                    "consumer group %s: receive from %s failed: %s; retrying in %.1fs",
                    self.group,
                    self.topic,
                    exc,
                    backoff,
                )
                self._stopping.wait(backoff)
                continue
            for raw in received or ():
                self._dispatch(raw)

    def _receive(self, free: int) -> Any:
        """One long-polling receive that stop() can interrupt: None once stopping.

        Why not the client's blocking ``receive``: it holds the loop for up to :data:`AWAIT_S`,
        so every close would wait that long for an empty poll.  A receive abandoned this way
        may still bring messages; nobody acks them, so they come back after their invisible
        time, like any message received but not handled when a consumer closes.
        """
        future = self.client.receive_async(free, INVISIBLE_S)

        def wake(_done: Any) -> None:  # on the client's thread; stop() notifies the same way
            with self._lock:
                self._lock.notify_all()

        future.add_done_callback(wake)
        with self._lock:
            self._lock.wait_for(lambda: future.done() or self._stopping.is_set())
        if self._stopping.is_set():
            return None
        return future.result()

    # ---- acks ----------------------------------------------------------------------------------
    def _ack_async(self, raw: Any) -> Future[Any]:
        """The ack of ``raw``, sent without waiting: its future is answered on the client's I/O
        thread, where nothing may block (hand blocking work to a pool).

        Why the consumers do not wait for their acks in a handler thread: a thread waiting for
        the ack's round trip handles nothing meanwhile, so ``concurrency`` threads handled at most
        ``concurrency`` messages per round trip, and a default listener (4 threads) fell behind at
        200 messages/s on a loaded machine (``benchmarks.delivery_latency``, docs/guide/outbox.md).
        Why not the client's ``ack_async``: 5.1.2's returns nothing, and the ``_ack_async`` behind
        it makes an ``asyncio.Future`` in the calling thread, which raises outside an event loop.
        The request is the one its synchronous ``ack`` sends."""
        config = self.client.client_configuration
        request = AckMessageRequest()
        request.group.name = self.group
        request.group.resource_namespace = config.namespace
        request.topic.name = raw.topic
        request.topic.resource_namespace = config.namespace
        entry = AckMessageEntry()
        entry.message_id = raw.message_id
        entry.receipt_handle = raw.receipt_handle
        request.entries.append(entry)
        future: Future[Any] = self.client.rpc_client.ack_message_async(
            raw.endpoints, request, metadata=self.client.sign(), timeout=config.request_timeout
        )
        return future

    @staticmethod
    def _ack_refusal(done: Future[Any]) -> str | None:
        """Why the ack answered by ``done`` failed; None when the proxy took it."""
        exc = done.exception()
        if exc is not None:
            return f"{type(exc).__name__}: {exc}"
        status = done.result().status
        if int(status.code) != Code.OK:
            return f"the proxy answered {int(status.code)} {status.message}"
        return None

    # ---- lifecycle -----------------------------------------------------------------------------
    def stop(self, timeout: float) -> None:
        """Stop receiving, wait at most ``timeout`` for running handlers, shut the client down.
        Messages received but not yet handled are not acked: they become visible again after
        their invisible time."""
        deadline = time.monotonic() + max(0.0, timeout)
        if self._stopping.is_set():
            return
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=self.CANCEL_QUEUED)
        with self._lock:
            while self._running_handlers() and self._lock.wait(
                max(0.0, deadline - time.monotonic())
            ):
                pass
            busy = self._running_handlers()
        if busy:
            log.error(
                "consumer group %s: %d handler(s) still running after the %.1fs close timeout; "
                "their messages are redelivered later",
                self.group,
                busy,
                timeout,
            )
        self._loop.join(max(0.0, deadline - time.monotonic()))
        shut_down(self.client, f"consumer group {self.group}")
