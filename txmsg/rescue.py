"""Rescue of the half messages a broker discarded after its last check-back.

Why: a broker checks a pending transaction back at most ``transactionCheckMax`` times,
``transactionCheckInterval`` apart (production defaults: 15 x 60 s), then gives up: it moves the
half message to the system topic ``TRANS_CHECK_MAX_TIME_TOPIC`` and never delivers it.  A
producer group that is down, stuck or answering UNKNOW for longer than that horizon (an outage, a
bad deploy, a slow database) thus loses messages whose local transactions *committed*: the
inconsistency transactional messages exist to prevent.  The stored copy keeps everything needed to
send it again (``REAL_TOPIC``, ``PGROUP``, body, tags, keys, ``UNIQ_KEY``, user properties:
``docs/rocketmq-facts.md``).

How: every transactional listener's group (unless ``rescue_discarded=False``) consumes the discard
topic as the clustering consumer group ``<group>-txmsg-rescue`` (:func:`rescue_group`).  For each
message of its own producer group (property ``PGROUP``) :class:`Rescuer` asks the group's
``check_local`` through the group's check dispatcher (so an ``async def check_local``, the
executor and the join of a running check of the same key apply as for a check-back):

* COMMIT: the message is sent to its real topic again, with its body, tags, keys and user
  properties and a :data:`~txmsg.message.DEDUP_KEY` equal to the original's dedup key (its
  ``UNIQ_KEY``, or the dedup key it carried), so idempotent consumers absorb a copy that was
  delivered already (the broker also discards re-put copies of transactions an earlier check
  committed).  It is sent by the group's transactional sender as a transaction committed at once
  (the half message, then COMMIT), not as a plain send: on RocketMQ 5 a plain message to a
  TRANSACTION topic is refused (the proxy's ``ProducerProcessor`` checks the topic's message
  type, ``MESSAGE_PROPERTY_CONFLICT_WITH_TYPE``), while a committed transaction is delivered like
  any message, on 4.x, 5.x and untyped topics alike.  The broker gives the copy a new message id;
  the dedup key is what ties it to the original;
* ROLLBACK: acknowledged (logged at INFO);
* UNKNOW, or ``check_local`` raised: the message is put back into the broker's check cycle: sent
  again as a half message of the group whose local answer is UNKNOW, carrying the original's
  transaction key (:data:`~txmsg.message.RESCUED_FROM`, which
  :attr:`~txmsg.message.Message.transaction_key` prefers), so the broker checks it back with the
  group's ``check_local`` for another horizon, and a recovered service commits it at the next
  check-back.  The broker's check cycle is the back-off: durable (the broker holds it), and
  without a thread waiting.  Unanswered again, it is discarded again and comes back here; after
  ``rescue_attempts`` rounds (16: 16 horizons, 4 h with the production defaults) it is given up:
  a dead row (:class:`DeadStore`), an ERROR line, the ``@app.on_transaction_discarded`` hooks
  with a :class:`DiscardedEvent`, and ``txmsg.discards{outcome=dead}``.

Why not the consumer's own retry (returning "consume later"): a redelivered message comes back
through the broker's delay queue, which overwrites ``REAL_TOPIC`` with the retry topic
(``CommitLog`` puts a delayed message's topic there): its real topic would be lost.  A send that
fails (the broker unreachable) is tried again in place, a few times, before that last resort.

Why the consumer group's queue ownership rather than a claim row: RocketMQ hands each queue of a
clustering consumer group to exactly one of its consumers, and the discard topic has one queue per
broker, so of several instances of a service only one receives a stored copy (and its retries, on
the group's one retry queue); it needs no database, so it works for listeners without one.  The
rare double after a rebalance (an instance dies between the send and the acknowledgement) is what
the dedup key is for.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from txmsg import defaults
from txmsg.errors import SystemTopicUnavailableError, TxMsgError
from txmsg.message import DEDUP_KEY, RESCUED_FROM, UNIQ_KEY, Message, OutgoingMessage
from txmsg.otel import hooks as telemetry
from txmsg.otel.names import DISCARD_OUTCOMES
from txmsg.states import LocalTransactionState

if TYPE_CHECKING:
    from txmsg.backend import Backend
    from txmsg.producer import TransactionalProducer

log = logging.getLogger("txmsg.rescue")

DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
"""Where a broker moves a half message it stopped checking (``TopicValidator.
RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC``; its log line misspells it ``TRANS_CHECK_MAXTIME_TOPIC``)."""
RESCUE_SUFFIX = "-txmsg-rescue"
PRODUCER_GROUP_PROPERTY = "PGROUP"
REAL_TOPIC_PROPERTY = "REAL_TOPIC"
RESCUED_PROPERTY = RESCUED_FROM
"""Set on a rescued message: the transaction key of the half message the broker discarded."""
ROUND_PROPERTY = "TXMSG_RESCUE_ROUND"
"""Set on a half message put back into the check cycle: how many rounds the rescue spent on it."""
SEND_RETRIES = (0.5, 1.0, 2.0, 4.0)
"""Seconds between the in-place tries of a rescue send that failed (then: the consumer's retry)."""
RESCUE_CONCURRENCY = 2
"""Threads of a group's rescue consumer: discards come in bursts after an outage, and each one
costs a ``check_local`` and maybe a send."""
MEMORY_DEAD_EVENTS = 1000
"""Dead events a process keeps in memory per group (the newest), besides any database rows."""

TRANSACTION_PROPERTIES = frozenset(
    {
        "TRAN_MSG",
        "PGROUP",
        "REAL_TOPIC",
        "REAL_QID",
        "TRANSACTION_CHECK_TIMES",
        "TRAN_PREPARED_QUEUE_OFFSET",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "WAIT",
        "CLUSTER",
        "MSG_REGION",
        "TRACE_ON",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "CONSUME_START_TIME",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "TXMSG_DLQ_REASON",
        "DELAY",
        "KEYS",
        "TAGS",
        "TXMSG_PROPS",
        "TXMSG_ENC",
        "__SHARDINGKEY",
    }
)
"""Properties the broker (or a client, or txmsg's backends) sets on a half message, its discarded
copy or a redelivery: dropped from the rescued send, whose client and broker set their own.
Keys and tags travel as the message's own fields."""


def rescue_group(group: str) -> str:
    """The consumer group that rescues producer group ``group``'s discarded half messages."""
    return f"{group}{RESCUE_SUFFIX}"


@dataclass(frozen=True)
class DiscardedEvent:
    """A discarded half message the rescuer gave up on (``@app.on_transaction_discarded``)."""

    group: str
    """The producer group."""
    topic: str
    """The message's real topic (``REAL_TOPIC``)."""
    transaction_key: str | None
    message: Message
    """The half message as ``check_local`` saw it."""
    attempts: int
    """Rounds spent on it (each one ``check_local`` run by the rescuer and, but for the last,
    one more horizon of the broker's check-backs)."""
    reason: str
    """Why it was given up (the last answer, or the send's error)."""
    stored: bool = False
    """True when a dead row holds it in the group's database (``txmsg discarded list``); False:
    only this event and the process's memory (``app.rescuers[group].dead``) know it."""
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


class DeadStore(Protocol):
    """Where given-up discarded messages are kept for an operator."""

    def add(self, event: DiscardedEvent) -> bool:
        """Keep ``event``; True when it is stored durably (a database row)."""
        ...


class MemoryDeadStore:
    """The process's memory: for listeners without a database (the event and hook still run)."""

    durable = False

    def add(self, event: DiscardedEvent) -> bool:
        return False


def store_for(listener: Any) -> DeadStore:
    """The dead rows' home: the listener's database when it has one (a record-backed listener's
    ``session_factory``, as the outbox keeps its dead rows next to its messages), else memory."""
    sessions = getattr(listener, "session_factory", None)
    if sessions is None or not callable(sessions):
        return MemoryDeadStore()
    from txmsg.sqla.discarded import SqlDeadStore  # noqa: PLC0415 - SQLAlchemy only when used

    return SqlDeadStore(sessions)


def half_message(delivered: Message) -> Message | None:
    """The half message as a check-back presents it (topic = ``REAL_TOPIC``, id = ``UNIQ_KEY``),
    from its discarded copy as consumed; None when it carries no ``REAL_TOPIC`` (or, in a copy
    the broker redelivered through its delay queue, the retry topic instead)."""
    props = dict(delivered.properties)
    real_topic = props.get(REAL_TOPIC_PROPERTY)
    if not real_topic or real_topic.startswith("%"):
        return None
    for name in ("RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "TXMSG_DLQ_REASON"):
        props.pop(name, None)
    return Message(
        topic=real_topic,
        body=delivered.body,
        tags=delivered.tags,
        keys=delivered.keys,
        properties=props,
        message_id=props.get(UNIQ_KEY) or delivered.message_id,
        reconsume_times=delivered.reconsume_times,
    )


def rescued_properties(half: Message, rounds: int) -> dict[str, str]:
    """The user properties of ``half`` for its rescued send: the dedup key its first delivery
    had (``DEDUP_KEY``, else ``UNIQ_KEY``), the original transaction key
    (:data:`RESCUED_PROPERTY`) and the rounds spent (:data:`ROUND_PROPERTY`)."""
    props = {
        k: v
        for k, v in half.properties.items()
        if k not in TRANSACTION_PROPERTIES and k != UNIQ_KEY
    }
    original = half.transaction_key
    if original:
        props.setdefault(DEDUP_KEY, original)
        props[RESCUED_PROPERTY] = original
    props[ROUND_PROPERTY] = str(rounds)
    return props


def rescued_message(half: Message, rounds: int) -> OutgoingMessage:
    """What the rescue sends for ``half`` (see :func:`rescued_properties`)."""
    return OutgoingMessage(
        topic=half.topic,
        body=half.body,
        tags=half.tags,
        keys=half.keys,
        properties=rescued_properties(half, rounds),
    )


def rounds_spent(message: Message) -> int:
    """How many rounds the rescue spent on ``message`` before (0 for a first discard)."""
    try:
        return max(0, int(message.properties.get(ROUND_PROPERTY, "0")))
    except ValueError:
        return 0


@dataclass
class RescueStats:
    """What a group's rescuer did in this process."""

    rescued: int = 0
    rolled_back: int = 0
    retried: int = 0
    dead: int = 0
    foreign: int = 0
    """Discards of other producer groups, acknowledged untouched (every group's rescue consumer
    reads the whole topic)."""


class Rescuer:
    """The consume handler of one producer group's rescue consumer (see the module docstring).

    ``producer``'s dispatcher runs ``check_local`` and its transactional sender sends the
    rescued messages; ``attempts`` is the listener's ``rescue_attempts``; ``hooks`` run on this
    consumer's thread for each message given up (an exception is logged and ignored)."""

    def __init__(
        self,
        producer: TransactionalProducer,
        *,
        attempts: int,
        store: DeadStore,
        hooks: Sequence[Callable[[DiscardedEvent], Any]] = (),
        topic_groups: Sequence[str] = (),
    ) -> None:
        self.producer = producer
        self.topic_groups = tuple(topic_groups)
        """Topics whose name is this group's ``PGROUP`` too: a RocketMQ 5 proxy stores a gRPC
        producer's half messages with the topic as their producer group (``SendMessageActivity``:
        "use topicName as producerGroup for transactional checker"), namespaced or not."""
        self.group = producer.group
        self.attempts = attempts
        self.store = store
        self.hooks = tuple(hooks)
        self.dead: deque[DiscardedEvent] = deque(maxlen=MEMORY_DEAD_EVENTS)
        """The newest messages given up in this process (also when a dead row holds them)."""
        self._stats = RescueStats()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        for outcome in DISCARD_OUTCOMES:  # the series exist before the first discard
            telemetry.discard_counted(self.group, outcome, 0)

    def stats(self) -> RescueStats:
        with self._lock:
            return RescueStats(**vars(self._stats))

    def wait_for(self, predicate: Callable[[RescueStats], bool], timeout: float) -> bool:
        """Wait until ``predicate(stats)`` holds (tests and operators' scripts); its last value."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._stats), timeout)

    def _count(self, outcome: str) -> None:
        with self._changed:
            setattr(self._stats, outcome, getattr(self._stats, outcome) + 1)
            self._changed.notify_all()
        if outcome in DISCARD_OUTCOMES:
            telemetry.discard_counted(self.group, outcome)

    def __call__(self, message: Message) -> bool:
        """True: done with this copy (acknowledge); False: deliver it again later.  Never
        raises (a backend's consume handler must not)."""
        try:
            return self._handle(message)
        except Exception:
            log.exception(
                "group %s: could not handle discarded half message %s; it comes again",
                self.group,
                message.message_id,
            )
            return False

    def owns(self, producer_group: str | None) -> bool:
        """Whether a discarded message of ``producer_group`` (its ``PGROUP``) is this group's."""
        if producer_group is None:
            return False
        if producer_group == self.group:
            return True
        return any(
            producer_group == topic or producer_group.endswith(f"%{topic}")
            for topic in self.topic_groups
        )

    def _handle(self, delivered: Message) -> bool:
        if not self.owns(delivered.properties.get(PRODUCER_GROUP_PROPERTY)):
            self._count("foreign")
            return True
        half = half_message(delivered)
        if half is None:
            log.error(
                "group %s: discarded half message %s (keys %s) carries no real topic (REAL_TOPIC "
                "%r): it cannot be sent again and is left alone; find it with the broker's tools",
                self.group,
                delivered.transaction_key,
                delivered.keys,
                delivered.properties.get(REAL_TOPIC_PROPERTY),
            )
            self._count("foreign")
            return True
        attempt = rounds_spent(delivered) + 1
        state = self.producer.dispatcher.handle(half)
        if state is LocalTransactionState.COMMIT:
            if not self._send(half, attempt, LocalTransactionState.COMMIT):
                return False
            log.warning(
                "group %s: the broker had discarded committed half message %s after its last "
                "check-back; rescued: sent to %s again",
                self.group,
                half.transaction_key,
                half.topic,
            )
            self._count("rescued")
            return True
        if state is LocalTransactionState.ROLLBACK:
            log.info(
                "group %s: discarded half message %s (topic %s) was rolled back: nothing to send",
                self.group,
                half.transaction_key,
                half.topic,
            )
            self._count("rolled_back")
            return True
        if attempt >= self.attempts:
            self._give_up(
                half,
                attempt,
                f"check_local gave no answer (UNKNOW, or it raised) in {attempt} round(s) after "
                "the broker discarded it",
            )
            return True
        if not self._send(half, attempt, LocalTransactionState.UNKNOW):
            return False
        log.warning(
            "group %s: discarded half message %s (topic %s): check_local answered UNKNOW (round "
            "%d of %d); put back into the broker's check cycle, its check-backs decide",
            self.group,
            half.transaction_key,
            half.topic,
            attempt,
            self.attempts,
        )
        self._count("retried")
        return True

    def _send(self, half: Message, attempt: int, state: LocalTransactionState) -> bool:
        """Send ``half`` again as a transaction answered ``state`` (COMMIT: delivered at once;
        UNKNOW: checked back).  False when every try failed (logged)."""
        message = rescued_message(half, attempt)
        error: Exception | None = None
        for pause in (0.0, *SEND_RETRIES):
            if pause and self._stopping.wait(pause):
                break
            try:
                self.producer.sender.send_in_transaction(message, lambda _m: state)
            except TxMsgError as exc:  # SendError, ProducerClosedError...: try again
                error = exc
                continue
            return True
        log.warning(
            "group %s: could not send discarded half message %s to %s again (%s: %s); the "
            "broker delivers the discarded copy again later",
            self.group,
            half.transaction_key,
            half.topic,
            type(error).__name__,
            error,
        )
        return False

    def stop(self) -> None:
        """Stop waiting between send tries (the consumer is stopping)."""
        self._stopping.set()

    def _give_up(self, half: Message, attempt: int, reason: str) -> None:
        event = DiscardedEvent(
            group=self.group,
            topic=half.topic,
            transaction_key=half.transaction_key,
            message=half,
            attempts=attempt,
            reason=reason,
        )
        try:
            stored = self.store.add(event)
        except Exception:
            log.exception(
                "group %s: could not write the dead row of discarded half message %s (create "
                "txmsg's tables: txmsg.sqla.create_tables(engine), or Alembic with "
                "txmsg.sqla.metadata); it is kept in memory only",
                self.group,
                half.transaction_key,
            )
            stored = False
        event = DiscardedEvent(**{**vars(event), "stored": stored})
        self.dead.append(event)
        log.error(
            "group %s: gave up discarded half message %s (topic %s, keys %s): %s. %s",
            self.group,
            half.transaction_key,
            half.topic,
            half.keys,
            reason,
            "Its dead row: `txmsg discarded list --group " + self.group + "`"
            if stored
            else "No database holds it: the on_transaction_discarded hooks and this log line do",
        )
        self._count("dead")
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:
                log.exception("on_transaction_discarded hook %r failed", hook)


@dataclass(frozen=True)
class Rescue:
    """A started rescue consumer: its handler and how to stop it."""

    rescuer: Rescuer
    stop: Callable[[float], None]


def start_rescue(
    backend: Backend,
    producer: TransactionalProducer,
    listener: Any,
    *,
    attempts: int,
    hooks: Sequence[Callable[[DiscardedEvent], Any]] = (),
    store: DeadStore | None = None,
) -> Rescue | None:
    """Subscribe ``producer``'s group's rescue consumer; None (and a WARNING saying why) when
    the backend cannot reach the discard topic: the app runs on, without the rescue.

    A backend whose own clients cannot reach the discard topic may consume it through another
    route (``rocketmq5``: remoting, as a 5.x proxy refuses system topics over gRPC), or raise
    :class:`~txmsg.errors.SystemTopicUnavailableError` saying what would make it reachable."""
    from txmsg.backend import capabilities_of  # noqa: PLC0415 - the backend module is heavier

    group = producer.group
    by_topic = not capabilities_of(backend).shared_topics  # a 5.x proxy: PGROUP is the topic
    rescuer = Rescuer(
        producer,
        attempts=attempts,
        store=store if store is not None else store_for(listener),
        hooks=hooks,
        topic_groups=producer.spec.topics if by_topic else (),
    )
    try:
        stop = backend.subscribe(
            DISCARD_TOPIC,
            rescue_group(group),
            rescuer,
            concurrency=RESCUE_CONCURRENCY,
            max_reconsume=defaults.MAX_RECONSUME,
            consume_from="first",
        )
    except SystemTopicUnavailableError as exc:
        log.warning(
            "group %s: half messages the broker discards after its last check-back are NOT "
            "rescued: %s",
            group,
            exc,
        )
        return None
    except TxMsgError as exc:
        log.warning(
            "group %s: the rescue of discarded half messages could not start (%s: %s); "
            "discarded messages of this group are not rescued",
            group,
            type(exc).__name__,
            exc,
        )
        return None
    log.info("group %s: rescues discarded half messages as %s", group, rescue_group(group))

    def stop_rescue(timeout: float) -> None:
        rescuer.stop()
        stop(timeout)

    return Rescue(rescuer, stop_rescue)
