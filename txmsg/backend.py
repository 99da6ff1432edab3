"""The small interface a messaging backend implements.

The core never imports a backend; backends are found through the entry-point group
``txmsg.backends`` (see :func:`txmsg.app.load_backend`).  The shape follows what the real RocketMQ C++
client does (``docs/rocketmq-facts.md``):

* ``send_in_transaction`` runs the half send, then calls ``execute_local`` **in the calling
  thread**, then ends the transaction with the returned state.
* plain sends (``send``, ``send_async``, ``send_oneway``, ``send_batch``; ordered when the
  message carries a ``sharding_key``, delayed with ``delay_level``/``deliver_at_ms``) go through
  a :class:`MessageSender` the backend creates per producer group; it needs no listener.
* check-backs arrive on native threads the backend owns (one per client instance in librocketmq);
  the backend hands each to ``check_handler`` and sends back the returned state.  Handlers given
  to a backend never raise: the core wraps listener code before it reaches a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from txmsg import defaults
from txmsg.errors import ConfigError
from txmsg.message import Message, OutgoingMessage, SendResult
from txmsg.names import NameRule, check_name
from txmsg.states import LocalTransactionState

LocalExecutor = Callable[[Message], LocalTransactionState]
"""Called by the backend in the sending thread with the half message; never raises."""

CheckHandler = Callable[[Message], LocalTransactionState]
"""Called by the backend for each check-back; never raises, returns the state to send back."""

ConsumeHandler = Callable[[Message], bool]
"""Called for each consumed message; True = consumed, False = redeliver later. Never raises.
For an orderly subscription False suspends the message's queue for a moment and then hands the
same message again (RocketMQ's ``SUSPEND_CURRENT_QUEUE_A_MOMENT``); later messages of that queue
wait."""

StopConsumer = Callable[[float], None]
"""Returned by :meth:`Backend.subscribe`: stops the consumer, waiting at most the given seconds
for messages being consumed."""


@dataclass(frozen=True)
class Capabilities:
    """Where backends may differ, stated by the backend (class attribute ``capabilities``).

    The contract suite (``tests/contract``) runs every installed backend through the same
    scenarios and checks each value here: a backend lacking something must show the documented
    alternative (or the test is an expected failure), never a silent skip.  The defaults are
    what RocketMQ's remoting protocol gives.
    """

    shared_topics: bool = True
    """Two producer groups of one app may declare the same topic.  False where the broker routes
    check-backs by topic (a RocketMQ 5 proxy): ``start()`` raises ``ListenerDefinitionError``
    instead of letting one group's ``check_local`` answer the other's transactions."""
    dlq_listener: bool = True
    """A ``@message_listener`` may consume ``%DLQ%<group>``.  False: that name is refused at
    registration (``InvalidNameError``); dead letters stay readable with the broker's tools."""
    max_topic_length: int = 255
    """Longest topic name accepted (RocketMQ's remoting rule: 255; RocketMQ 5 proxies: 127)."""
    oneway: bool = True
    """``send_oneway`` is a real one-way send (no answer awaited).  False: the backend sends
    asynchronously and ignores the answer (RocketMQ 5 has no one-way RPC), which the docs say."""
    batch: bool = True
    """``send_batch`` stores the messages with one request (RocketMQ 4 ``SEND_BATCH_MESSAGE``).
    False: the backend sends them one by one, in order, and returns the joined result."""
    delay_levels: bool = True
    """``delay_level=1..18`` is honoured by the broker's delay levels.  A backend with
    ``delivery_timestamps`` maps a level to ``now + DELAY_LEVELS[level-1]``."""
    delivery_timestamps: bool = False
    """``deliver_at=`` (any time) works: RocketMQ 5 timer messages.  False: refused with
    ``InvalidMessageError`` naming ``delay_level`` (a RocketMQ 4.9 broker has no timer wheel)."""
    orderly_consumer: bool = True
    """``@message_listener(orderly=True)`` consumes each queue (or FIFO message group) one
    message at a time, in order.  False: refused at ``start()`` with ``ListenerDefinitionError``."""
    orderly_crash_safe: bool = False
    """A consumer that dies inside an orderly callback always gets that message handed again
    (RocketMQ 5 FIFO: each message is acknowledged on its own).  False, the default and
    librocketmq 2.1.0's case (its orderly consumer can commit a queue's offset past a message
    still in its callback, docs/librocketmq-hazards.md #10): txmsg writes every orderly message
    to the in-flight journal in the listener's database first (:mod:`txmsg.sqla.journal`)."""


def capabilities_of(backend: Any) -> Capabilities:
    """The capabilities a backend (class, instance or factory) declares; the defaults if none."""
    declared = getattr(backend, "capabilities", None)
    return declared if isinstance(declared, Capabilities) else Capabilities()


def check_sender_arguments(
    group: str,
    topics: Sequence[str],
    check_concurrency: int,
    *,
    owner: str,
    rules: tuple[NameRule, ...],
) -> None:
    """Refuse what no backend's :meth:`Backend.create_transactional_sender` can start with.

    Why here: every backend must refuse the same arguments with the same words (the contract
    suite sends them through each), before it starts a client: the group and each declared topic
    by the backend's name ``rules`` (``owner`` names the backend in the message), and a
    ``check_concurrency`` below 1.

    Raises:
        InvalidNameError: a name ``rules`` refuse.
        ConfigError: ``check_concurrency`` < 1.
    """
    check_name("producer_group", group, owner=owner, rules=rules)
    for topic in topics:
        check_name("topic", topic, owner=f"{owner}, group {group}", rules=rules)
    if int(check_concurrency) < 1:
        raise ConfigError(
            f"check_concurrency must be an int >= 1 (got {check_concurrency!r}); it is the "
            "listener's ExecutorConfig.concurrency"
        )


def check_subscription_arguments(
    topic: str, group: str, *, owner: str, rules: tuple[NameRule, ...]
) -> None:
    """Refuse the names no backend's :meth:`Backend.subscribe` can start with (see
    :func:`check_sender_arguments` for why in one place).

    Raises:
        InvalidNameError: the consumer group or the topic is refused by ``rules``.
    """
    check_name("consumer_group", group, owner=owner, rules=rules)
    check_name("topic", topic, owner=f"{owner}, consumer group {group}", rules=rules)


@runtime_checkable
class MessageSender(Protocol):
    """A started producer for plain sends of one producer group (no listener, no check-backs).

    A message with ``sharding_key`` goes to the queue of that key (same key, same queue) and
    carries the key in the ``__SHARDINGKEY`` property.  Errors are :class:`txmsg.SendError`
    (broker or network) or :class:`txmsg.InvalidMessageError` (what the backend cannot send).
    """

    group: str

    def send(self, message: OutgoingMessage) -> SendResult:
        """Send and wait for the broker's answer."""
        ...

    def send_async(self, message: OutgoingMessage) -> Future[SendResult]:
        """Send without blocking; the future ends with the answer or the error."""
        ...

    def send_oneway(self, message: OutgoingMessage) -> None:
        """Send without waiting for any answer (nothing tells whether it was stored)."""
        ...

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        """Send messages of one topic together (see ``Capabilities.batch``)."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting sends, wait for pending async sends (bounded), shut the client down."""
        ...


@runtime_checkable
class TransactionalSender(Protocol):
    """A started transactional producer for one producer group."""

    group: str

    def send_in_transaction(
        self, message: OutgoingMessage, local_executor: LocalExecutor
    ) -> tuple[str, str, str, int | None]:
        """Send a half message, run ``local_executor``, end the transaction.

        Returns ``(message_id, transaction_key, send_status, offset)``.
        """
        ...

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting sends, wait for in-flight callbacks (bounded), shut the client down."""
        ...


class HalfMessage(Protocol):
    """A half message the broker stored, its transaction not ended yet
    (:meth:`SplitTransactionalSender.send_half_async`)."""

    message: Message
    """The half message as ``execute_local`` sees it (its id set)."""
    message_id: str
    transaction_key: str
    send_status: str
    offset: int | None

    def end(self, state: LocalTransactionState) -> Future[None]:
        """Commit or roll back (UNKNOW: nothing is sent, the broker checks back); call it once.

        The future never fails: a failed end is logged by the backend and left to the check-back,
        as :meth:`TransactionalSender.send_in_transaction` does."""
        ...


@runtime_checkable
class SplitTransactionalSender(Protocol):
    """A :class:`TransactionalSender` whose client sends the half message and ends the
    transaction as separate non-blocking calls (the 5.x client; librocketmq's transactional send
    is one blocking call that runs the local executor inside it).

    Why: an awaited send (:class:`txmsg.AsyncProducer`) then needs no thread of its own: the half
    message and the end are awaited on the event loop and ``async def execute_local`` runs there
    between them, where a blocking client must park a thread of the send pool for the whole
    transaction and cross between it and the loop four times.
    """

    splits_sends: bool
    """False when this sender cannot split after all (e.g. its client lacks a step): the core
    then runs :meth:`TransactionalSender.send_in_transaction` on a thread, as for any sender."""

    def send_half_async(self, message: OutgoingMessage) -> Future[HalfMessage]:
        """Send the half message without blocking; the future ends with the stored half message
        or the send's error.  Every half message delivered must be ended with
        :meth:`HalfMessage.end` (the sender's ``close`` waits for it)."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Factory for producers and consumers against one RocketMQ name server."""

    name: str

    def create_transactional_sender(
        self,
        group: str,
        check_handler: CheckHandler,
        *,
        check_concurrency: int,
        topics: Sequence[str] = (),
    ) -> TransactionalSender:
        """Start a transactional producer for ``group`` whose check-backs can run
        ``check_concurrency`` at once; checks go to ``check_handler``.  ``topics`` are the
        topics the listener declared (the backend may reach their brokers before the first
        send, so left-over check-backs arrive at once)."""
        ...

    def create_sender(self, group: str) -> MessageSender:
        """Start a producer for plain sends of ``group`` (its own client: a transactional
        producer of the same group keeps its check-back instances to itself)."""
        ...

    def subscribe(
        self,
        topic: str,
        group: str,
        handler: ConsumeHandler,
        *,
        tags: str = "*",
        concurrency: int = defaults.CONSUMER_CONCURRENCY,
        max_reconsume: int = defaults.MAX_RECONSUME,
        consume_from: str = "first",
        orderly: bool = False,
    ) -> StopConsumer:
        """Start a push consumer; returns ``stop(timeout)``, which shuts it down gracefully.
        ``consume_from``: ``first`` or ``last``, where a queue without a usable stored offset
        starts (:class:`txmsg.config.ConsumerSettings`).  ``orderly``: each queue (FIFO message
        group on RocketMQ 5) is consumed one message at a time, strictly in order, by at most
        one consumer of the group; ``concurrency`` threads serve different queues."""
        ...

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Shut down everything this backend started (each part bounded by ``timeout``)."""
        ...
