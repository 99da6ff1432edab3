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

import contextlib
import ctypes
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
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
from .connect_race import send_retrying_instant_failure
from .gate import Gate
from .names import refuse_printf_topic
from .native import (
    NATIVE_LOCK,
    OK,
    ON_SEND_EXCEPTION,
    ON_SEND_SUCCESS,
    QUEUE_SELECTOR_CALLBACK,
    SEND_EXCEPTION,
    SEND_STATUS_NAMES,
    SEND_SUCCESS,
    CMQException,
    CSendResult,
    Native,
)
from .settings import DEFAULT_MAX_MESSAGE_SIZE
from .timers import when_quiet

log = logging.getLogger("txmsg.rocketmq")

MAX_DELAY_LEVEL = 18
"""RocketMQ 4's default ``messageDelayLevel`` has 18 levels (1 s ... 2 h)."""

_SPENT_THUNK_TTL = 5.0
"""Seconds a per-send thunk pair is kept after its callback ran (see _complete)."""

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


def _status_name(code: int) -> str:
    return SEND_STATUS_NAMES.get(int(code), str(int(code)))


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class _OrderlyAsync:
    """Thunks of one ordered asynchronous send (``SendMessageOrderlyAsync`` has no user data)."""

    __slots__ = ("on_error", "on_success")

    def __init__(self, on_success: Any, on_error: Any) -> None:
        self.on_success = on_success
        self.on_error = on_error


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
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[SendResult], _OrderlyAsync | None, int | None]] = {}
        self._pending_lock = threading.Lock()
        self._spent: deque[tuple[float, _OrderlyAsync]] = deque()
        self._selected = threading.local()
        # One thunk each for the whole life of the producer (it must outlive the native client).
        self._selector = QUEUE_SELECTOR_CALLBACK(self._select)
        self._on_success = ON_SEND_SUCCESS(self._async_success)
        self._on_exception = ON_SEND_EXCEPTION(self._async_exception)
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

    # ---- validation ------------------------------------------------------------------------
    def _validate(self, message: OutgoingMessage, *, batch: bool = False) -> None:
        """Refuse what librocketmq 2.1.0 or a 4.9 broker cannot send, saying what to do."""
        refuse_printf_topic(message.topic)
        if message.deliver_at_ms is not None:
            raise InvalidMessageError(
                "deliver_at (a delivery timestamp) needs RocketMQ 5 timer messages; the rocketmq "
                "backend (RocketMQ 4.9 protocol) has delay levels only: use delay_level=1..18 "
                "(1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h) or the rocketmq5 backend"
            )
        level = message.delay_level
        if level is not None and not (isinstance(level, int) and 1 <= level <= MAX_DELAY_LEVEL):
            raise InvalidMessageError(
                f"delay_level must be an int 1..{MAX_DELAY_LEVEL} (got {level!r}): "
                "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
            )
        if message.sharding_key is not None:
            if not isinstance(message.sharding_key, str) or not message.sharding_key:
                raise InvalidMessageError(
                    f"sharding_key must be a non-empty str (got {message.sharding_key!r}); use the "
                    "id of the business entity whose messages must stay in order"
                )
            if level is not None:
                raise InvalidMessageError(
                    "an ordered message (sharding_key) cannot be delayed: the broker would put it "
                    "back into the key's queue after later messages of the same key; send it at once"
                )
            if batch:
                raise InvalidMessageError(
                    "send_batch cannot keep a sharding key's order (librocketmq 2.1.0 spreads "
                    "batches over queues); send ordered messages one by one with a sharding_key"
                )
        if batch and level is not None:
            raise InvalidMessageError(
                "a batch cannot be delayed (RocketMQ refuses delay levels in batches); send "
                "delayed messages one by one"
            )
        if not message.body:
            raise InvalidMessageError(
                f"message to topic {message.topic!r} has an empty body, which RocketMQ refuses; "
                "send at least one byte"
            )
        size = self._wire_size(message)
        if size > self.max_message_size:
            raise InvalidMessageError(
                f"message body of {size} bytes (as sent) exceeds the maximum message size of "
                f"{self.max_message_size} bytes (the broker's maxMessageSize); store the payload "
                "elsewhere and send a reference, or split it"
            )

    @staticmethod
    def _wire_size(message: OutgoingMessage) -> int:
        """Body length as sent: bodies with NUL bytes go base64-encoded (see messages.py)."""
        n = len(message.body)
        return (n + 2) // 3 * 4 if b"\x00" in message.body else n

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
                with self._pending_lock:
                    entry = self._pending.get(send_id)
                    if entry is not None:
                        self._pending[send_id] = (entry[0], entry[1], index)
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
                    message_id=_text(result.msgId),
                    send_status=_status_name(result.sendStatus),
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
            message_id=_text(result.msgId),
            send_status=_status_name(result.sendStatus),
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
        send_id = next(self._ids)
        dll = self.native.dll
        try:
            handle = messages.build(self.native, message)
        except BaseException:
            self.gate.exit_send()
            raise
        try:
            if message.sharding_key:
                thunks = _OrderlyAsync(
                    SEND_SUCCESS(lambda result: self._async_success(result, None, send_id)),
                    SEND_EXCEPTION(lambda exc: self._async_exception(exc, None, send_id)),
                )
                with self._pending_lock:
                    self._pending[send_id] = (future, thunks, None)
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
                with self._pending_lock:
                    self._pending[send_id] = (future, None, None)
                status = int(
                    dll.SendAsync(
                        self.handle, handle, self._on_success, self._on_exception, send_id
                    )
                )
            if status != OK:
                # The callback may already have reported it (2.1.0 calls onException for some
                # failures and also returns an error); whoever completes first wins.
                self._complete(
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

    def _async_success(
        self, result: CSendResult, _message: int | None, send_id: int | None
    ) -> None:
        self._callback(
            send_id,
            lambda queue: SendResult(
                message_id=_text(result.msgId),
                send_status=_status_name(result.sendStatus),
                offset=int(result.offset),
                queue_id=queue,
            ),
        )

    def _async_exception(
        self, exc: CMQException, _message: int | None, send_id: int | None
    ) -> None:
        detail = f"{_text(exc.msg)} (error {int(exc.error)})"

        def error(_queue: int | None) -> SendError:
            return SendError(
                f"asynchronous send (group {self.group!r}) failed: {detail}. librocketmq 2.1.0 "
                "reports broker refusals of asynchronous sends without their reason; the broker's "
                "broker.log and the client log (ROCKETMQ_CLIENT_LOG_DIR) name it"
            )

        self._callback(send_id, error)

    def _callback(
        self, send_id: int | None, outcome: Callable[[int | None], SendResult | SendError]
    ) -> None:
        """Body of both native callbacks: never lets an exception into C."""
        self.gate.enter_callback(refuse_after_shut=False)
        try:
            with self._pending_lock:
                entry = self._pending.get(int(send_id or 0))
            queue = entry[2] if entry is not None else None
            value = outcome(queue)
            if isinstance(value, SendResult):
                self._complete(int(send_id or 0), result=value)
            else:
                self._complete(int(send_id or 0), error=value)
        except BaseException:
            with contextlib.suppress(
                BaseException
            ):  # a logging failure cannot be reported anywhere
                log.exception("asynchronous send callback of %s failed", self.group)
        finally:
            self.gate.exit_callback()

    def _complete(
        self, send_id: int, *, result: SendResult | None = None, error: BaseException | None = None
    ) -> None:
        with self._pending_lock:
            entry = self._pending.pop(send_id, None)
            if entry is not None and entry[1] is not None:
                # Per-send thunks: we may be running inside one right now, and ctypes reads the
                # thunk's cif after the Python body returns - free them a while later instead.
                now = time.monotonic()
                self._spent.append((now, entry[1]))
                while self._spent and now - self._spent[0][0] > _SPENT_THUNK_TTL:
                    self._spent.popleft()
        if entry is None:
            return  # already completed (failure reported twice) or failed by close()
        future = entry[0]
        self.gate.exit_send()
        if error is not None:
            self.failed += 1
            future.set_exception(error)
        elif result is not None:
            self.sent += 1
            future.set_result(result)

    @property
    def pending(self) -> int:
        """Asynchronous sends still waiting for the broker."""
        with self._pending_lock:
            return len(self._pending)

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
                with self._pending_lock:
                    left = list(self._pending)
                log.error(
                    "producer %s/%s still has %d asynchronous send(s) without an answer after %.1f s; "
                    "leaving the client running rather than crash the process",
                    self.group,
                    self.instance_name,
                    len(left),
                    limit,
                )
                for send_id in left:
                    self._complete(
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
