"""``@message_listener`` on the rocketmq5 backend: the 5.x ``SimpleConsumer`` with txmsg's own loop.

Why not the 5.x ``PushConsumer``:

* **graceful close(timeout)**: its ``shutdown()`` waits for its consumption pool without a bound and
  it prefetches up to 1024 messages per queue into a local cache; our loop holds at most
  :data:`HELD_PER_THREAD` messages per handler thread (at least :data:`RECEIVE_MAX`), stops
  receiving on close and waits for handlers at most ``timeout``;
* **max_reconsume per listener**: the push consumer's retry limit is the server's (17 attempts);
  here a message whose handler failed after ``max_reconsume`` redeliveries is forwarded to
  ``%DLQ%<group>`` at once (``ForwardMessageToDeadLetterQueue``, as the push consumer does for FIFO);
* **threads we name and count**: ``concurrency`` handler threads, one receive loop.

Semantics, as on the rocketmq backend: the handler (the core's ``safe_handler``, which never raises)
returns True = consumed (ack) or False = redeliver (the message becomes visible again after a
back-off, RocketMQ's retry delays 1 s, 5 s, 10 s, 30 s, ...; the broker counts the attempt).
Idempotency is the core's (``idempotent=True`` wraps the handler before it gets here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from txmsg.backend import ConsumeHandler
from txmsg.errors import ConfigError, SendError

from . import messages
from ._client import FilterExpression, ForwardMessageToDeadLetterQueueRequest
from .receive import AWAIT_S, INVISIBLE_S, QuietSimpleConsumer, ReceiveLoop

log = logging.getLogger("txmsg.rocketmq5")

RETRY_DELAYS_S = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
"""RocketMQ's retry back-off by delivery attempt (delay levels 3..18)."""
HELD_PER_THREAD = 4
"""Messages held (received, handled or waiting for a handler thread) per handler thread.

Why more than one: a receive asks for as many messages as there is room for, and the next
receive starts only when this one has answered.  Holding only ``concurrency`` messages (4 by
default) made each receive round trip bring at most the handlers free at that moment, so the
consumer's rate was bounded by the round trip, not by the handlers: at 200 messages/s a default
listener fell behind and commit->delivery grew to seconds (``benchmarks.delivery_latency``,
docs/guide/outbox.md).  The FIFO consumer holds the same (:mod:`.fifo`)."""
RECEIVE_MAX = 32
"""The proxy's receive batch maximum, and the fewest messages held whatever the thread count."""
EXPIRED_MARGIN_S = 5.0
"""A held message whose handler would start less than this before its invisible time ends is not
handled: the broker delivers it again (to this or another consumer) and handling this copy too
would run the handler twice and fail its ack."""


class LoopConsumer(ReceiveLoop):
    """One consumer group on one topic: a receive loop feeding ``concurrency`` handler threads."""

    def __init__(
        self,
        configuration: Any,
        *,
        group: str,
        topic: str,
        tags: str,
        handler: ConsumeHandler,
        concurrency: int,
        max_reconsume: int,
        tls: bool = False,
    ) -> None:
        if concurrency < 1 or max_reconsume < 0:
            raise ConfigError(
                f"consumer group {group!r}: concurrency must be >= 1 and max_reconsume >= 0 "
                f"(got {concurrency}, {max_reconsume})"
            )
        self.group, self.topic = group, topic
        self.handler = handler
        self.concurrency = concurrency
        self.capacity = max(RECEIVE_MAX, concurrency * HELD_PER_THREAD)
        self.max_reconsume = max_reconsume
        self.consumed = self.failed = self.dead_lettered = self.expired = 0
        self._lock = threading.Condition()
        self._busy = 0  # held: received and not yet handled (running or waiting for a thread)
        self._stopping = threading.Event()
        self.client = QuietSimpleConsumer(
            configuration,
            group,
            {topic: FilterExpression(tags or "*")},
            await_duration=AWAIT_S,
            tls_enable=tls,
        )
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix=f"txmsg5-consume-{group}"
        )
        self.client.startup()
        self._loop = threading.Thread(target=self._run, name=f"txmsg5-receive-{group}", daemon=True)
        self._loop.start()

    # ---- the loop (ReceiveLoop._run) ------------------------------------------------------------
    def _room(self) -> int:
        return min(self.capacity - self._busy, RECEIVE_MAX)

    def _dispatch(self, raw: Any) -> None:
        with self._lock:
            self._busy += 1
        try:
            future = self._pool.submit(self._consume, raw, time.monotonic())
        except RuntimeError:  # pool shut down (closing): it becomes visible again later
            self._release()
        else:  # also when cancelled by stop(): the slot is free again
            future.add_done_callback(self._handled)

    def _handled(self, done: Future[Future[Any] | None]) -> None:
        """A handler returned (or was cancelled): its slot is free now, or once its ack answered."""
        ack = None if done.cancelled() or done.exception() is not None else done.result()
        if ack is None:
            self._release()
        else:
            ack.add_done_callback(lambda _ack: self._release())

    def _running_handlers(self) -> int:
        return self._busy  # stop() cancels the queued ones, so these are the running handlers

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1
            self._lock.notify_all()

    def _consume(self, raw: Any, received: float) -> Future[Any] | None:
        """Handle ``raw``; the ack's future when it was consumed (None otherwise).

        The ack is not waited for here (:meth:`ReceiveLoop._ack_async` says why); the message
        holds its slot until the ack is answered (stop() waits for it as for a handler).
        """
        if time.monotonic() - received > INVISIBLE_S - EXPIRED_MARGIN_S:
            with self._lock:
                self.expired += 1
            log.warning(
                "consumer group %s: message %s waited %.0f s for a handler thread, too close to "
                "its invisible time (%d s): not handled here, the broker delivers it again; "
                "raise the listener's concurrency or shorten its handler",
                self.group,
                getattr(raw, "message_id", None),
                time.monotonic() - received,
                INVISIBLE_S,
            )
            return None
        try:
            message = messages.from_client(raw)
            ok = bool(self.handler(message))
            if ok:
                ack = self._ack_async(raw)
                ack.add_done_callback(lambda done: self._acked(raw, done))
                return ack
            self._retry_or_dead_letter(raw, message.reconsume_times)
        except BaseException as exc:  # noqa: BLE001 - the message comes back after its invisible time
            self._not_acked(raw, f"{type(exc).__name__}: {exc}")
        return None

    def _acked(self, raw: Any, done: Future[Any]) -> None:
        refusal = self._ack_refusal(done)
        if refusal is not None:
            self._not_acked(raw, refusal)
            return
        with self._lock:
            self.consumed += 1

    def _not_acked(self, raw: Any, reason: str) -> None:
        log.error(
            "consumer group %s: message %s not acknowledged (%s); it is redelivered after "
            "its invisible time",
            self.group,
            getattr(raw, "message_id", None),
            reason,
        )

    def _retry_or_dead_letter(self, raw: Any, reconsume_times: int) -> None:
        with self._lock:
            self.failed += 1
        if reconsume_times >= self.max_reconsume:
            self._dead_letter(raw, reconsume_times)
            return
        delay = RETRY_DELAYS_S[min(reconsume_times, len(RETRY_DELAYS_S) - 1)]
        self.client.change_invisible_duration(raw, delay)

    def _dead_letter(self, raw: Any, reconsume_times: int) -> None:
        """Forward to ``%DLQ%<group>`` (the proxy also acknowledges the delivery)."""
        config = self.client.client_configuration
        req = ForwardMessageToDeadLetterQueueRequest()
        req.group.name = self.group
        req.group.resource_namespace = config.namespace
        req.topic.name = raw.topic
        req.topic.resource_namespace = config.namespace
        req.receipt_handle = raw.receipt_handle
        req.message_id = raw.message_id
        req.delivery_attempt = raw.delivery_attempt or reconsume_times + 1
        req.max_delivery_attempts = self.max_reconsume + 1
        future = self.client.rpc_client.forward_message_to_dead_letter_queue_async(
            raw.endpoints, req, metadata=self.client.sign(), timeout=config.request_timeout
        )
        reply = future.result(timeout=config.request_timeout + 5)
        code = int(reply.status.code)
        if code != 20000:  # apache.rocketmq.v2.Code.OK
            raise SendError(f"forward to the DLQ refused: {code} {reply.status.message}")
        with self._lock:
            self.dead_lettered += 1
        log.warning(
            "consumer group %s: message %s failed after %d redeliveries (max_reconsume=%d); "
            "moved to %%DLQ%%%s",
            self.group,
            raw.message_id,
            reconsume_times,
            self.max_reconsume,
            self.group,
        )

    # ---- lifecycle -----------------------------------------------------------------------------
    def stop(self, timeout: float = 30.0) -> None:
        """Stop receiving, wait at most ``timeout`` for running handlers, shut the client down.
        Messages received but not yet handled become visible again after their invisible time."""
        super().stop(timeout)


StopConsumer = Callable[[float], None]
