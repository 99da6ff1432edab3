"""The options of a message, declared once: what every send, the outbox and its relay take.

A send's keyword options are one of the ``TypedDict`` s below (``**options: Unpack[...]``), so
each option's name and type is written here only, and :meth:`SendOptions.of` is their one
validator: ``Producer`` and ``AsyncProducer`` sends, ``Outbox.send`` (the row it writes) and the
relay (which sends the row with the producer) all refuse the same things with the same words.
What only a backend knows (whether it can delay, or deliver at a time) is checked by the
producer after this.
"""

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Required, TypedDict

from txmsg.errors import InvalidMessageError
from txmsg.message import DELAY_LEVELS, SHARDING_KEY, OutgoingMessage

# Evaluated annotations (no ``from __future__ import annotations``): a TypedDict reads its
# Required[...] keys from them.


class BatchOptions(TypedDict, total=False):
    """The options of ``send_batch``: they apply to each message of the batch."""

    keys: str | Sequence[str] | None
    """Message keys (a string or several), searchable in the broker's tools."""
    tags: str | None
    """The message's tag, what consumers filter on."""


class MessageOptions(BatchOptions, total=False):
    """The options every message takes."""

    properties: Mapping[str, Any] | None
    """User properties (values become strings)."""


class DelayOptions(MessageOptions, total=False):
    """The options of a plain send (``send``, ``send_async``, ``send_oneway``)."""

    delay_level: int | None
    """RocketMQ delay level 1..18 (:data:`DELAY_LEVELS_TEXT`): consumers see it that much
    later."""
    deliver_at: datetime | float | None
    """Deliver at this time: an aware ``datetime`` or epoch seconds (a backend with
    ``Capabilities.delivery_timestamps``, RocketMQ 5; not with ``delay_level``).  A time in the
    past delivers at once."""


class OrderedOptions(MessageOptions, total=False):
    """The options of an ordered send (``send_orderly``, ``send_orderly_async``)."""

    sharding_key: Required[str]
    """The business entity whose messages stay in order (an order id): every message of a key
    goes to the same queue (RocketMQ 5: the same FIFO message group).  See
    :func:`check_sharding_key`."""


class RowOptions(DelayOptions, total=False):
    """The options of ``Outbox.send``: a plain send's, and an optional ``sharding_key`` (the
    row is then sent ordered).  An ordered message cannot be delayed."""

    sharding_key: str | None


class TransactionOptions(MessageOptions, total=False):
    """The options of a transactional send (``send_in_transaction``)."""

    arg: Any
    """Handed to ``execute_local(message, arg)`` as it is (never sent)."""
    check_immunity_seconds: int | None
    """Seconds before the broker's first check-back of this message."""


DELAY_LEVELS_TEXT = ", ".join(
    f"{n}={s}s" if s < 60 else f"{n}={s // 60}m" if s < 3600 else f"{n}={s // 3600}h"
    for n, s in enumerate(DELAY_LEVELS, start=1)
)
"""RocketMQ's delay levels as error messages name them: ``1=1s, 2=5s, ..., 18=2h``."""

MAX_SHARDING_KEY = 255
"""Longest sharding key, in characters (the outbox stores it in a ``String(255)`` column; a
RocketMQ 5 proxy's own limit, ``maxMessageGroupSize``, is 64 UTF-8 bytes by default)."""


def check_sharding_key(owner: str, sharding_key: object) -> None:
    """Refuse a sharding key RocketMQ would refuse: the one rule of every ordered send.

    Non-blank, because a RocketMQ 5 proxy refuses a message group of whitespace
    (``GrpcValidator.validateMessageGroup``: "message group cannot be the char sequence of
    whitespace") and the Java client's ``setMessageGroup`` requires ``isNotBlank``; at most
    :data:`MAX_SHARDING_KEY` characters.  The proxy's size limit is its configuration, so a
    longer key it refuses is its error, at the send.
    """
    if (
        not isinstance(sharding_key, str)
        or not sharding_key.strip()
        or len(sharding_key) > MAX_SHARDING_KEY
    ):
        raise InvalidMessageError(
            f"{owner}: sharding_key must be a non-blank string of at most {MAX_SHARDING_KEY} "
            "characters (the business entity whose messages must stay in order, e.g. an order "
            f"id), got {sharding_key!r}"
        )


def keys_text(keys: str | Sequence[str] | None) -> str | None:
    """``keys`` as RocketMQ carries them: one string, several separated by a space."""
    if keys is None or isinstance(keys, str):
        return keys
    return " ".join(str(k) for k in keys)  # RocketMQ's KEY_SEPARATOR


def deliver_at_ms(owner: str, deliver_at: object) -> int:
    """``deliver_at`` (an aware datetime or epoch seconds) in epoch milliseconds."""
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise InvalidMessageError(
                f"{owner}: deliver_at must be an aware datetime (e.g. "
                "datetime.now(timezone.utc) + timedelta(minutes=5)), got a naive one"
            )
        return round(deliver_at.timestamp() * 1000)
    if isinstance(deliver_at, int | float) and not isinstance(deliver_at, bool):
        seconds = float(deliver_at)
        if math.isfinite(seconds) and seconds >= 0:
            return round(seconds * 1000)
        raise InvalidMessageError(
            f"{owner}: deliver_at in epoch seconds must be a finite number >= 0, got {deliver_at!r}"
        )
    raise InvalidMessageError(
        f"{owner}: deliver_at must be an aware datetime or epoch seconds, "
        f"got {type(deliver_at).__name__}"
    )


def check_keywords(method: str, options: Mapping[str, Any], kind: type[Any]) -> None:
    """The TypeError Python raises for a wrong keyword, for a method taking ``**options`` of the
    TypedDict ``kind`` (type checkers flag it before it runs)."""
    required: frozenset[str] = kind.__required_keys__
    if required.issubset(options) and kind.__optional_keys__.issuperset(options.keys() - required):
        return
    try:
        _signature(kind).bind(**options)  # raises the TypeError
    except TypeError as exc:
        exc.args = (f"{method}() {exc}",)
        raise


_SIGNATURES: dict[type[Any], inspect.Signature] = {}


def _signature(kind: type[Any]) -> inspect.Signature:
    found = _SIGNATURES.get(kind)
    if found is not None:
        return found
    keyword = inspect.Parameter.KEYWORD_ONLY
    found = _SIGNATURES[kind] = inspect.Signature(
        [
            inspect.Parameter(name, keyword, default=inspect.Parameter.empty)
            if name in kind.__required_keys__
            else inspect.Parameter(name, keyword, default=None)
            for name in kind.__annotations__
        ]
    )
    return found


@dataclass(frozen=True, slots=True)
class SendOptions:
    """A message's options, validated and in the form the message carries them."""

    keys: str | None = None
    tags: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    sharding_key: str | None = None
    delay_level: int | None = None
    deliver_at_ms: int | None = None

    @classmethod
    def of(
        cls,
        owner: str,
        options: Mapping[str, Any],
        *,
        reserved: frozenset[str] = frozenset({SHARDING_KEY}),
        ordered: bool = False,
    ) -> "SendOptions":
        """Validate ``options`` (any of :class:`RowOptions`' keys); ``owner`` starts each error.
        ``ordered``: a sharding key is required (None is refused, not "unordered").

        Raises:
            InvalidMessageError: a bad sharding key; an ordered message with a delay; both
                delays; a delay level outside 1..18; a bad ``deliver_at``; a property in
                ``reserved`` (set by txmsg or the client).
        """
        sharding_key = options.get("sharding_key")
        delay_level = options.get("delay_level")
        deliver_at = options.get("deliver_at")
        if sharding_key is not None or ordered:
            check_sharding_key(owner, sharding_key)
            if delay_level is not None or deliver_at is not None:
                raise InvalidMessageError(
                    f"{owner}: an ordered message cannot be delayed (it would overtake or block "
                    "its key's later messages); send it without sharding_key, or without a delay"
                )
        if delay_level is not None and deliver_at is not None:
            raise InvalidMessageError(f"{owner}: give delay_level or deliver_at, not both")
        if delay_level is not None and (
            isinstance(delay_level, bool)
            or not isinstance(delay_level, int)
            or not 1 <= delay_level <= len(DELAY_LEVELS)
        ):
            raise InvalidMessageError(
                f"{owner}: delay_level must be an int 1..18 ({DELAY_LEVELS_TEXT}), "
                f"got {delay_level!r}"
            )
        properties = options.get("properties")
        props = {str(k): str(v) for k, v in (properties or {}).items()}
        if reserved and not reserved.isdisjoint(props):
            raise InvalidMessageError(
                f"{owner}: properties {sorted(reserved.intersection(props))} are set by txmsg "
                "or the client: an ordered message takes send_orderly(..., sharding_key=...) "
                "(the outbox: sharding_key=...), and the outbox sends its row's stable key itself"
            )
        return cls(
            keys=keys_text(options.get("keys")),
            tags=options.get("tags"),
            properties=props,
            sharding_key=sharding_key,
            delay_level=delay_level,
            deliver_at_ms=None if deliver_at is None else deliver_at_ms(owner, deliver_at),
        )

    def message(
        self, topic: str, body: bytes, *, check_immunity_seconds: int | None = None
    ) -> OutgoingMessage:
        """The message to send to ``topic`` with these options."""
        return OutgoingMessage(
            topic=topic,
            body=body,
            tags=self.tags,
            keys=self.keys,
            properties=self.properties,
            sharding_key=self.sharding_key,
            delay_level=self.delay_level,
            deliver_at_ms=self.deliver_at_ms,
            check_immunity_seconds=check_immunity_seconds,
        )
