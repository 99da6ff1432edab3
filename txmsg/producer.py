"""``Producer`` sends the plain messages of one producer group: plain, async, one-way, delayed,
ordered, batch; ``TransactionalProducer`` (a ``Producer``) adds the transactional sends of a group
that has a transactional listener.

Two types rather than one with two modes: what a group can do is known when it is declared, so
the type says it, and a type checker flags ``send_in_transaction`` on a plain group before it
runs (``app.transactional_producer(group)`` has the transactional type).

Transactional sends follow RocketMQ's protocol: the backend sends a half message, then calls our
local executor **in the sending thread** with the message as the broker stored it (so the
transaction key is known), then ends the transaction with the state ``execute_local`` decided.
``arg`` reaches ``execute_local`` through a closure: the real client's ``user_args`` can only
carry ints and strings.

Plain sends go through the backend's :class:`~txmsg.backend.MessageSender` of the group, a client
of its own: a group declared with ``app.add_producer(group=...)`` opens it at ``start()``; a
transactional group opens it at its first plain send, so a service that only sends in
transactions opens nothing more than before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Unpack, cast

from txmsg.aio.callables import is_async
from txmsg.aio.loop import LoopBridge, warn_blocking_send
from txmsg.backend import (
    Backend,
    Capabilities,
    HalfMessage,
    MessageSender,
    SplitTransactionalSender,
    TransactionalSender,
    capabilities_of,
)
from txmsg.convert import to_body
from txmsg.defaults import CHECK_WAIT_TIMEOUT
from txmsg.dispatch import CheckDispatcher, DispatchStats
from txmsg.errors import (
    InvalidMessageError,
    LifecycleError,
    ProducerClosedError,
    RejectedError,
    SendError,
    TxMsgError,
)
from txmsg.executor import ExecutorConfig, ExecutorStats, TxExecutor
from txmsg.listener import ListenerSpec
from txmsg.message import (
    Message,
    OutgoingMessage,
    SendResult,
    TransactionSendResult,
)
from txmsg.names import NameRule, check_name, rocketmq_rule
from txmsg.otel import gauges, hooks
from txmsg.safety import run_execute_local, run_execute_local_async
from txmsg.sending import (
    DELAY_LEVELS_TEXT,
    BatchOptions,
    DelayOptions,
    OrderedOptions,
    SendOptions,
    TransactionOptions,
    check_keywords,
    keys_text,
)
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.producer")

SKEW_WARNING = 2.0
"""Queue skew (busiest queue / mean of the queues used) above which a topic's ordered sends log a
WARNING: one queue gets more than twice its share, the mark of a hot sharding key."""
SKEW_MIN_SENDS = 100
"""Ordered sends to a topic before its skew is judged (a handful of sends is always uneven)."""

_NO_EXECUTOR = ExecutorStats(threads=0, active=0, queued=0, completed=0, rejected=0, caller_ran=0)
_NO_CHECKS = DispatchStats(checks=0, deduplicated=0, rejected=0, timed_out=0, in_flight=0)


@dataclass(frozen=True)
class ProducerStats:
    """Figures of one producer group.

    A plain producer group (``app.add_producer``) has no executor and receives no check-backs:
    its ``executor`` and ``checks`` figures are all zero and ``transactional`` is False.
    """

    group: str
    sent: int
    """Transactional sends that reached the broker."""
    committed: int
    rolled_back: int
    unknown: int
    failed: int
    """Transactional sends that raised."""
    executor: ExecutorStats
    checks: DispatchStats
    transactional: bool = True
    """The group has a transactional listener (``send_in_transaction`` works)."""
    plain_sent: int = 0
    """Messages of plain sends the broker accepted (a batch counts each message; a one-way send
    counts when the client took it, since nothing more is known)."""
    plain_failed: int = 0
    """Plain send calls (or async futures) that ended with an error."""
    ordered_sent: int = 0
    """Of ``plain_sent``: ordered sends (``send_orderly``)."""
    queues: dict[int, int] = field(default_factory=dict)
    """Ordered sends per queue id, summed over topics (from ``SendResult.queue_id``; a backend
    that does not report queues leaves it empty)."""
    topic_queues: dict[str, dict[int, int]] = field(default_factory=dict)
    """The same per topic."""
    queue_skew: float = 1.0
    """Busiest queue / mean over the queues used, for the most uneven topic: 1.0 is even, 2.0
    means one queue takes twice its share (a hot sharding key).  Queues never used are not
    seen: compare ``len(topic_queues[topic])`` with the topic's queue count too."""


def _skew(counts: Mapping[int, int]) -> float:
    if not counts:
        return 1.0
    total = sum(counts.values())
    return max(counts.values()) / (total / len(counts)) if total else 1.0


class Producer:
    """Sends the plain messages of one producer group.

    Usually made by :class:`txmsg.TxMsg` (``app.producer(group)``): one per group declared with
    ``app.add_producer(group=...)``, and a :class:`TransactionalProducer` per transactional
    listener.  Without the app, use :meth:`create_plain`.

    :meth:`send`, :meth:`send_async`, :meth:`send_oneway`, :meth:`send_orderly` and
    :meth:`send_batch` work on every producer; sending in a transaction takes a
    :class:`TransactionalProducer`.  Payloads are converted as for transactional sends
    (:func:`txmsg.to_body`).
    """

    name_rules: tuple[NameRule, ...] = (rocketmq_rule,)
    """Rules every send's topic must pass (RocketMQ's, plus the backend's when made by an app)."""

    def __init__(
        self,
        group: str,
        *,
        backend: Backend | None = None,
        message_sender: MessageSender | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.backend = backend
        """Where the plain-send client is opened on first use (None: only ``message_sender``)."""
        self.capabilities = capabilities or (
            capabilities_of(backend) if backend is not None else Capabilities()
        )
        """What the backend can send (delivery timestamps, ...): checked before each send."""
        self._group = group
        self._lock = threading.Lock()
        self._plain_lock = threading.Lock()  # opening / closing the plain-send client
        self._message_sender = message_sender
        self._closed = False
        self._counts = {
            "sent": 0,
            "failed": 0,
            "plain_sent": 0,
            "plain_failed": 0,
            "ordered_sent": 0,
        } | {s.name: 0 for s in LocalTransactionState}
        self._queues: dict[str, dict[int, int]] = {}
        self._skew_warned: set[str] = set()

    @property
    def group(self) -> str:
        """The producer group."""
        return self._group

    @property
    def transactional(self) -> bool:
        """True for a :class:`TransactionalProducer` (the group has a transactional listener)."""
        return False

    @staticmethod
    def create_plain(
        backend: Backend,
        group: str,
        *,
        name_rules: tuple[NameRule, ...] = (rocketmq_rule,),
        capabilities: Capabilities | None = None,
    ) -> Producer:
        """A producer for plain sends of ``group`` (no listener), its client started now.

        Raises:
            InvalidNameError: ``group`` is refused by RocketMQ or ``name_rules``.
        """
        check_name("producer_group", group, owner="Producer.create_plain", rules=name_rules)
        producer = Producer(group, backend=backend, capabilities=capabilities)
        producer.name_rules = name_rules
        producer.open_sender()
        return producer

    # ---- plain sends ----------------------------------------------------------------------------
    def send(self, topic: str, payload: Any, **options: Unpack[DelayOptions]) -> SendResult:
        """Send ``payload`` to ``topic`` and wait for the broker's answer (no transaction).

        The options (``keys``, ``tags``, ``properties``, ``delay_level``, ``deliver_at``) are
        :class:`txmsg.sending.DelayOptions`.

        Raises:
            InvalidNameError: the topic name is refused.
            InvalidMessageError: the payload cannot be converted, or the delay options are wrong
                or not supported by the backend (the message says what to use instead).
            ProducerClosedError: after :meth:`close`.
            SendError: the broker did not accept the message.
        """
        warn_blocking_send(self.group, "send")
        return self._send_now(self._plain("send", topic, payload, options, DelayOptions))

    def send_async(
        self, topic: str, payload: Any, **options: Unpack[DelayOptions]
    ) -> Future[SendResult]:
        """:meth:`send` without waiting: the future ends with the broker's answer or the error
        (:class:`~txmsg.SendError`).  The future completes on the client's callback thread: keep
        its callbacks short.  :meth:`close` waits (bounded) for futures still pending.

        Raises (at once, nothing sent): as :meth:`send`, except ``SendError``.
        """
        return self._send_later(self._plain("send_async", topic, payload, options, DelayOptions))

    def send_oneway(self, topic: str, payload: Any, **options: Unpack[DelayOptions]) -> None:
        """Send without any answer: the fastest send, and nothing tells whether the broker
        stored the message (logs, metrics).  A backend without ``Capabilities.oneway`` sends
        asynchronously and ignores the answer.  Options and errors as :meth:`send`."""
        message = self._plain("send_oneway", topic, payload, options, DelayOptions)
        sender = self.open_sender()
        with hooks.sending(self.group, message) as telemetry, self._failures(message):
            sender.send_oneway(telemetry.message)
        self._count("plain_sent")

    def send_orderly(
        self, topic: str, payload: Any, **options: Unpack[OrderedOptions]
    ) -> SendResult:
        """Send so that every message with the same ``sharding_key`` goes to the same queue
        (RocketMQ 5: the same FIFO message group), in the order of the sends.

        Choose one business entity per key (an order id; ``f"{tenant}:{order_id}"``): every key
        is one ordered stream, and many keys spread over the queues.  Ordered messages cannot be
        delayed.  Order holds between sends that finished one after the other; two threads
        sending for one key at once are in no defined order.

        The options are :class:`txmsg.sending.OrderedOptions` (``sharding_key``, ``keys``,
        ``tags``, ``properties``).

        Raises:
            InvalidMessageError: ``sharding_key`` is blank, too long or not a string
                (:func:`txmsg.sending.check_sharding_key`), or as :meth:`send`.
            ProducerClosedError, SendError: as :meth:`send`.
        """
        warn_blocking_send(self.group, "send_orderly")
        return self._send_now(self._plain("send_orderly", topic, payload, options, OrderedOptions))

    def send_orderly_async(
        self, topic: str, payload: Any, **options: Unpack[OrderedOptions]
    ) -> Future[SendResult]:
        """:meth:`send_orderly` without waiting.  Two async sends of one key in flight at once
        may be stored in either order: to keep a key's order, send its next message after the
        previous future finished (or use :meth:`send_orderly`)."""
        method = "send_orderly_async"
        return self._send_later(self._plain(method, topic, payload, options, OrderedOptions))

    def send_batch(
        self, topic: str, payloads: Iterable[Any], **options: Unpack[BatchOptions]
    ) -> SendResult:
        """Send several payloads to one topic together; ``tags`` and ``keys`` apply to each.

        With ``Capabilities.batch`` the broker stores them with one request (RocketMQ 4; keep a
        batch under the broker's 4 MiB message limit); otherwise the backend sends them one by
        one, in order.  ``result.message_ids`` lists the id of each message.

        Raises:
            InvalidMessageError: no payloads, a payload cannot be converted, or the batch is too
                large for the backend.
            InvalidNameError, ProducerClosedError, SendError: as :meth:`send`.
        """
        warn_blocking_send(self.group, "send_batch")
        check_keywords("send_batch", options, BatchOptions)
        self._check_open()
        check_name("topic", topic, owner=f"group {self.group}: send_batch", rules=self.name_rules)
        tags, keys = options.get("tags"), keys_text(options.get("keys"))
        messages = [
            OutgoingMessage(topic=topic, body=to_body(p), tags=tags, keys=keys) for p in payloads
        ]
        if not messages:
            raise InvalidMessageError(
                f"group={self.group} topic={topic}: send_batch got no payloads; pass at least one"
            )
        sender = self.open_sender()
        with hooks.sending(self.group, messages[0], count=len(messages)) as telemetry:
            with self._failures(messages[0]):
                result = sender.send_batch(hooks.inject_all(messages, telemetry.message))
            telemetry.sent(result.message_id)
        self._count("plain_sent", len(messages))
        return result

    # ---- plain-send plumbing --------------------------------------------------------------------
    def _plain(
        self, method: str, topic: str, payload: Any, options: Mapping[str, Any], kind: type[Any]
    ) -> OutgoingMessage:
        """Validate a plain send of ``method`` (its options of the TypedDict ``kind``) and build
        its message (nothing is opened or sent yet)."""
        check_keywords(method, options, kind)
        self._check_open()
        owner = f"group={self.group} topic={topic}"
        check_name("topic", topic, owner=f"group {self.group}: send", rules=self.name_rules)
        sending = SendOptions.of(owner, options, ordered=kind is OrderedOptions)
        caps = self.capabilities
        if sending.delay_level is not None and not (caps.delay_levels or caps.delivery_timestamps):
            raise InvalidMessageError(
                f"{owner}: this backend cannot delay messages; send without delay_level"
            )
        if sending.deliver_at_ms is not None and not caps.delivery_timestamps:
            raise InvalidMessageError(
                f"{owner}: this backend cannot deliver at a given time (RocketMQ 4 has no timer "
                f"messages); use delay_level=1..18 instead ({DELAY_LEVELS_TEXT})"
            )
        return sending.message(topic, to_body(payload))

    def _check_open(self) -> None:
        if self._closed:
            raise ProducerClosedError(
                f"producer group {self.group!r} is closed; sends must happen before TxMsg.close()"
            )

    def open_sender(self) -> MessageSender:
        """The plain-send client of this group, started now if it is not yet.

        The app calls it at ``start()`` for groups declared with ``add_producer``; a
        transactional group's client opens on its first plain send (one at a time: concurrent
        first sends wait for the same client).

        Raises:
            ProducerClosedError: after :meth:`close`.
            LifecycleError: the producer was built without a backend.
        """
        sender = self._message_sender
        if sender is not None:
            return sender
        with self._plain_lock:
            self._check_open()  # close() sets _closed before it takes the lock: none leaks
            if self._message_sender is None:
                if self.backend is None:
                    raise LifecycleError(
                        f"producer group {self.group!r} was built without a backend, so it cannot "
                        "open a client for plain sends; use TransactionalProducer.create(...) or "
                        "Producer.create_plain(...)"
                    )
                self._message_sender = self.backend.create_sender(self.group)
                log.info("producer group %s: plain-send client started", self.group)
            return self._message_sender

    def _send_now(self, message: OutgoingMessage) -> SendResult:
        sender = self.open_sender()
        with hooks.sending(self.group, message) as telemetry:
            with self._failures(message):
                result = sender.send(telemetry.message)
            telemetry.sent(result.message_id)
        self._sent(message, result)
        return result

    def _send_later(self, message: OutgoingMessage) -> Future[SendResult]:
        sender = self.open_sender()
        telemetry = hooks.sending(self.group, message)  # its span ends in done() below
        try:
            with self._failures(message):
                inner = sender.send_async(telemetry.message)
        except BaseException as exc:
            telemetry.end(exc)
            raise
        outer: Future[SendResult] = Future()
        outer.set_running_or_notify_cancel()

        def done(f: Future[SendResult]) -> None:
            # Runs on the client's callback thread: count, map the error, hand on; never raise.
            exc = f.exception() if not f.cancelled() else SendError("the send was cancelled")
            if exc is not None:
                self._count("plain_failed")
                error = self._send_error(exc, message)
                telemetry.end(error)
                outer.set_exception(error)
                return
            result = f.result()
            self._sent(message, result)
            telemetry.sent(result.message_id)
            telemetry.end()
            outer.set_result(result)

        inner.add_done_callback(done)
        return outer

    def _failures(self, message: OutgoingMessage) -> contextlib.AbstractContextManager[None]:
        """Count a failed plain send; txmsg's errors pass unchanged, others become a SendError."""
        return self._counted("plain_failed", lambda exc: self._send_error(exc, message))

    @contextlib.contextmanager
    def _counted(self, counter: str, error: Callable[[Exception], BaseException]) -> Iterator[None]:
        """Count a failure in ``counter``; txmsg's errors pass unchanged, others become
        ``error(exc)``."""
        try:
            yield
        except TxMsgError:
            self._count(counter)
            raise
        except Exception as exc:
            self._count(counter)
            raise error(exc) from exc

    def _send_error(self, exc: BaseException, message: OutgoingMessage) -> BaseException:
        """txmsg's errors pass unchanged; anything else becomes a SendError that says where."""
        if isinstance(exc, TxMsgError) or not isinstance(exc, Exception):
            return exc
        error = SendError(
            f"group={self.group} topic={message.topic}: the send failed: "
            f"{type(exc).__name__}: {exc}; check that the name server and broker are reachable "
            "(`txmsg doctor`)"
        )
        error.__cause__ = exc
        return error

    def _sent(self, message: OutgoingMessage, result: SendResult) -> None:
        warn: tuple[float, dict[int, int]] | None = None
        with self._lock:
            self._counts["plain_sent"] += 1
            if message.sharding_key is None:
                return
            self._counts["ordered_sent"] += 1
            if result.queue_id is None:
                return
            counts = self._queues.setdefault(message.topic, {})
            counts[result.queue_id] = counts.get(result.queue_id, 0) + 1
            if message.topic not in self._skew_warned and sum(counts.values()) >= SKEW_MIN_SENDS:
                skew = _skew(counts)
                if skew > SKEW_WARNING:
                    self._skew_warned.add(message.topic)
                    warn = (skew, dict(sorted(counts.items())))
        if warn is not None:
            log.warning(
                "group=%s topic=%s: ordered sends are uneven over the queues (the busiest queue "
                "gets %.1fx its share; sends per queue %s): a few sharding keys carry "
                "most messages. Use finer keys (one business entity each, e.g. "
                "f'{tenant}:{order_id}'), see docs/guide/sending.md",
                self.group,
                message.topic,
                warn[0],
                warn[1],
            )

    # ---- figures and lifecycle ------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def stats(self) -> ProducerStats:
        """Send outcomes, executor figures and check-back figures of this group, and how its
        ordered sends spread over the queues."""
        with self._lock:
            c = dict(self._counts)
            topic_queues = {t: dict(q) for t, q in self._queues.items()}
        queues: dict[int, int] = {}
        for per_topic in topic_queues.values():
            for queue, n in per_topic.items():
                queues[queue] = queues.get(queue, 0) + n
        executor, checks = self._transaction_figures()
        return ProducerStats(
            group=self.group,
            sent=c["sent"],
            committed=c["COMMIT"],
            rolled_back=c["ROLLBACK"],
            unknown=c["UNKNOW"],
            failed=c["failed"],
            executor=executor,
            checks=checks,
            transactional=self.transactional,
            plain_sent=c["plain_sent"],
            plain_failed=c["plain_failed"],
            ordered_sent=c["ordered_sent"],
            queues=queues,
            topic_queues=topic_queues,
            queue_skew=max((_skew(q) for q in topic_queues.values()), default=1.0),
        )

    def _transaction_figures(self) -> tuple[ExecutorStats, DispatchStats]:
        """The executor and check-back figures: none for a plain group."""
        return _NO_EXECUTOR, _NO_CHECKS

    @property
    def closed(self) -> bool:
        """True after close(); sends then raise ProducerClosedError."""
        return self._closed

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop sending: close the plain-send client (it waits for pending async sends), then
        what a transactional producer adds (:meth:`_closers`).  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._plain_lock:  # a first plain send opening the client finishes first
            plain, self._message_sender = self._message_sender, None
        closes: list[Callable[[], object]] = []
        if plain is not None:
            closes.append(lambda: plain.close(timeout))
        closes.extend(self._closers(timeout))
        _run_all(closes)

    def _closers(self, timeout: float | None) -> list[Callable[[], object]]:
        """What :meth:`close` closes after the plain-send client: nothing more here."""
        return []

    def __repr__(self) -> str:
        kind = "transactional" if self.transactional else "plain"
        return f"<{type(self).__name__} group={self.group!r} {kind} closed={self._closed}>"


def _leave_to_check_back(sending: Future[HalfMessage]) -> None:
    """A half message whose sender stopped waiting (its task was cancelled): end it as UNKNOW
    (nothing is sent; the broker checks it back) once it is stored.  Not when the send failed,
    or was cancelled before it was stored (the backend then ended it itself)."""
    if not sending.cancelled() and sending.exception() is None:
        sending.result().end(LocalTransactionState.UNKNOW)


class TransactionalProducer(Producer):
    """A :class:`Producer` whose group has a transactional listener: it also sends in
    transactions (:meth:`send_in_transaction`, :meth:`send_in_transaction_async`) and answers
    the broker's check-backs with the listener.

    Made by :class:`txmsg.TxMsg` for every transactional listener
    (``app.transactional_producer(group)``), or by :meth:`create`.
    """

    def __init__(
        self,
        sender: TransactionalSender,
        listener: Any,
        spec: ListenerSpec,
        executor: TxExecutor,
        dispatcher: CheckDispatcher,
        *,
        backend: Backend | None = None,
        message_sender: MessageSender | None = None,
        capabilities: Capabilities | None = None,
        bridge: LoopBridge | None = None,
    ) -> None:
        super().__init__(
            spec.group, backend=backend, message_sender=message_sender, capabilities=capabilities
        )
        self.bridge = bridge
        """The app's event loop: where an ``async def execute_local`` runs for a send made
        from another thread (an :class:`~txmsg.aio.producer.AsyncProducer` runs it on the loop
        that awaits the send)."""
        self.sender = sender
        """The transactional sender of the group."""
        self.listener = listener
        """The listener instance: ``execute_local`` runs in the sending thread, ``check_local``
        on the executor."""
        self.spec = spec
        self.executor = executor
        """Check-backs and :meth:`send_in_transaction_async` run here."""
        self.dispatcher = dispatcher
        self._watching = [  # txmsg.executor.* and txmsg.local_transactions, read when collected
            *gauges.watch_executor(spec.group, executor),
            *gauges.watch_local_transactions(spec.group, self._local_results),
        ]

    @property
    def transactional(self) -> bool:
        """True: the group has a transactional listener."""
        return True

    @classmethod
    def create(
        cls,
        backend: Backend,
        spec: ListenerSpec,
        listener: Any,
        executor_config: ExecutorConfig | None = None,
        *,
        check_wait_timeout: float = CHECK_WAIT_TIMEOUT,
        name_rules: tuple[NameRule, ...] = (rocketmq_rule,),
        capabilities: Capabilities | None = None,
        bridge: LoopBridge | None = None,
    ) -> TransactionalProducer:
        """Build the executor and check dispatcher for ``spec`` and start a transactional sender
        on ``backend``; the plain-send client opens on the first plain send.

        ``name_rules`` check the topic of every send (the app passes its backend's rules);
        ``bridge`` is the app's event loop, where ``async def`` listener methods run."""
        executor = TxExecutor(executor_config or spec.executor, name=f"txmsg-{spec.group}")
        dispatcher = CheckDispatcher(
            listener, spec, executor, wait_timeout=check_wait_timeout, bridge=bridge
        )
        try:
            sender = backend.create_transactional_sender(
                spec.group,
                dispatcher,  # callable (blocking handle) and .submit (non-blocking, rocketmq5)
                check_concurrency=dispatcher.check_concurrency,
                topics=spec.topics,
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        producer = cls(
            sender,
            listener,
            spec,
            executor,
            dispatcher,
            backend=backend,
            capabilities=capabilities,
            bridge=bridge,
        )
        producer.name_rules = name_rules
        return producer

    # ---- transactional sends --------------------------------------------------------------------
    def send_in_transaction(
        self, topic: str, payload: Any, **options: Unpack[TransactionOptions]
    ) -> TransactionSendResult:
        """Send ``payload`` to ``topic`` as a half message, run ``execute_local(message, arg)``
        in this thread, and end the transaction with its answer.

        The options (``arg``, ``keys``, ``tags``, ``properties``, ``check_immunity_seconds``)
        are :class:`txmsg.sending.TransactionOptions`.

        ``result.local_state`` is the answer after exception mapping (None when the local
        transaction did not run because the half send failed).

        Raises:
            InvalidNameError: the topic name is refused by RocketMQ or the backend.
            InvalidMessageError: the payload cannot be converted (see :mod:`txmsg.convert`) or
                ``check_immunity_seconds`` is invalid.
            ProducerClosedError: after :meth:`close`.
            SendError: the broker or the backend refused the half message.
            LifecycleError: called on the app's event loop thread while ``execute_local`` is
                ``async def`` (it could never run: the loop waits for this call); nothing sent.
                Use ``await app.async_transactional_producer(group).send_in_transaction(...)``.
        """
        check_keywords("send_in_transaction", options, TransactionOptions)
        bridge = self.bridge
        if bridge is not None and bridge.in_loop_thread() and is_async(self.listener.execute_local):
            raise LifecycleError(
                f"group={self.group}: send_in_transaction() was called on the app's event loop "
                "and execute_local is `async def`: it would wait for the loop it blocks, forever; "
                f"nothing was sent. Use `await app.async_transactional_producer({self.group!r})"
                ".send_in_transaction(...)`"
            )
        warn_blocking_send(self.group, "send_in_transaction")
        return self._transact(topic, payload, options, bridge)

    def _transact(
        self,
        topic: str,
        payload: Any,
        options: TransactionOptions,
        bridge: LoopBridge | None = None,
    ) -> TransactionSendResult:
        """:meth:`send_in_transaction` with the event loop an ``async def execute_local`` runs
        on (``bridge``), without the checks of the calling thread: what the sync and the async
        producer share.  The caller must not be on ``bridge``'s loop."""
        sender, spec = self.sender, self.spec
        self._check_open()
        message = self._outgoing(topic, payload, options)
        arg = options.get("arg")
        decided: list[LocalTransactionState] = []
        listener = self.listener

        def local_executor(half: Message) -> LocalTransactionState:
            try:
                state = run_execute_local(listener, half, arg, spec, bridge)
            except BaseException:  # noqa: BLE001 - run_execute_local never raises; be sure
                state = spec.on_exception
            decided.append(state)
            return state

        # `send <topic>` span: execute_local runs inside it (this thread), as its current span
        with hooks.sending(self.group, message, transactional=True) as telemetry:
            with self._half_failures(topic):
                message_id, transaction_key, status, offset = sender.send_in_transaction(
                    telemetry.message, local_executor
                )
            state = decided[-1] if decided else None
            self._count("sent")
            if state is not None:
                self._count(state.name)
            telemetry.sent(message_id)
            telemetry.local_state(state)
        return TransactionSendResult(
            message_id=message_id,
            transaction_key=transaction_key,
            local_state=state,
            send_status=status,
            offset=offset,
        )

    def _half_failures(self, topic: str) -> contextlib.AbstractContextManager[None]:
        """Count a failed half send; txmsg's errors pass unchanged, others become a SendError."""
        return self._counted(
            "failed",
            lambda exc: SendError(
                f"group={self.group} topic={topic}: sending the half message failed: {exc}; "
                "check that the name server and broker are reachable (`txmsg doctor`)"
            ),
        )

    @functools.cached_property
    def splits_sends(self) -> bool:
        """True when an awaited send can run on the loop itself (:meth:`_transact_on_loop`): the
        backend splits its transactional send and ``execute_local`` is ``async def``."""
        sender = self.sender
        return (
            isinstance(sender, SplitTransactionalSender)
            and bool(sender.splits_sends)
            and is_async(getattr(self.listener, "execute_local", None))
        )

    async def _transact_on_loop(
        self,
        topic: str,
        payload: Any,
        options: TransactionOptions,
        bridge: LoopBridge | None = None,
    ) -> TransactionSendResult:
        """:meth:`_transact` awaited on the running loop with no thread waiting: the half message
        is awaited, ``async def execute_local`` runs in the caller's task, the end is awaited.
        Only when :attr:`splits_sends` (a :class:`~txmsg.backend.SplitTransactionalSender`).

        A task cancelled while ``execute_local`` runs ends nothing: whether the local transaction
        committed is unknown here, so the broker's check-back (``check_local``) decides."""
        if not self.splits_sends:  # cached: a runtime Protocol's isinstance is slow
            raise LifecycleError(
                f"group {self.group!r}: _transact_on_loop needs a backend that splits transactional "
                "sends and an `async def execute_local`; use _transact() on a thread"
            )
        sender = cast(SplitTransactionalSender, self.sender)
        self._check_open()
        message = self._outgoing(topic, payload, options)
        with hooks.sending(self.group, message, transactional=True) as telemetry:
            sending: Future[HalfMessage] | None = None
            try:
                with self._half_failures(topic):
                    sending = sender.send_half_async(telemetry.message)
                    half = await asyncio.wrap_future(sending)
            except asyncio.CancelledError:
                if sending is not None:
                    # the half may be stored already (its answer on its way to this loop): end
                    # it as UNKNOW once it is, so the sender's count drops; the check-back decides
                    sending.add_done_callback(_leave_to_check_back)
                raise
            state = LocalTransactionState.UNKNOW
            try:
                state = await run_execute_local_async(
                    self.listener, half.message, options.get("arg"), self.spec, bridge
                )
            finally:  # cancelled: UNKNOW ends nothing, and releases the sender's count
                ending = half.end(state)
            self._count("sent")
            self._count(state.name)
            telemetry.sent(half.message_id)
            telemetry.local_state(state)
            # the end goes out whatever happens to this task; shielded, so a cancel here does
            # not cancel the future the backend completes
            await asyncio.shield(asyncio.wrap_future(ending))
        return TransactionSendResult(
            message_id=half.message_id,
            transaction_key=half.transaction_key,
            local_state=state,
            send_status=half.send_status,
            offset=half.offset,
        )

    def send_in_transaction_async(
        self, topic: str, payload: Any, **options: Unpack[TransactionOptions]
    ) -> Future[TransactionSendResult]:
        """:meth:`send_in_transaction` on the listener's executor; returns its future.

        When every executor thread is busy and ``queue_capacity`` sends wait, the executor's
        rejection policy applies: ``caller_runs`` (default) sends in this thread and returns a
        finished future; ``abort`` raises :class:`RejectedError` (nothing was sent).

        Raises:
            RejectedError: ``rejection='abort'`` and the executor is full.
            ProducerClosedError: after :meth:`close`.
        """
        check_keywords("send_in_transaction_async", options, TransactionOptions)
        executor = self.executor
        self._check_open()
        # the caller's context (its current span: the send span's parent) goes along
        context = contextvars.copy_context()
        try:
            future: Future[TransactionSendResult] = executor.submit(
                context.run, self._transact, topic, payload, options, self.bridge
            )
        except RejectedError as exc:
            if executor.is_shutdown:  # closed between the check above and submit()
                raise ProducerClosedError(f"producer group {self.group!r} is closed") from exc
            raise
        return future

    def _outgoing(self, topic: str, payload: Any, options: TransactionOptions) -> OutgoingMessage:
        check_name("topic", topic, owner=f"group {self.group}: send", rules=self.name_rules)
        check_immunity_seconds = options.get("check_immunity_seconds")
        if check_immunity_seconds is not None and (
            not isinstance(check_immunity_seconds, int) or check_immunity_seconds < 1
        ):
            raise InvalidMessageError(
                f"check_immunity_seconds must be a positive int (seconds before the first "
                f"check-back), got {check_immunity_seconds!r}"
            )
        owner = f"group={self.group} topic={topic}"
        sending = SendOptions.of(owner, options, reserved=frozenset())
        return sending.message(
            topic, to_body(payload), check_immunity_seconds=check_immunity_seconds
        )

    # ---- figures and lifecycle ------------------------------------------------------------------
    def _transaction_figures(self) -> tuple[ExecutorStats, DispatchStats]:
        return self.executor.stats(), self.dispatcher.stats()

    def _local_results(self) -> dict[str, int]:
        """``committed``, ``rolled_back``, ``unknown`` of :meth:`stats`, as metrics name them."""
        with self._lock:
            counts = dict(self._counts)
        return {hooks.result_name(state): counts[state.name] for state in LocalTransactionState}

    def _closers(self, timeout: float | None) -> list[Callable[[], object]]:
        """The transactional sender (it waits for in-flight callbacks, which still need the
        executor), then the executor."""
        sender, executor = self.sender, self.executor
        return [
            lambda: sender.close(timeout),
            lambda: executor.shutdown(wait=True, timeout=timeout),
            lambda: gauges.unwatch_all(self._watching),
        ]


def _run_all(calls: list[Callable[[], object]]) -> None:
    """Run every call even if one raises; raise the first error afterwards."""
    error: BaseException | None = None
    for call in calls:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others ran
            error = error or exc
    if error is not None:
        raise error
