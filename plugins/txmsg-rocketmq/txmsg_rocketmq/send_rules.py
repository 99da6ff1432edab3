"""What librocketmq 2.1.0 or a RocketMQ 4.9 broker refuses to send, refused before the send.

The client reports most refusals as "No route info" (or not at all for an empty body), so the
sender checks a message first and raises an :class:`InvalidMessageError` that says what to do.
Kept apart from :mod:`.sender`: these are rules about a message, not about the producer that
sends it.
"""

from __future__ import annotations

from txmsg.message import OutgoingMessage

from ._errors import InvalidMessageError
from .names import refuse_printf_topic

MAX_DELAY_LEVEL = 18
"""RocketMQ 4's default ``messageDelayLevel`` has 18 levels (1 s ... 2 h)."""


def validate(message: OutgoingMessage, max_message_size: int, *, batch: bool = False) -> None:
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
    size = wire_size(message)
    if size > max_message_size:
        raise InvalidMessageError(
            f"message body of {size} bytes (as sent) exceeds the maximum message size of "
            f"{max_message_size} bytes (the broker's maxMessageSize); store the payload "
            "elsewhere and send a reference, or split it"
        )


def wire_size(message: OutgoingMessage) -> int:
    """Body length as sent: bodies with NUL bytes go base64-encoded (see messages.py)."""
    n = len(message.body)
    return (n + 2) // 3 * 4 if b"\x00" in message.body else n
