"""Plain sends (sync, async, one-way, batch, ordered, delayed) on one librocketmq producer.

What librocketmq 2.1.0 does, and why this module works around some of it (read in the 2.1.0
sources, ``src/extern/CProducer.cpp`` and ``src/producer/DefaultMQProducerImpl.cpp``; see
docs/backend-design.md, "Plain sends"):

* ``CreateOrderlyProducer`` and ``CreateProducer`` build the same ``DefaultMQProducer``; the
  "orderly" flag is never read.  One ``CreateProducer`` serves every kind of send here.
* ``SendMessageOrderlyByShardingKey`` picks ``std::hash<std::string>(key) % queues`` - a hash that
  differs between C++ standard libraries, so a Java producer (``SelectMessageQueueByHash``:
  ``String.hashCode``) puts the same key on another queue - and it sends with 3 automatic
  retries that go to the *next* queue (``sendAutoRetrySelectImpl``), which breaks the key's
  order exactly when the broker hiccups.  We call ``SendMessageOrderly`` with our own selector
  (Java's hash, so mixed-language producers agree) and ``autoRetryTimes=0``: a failed ordered
  send is reported, never re-routed.
* ``SendMessageAsync``'s callbacks carry no user data; ``SendAsync``'s do, so one pair of ctypes
  thunks serves every asynchronous send (the send's id is the user data).  The ordered
  asynchronous call has no user data, so those sends get a thunk pair each (kept until called).
* Every asynchronous request has a timer of the send timeout that answers with an exception, so
  each pending send completes within about ``send_timeout``; shutting the client down drops
  callbacks that have not run yet (``TcpRemotingClient::stopAllTcpTransportThread``).  ``close``
  therefore waits for every pending send before it shuts the client down.
* The client refuses empty bodies and bodies over ``maxMessageSize`` (128 KiB by default in
  2.1.0, 4 MiB on the broker); we raise the client's limit to ``max_message_size`` and check both
  before sending, so the caller gets an :class:`InvalidMessageError` instead of "No route info".
* ``SendBatchMessage`` is not used: 2.1.0 flags the request ``m=1`` and real brokers (Java's
  ``Boolean.parseBoolean``) read that as "not a batch", storing the encoded batch as one message.
  ``send_batch`` sends the messages one by one (``Capabilities.batch`` is False).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from txmsg.errors import ConfigError
from txmsg.message import OutgoingMessage, SendResult

from . import messages
from ._errors import (
    BackendUnavailableError,
    InvalidMessageError,
    ProducerClosedError,
    SendError,
)
from .async_sends import PendingSends, c_text, status_name
from .connect_race import send_retrying_instant_failure
from .gate import Gate
from .native import (
    NATIVE_LOCK,
    OK,
    QUEUE_SELECTOR_CALLBACK,
    CSendResult,
    Native,
)
from .send_rules import validate
from .settings import DEFAULT_MAX_MESSAGE_SIZE
from .timers import when_quiet

log = logging.getLogger("txmsg.rocketmq")

Credentials = tuple[bytes, bytes, bytes]

_STILL_RUNNING: set[PlainSender] = set()
"""Senders whose close timed out with sends still pending: the native producer keeps running and
may still call their ctypes thunks, so they are kept alive here (see pool._STILL_RUNNING)."""


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, 32-bit wrap-around).

    Why Java's: RocketMQ's stock selector for ordered sends (``SelectMessageQueueByHash``) uses
    it, so services in Java and Python that send the same entity's events with the same key put
    them on the same queue.
    """
    h = 0
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] | data[i + 1] << 8)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def queue_index(key: str, queues: int) -> int:
    """The queue (index in the topic's write-queue list) of ``key``: Java's
    ``SelectMessageQueueByHash`` - ``hashCode % n``, made non-negative with ``abs``."""
    return abs(java_string_hash(key)) % queues


class PlainSender:
    """A started ``DefaultMQProducer`` of one group for plain sends (the backend's
    :class:`txmsg.backend.MessageSender`).  Own instance name = own client factory, so closing
    it never touches the transactional producers of the same group."""

    def __init__(
        self,
        native: Native,
        group: str,
        *,
        instance_name: str,
        name_server: str,
        send_timeout_ms: int = 3000,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        credentials: Credentials | None = None,
    ) -> None:
        if max_message_size < 1:
            raise ConfigError(f"max_message_size must be >= 1 byte (got {max_message_size})")
        self.native = native
        self.group = group
        self.instance_name = instance_name
        self.send_timeout_ms = int(send_timeout_ms)
        self.max_message_size = int(max_message_size)
        self.gate = Gate()
        self.sent = 0
        self.failed = 0
        self._closed = False
        self.shut_down = False
        self._close_lock = threading.Lock()
        #: asynchronous sends waiting for their callbacks (and the thunks that answer them)
        self._async = PendingSends(self)
        self._selected = threading.local()
        # One thunk for the whole life of the producer (it must outlive the native client).
        self._selector = QUEUE_SELECTOR_CALLBACK(self._select)
        self.started_at: float | None = None
        dll = native.dll
        with NATIVE_LOCK:
            handle = dll.CreateProducer(group.encode())
            if not handle:
                raise BackendUnavailableError(
                    f"librocketmq could not create a producer for group {group!r}: {native.last_error()}"
                )
            self.handle = int(handle)
            started = False
            try:
                self._check(
                    dll.SetProducerInstanceName(handle, instance_name.encode()), "set instance name"
                )
                self._check(
                    dll.SetProducerNameServerAddress(handle, name_server.encode()),
                    "set name server",
                )
                self._check(
                    dll.SetProducerSendMsgTimeout(handle, self.send_timeout_ms), "set send timeout"
                )
                self._check(
                    dll.SetProducerMaxMessageSize(handle, self.max_message_size),
                    "set max message size",
                )
                if credentials is not None:
                    self._check(
                        dll.SetProducerSessionCredentials(handle, *credentials),
                        "set session credentials",
                    )
                self._check(dll.StartProducer(handle), "start the producer")
                self.started_at = time.monotonic()  # its factory's timers run from here
                started = True
            finally:
                if not started:
                    # A producer that never started owns no threads (unlike a push consumer,
                    # hazard #7): destroying it is safe.
                    dll.DestroyProducer(handle)

    def _check(self, status: Any, what: str) -> None:
        if int(status) != OK:
            raise BackendUnavailableError(
                f"librocketmq failed to {what} for producer {self.group}/{self.instance_name} "
                f"(status {int(status)}): {self.native.last_error()}"
            )

    def _validate(self, message: OutgoingMessage, *, batch: bool = False) -> None:
        validate(message, self.max_message_size, batch=batch)

    def _enter(self) -> None:
        if self._closed or not self.gate.enter_send():
            raise ProducerClosedError(
                f"producer group {self.group!r} is closed; create a new application/producer to "
                "send more messages"
            )

    def _send_error(
        self, message: OutgoingMessage, detail: str, how: str, *, count: bool = True
    ) -> SendError:
        if count:  # asynchronous failures are counted once, when their future completes
            self.failed += 1
        ordered = (
            f" The message was not re-routed: an ordered message goes to its key's queue or "
            f"nowhere (key {message.sharding_key!r}); retry it before sending later messages "
            "of that key."
            if message.sharding_key
            else ""
        )
        return SendError(
            f"{how} to topic {message.topic!r} (group {self.group!r}) failed: "
            f"{detail or 'no detail from librocketmq'}.{ordered} librocketmq 2.1.0 reports most "
            "broker refusals as 'No route info', so check, in order: the name server address "
            "and that the topic exists; on a cluster with ACL, that access_key/secret_key may "
            "PUB to the topic; that the broker can write. The broker's broker.log names the cause."
        )

    # ---- queue selection (sending thread, inside the send call) ------------------------------
    def _select(self, size: int, _message: int, arg: int | None) -> int:
        """``arg`` is the key's hash + 1 (never NULL: SendMessageOrderly refuses a NULL arg).

        Records the choice for the SendResult: in a thread-local for synchronous sends, in the
        pending entry for asynchronous ones (their answer may arrive on another thread before
        the send call returns)."""
        try:
            index = (int(arg or 1) - 1) % max(1, int(size))
            self._selected.index = index
            send_id = getattr(self._selected, "send_id", None)
            if send_id is not None:
                self._async.chose_queue(send_id, index)
            return index
        except BaseException:  # noqa: BLE001 - nothing may cross into C; queue 0 is a valid answer
            return 0

    @staticmethod
    def _selector_arg(key: str) -> int:
        return abs(java_string_hash(key)) + 1

    # ---- sync ------------------------------------------------------------------------------
    def send(self, message: OutgoingMessage) -> SendResult:
        """Send and wait for the broker (ordered when ``message.sharding_key`` is set)."""
        self._validate(message)
        self._enter()
        try:
            handle = messages.build(self.native, message)
            try:
                if message.sharding_key:
                    return self._send_ordered(message, handle)
                result = self.native.new_send_result()
                status = send_retrying_instant_failure(
                    lambda: self.native.dll.SendMessageSync(
                        self.handle, handle, ctypes.byref(result)
                    ),
                    what=f"send to {message.topic}",
                )
                if status != OK:
                    raise self._send_error(message, self.native.last_error(), "send")
                self.sent += 1
                return SendResult(
                    message_id=c_text(result.msgId),
                    send_status=status_name(result.sendStatus),
                    offset=int(result.offset),
                )
            finally:
                self.native.dll.DestroyMessage(handle)
        finally:
            self.gate.exit_send()

    def _send_ordered(self, message: OutgoingMessage, handle: int) -> SendResult:
        key = message.sharding_key or ""
        result = CSendResult()
        self._selected.index = None
        status = send_retrying_instant_failure(
            lambda: self.native.dll.SendMessageOrderly(
                self.handle,
                handle,
                self._selector,
                self._selector_arg(key),
                0,
                ctypes.byref(result),
            ),
            what=f"ordered send to {message.topic}",
        )
        if status != OK:
            raise self._send_error(message, self.native.last_error(), "ordered send")
        self.sent += 1
        return SendResult(
            message_id=c_text(result.msgId),
            send_status=status_name(result.sendStatus),
            offset=int(result.offset),
            queue_id=self._selected.index,
        )

    # ---- one-way ---------------------------------------------------------------------------
    def send_oneway(self, message: OutgoingMessage) -> None:
        """Hand the message to the network and return; nothing says whether it was stored."""
        self._validate(message)
        self._enter()
        try:
            handle = messages.build(self.native, message)
            try:
                dll = self.native.dll
                if message.sharding_key:
                    status = int(
                        dll.SendMessageOnewayOrderly(
                            self.handle,
                            handle,
                            self._selector,
                            self._selector_arg(message.sharding_key),
                        )
                    )
                else:
                    status = int(dll.SendMessageOneway(self.handle, handle))
                if status != OK:
                    raise self._send_error(message, self.native.last_error(), "one-way send")
                self.sent += 1
            finally:
                self.native.dll.DestroyMessage(handle)
        finally:
            self.gate.exit_send()

    # ---- batch -----------------------------------------------------------------------------
    def send_batch(self, batch: Sequence[OutgoingMessage]) -> SendResult:
        """Send messages of one topic one by one, in order; ids joined by commas.

        Not librocketmq's ``SendBatchMessage``: 2.1.0 flags its batch request ``m=1``, and a real
        broker (4.9.8 and 5.3.3 decode the flag with Java's ``Boolean.parseBoolean``: only "true"
        counts) stores the whole encoded batch as *one* message, which consumers get as an empty
        body (seen on a real 4.9.8, docs/rocketmq-facts.md).  Every message is checked before the
        first is sent, so a bad batch sends nothing.

        Raises:
            InvalidMessageError: an empty batch, messages of different topics, a message that
                cannot be sent (delayed or ordered ones: RocketMQ refuses them in batches).
            SendError: a send failed; the error names how many of the batch were stored before.
        """
        items = list(batch)
        if not items:
            raise InvalidMessageError("send_batch needs at least one message")
        topic = items[0].topic
        for item in items:
            if item.topic != topic:
                raise InvalidMessageError(
                    f"a batch goes to one topic (got {topic!r} and {item.topic!r}); send one batch per topic"
                )
            self._validate(item, batch=True)
        ids: list[str] = []
        last = SendResult(message_id="", send_status="SEND_OK")
        for index, item in enumerate(items):
            try:
                last = self.send(item)
            except SendError as exc:
                raise SendError(
                    f"{exc} (batch: messages 1..{index} of {len(items)} were stored: "
                    f"{','.join(ids) or 'none'}; resend from message {index + 1})"
                ) from exc
            ids.append(last.message_id)
        return SendResult(
            message_id=",".join(ids),
            send_status=last.send_status,
            offset=last.offset,
            queue_id=last.queue_id,
        )

    # ---- async -----------------------------------------------------------------------------
    def send_async(self, message: OutgoingMessage) -> Future[SendResult]:
        """Send without blocking; the future ends on a librocketmq thread with the result or a
        :class:`SendError`, at the latest about ``send_timeout`` after the call.

        Callbacks added to the future run on that native thread: keep them short.  Ordered
        messages (``sharding_key``) go to their key's queue, but two asynchronous sends of one
        key may be stored in either order - wait for each before sending the next.
        """
        self._validate(message)
        self._enter()  # left when the send completes (gate counts pending sends)
        future: Future[SendResult] = Future()
        future.set_running_or_notify_cancel()  # a send on the wire cannot be cancelled
        send_id = self._async.next_id()
        dll = self.native.dll
        try:
            handle = messages.build(self.native, message)
        except BaseException:
            self.gate.exit_send()
            raise
        try:
            if message.sharding_key:
                thunks = self._async.ordered_callbacks(send_id)
                self._async.add(send_id, future, thunks)
                self._selected.send_id = send_id
                try:
                    status = int(
                        dll.SendMessageOrderlyAsync(
                            self.handle,
                            handle,
                            self._selector,
                            self._selector_arg(message.sharding_key),
                            thunks.on_success,
                            thunks.on_error,
                        )
                    )
                finally:
                    self._selected.send_id = None
            else:
                self._async.add(send_id, future, None)
                status = int(
                    dll.SendAsync(
                        self.handle,
                        handle,
                        self._async.on_success,
                        self._async.on_exception,
                        send_id,
                    )
                )
            if status != OK:
                # The callback may already have reported it (2.1.0 calls onException for some
                # failures and also returns an error); whoever completes first wins.
                self._async.complete(
                    send_id,
                    error=self._send_error(
                        message, self.native.last_error(), "asynchronous send", count=False
                    ),
                )
        finally:
            # The client copied the message (SendCallbackWrap keeps its own MQMessage); the
            # pointer handed back to the callbacks is never dereferenced.
            dll.DestroyMessage(handle)
        return future

    @property
    def pending(self) -> int:
        """Asynchronous sends still waiting for the broker."""
        return len(self._async)

    # ---- shutdown --------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """Refuse new sends, wait (bounded) until every pending send has its answer, shut down.

        On timeout the native producer is left running (its callbacks may still come; shutting
        it down then could crash the process) and the still-pending futures fail with a
        :class:`SendError` saying the outcome is unknown; a later ``close`` shuts it down.
        """
        with self._close_lock:
            if self.shut_down:
                return
            self._closed = True
            limit = 30.0 if timeout is None else max(0.0, timeout)
            deadline = time.monotonic() + limit
            if not self.gate.drain_and_shut(deadline):
                left = self._async.ids()
                log.error(
                    "producer %s/%s still has %d asynchronous send(s) without an answer after %.1f s; "
                    "leaving the client running rather than crash the process",
                    self.group,
                    self.instance_name,
                    len(left),
                    limit,
                )
                for send_id in left:
                    self._async.complete(
                        send_id,
                        error=SendError(
                            f"producer group {self.group!r} was closed before the broker answered "
                            "this asynchronous send; the message may or may not be stored"
                        ),
                    )
                _STILL_RUNNING.add(self)
                return
            dll, handle = self.native.dll, self.handle
            # this client's shutdown ends its factory: at a quiet moment, checked under the lock
            when_quiet(
                self.started_at,
                NATIVE_LOCK,
                lambda: (dll.ShutdownProducer(handle), dll.DestroyProducer(handle)),
            )
            self.shut_down = True
            _STILL_RUNNING.discard(self)

    def stats(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "failed": self.failed,
            "pending": self.pending,
            "shut_down": self.shut_down,
        }
