"""A real librocketmq push consumer driving a txmsg :data:`~txmsg.backend.ConsumeHandler`.

Why it is built on the C API rather than the wrapper's ``PushConsumer``: the wrapper re-raises
callback exceptions into ctypes (which then returns garbage to C++) and cannot set an instance
name per consumer before ``Subscribe``.  Semantics kept from RocketMQ:

* handler returns True -> ``CONSUME_SUCCESS``; False (or anything going wrong) ->
  ``RECONSUME_LATER``: the client sends the message back and the broker redelivers it from the
  group's retry topic with growing delays; after ``maxReconsumeTimes`` the broker moves it to
  ``%DLQ%<group>``.
* librocketmq 2.1.0 has no C call for ``maxReconsumeTimes``; every send-back carries the
  client default 16 (``DefaultMQPushConsumerImpl::getMaxReconsumeTimes``).  A smaller
  ``max_reconsume`` is enforced here: once a message has been redelivered ``max_reconsume`` times
  and fails again, it is sent to ``%DLQ%<group>`` by a plain producer of this consumer (same
  body, keys, tags and properties plus ``RETRY_TOPIC``/``ORIGIN_MESSAGE_ID`` as the broker would
  set) and acknowledged.  If that send fails (a real broker creates the DLQ topic only on its own
  first dead letter and may refuse to auto-create it), the message is handed back with
  RECONSUME_LATER, so the broker's own DLQ still takes it after 16: nothing is dropped.  Values
  above 16 cannot be honoured; a warning says so.
* ``orderly=True`` registers through ``RegisterMessageCallbackOrderly``: 2.1.0's
  ``ConsumeMessageOrderlyService`` locks each queue on the broker (``LOCK_BATCH_MQ``, renewed
  every 20 s), consumes a queue only while it holds the lock, one message at a time under the
  queue's mutex, and commits the offset after each success.  ``concurrency`` threads serve
  different queues.  RECONSUME_LATER keeps the message at the head of its queue (its
  ``reconsume_times`` counted locally) and resubmits the queue 1 s later - 5 s after 16 local
  attempts - for ever: an orderly message never goes to the retry topic or the DLQ, which is
  why txmsg's orderly listener bounds retries itself (txmsg.orderly).
* Every consumed message carries ``queue_id``, ``queue_offset`` and, when it was sent with one,
  ``sharding_key`` (property ``__SHARDINGKEY``).
* One ``Subscribe`` per consumer group: RocketMQ requires every consumer of a group to
  subscribe identically, so a second topic needs its own group.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time

from txmsg.backend import ConsumeHandler
from txmsg.errors import ConfigError
from txmsg.message import SHARDING_KEY, Message, OutgoingMessage
from txmsg.rescue import DISCARD_TOPIC

from . import messages
from ._errors import BackendUnavailableError
from .callbacks import guarded
from .gate import Gate
from .native import (
    CONSUME_FROM,
    E_CONSUME_SUCCESS,
    E_RECONSUME_LATER,
    MESSAGE_CALLBACK,
    NATIVE_LOCK,
    OK,
    Native,
    release_push_consumer,
    set_consume_from,
    set_pull,
    start_push_consumer,
)
from .pull_watch import STALLED_AFTER, WATCH_EVERY, HeldQueue, PullWatch, StallWatcher
from .settings import PULL_THREADS
from .timers import CONSUMER_TIMER_PHASES, wait_until_quiet, when_quiet

log = logging.getLogger("txmsg.rocketmq")

DLQ_PREFIX = "%DLQ%"
# Set by the broker/client on every stored message; copying them into a new message would lie.
_BROKER_OWNED_PROPERTIES = frozenset(
    {"UNIQ_KEY", "TRAN_MSG", "PGROUP", "TAGS", "KEYS", "REAL_TOPIC", "REAL_QID"}
)
ORDERLY_SUSPEND = 0.9
"""Seconds a failed orderly message is not handed to the handler again.  librocketmq resubmits
the queue 1 s after the failure; a little less here so that resubmission is never refused."""
BROKER_MAX_RECONSUME = 16
"""What librocketmq 2.1.0 sends as maxReconsumeTimes (not settable through its C API)."""
RESTART_DRAIN = 30.0
"""Seconds a restart (a stalled queue) waits for the handlers under way before giving up."""
RESTART_BACKOFF_MAX = 300.0
"""Longest pause between two attempts to start a restarted consumer that failed to start."""


_STILL_RUNNING: set[PushConsumer] = set()
"""Consumers whose stop timed out, kept alive with their ctypes callback (see pool._STILL_RUNNING)."""


def _check_options(
    group: str,
    consume_from: str,
    pull_threads: int,
    concurrency: int,
    max_reconsume: int,
    orderly: bool,
) -> None:
    """Refuse options librocketmq would misuse; warn where it silently caps one."""
    if consume_from not in CONSUME_FROM:
        raise ConfigError(
            f"consume_from must be one of {sorted(CONSUME_FROM)} (got {consume_from!r}) for "
            f"consumer group {group!r}"
        )
    if pull_threads < 1:
        raise ConfigError(
            f"pull_threads must be >= 1 (got {pull_threads}) for consumer group {group!r}"
        )
    if concurrency < 1:
        raise ConfigError(
            f"concurrency must be >= 1 (got {concurrency}) for consumer group {group!r}"
        )
    if max_reconsume < 0:
        raise ConfigError(f"max_reconsume must be >= 0 (got {max_reconsume}) for group {group!r}")
    if max_reconsume > BROKER_MAX_RECONSUME and not orderly:
        log.warning(
            "consumer group %s asks for max_reconsume=%d but librocketmq 2.1.0 always tells "
            "the broker %d; messages go to %%DLQ%%%s after %d redeliveries",
            group,
            max_reconsume,
            BROKER_MAX_RECONSUME,
            group,
            BROKER_MAX_RECONSUME,
        )


class PushConsumer:
    """One started push consumer for (group, topic, tags)."""

    def __init__(
        self,
        native: Native,
        *,
        group: str,
        topic: str,
        tags: str,
        handler: ConsumeHandler,
        name_server: str,
        instance_name: str,
        concurrency: int,
        max_reconsume: int,
        consume_from: str = "first",
        pull_threads: int = PULL_THREADS,
        credentials: tuple[bytes, bytes, bytes] | None = None,
        orderly: bool = False,
        sync_pull: bool = False,
        stall_after: float = STALLED_AFTER,
        watch_every: float = WATCH_EVERY,
    ) -> None:
        _check_options(group, consume_from, pull_threads, concurrency, max_reconsume, orderly)
        self.native = native
        self.credentials = credentials
        self.group = group
        self.topic = topic
        self._extra = messages.DISCARD_PROPS if topic == DISCARD_TOPIC else ()
        self.max_reconsume = max_reconsume
        self.orderly = orderly
        self._suspended: dict[tuple[int | None, int | None, str | None], float] = {}
        self._suspended_lock = threading.Lock()
        self.gate = Gate()
        self.consumed = 0
        self.failed = 0
        self.dead_lettered = 0
        self.instance_name = instance_name
        self.name_server = name_server
        self._dlq_producer: _PlainProducer | None = None
        self._dlq_lock = threading.Lock()
        self._handler = handler
        self._stopped = False
        self._started_at: float | None = None
        self._stop_lock = threading.Lock()
        self._callback = MESSAGE_CALLBACK(
            guarded(E_RECONSUME_LATER, f"consumer callback of {group}", self._on_message)
        )
        self._pull_watch = PullWatch(native)
        if not sync_pull and not self._pull_watch.available:
            log.warning(
                "consumer group %s: this librocketmq cannot report its queues, so a stalled "
                "asynchronous pull could not be seen; pulling synchronously (about a core while "
                "idle; docs/librocketmq-hazards.md #5)",
                group,
            )
            sync_pull = True
        self.sync_pull = sync_pull
        self._options = (tags, concurrency, consume_from, pull_threads)
        self._running = False  # a started native consumer behind self.handle
        self._closing = False  # stop() has begun: no restart any more
        self.starts = 0
        """Native consumers started (more than 1: the watcher restarted it)."""
        self._retry_at = 0.0
        self._retry_delay = watch_every
        self._create(*self._options)
        self.watcher: StallWatcher | None = (
            None
            if sync_pull
            else StallWatcher(
                group, self._held, self._restart, stall_after=stall_after, every=watch_every
            )
        )

    def _create(self, tags: str, concurrency: int, consume_from: str, pull_threads: int) -> None:
        """Create, configure and start the native consumer (released again if any step fails)."""
        native, group, topic = self.native, self.group, self.topic
        credentials, name_server = self.credentials, self.name_server
        instance_name, orderly = self.instance_name, self.orderly
        dll = native.dll
        with NATIVE_LOCK:
            handle = dll.CreatePushConsumer(group.encode())
            if not handle:
                raise BackendUnavailableError(
                    f"librocketmq could not create a push consumer for group {group!r}: "
                    f"{native.last_error()}"
                )
            self.handle = int(handle)
            started = False
            try:
                self._ok(
                    dll.SetPushConsumerNameServerAddress(handle, name_server.encode()),
                    "set name server",
                )
                self._ok(
                    dll.SetPushConsumerInstanceName(handle, instance_name.encode()),
                    "set instance name",
                )
                if credentials is not None:  # a broker with ACL (access_key/secret_key)
                    self._ok(
                        dll.SetPushConsumerSessionCredentials(handle, *credentials),
                        "set session credentials",
                    )
                self._ok(
                    dll.SetPushConsumerThreadCount(handle, int(concurrency)), "set thread count"
                )
                self._ok(dll.SetPushConsumerMessageBatchMaxSize(handle, 1), "set batch size")
                self._ok(dll.Subscribe(handle, topic.encode(), (tags or "*").encode()), "subscribe")
                register = (
                    dll.RegisterMessageCallbackOrderly if orderly else dll.RegisterMessageCallback
                )
                self._ok(register(handle, self._callback), "register the callback")
                set_pull(native, handle, sync=self.sync_pull, threads=pull_threads)
                set_consume_from(native, handle, CONSUME_FROM[consume_from])
                self._ok(start_push_consumer(native, handle), "start")
                self._started_at = time.monotonic()  # its factory's timers run from here
                started = self._running = True
                self.starts += 1
            finally:
                if not started:
                    release_push_consumer(native, handle, started=False, keep=self._callback)

    def _ok(self, status: int, what: str) -> None:
        if int(status) != OK:
            raise BackendUnavailableError(
                f"push consumer {self.group!r} on {self.topic!r}: failed to {what} "
                f"(status {int(status)}): {self.native.last_error()}. Check the name server "
                "address and that the topic exists."
            )

    def _on_message(self, _consumer: int, c_message: int) -> int:
        gate = self.gate  # a restart replaces it (after this consumer's native one is shut)
        if not gate.enter_callback():
            return E_RECONSUME_LATER  # native shutdown under way: return to C++ at once
        try:
            message = messages.read(
                self.native, c_message, origin=False, queue=True, extra=self._extra
            )
            if self.orderly:
                return self._orderly(message)
            ok = self._handler(message) is True
            if ok:
                self.consumed += 1
                return E_CONSUME_SUCCESS
            self.failed += 1
            if (
                self.max_reconsume < BROKER_MAX_RECONSUME
                and message.reconsume_times >= self.max_reconsume
                and self._dead_letter(message)
            ):
                return E_CONSUME_SUCCESS
            return E_RECONSUME_LATER
        finally:
            gate.exit_callback()

    def _orderly(self, message: Message) -> int:
        """One hand-over of an orderly queue; False from the handler suspends the queue ~1 s.

        librocketmq 2.1.0 (``ConsumeMessageOrderlyService::ConsumeRequest``) answers
        RECONSUME_LATER by putting the message back at the head of its queue and resubmitting
        the queue 1 s later - but every pull that brings new messages for that queue submits it
        again *at once* (Java's ``ProcessQueue.consuming`` flag prevents that; 2.1.0 has no such
        flag), so on a busy queue a failed message came back within milliseconds.  A message
        handed back before its suspension is over is therefore refused here without calling
        the handler; the client resubmits the queue again 1 s later.  Side effect: those early
        hand-overs also count in the client's local ``reconsume_times``.
        """
        key = (message.queue_id, message.queue_offset, message.message_id)
        now = time.monotonic()
        with self._suspended_lock:
            until = self._suspended.get(key)
        if until is not None and now < until:
            return E_RECONSUME_LATER  # an early re-hand: keep the queue suspended
        ok = self._handler(message) is True
        with self._suspended_lock:
            if ok:
                self._suspended.pop(key, None)
            else:
                if len(self._suspended) > 1024:  # messages that went to another consumer
                    horizon = now - 60.0
                    for stale in [k for k, t in self._suspended.items() if t < horizon]:
                        del self._suspended[stale]
                self._suspended[key] = time.monotonic() + ORDERLY_SUSPEND
        if ok:
            self.consumed += 1
            return E_CONSUME_SUCCESS
        self.failed += 1
        # Nothing goes back to the broker and there is no DLQ for orderly messages: after 16
        # local attempts 2.1.0 only lengthens the pause to 5 s.
        return E_RECONSUME_LATER

    def _dead_letter(self, message: Message) -> bool:
        """Send ``message`` to ``%DLQ%<group>``; True when the broker stored it."""
        dlq = DLQ_PREFIX + self.group
        properties = {
            k: v for k, v in message.properties.items() if k not in _BROKER_OWNED_PROPERTIES
        }
        properties.setdefault("RETRY_TOPIC", message.topic)
        if message.message_id:
            properties.setdefault("ORIGIN_MESSAGE_ID", message.message_id)
        properties["TXMSG_DLQ_REASON"] = f"max_reconsume={self.max_reconsume}"
        properties.pop(SHARDING_KEY, None)  # carried by sharding_key (a reserved name)
        out = OutgoingMessage(
            topic=dlq,
            body=message.body,
            tags=message.tags,
            keys=message.keys,
            properties=properties,
            sharding_key=message.sharding_key,
        )
        try:
            with self._dlq_lock:
                if self._dlq_producer is None:
                    self._dlq_producer = _PlainProducer(
                        self.native,
                        f"{self.group}_TXMSG_DLQ",
                        f"{self.instance_name}-dlq",
                        self.name_server,
                        self.credentials,
                    )
                self._dlq_producer.send(out)
        except Exception as exc:  # noqa: BLE001 - fall back to the broker's own DLQ
            log.warning(
                "could not send message %s of group %s to %s (%s); handing it back so the "
                "broker's DLQ takes it after %d redeliveries",
                message.message_id,
                self.group,
                dlq,
                exc,
                BROKER_MAX_RECONSUME,
            )
            return False
        self.dead_lettered += 1
        log.error(
            "message %s of group %s failed %d redeliveries (max_reconsume=%d): moved to %s",
            message.message_id,
            self.group,
            message.reconsume_times,
            self.max_reconsume,
            dlq,
        )
        return True

    def _held(self) -> list[HeldQueue] | None:
        """The queues the native consumer holds, for :attr:`watcher` (None: nothing to watch;
        after a restart that could not start a new native consumer, it is tried again here)."""
        with self._stop_lock:
            if self._stopped or self._closing:
                return None
            if not self._running:
                if time.monotonic() >= self._retry_at:
                    self._start_again()
                return None
            return self._pull_watch.held(self.handle)

    def _start_again(self) -> None:
        """Start a new native consumer; on failure try again later, waiting twice as long each
        time up to :data:`RESTART_BACKOFF_MAX` (each failed start parks a native consumer)."""
        try:
            self._create(*self._options)
        except BackendUnavailableError as exc:
            self._retry_at = time.monotonic() + self._retry_delay
            log.error(
                "consumer group %s: could not start its consumer again (%s); trying again in "
                "%.0f s",
                self.group,
                exc,
                self._retry_delay,
            )
            self._retry_delay = min(RESTART_BACKOFF_MAX, 2 * self._retry_delay)
        else:
            self._retry_delay = self.watcher.every if self.watcher is not None else WATCH_EVERY

    def _restart(self, stalled: list[HeldQueue]) -> None:
        """Replace the native consumer whose pulls of ``stalled`` stopped (hazard #5 of
        docs/librocketmq-hazards.md): a new one starts with a new pull callback table.  What the
        old one had fetched but not yet acknowledged is delivered again (RocketMQ's
        at-least-once); handlers under way finish first (librocketmq's shutdown waits for them).
        """
        with self._stop_lock:
            if self._stopped or self._closing:
                return
            log.warning(
                "consumer group %s: %s not pulled for over %.0f s (librocketmq 2.1.0's "
                "asynchronous pull stopped after a rebalance); restarting the consumer",
                self.group,
                ", ".join(f"{q.topic}@{q.broker}#{q.queue_id}" for q in stalled),
                self.watcher.stall_after if self.watcher is not None else STALLED_AFTER,
            )
            if self._running:
                # first the quiet moment, then refuse deliveries: what is refused meanwhile goes
                # back to the broker (a concurrent consumer) or waits (an orderly one)
                wait_until_quiet(self._started_at, CONSUMER_TIMER_PHASES)
                if not self.gate.refuse_and_drain(time.monotonic() + RESTART_DRAIN):
                    _, running = self.gate.in_flight()
                    log.error(
                        "consumer group %s: %d handler(s) still running after %.0f s; "
                        "restarting it later",
                        self.group,
                        running,
                        RESTART_DRAIN,
                    )
                    return
                self._release()
                self.gate = Gate()
            if self._closing:  # stop() began while this one drained: it has nothing left to shut
                return
            self._start_again()

    def _release(self) -> None:
        """Shut the native consumer down between its factory's timers (hazard #9)."""
        handle = self.handle
        self._running = False
        when_quiet(
            self._started_at,
            NATIVE_LOCK,
            lambda: release_push_consumer(self.native, handle, started=True),
            CONSUMER_TIMER_PHASES,
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new deliveries, wait for running handlers (bounded), shut the consumer down."""
        self._closing = True  # a restart waiting for the lock gives up
        if self.watcher is not None:
            self.watcher.stop()
        with self._stop_lock:
            if self._stopped:
                return
            deadline = time.monotonic() + max(0.0, timeout)
            if not self.gate.drain_and_shut(deadline):
                _, running = self.gate.in_flight()
                log.error(
                    "consumer %s still has %d handler(s) running after %.1f s; leaving it "
                    "running rather than crash the process",
                    self.group,
                    running,
                    timeout,
                )
                _STILL_RUNNING.add(self)  # the native consumer may still call our ctypes callback
                return
            if self._running:
                self._release()
            self._stopped = True
            _STILL_RUNNING.discard(self)
            with self._dlq_lock:
                if self._dlq_producer is not None:
                    self._dlq_producer.close()
                    self._dlq_producer = None


class _PlainProducer:
    """A started non-transactional producer (for dead letters)."""

    def __init__(
        self,
        native: Native,
        group: str,
        instance_name: str,
        name_server: str,
        credentials: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        self.native = native
        dll = native.dll
        with NATIVE_LOCK:
            handle = dll.CreateProducer(group.encode())
            if not handle:
                raise BackendUnavailableError(
                    f"could not create producer {group!r}: {native.last_error()}"
                )
            self.handle = int(handle)
            dll.SetProducerInstanceName(handle, instance_name.encode())
            dll.SetProducerNameServerAddress(handle, name_server.encode())
            if credentials is not None:
                dll.SetProducerSessionCredentials(handle, *credentials)
            if int(dll.StartProducer(handle)) != OK:
                error = native.last_error()
                dll.DestroyProducer(handle)
                raise BackendUnavailableError(f"could not start producer {group!r}: {error}")
            self.started_at = time.monotonic()  # its own instance name: its own factory

    def send(self, message: OutgoingMessage) -> None:
        dll = self.native.dll
        handle = messages.build(self.native, message)
        try:
            result = self.native.new_send_result()
            status = int(dll.SendMessageSync(self.handle, handle, ctypes.byref(result)))
            if status != OK:
                raise BackendUnavailableError(self.native.last_error() or f"status {status}")
        finally:
            dll.DestroyMessage(handle)

    def close(self) -> None:
        """Shut it down (ending its factory) between the factory's timers (hazard #9)."""
        dll, handle = self.native.dll, self.handle
        when_quiet(
            self.started_at,
            NATIVE_LOCK,
            lambda: (dll.ShutdownProducer(handle), dll.DestroyProducer(handle)),
        )
