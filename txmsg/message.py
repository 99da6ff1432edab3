"""Messages as listeners see them, and results of sends."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from txmsg.states import LocalTransactionState

T = TypeVar("T")

UNIQ_KEY = "UNIQ_KEY"
"""Message property holding the client-generated message id.  RocketMQ uses it as the
transaction id on the wire (``msgId`` in END_TRANSACTION headers), so it is the one key that is
the same in ``execute_local``, every ``check_local`` and the broker's logs."""

SHARDING_KEY = "__SHARDINGKEY"
"""Message property holding the sharding key of an ordered send (RocketMQ's
``MessageConst.PROPERTY_SHARDING_KEY``), so consumers see which key a message was ordered by."""

DEDUP_KEY = "TXMSG_DEDUP_KEY"
"""Message property naming what copies of one message share, when the sender knows better than
``UNIQ_KEY``: the outbox relay sets it to the row's stable key, because a row sent again after a
crash gets a new ``UNIQ_KEY`` from the client.  Idempotent consumers de-duplicate on it first
(:func:`txmsg.sqla.idempotent.message_key`)."""

RESCUED_FROM = "TXMSG_RESCUED_FROM"
"""Message property of a half message the rescue of discarded half messages sent again
(:mod:`txmsg.rescue`): the transaction key of the original, which the broker discarded.  Such a
message's :attr:`Message.transaction_key` is that key, so ``check_local`` and the records answer
for the original transaction, and consumers see the key they would have seen."""

DELAY_LEVELS: tuple[int, ...] = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
"""Seconds of RocketMQ's delay levels 1..18 (the broker's ``messageDelayLevel`` default:
1s 5s 10s 30s 1m..10m 20m 30m 1h 2h); ``DELAY_LEVELS[level - 1]``."""


@dataclass(frozen=True)
class MessageContent:
    """What a RocketMQ message carries, received (:class:`Message`) or to send
    (:class:`OutgoingMessage`): declared once, so both directions name and type it alike."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Message(MessageContent):
    """A message handed to ``execute_local``, ``check_local`` or a consumer.

    ``body`` is always bytes; :meth:`text` and :meth:`json` decode it.  ``transaction_key`` is
    the ``UNIQ_KEY`` property (the message id the client generated), which stays the same
    across check-backs even though the broker re-stores the half message each time.
    """

    message_id: str | None = None
    reconsume_times: int = 0
    sharding_key: str | None = None
    """The key an ordered message was sent with (``send_orderly``; a FIFO message group on
    RocketMQ 5); None for other messages."""
    queue_id: int | None = None
    """The queue the message was consumed from, where the backend knows it."""
    queue_offset: int | None = None
    """Its offset in that queue, where the backend knows it."""

    @property
    def transaction_key(self) -> str | None:
        """``UNIQ_KEY``; for a rescued copy of a discarded half message, the original's
        (:data:`RESCUED_FROM`)."""
        props = self.properties
        return props.get(RESCUED_FROM) or props.get(UNIQ_KEY) or self.message_id

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)

    def json(self) -> Any:
        return json.loads(self.body)

    def decode(self, type_: type[T]) -> T:
        """The body as ``type_`` (str, dict, a dataclass, a pydantic model, or any type with a
        registered converter): the inverse of the producer's payload conversion."""
        from txmsg.convert import from_body  # noqa: PLC0415 - convert is optional for messages

        return from_body(self.body, type_)


@dataclass(frozen=True)
class TransactionSendResult:
    """Outcome of ``send_in_transaction``.

    ``send_status`` is the broker's answer to the half message (``SEND_OK`` ...);
    ``local_state`` is what the local transaction decided (after exception mapping).
    """

    message_id: str
    transaction_key: str
    local_state: LocalTransactionState | None
    """None only when the backend never ran the local transaction."""
    send_status: str
    offset: int | None = None


@dataclass(frozen=True)
class SendResult:
    """Outcome of a plain send (``send``, ``send_orderly``, ``send_batch``, ``send_async``).

    For a batch, ``message_id`` holds every id joined by commas, as the Java client answers;
    :attr:`message_ids` splits them (both backends send a batch's messages one by one:
    ``Capabilities.batch``).
    """

    message_id: str
    send_status: str
    offset: int | None = None
    queue_id: int | None = None
    """The queue the broker stored the message in (where the backend reports it): the figure
    behind the producer's queue-skew statistics for ordered sends."""

    @property
    def message_ids(self) -> tuple[str, ...]:
        return tuple(part for part in self.message_id.split(",") if part)


@dataclass(frozen=True)
class OutgoingMessage(MessageContent):
    """A message ready for a backend: body already converted to bytes."""

    check_immunity_seconds: int | None = None
    sharding_key: str | None = None
    """Ordered send: every message with this key goes to the same queue (RocketMQ 4: hash of the
    key modulo the topic's queues; RocketMQ 5: the FIFO message group).  The backend also stores
    it in the :data:`SHARDING_KEY` property so consumers see it."""
    delay_level: int | None = None
    """RocketMQ delay level 1..18 (:data:`DELAY_LEVELS`); None = deliver at once."""
    deliver_at_ms: int | None = None
    """Delivery time, epoch milliseconds (RocketMQ 5 timer messages); None = at once."""
