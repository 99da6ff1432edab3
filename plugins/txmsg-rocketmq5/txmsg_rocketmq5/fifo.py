"""``@message_listener(orderly=True)`` on the rocketmq5 backend: FIFO message groups, in order.

What RocketMQ 5 guarantees, and what this loop adds:

* For a **FIFO consumer group** (its subscription group has ``consumeMessageOrderly=true``; the
  proxy says so in its Settings answer, ``subscription.fifo``) the broker pops a queue orderly: once
  messages of a queue are delivered, that queue delivers nothing else until they are acked or
  their invisible time runs out, and then the oldest unacknowledged one comes first.  A message
  group always lives in one queue (the producer hashes the group to a queue).  Without a FIFO
  group the broker delivers concurrently and no client can restore the order, so :func:`check_fifo`
  refuses to start.
* Here: the messages of one receive are split by message group (``Message.sharding_key``;
  messages without a group share the key ``""``).  Each group is worked on by one thread at a
  time, strictly receive -> handle -> ack answered before its next message (the thread does not
  wait for the ack: it works on another group meanwhile); different groups run on up to
  ``concurrency`` threads.  A handler answering False (the core could not even park the message)
  makes that message **and every later message of its group already received** invisible for
  ``ORDERLY_RETRY_DELAY`` (~1 s) without acking any of them, so they come back in the same order;
  other groups keep flowing.  Nothing is ever acked ahead of an earlier message of its group.

Retries and parking are the core's (``txmsg.orderly``): this backend does not dead-letter orderly
messages itself (``max_reconsume`` is not used); the broker's own retry limit of the group
(``retryMaxTimes``, 16 by default) still moves a message that comes back that often to
``%DLQ%<group>``, as for every 5.x FIFO consumer.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from txmsg import defaults
from txmsg.backend import ConsumeHandler
from txmsg.errors import BackendUnavailableError, ConfigError, ListenerDefinitionError

from . import messages
from ._client import FilterExpression
from .receive import AWAIT_S, INVISIBLE_S, QuietSimpleConsumer, ReceiveLoop

log = logging.getLogger("txmsg.rocketmq5")

SETTINGS_WAIT_S = 10.0
"""How long start-up waits for the proxy's Settings answer (the client's own wait for push consumers)."""
HELD_PER_THREAD = 4
"""Messages held (received, not yet acked) per handler thread: enough to keep every thread busy
when one receive brings several groups, few enough that a close() leaves little to redeliver."""
RECEIVE_MAX = 32
"""The proxy's receive batch maximum, and the fewest messages held at once whatever the thread
count: with 1 thread and 4 held, every 4 messages waited for a receive round trip, which made
txmsg's FIFO consumer 0.44-0.69 as fast as the 5.x client's own receive-and-ack loop
(``benchmarks.orderly_throughput``, ``fifo_t1``); 32 held gave 0.61-0.93 in the same trial."""


class _SettingsConsumer(QuietSimpleConsumer):
    """A ``SimpleConsumer`` that remembers the proxy's Settings answer (``subscription.fifo``).

    Why: the base class ignores that answer, and its ``startup()`` does not wait for it (only push
    consumers do), so :func:`check_fifo` waits on :attr:`settled` itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.fifo: bool | None = None
        self.settled = threading.Event()
        super().__init__(*args, **kwargs)

    def reset_setting(self, settings: Any) -> None:
        if settings is not None and settings.HasField("subscription"):
            self.fifo = bool(settings.subscription.fifo)
            self.settled.set()
        super().reset_setting(settings)


def check_fifo(client: Any, group: str, topic: str, wait: float = SETTINGS_WAIT_S) -> None:
    """Raise unless the proxy's Settings answer says ``group`` is consumed as a FIFO group.

    Raises:
        BackendUnavailableError: no Settings answer within ``wait`` seconds (proxy unreachable).
        ListenerDefinitionError: the answer says the group is not FIFO (how to make it one).
    """
    if not client.settled.wait(wait):
        raise BackendUnavailableError(
            f"consumer group {group!r}: the RocketMQ 5 proxy did not answer the consumer's settings "
            f"within {wait:.0f} s, so txmsg cannot tell whether it consumes the group in order; "
            "check the endpoints (`txmsg doctor`) and start again"
        )
    if client.fifo:
        return
    raise ListenerDefinitionError(
        f"consumer group {group!r} on topic {topic!r}: the RocketMQ 5 proxy does not consume this "
        "group in order (its Settings answer has fifo=false), so an orderly listener cannot keep "
        "the order. Create the group as an orderly group and the topic as a FIFO topic: "
        f"`mqadmin updateSubGroup -g {group} -o true` and `mqadmin updateTopic -t {topic} "
        "-a +message.type=FIFO` (both tools work against txmsg's embedded broker too, as do "
        f"`txmsg group create {group} --orderly` and `txmsg topic create {topic} --type FIFO`), "
        "then restart"
    )


class FifoConsumer(ReceiveLoop):
    """One FIFO consumer group on one topic: a receive loop feeding per-group sequential work."""

    def __init__(
        self,
        configuration: Any,
        *,
        group: str,
        topic: str,
        tags: str,
        handler: ConsumeHandler,
        concurrency: int,
        retry_delay: float = defaults.ORDERLY_RETRY_DELAY,
        tls: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(
                f"consumer group {group!r}: concurrency must be >= 1 (got {concurrency})"
            )
        self.group, self.topic = group, topic
        self.handler = handler
        self.concurrency = concurrency
        # the client sends whole seconds; never 0 (that would redeliver at once, in a tight loop)
        self.retry_seconds = max(1, math.ceil(retry_delay))
        self.capacity = max(RECEIVE_MAX, concurrency * HELD_PER_THREAD)
        self.consumed = self.suspended = 0
        self._lock = threading.Condition()
        self._pending: dict[str, deque[Any]] = {}
        self._running: set[str] = set()
        self._held = 0
        self._stopping = threading.Event()
        self.client = _SettingsConsumer(
            configuration,
            group,
            {topic: FilterExpression(tags or "*")},
            await_duration=AWAIT_S,
            tls_enable=tls,
        )
        self.client.startup()
        try:
            check_fifo(self.client, group, topic)
        except BaseException:
            self.client.shutdown()
            raise
        self._pool = ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix=f"txmsg5-fifo-{group}"
        )
        self._loop = threading.Thread(
            target=self._run, name=f"txmsg5-fifo-receive-{group}", daemon=True
        )
        self._loop.start()

    # ---- receive loop (ReceiveLoop._run) ---------------------------------------------------------
    def _room(self) -> int:
        return min(self.capacity - self._held, RECEIVE_MAX)

    def _running_handlers(self) -> int:
        return len(self._running)

    def _dispatch(self, raw: Any) -> None:
        self._enqueue(raw)

    def _enqueue(self, raw: Any) -> None:
        """Queue ``raw`` behind its group's messages; start a worker if the group has none."""
        key = str(getattr(raw, "message_group", None) or "")
        with self._lock:
            self._held += 1
            self._pending.setdefault(key, deque()).append(raw)
            if key in self._running:
                return
            self._running.add(key)
        try:
            self._pool.submit(self._work, key)
        except RuntimeError:  # pool shut down (closing): these come back after their invisible time
            with self._lock:
                dropped = self._pending.pop(key, deque())
                self._running.discard(key)
                self._held -= len(dropped)
                self._lock.notify_all()

    # ---- one group -----------------------------------------------------------------------------
    def _work(self, key: str) -> None:
        """Handle ``key``'s next message and send its ack; the ack's answer hands the group on.

        One message of a group at a time, each handled only once the previous one's ack was
        answered, as before; but the thread does not wait for the ack (see
        :meth:`ReceiveLoop._ack_async`): it takes the next group with work, and the answer
        submits this group's next message (or its suspension) to the pool.  A group stays in
        ``_running`` until then, so stop() waits for acks in flight as for handlers."""
        with self._lock:
            waiting = self._pending.get(key)
            if not waiting or self._stopping.is_set():
                # on stop: what is left is not acked and comes back after its invisible time
                self._give_back(key)
                return
            raw = waiting[0]
        ack = self._handle(raw)
        if ack is None:
            self._fail(key)
            return
        ack.add_done_callback(lambda done: self._acked(key, raw, done))

    def _give_back(self, key: str) -> None:
        """Drop ``key``'s held messages without acking them (called holding ``_lock``)."""
        left = self._pending.pop(key, deque())
        self._held -= len(left)
        self._running.discard(key)
        self._lock.notify_all()

    def _fail(self, key: str) -> None:
        """Suspend the group: its first held message and every later one received, in order."""
        with self._lock:
            later = list(self._pending.pop(key, deque()))
            self._held -= len(later)
            self._running.discard(key)
            self.suspended += 1
            self._lock.notify_all()
        self._suspend(key, later)

    def _acked(self, key: str, raw: Any, done: Future[Any]) -> None:
        """The ack of ``key``'s first held message was answered (on the client's I/O thread:
        nothing here may block, the group's next step goes to the pool)."""
        refusal = self._ack_refusal(done)
        if refusal is None:
            with self._lock:
                self._pending[key].popleft()
                self._held -= 1
                self.consumed += 1
                self._lock.notify_all()
        else:
            log.error(
                "consumer group %s: message %s (group key %r) handled but not acknowledged (%s); "
                "it is redelivered and handled again before the later messages of its key",
                self.group,
                raw.message_id,
                key,
                refusal,
            )
        try:
            self._pool.submit(self._work if refusal is None else self._fail, key)
        except RuntimeError:  # stopping: what is left comes back after its invisible time
            with self._lock:
                self._give_back(key)

    def _handle(self, raw: Any) -> Future[Any] | None:
        """Run the handler and send the ack; None = the message must come again (not acked)."""
        try:
            message = messages.from_client(raw)
        except Exception:  # a message we cannot read is retried, never skipped
            log.exception("consumer group %s: cannot read message %s", self.group, raw.message_id)
            return None
        if not self.handler(message):
            return None
        try:
            return self._ack_async(raw)
        except Exception as exc:  # noqa: BLE001 - not acked: it comes again, the group waits for it
            log.error(
                "consumer group %s: message %s (group key %r) handled but not acknowledged (%s: %s); "
                "it is redelivered and handled again before the later messages of its key",
                self.group,
                raw.message_id,
                message.sharding_key,
                type(exc).__name__,
                exc,
            )
            return None

    def _suspend(self, key: str, held: list[Any]) -> None:
        """Make ``held`` (the failed message first) visible again in ``retry_seconds``.

        If a change fails, that message comes back after its receive's invisible time instead;
        the broker still hands a FIFO queue's messages out oldest first, so order is kept."""
        for raw in held:
            try:
                self.client.change_invisible_duration(raw, self.retry_seconds)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                log.warning(
                    "consumer group %s: could not shorten the invisible time of message %s (key %r): "
                    "%s; it comes back after %d s",
                    self.group,
                    raw.message_id,
                    key,
                    exc,
                    INVISIBLE_S,
                )

    # ---- lifecycle -----------------------------------------------------------------------------
    CANCEL_QUEUED = False
    """Not cancel_futures: a queued worker must run to give its group back (it sees the stop at
    once and returns without handling anything)."""

    def stop(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Stop receiving, let each running handler finish (at most ``timeout``), shut down.
        Received messages not handled yet are not acked: they come back, in order, later."""
        super().stop(timeout)
