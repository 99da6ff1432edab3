"""The small interface a messaging backend implements.

The core never imports a backend; backends are found through the entry-point group
``txmsg.backends`` (see :func:`txmsg.app.load_backend`).  The shape follows what the real RocketMQ C++
client does (``docs/rocketmq-facts.md``):

* ``send_in_transaction`` runs the half send, then calls ``execute_local`` **in the calling
  thread**, then ends the transaction with the returned state.
* check-backs arrive on native threads the backend owns (one per client instance in librocketmq);
  the backend hands each to ``check_handler`` and sends back the returned state.  Handlers given
  to a backend never raise: the core wraps listener code before it reaches a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from txmsg import defaults
from txmsg.message import Message, OutgoingMessage
from txmsg.states import LocalTransactionState

LocalExecutor = Callable[[Message], LocalTransactionState]
"""Called by the backend in the sending thread with the half message; never raises."""

CheckHandler = Callable[[Message], LocalTransactionState]
"""Called by the backend for each check-back; never raises, returns the state to send back."""

ConsumeHandler = Callable[[Message], bool]
"""Called for each consumed message; True = consumed, False = redeliver later. Never raises."""

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


def capabilities_of(backend: Any) -> Capabilities:
    """The capabilities a backend (class, instance or factory) declares; the defaults if none."""
    declared = getattr(backend, "capabilities", None)
    return declared if isinstance(declared, Capabilities) else Capabilities()


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
    ) -> StopConsumer:
        """Start a push consumer; returns ``stop(timeout)``, which shuts it down gracefully.
        ``consume_from``: ``first`` or ``last``, where a queue without a usable stored offset
        starts (:class:`txmsg.config.ConsumerSettings`)."""
        ...

    def close(self, timeout: float = defaults.CLOSE_TIMEOUT) -> None:
        """Shut down everything this backend started (each part bounded by ``timeout``)."""
        ...
