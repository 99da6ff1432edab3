"""Plain sends of one producer group over the 5.x client (:class:`txmsg.backend.MessageSender`).

How RocketMQ 4 send kinds map onto RocketMQ 5 (``Capabilities`` of the backend say the same):

* ``sharding_key`` -> the message's ``message_group`` (a FIFO message).  The client picks the queue
  by a hash of the group (same group, same queue) and the proxy stores the group as the
  ``__SHARDINGKEY`` property, so a remoting consumer sees the key too.  The topic must be a FIFO
  topic (``message.type=FIFO``), which the client checks against the route.
* ``delay_level`` -> ``delivery_timestamp = now + DELAY_LEVELS[level - 1]`` and ``deliver_at_ms``
  -> ``delivery_timestamp`` (a DELAY topic).  The client carries whole seconds only; the time is
  rounded *up* so a message is never delivered before the time asked for.
* ``send_oneway``: gRPC has no one-way RPC; the message is sent asynchronously and the answer is
  only looked at to log a failure at WARNING (nothing tells the caller, as with a real one-way send).
* ``send_batch``: the proxy refuses batches of more than one message per request for most message
  types, and the 5.x client has no batch API; the messages are sent one by one, in order, each
  waiting for the previous one, and the ids are joined by commas as RocketMQ answers a batch.

Its own ``Producer`` instance (not the group's transactional one): a transactional producer
announces its topics for check-backs, a plain one must not answer check-backs at all.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from txmsg.errors import InvalidMessageError, ProducerClosedError, SendError
from txmsg.message import DELAY_LEVELS, SHARDING_KEY, OutgoingMessage, SendResult

from . import messages
from ._client import IllegalArgumentException, Producer
from ._client import Message as ClientMessage
from .client import shut_down
from .routes import fetch_routes_on_their_thread

log = logging.getLogger("txmsg.rocketmq5")

SEND_OK = "SEND_OK"


def delivery_seconds(message: OutgoingMessage, now: float | None = None) -> int | None:
    """The epoch second a delayed message is due (None: at once), rounded up.

    Raises:
        InvalidMessageError: a delay level outside 1..18, or both ``delay_level`` and
            ``deliver_at_ms`` (the core refuses these earlier; a backend must not guess).
    """
    level, at_ms = message.delay_level, message.deliver_at_ms
    if level is not None and at_ms is not None:
        raise InvalidMessageError(
            f"topic {message.topic!r}: give delay_level or deliver_at, not both"
        )
    if level is not None:
        if not 1 <= int(level) <= len(DELAY_LEVELS):
            raise InvalidMessageError(
                f"topic {message.topic!r}: delay_level must be 1..{len(DELAY_LEVELS)} "
                f"(got {level}); the levels are {DELAY_LEVELS} seconds"
            )
        base = time.time() if now is None else now
        return math.ceil(base + DELAY_LEVELS[int(level) - 1])
    if at_ms is not None:
        return math.ceil(int(at_ms) / 1000)
    return None


def _queue_id(receipt: Any) -> int | None:
    """The queue id of a ``SendReceipt``'s queue.

    Why the fallback to the mangled attribute: the client's ``MessageQueue`` keeps the id private
    (``__queue_id``) and exposes no getter in 5.1.x; the queue is what the producer's skew
    statistics count, and None (unknown) is an acceptable answer if the client changes."""
    queue = getattr(receipt, "message_queue", None)
    if queue is None:
        return None
    value = getattr(queue, "queue_id", None)
    if value is None:
        value = getattr(queue, "_MessageQueue__queue_id", None)
    return int(value) if isinstance(value, int) else None


class PlainSender:
    """:class:`txmsg.backend.MessageSender` of one group on its own 5.x ``Producer``."""

    def __init__(self, group: str, *, configuration: Any, tls: bool = False) -> None:
        self.group = group
        self._lock = threading.Condition()
        self._closed = False
        self._in_flight = 0  # sync sends running + async sends not answered yet
        self.sent = 0
        self.failed = 0
        self.oneway_failed = 0
        self.producer = Producer(configuration, None, None, tls)
        fetch_routes_on_their_thread(self.producer)
        self.producer.startup()

    # ---- building ------------------------------------------------------------------------------
    def _build(self, message: OutgoingMessage) -> Any:
        props = dict(message.properties)
        key = message.sharding_key
        if key is not None:
            if not key.strip():
                raise InvalidMessageError(
                    f"topic {message.topic!r}: the sharding key is blank; give each ordered "
                    "message the id of the business entity it belongs to"
                )
            # the proxy stores the message group as this property itself and refuses it as a
            # user property ("property is used by system")
            props.pop(SHARDING_KEY, None)
        out = messages.to_client(
            OutgoingMessage(
                topic=message.topic,
                body=message.body,
                tags=message.tags,
                keys=message.keys,
                properties=props,
            ),
            ClientMessage,
        )
        at = delivery_seconds(message)
        try:
            if key is not None:
                out.message_group = key
            if at is not None:
                out.delivery_timestamp = at
        except IllegalArgumentException as exc:
            raise InvalidMessageError(
                f"topic {message.topic!r}: {exc}. RocketMQ 5 cannot delay an ordered (FIFO) "
                "message; send it without delay_level/deliver_at or without a sharding key"
            ) from exc
        return out

    def _refused(self, message: OutgoingMessage, exc: Exception) -> Exception:
        """The error for a failed send: what the caller can change, or what to check."""
        if isinstance(exc, IllegalArgumentException):
            kind = (
                "FIFO"
                if message.sharding_key is not None
                else "DELAY"
                if message.delay_level is not None or message.deliver_at_ms is not None
                else "NORMAL"
            )
            return InvalidMessageError(
                f"topic {message.topic!r} (group {self.group!r}): the RocketMQ 5 client refused "
                f"the message: {exc}. A {kind} message needs a topic of that type "
                f"(`txmsg topic create {message.topic} --type {kind}`, or MIXED)"
            )
        return SendError(
            f"send to topic {message.topic!r} (group {self.group!r}) failed: "
            f"{type(exc).__name__}: {exc}. Check the endpoints (`txmsg doctor`) and that the "
            "topic exists; the message may or may not be stored"
        )

    def _enter(self) -> None:
        with self._lock:
            if self._closed:
                raise ProducerClosedError(
                    f"producer group {self.group!r} is closing; create a new application/producer "
                    "to send more messages"
                )
            self._in_flight += 1

    def _leave(self, ok: bool) -> None:
        with self._lock:
            self._in_flight -= 1
            if ok:
                self.sent += 1
            else:
                self.failed += 1
            self._lock.notify_all()

    @staticmethod
    def _result(receipt: Any) -> SendResult:
        offset = getattr(receipt, "offset", None)
        return SendResult(
            message_id=str(receipt.message_id),
            send_status=SEND_OK,
            offset=int(offset) if offset is not None else None,
            queue_id=_queue_id(receipt),
        )

    # ---- sends ---------------------------------------------------------------------------------
    def send(self, message: OutgoingMessage) -> SendResult:
        """Send and wait for the proxy's answer (the client retries per its backoff policy)."""
        out = self._build(message)
        self._enter()
        ok = False
        try:
            try:
                receipt = self.producer.send(out)
            except Exception as exc:
                raise self._refused(message, exc) from exc
            ok = True
            return self._result(receipt)
        finally:
            self._leave(ok)

    def send_async(self, message: OutgoingMessage) -> Future[SendResult]:
        """Send without blocking: the future ends with the :class:`SendResult` or the error
        (:class:`txmsg.SendError` / :class:`txmsg.InvalidMessageError`), on a client thread."""
        out = self._build(message)
        self._enter()
        result: Future[SendResult] = Future()
        try:
            inner = self.producer.send_async(out)
        except Exception as exc:  # noqa: BLE001 - refused before sending (route, message type, client)
            self._leave(False)
            result.set_exception(self._refused(message, exc))
            return result

        def done(fut: Future[Any]) -> None:
            try:
                value = self._result(fut.result())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's future
                self._leave(False)
                error = self._refused(message, exc) if isinstance(exc, Exception) else exc
                result.set_exception(error)
            else:
                self._leave(True)
                result.set_result(value)

        inner.add_done_callback(done)
        return result

    def send_oneway(self, message: OutgoingMessage) -> None:
        """Emulated (see the module docstring): sent asynchronously, a failure only logged."""
        future = self.send_async(message)

        def logged(fut: Future[SendResult]) -> None:
            exc = fut.exception()
            if exc is not None:
                with self._lock:
                    self.oneway_failed += 1
                log.warning(
                    "group=%s topic=%s: one-way send failed (the caller is not told): %s",
                    self.group,
                    message.topic,
                    exc,
                )

        future.add_done_callback(logged)

    def send_batch(self, messages_: Sequence[OutgoingMessage]) -> SendResult:
        """One by one, in order (see the module docstring); ids joined by commas.

        Raises:
            InvalidMessageError: an empty batch or messages of different topics (as RocketMQ 4).
            SendError: a send failed; the error names how many of the batch were stored before.
        """
        batch = list(messages_)
        if not batch:
            raise InvalidMessageError("send_batch needs at least one message")
        topics = {m.topic for m in batch}
        if len(topics) > 1:
            raise InvalidMessageError(
                f"a batch goes to one topic (got {sorted(topics)}); send one batch per topic"
            )
        for message in batch:
            self._build(message)  # refuse the whole batch before anything is sent
        ids: list[str] = []
        last = SendResult(message_id="", send_status=SEND_OK)
        for index, message in enumerate(batch):
            try:
                last = self.send(message)
            except SendError as exc:
                raise SendError(
                    f"{exc} (batch: messages 1..{index} of {len(batch)} were stored: "
                    f"{','.join(ids) or 'none'}; resend from message {index + 1})"
                ) from exc
            ids.append(last.message_id)
        return SendResult(
            message_id=",".join(ids),
            send_status=SEND_OK,
            offset=last.offset,
            queue_id=last.queue_id,
        )

    # ---- lifecycle -----------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """Refuse new sends, wait (bounded) for sends in flight, shut the client down."""
        deadline = time.monotonic() + (30.0 if timeout is None else max(0.0, timeout))
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._in_flight and self._lock.wait(max(0.0, deadline - time.monotonic())):
                pass
            pending = self._in_flight
        if pending:
            log.error(
                "producer group %s: %d send(s) still unanswered after the close timeout; shutting "
                "the client down anyway (they may or may not be stored). Give close() a longer "
                "timeout",
                self.group,
                pending,
            )
        shut_down(self.producer, f"producer group {self.group}")

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "sent": self.sent,
                "failed": self.failed,
                "oneway_failed": self.oneway_failed,
                "in_flight": self._in_flight,
            }
