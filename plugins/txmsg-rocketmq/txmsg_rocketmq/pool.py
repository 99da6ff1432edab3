"""Several real ``TransactionMQProducer`` instances for one producer group.

Why several: librocketmq runs every check-back of one producer instance on one native thread
(``TransactionMQProducerImpl::m_thread_num`` is hard-coded to 1 and not reachable from the C
API).  The broker, however, picks a channel of the group round-robin for every check
(``ProducerManager.getAvailableChannel``).  N instances with distinct instance names get N
client factories, N connections and N check threads, so the broker's own round-robin spreads
check-backs over them: N checks run at once.  Nothing here depends on the embedded broker; a
real Apache RocketMQ broker behaves the same (see docs/rocketmq-facts.md).

A channel is known to the broker only after the instance heartbeats (``HEART_BEAT`` with the
group in its producer set).  librocketmq heartbeats at start (before it knows any broker, so it
goes nowhere) and then every 30 s; :mod:`.announce` sends the first heartbeat at once.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from txmsg.backend import CheckHandler, LocalExecutor
from txmsg.errors import ConfigError
from txmsg.message import UNIQ_KEY, OutgoingMessage

from . import messages
from ._errors import BackendUnavailableError, ProducerClosedError, SendError
from .announce import Announcer
from .callbacks import guarded, state_code
from .connect_race import send_retrying_instant_failure
from .gate import Gate
from .names import refuse_printf_topic
from .native import (
    CHECK_CALLBACK,
    E_UNKNOWN_TRANSACTION,
    EXECUTE_CALLBACK,
    NATIVE_LOCK,
    OK,
    SEND_STATUS_NAMES,
    Native,
)
from .timers import wait_until_quiet, when_quiet

log = logging.getLogger("txmsg.rocketmq")

KEEPER_GROUP = "TXMSG_KEEPER"
"""Group of the plain producer that keeps each instance's client factory alive (see start())."""


Credentials = tuple[bytes, bytes, bytes]
"""access key, secret key, channel - as librocketmq's Set*SessionCredentials take them"""


@dataclass(frozen=True)
class ClientSettings:
    """What every native client of this backend is configured with."""

    name_server: str
    send_timeout_ms: int = 3000
    access_key: str | None = None
    secret_key: str | None = None
    ons_channel: str = "ALIYUN"

    @property
    def credentials(self) -> Credentials | None:
        """``(access key, secret key, channel)`` for ``Set*SessionCredentials``; None without keys.

        Every native client of the backend gets them (transaction producers, their keepers,
        consumers, announcers): a client factory signs its heartbeats with the credentials of one
        of its clients, so one unsigned client can get the factory's heartbeat refused by ACL."""
        if not (self.access_key and self.secret_key):
            return None
        return (self.access_key.encode(), self.secret_key.encode(), self.ons_channel.encode())


class _SendContext:
    """What the local-transaction callback of one send needs, and what it found out."""

    __slots__ = ("key", "local_executor", "message", "ran", "state")

    def __init__(self, message: OutgoingMessage, local_executor: LocalExecutor) -> None:
        self.message = message
        self.local_executor = local_executor
        self.key: str | None = None
        self.state: object = None
        self.ran = False


@dataclass
class InstanceStats:
    name: str
    sends: int
    checks: int
    checks_refused: int
    in_flight_sends: int
    in_flight_checks: int
    announced: bool
    shut_down: bool


_STILL_RUNNING: set[ProducerInstance] = set()
"""Instances whose close timed out: the native producer keeps running and may still call the
ctypes thunks they own, so they are kept alive here even if the application drops its pool
(a freed thunk called from C++ is a jump into freed memory)."""


class ProducerInstance:
    """One native transaction producer (own instance name = own factory, channel, check thread)."""

    def __init__(
        self,
        native: Native,
        group: str,
        instance_name: str,
        settings: ClientSettings,
        check_handler: CheckHandler,
    ) -> None:
        self.native = native
        self.group = group
        self.name = instance_name
        self.gate = Gate()
        self.sends = 0
        self.announced = False
        self.shut_down = False
        self._check_handler = check_handler
        self._deferred_consumers: list[int] = []
        self._pending: dict[int, _SendContext] = {}
        self._send_ids = itertools.count(1)
        self._execute_cb = EXECUTE_CALLBACK(
            guarded(
                E_UNKNOWN_TRANSACTION, f"local-transaction callback of {group}", self._on_execute
            )
        )
        self._keeper: int | None = None
        self.started_at: float | None = None
        self.settings = settings
        self._topics_seen: set[str] = set()
        self._topics_lock = threading.Lock()
        # The CFUNCTYPE object must outlive the native producer: keep it on self.
        self._check_cb = CHECK_CALLBACK(
            guarded(
                E_UNKNOWN_TRANSACTION, f"check callback of {group}/{instance_name}", self._on_check
            )
        )
        dll = native.dll
        with NATIVE_LOCK:
            handle = dll.CreateTransactionProducer(group.encode(), self._check_cb, None)
            if not handle:
                raise BackendUnavailableError(
                    f"librocketmq could not create a transaction producer for group {group!r}: "
                    f"{native.last_error()}"
                )
            self.handle: int = int(handle)
            self._check(
                dll.SetProducerInstanceName(handle, instance_name.encode()), "set instance name"
            )
            self._check(
                dll.SetProducerNameServerAddress(handle, settings.name_server.encode()),
                "set name server",
            )
            # Not the wrapper's ``timeout=`` (it lands in the ``orderly`` parameter): the C call.
            self._check(
                dll.SetProducerSendMsgTimeout(handle, int(settings.send_timeout_ms)),
                "set send timeout",
            )
            if settings.credentials is not None:
                self._check(
                    dll.SetProducerSessionCredentials(handle, *settings.credentials),
                    "set session credentials",
                )

    def _check(self, status: int, what: str) -> None:
        if int(status) != OK:
            raise BackendUnavailableError(
                f"librocketmq failed to {what} for {self.group}/{self.name} (status {int(status)}): "
                f"{self.native.last_error()}"
            )

    def start(self) -> None:
        dll = self.native.dll
        with NATIVE_LOCK:
            self._check(dll.StartProducer(self.handle), "start the producer")
            self.started_at = time.monotonic()  # the factory's timers run from here
            # The keeper: a plain producer on the same instance name, i.e. registered in the
            # same MQClientFactory.  librocketmq's TransactionMQProducerImpl::shutdown deletes
            # the factory (when nothing else is registered in it) *before* it stops the check
            # thread, so a check still queued in that thread would reply through freed memory
            # (observed: segfault when closing a group with hundreds of queued re-checks).
            # While the keeper is registered the factory survives the transaction producer's
            # shutdown; the keeper is shut down after the check thread has been joined.
            keeper = dll.CreateProducer(KEEPER_GROUP.encode())
            if not keeper:
                raise BackendUnavailableError(
                    f"librocketmq could not create the keeper producer of {self.name}: "
                    f"{self.native.last_error()}"
                )
            self._keeper = int(keeper)
            self._check(dll.SetProducerInstanceName(keeper, self.name.encode()), "name the keeper")
            self._check(
                dll.SetProducerNameServerAddress(keeper, self.settings.name_server.encode()),
                "set the keeper's name server",
            )
            if self.settings.credentials is not None:
                self._check(
                    dll.SetProducerSessionCredentials(keeper, *self.settings.credentials),
                    "set the keeper's session credentials",
                )
            self._check(dll.StartProducer(keeper), "start the keeper")

    # ---- check-backs (native check thread) --------------------------------------------------
    def _on_check(self, _producer: int, c_message: int, _user_data: int) -> int:
        # Always served, even while closing: the keeper keeps the factory alive for the reply.
        self.gate.enter_callback(refuse_after_shut=False)
        try:
            message = messages.read(self.native, c_message, origin=False)
            state = self._check_handler(message)
            return state_code(state, what="check handler", key=message.transaction_key)
        finally:
            self.gate.exit_callback()

    # ---- sends (caller thread) -------------------------------------------------------------
    def send(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        if not self.gate.enter_send():
            raise ProducerClosedError(
                f"producer group {self.group!r} is closing; create a new application/producer "
                "to send more messages"
            )
        try:
            return self._send(message, local_executor)
        finally:
            self.gate.exit_send()

    def _on_execute(self, _producer: int, c_message: int, user_data: int | None) -> int:
        """Local-transaction callback (one per instance: creating a ctypes thunk per send costs
        more than the rest of our send path); ``user_data`` is the send's id."""
        ctx = self._pending.get(user_data or 0)
        if ctx is None:
            log.error(
                "local-transaction callback for an unknown send (%r); answering UNKNOW", user_data
            )
            return E_UNKNOWN_TRANSACTION
        local = messages.local_view(self.native, c_message, ctx.message, self.group)
        ctx.key = local.transaction_key
        state = ctx.local_executor(local)
        ctx.state = state
        ctx.ran = True
        return state_code(state, what="local executor", key=ctx.key)

    def _send(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        native, dll = self.native, self.native.dll
        send_id = next(self._send_ids)
        ctx = _SendContext(message, local_executor)
        handle = messages.build(native, message)
        self._pending[send_id] = ctx
        try:
            result = native.new_send_result()
            status = send_retrying_instant_failure(
                lambda: dll.SendMessageTransaction(
                    self.handle, handle, self._execute_cb, send_id, ctypes.byref(result)
                ),
                retry_allowed=lambda: not ctx.ran,  # the half message was not stored
                what=f"half message to {message.topic}",
            )
            if int(status) != OK:
                ran = (
                    f" The local transaction already ran and answered {ctx.state!r}; the broker "
                    "will check it back if the half message was stored."
                    if ctx.ran
                    else " The local transaction did not run."
                )
                raise SendError(
                    f"half message to topic {message.topic!r} (group {self.group!r}) failed: "
                    f"{native.last_error() or 'no detail from librocketmq'}.{ran} librocketmq "
                    "2.1.0 reports most broker refusals as 'No route info', so check, in order: "
                    "the name server address and that the topic exists; on a cluster with ACL, "
                    "that access_key/secret_key are right and may PUB to the topic; that the "
                    "broker can write (a full disk is refused with code 14). The broker's "
                    "broker.log names the cause."
                )
            message_id = result.msgId.decode("utf-8", "replace")
            key = ctx.key or _origin_property(native, handle, UNIQ_KEY) or message_id
            self.sends += 1
            return (
                message_id,
                str(key),
                SEND_STATUS_NAMES.get(int(result.sendStatus), str(int(result.sendStatus))),
                int(result.offset),
            )
        finally:
            del self._pending[send_id]
            dll.DestroyMessage(handle)

    @property
    def topics_seen(self) -> frozenset[str]:
        with self._topics_lock:
            return frozenset(self._topics_seen)

    def first_send_to(self, topic: str) -> bool:
        """True exactly once per topic (the instance then knows that topic's brokers)."""
        if topic in self._topics_seen:  # fast path without the lock (set reads are atomic)
            return False
        with self._topics_lock:
            if topic in self._topics_seen:
                return False
            self._topics_seen.add(topic)
            return True

    # ---- shutdown ---------------------------------------------------------------------------
    def shutdown(self, deadline: float) -> bool:
        """Drain, then shut the native producer down; False (and left running) on timeout."""
        if self.shut_down:
            return True
        if not self.gate.drain_and_shut(deadline):
            sends, checks = self.gate.in_flight()
            log.error(
                "producer %s/%s still has %d send(s) and %d check callback(s) running after the "
                "close timeout; leaving this client running (shutting it down now would crash "
                "the process). Give close() a longer timeout or make check_local return sooner.",
                self.group,
                self.name,
                sends,
                checks,
            )
            _STILL_RUNNING.add(self)  # its ctypes callbacks must outlive any caller's references
            return False
        dll = self.native.dll
        # Not under NATIVE_LOCK: ShutdownProducer joins the check thread, which may be finishing
        # one last check whose handler needs other clients (never hold a lock across that).
        # Order matters (see start()): transaction producer first - the broker is told to
        # forget this channel for the group, the check thread is joined while the keeper holds
        # the factory - then the keeper, which tears the factory down, then what depended on it.
        wait_until_quiet(self.started_at)  # without a keeper, this shutdown ends the factory
        began = time.monotonic()
        dll.ShutdownProducer(self.handle)
        took = time.monotonic() - began
        with NATIVE_LOCK:
            dll.DestroyProducer(self.handle)
        keeper = self._keeper
        if keeper is not None:
            # the keeper's shutdown ends the factory: at a quiet moment checked under the lock
            # (the shutdown above may have taken long enough to reach the next timer), with room
            # for the keeper's own unregister requests before the factory stops its timers: the
            # same requests to the same brokers as the shutdown above, so as long at most
            when_quiet(self.started_at, NATIVE_LOCK, lambda: _end_keeper(dll, keeper), lasts=took)
            self._keeper = None
        with NATIVE_LOCK:
            for consumer in self._deferred_consumers:
                dll.DestroyPushConsumer(consumer)
            self._deferred_consumers.clear()
        self.shut_down = True
        _STILL_RUNNING.discard(self)
        return True

    def defer_destroy_consumer(self, handle: int) -> None:
        """Destroy this (already shut down) consumer after the instance's own shutdown."""
        self._deferred_consumers.append(handle)

    def stats(self) -> InstanceStats:
        sends, checks = self.gate.in_flight()
        return InstanceStats(
            name=self.name,
            sends=self.sends,
            checks=self.gate.callbacks_total,
            checks_refused=self.gate.callbacks_refused,
            in_flight_sends=sends,
            in_flight_checks=checks,
            announced=self.announced,
            shut_down=self.shut_down,
        )


def _end_keeper(dll: Any, keeper: int) -> None:
    """Shut the keeper down (ending its factory) and destroy it; with NATIVE_LOCK held."""
    dll.ShutdownProducer(keeper)
    dll.DestroyProducer(keeper)


def _origin_property(native: Native, handle: int, name: str) -> str | None:
    raw = native.dll.GetOriginMessageProperty(handle, name.encode())
    return raw.decode("utf-8", "replace") if raw else None


class ProducerPool:
    """The :class:`txmsg.backend.TransactionalSender` of one group: N instances, round-robin sends.

    ``instances`` is the group's check concurrency (``ExecutorConfig.concurrency``): every
    instance is started and announced, so all N receive check-backs - none sits idle.
    """

    def __init__(
        self,
        native: Native,
        group: str,
        check_handler: CheckHandler,
        *,
        instances: int,
        settings: ClientSettings,
        instance_prefix: str,
        announcer: Announcer | None = None,
        warmup_topics: Sequence[str] = (),
    ) -> None:
        if instances < 1:
            raise ConfigError(f"instances must be >= 1 (got {instances})")
        self.group = group
        self.native = native
        self.settings = settings
        self._announcer = announcer
        self._rr = itertools.count()
        self._warm_topics: set[str] = set()
        self._sticky = threading.local()
        self._closed = False
        self._close_lock = threading.Lock()
        self.instances: list[ProducerInstance] = []
        try:
            for k in range(instances):
                inst = ProducerInstance(
                    native, group, f"{instance_prefix}-{k}", settings, check_handler
                )
                self.instances.append(inst)
                inst.start()
        except BaseException:
            self.close(timeout=5.0)
            raise
        if announcer is not None and warmup_topics:
            # Declared topics are not marked as sent: the first send of each still announces the
            # instance again (the start-up announcement reaches no broker if it could find no route).
            for inst in self.instances:
                announcer.announce_now(inst, warmup_topics)

    def send_in_transaction(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        if self._closed:
            raise ProducerClosedError(
                f"producer group {self.group!r} is closed; create a new one to send more messages"
            )
        refuse_printf_topic(message.topic)
        inst = self._pick(message.topic)
        result = inst.send(message, local_executor)
        if inst.first_send_to(message.topic) and self._announcer is not None:
            # The send taught this instance the topic's brokers: heartbeat to them now instead
            # of at librocketmq's next 30 s tick, so check-backs can reach it.
            self._announcer.announce_later(inst)
        return result

    def _pick(self, topic: str) -> ProducerInstance:
        """The instance for a send to ``topic``.

        Until every instance has sent to ``topic`` once, sends go round-robin, so each learns
        the routes and heartbeats to those brokers.
        After that each sending thread keeps the instance it was given (assigned round-robin),
        which keeps a thread's sends on one connection: measured with 4 sending threads and 16
        instances, per-send round-robin cost 8 % of throughput against one instance, sticky
        threads about half that.  Check-backs do not depend on it: the broker spreads them over
        all of the group's channels whichever instance sent the half message.
        """
        if topic not in self._warm_topics:
            if all(topic in inst.topics_seen for inst in self.instances):
                self._warm_topics.add(topic)
            else:
                return self.instances[next(self._rr) % len(self.instances)]
        inst: ProducerInstance | None = getattr(self._sticky, "instance", None)
        if inst is None:
            inst = self.instances[next(self._rr) % len(self.instances)]
            self._sticky.instance = inst
        return inst

    def close(self, timeout: float | None = None) -> None:
        """Stop sends, wait (bounded) for in-flight sends and callbacks, shut instances down."""
        with self._close_lock:
            self._closed = True
            deadline = time.monotonic() + (30.0 if timeout is None else max(0.0, timeout))
            for inst in self.instances:
                inst.gate.begin_close()
            if self._announcer is not None:
                self._announcer.forget(self.instances, deadline)
            for inst in self.instances:
                inst.shutdown(deadline)

    def stats(self) -> list[InstanceStats]:
        return [inst.stats() for inst in self.instances]
