"""txmsg messages <-> the 5.x client's ``rocketmq.v5.model.Message``.

The 5.x client's message id is the ``UNIQ_KEY`` the broker stores (and the transaction id it
checks back with), so every txmsg :class:`~txmsg.message.Message` built here carries it as the
``UNIQ_KEY`` property: ``transaction_key`` is then the same in ``execute_local``, every
``check_local`` and the broker's logs, as on the remoting backend.
"""

from __future__ import annotations

from typing import Any

from txmsg.errors import InvalidMessageError
from txmsg.message import UNIQ_KEY, Message, OutgoingMessage

KEY_SEPARATOR = " "  # RocketMQ's MessageConst.KEY_SEPARATOR (txmsg joins keys with it)
PROPS_LIST = "TXMSG_PROPS"
"""The names of a half message's user properties, as the ``rocketmq`` backend writes them
(``txmsg_rocketmq.messages.PROPS_LIST``): librocketmq reads properties by name only, and a half
message the broker discards is read by librocketmq (:mod:`.remoting`), so a 5.x half message
lists its user properties too.  Dropped again when a 5.x client reads a message."""


def to_client(
    message: OutgoingMessage, client_message_cls: Any, *, list_properties: bool = False
) -> Any:
    """A 5.x ``Message`` for ``message`` (the client assigns the message id when sending);
    ``list_properties``: add :data:`PROPS_LIST` (half messages).

    Raises:
        InvalidMessageError: an empty body, which RocketMQ 5 refuses (the client raises
            ``message body is none``).
    """
    if not message.body:
        raise InvalidMessageError(
            f"topic {message.topic!r}: RocketMQ 5 refuses an empty message body; send a "
            "non-empty payload"
        )
    out = client_message_cls()
    try:
        out.topic = message.topic
        out.body = bytes(message.body)
        if message.tags:
            out.tag = message.tags
        for key in (k for k in (message.keys or "").split(KEY_SEPARATOR) if k):
            out.keys = key  # the client's setter adds one key per assignment
        for name, value in message.properties.items():
            out.add_property(str(name), str(value))
        if list_properties and message.properties:
            out.add_property(PROPS_LIST, ",".join(str(name) for name in message.properties))
    except Exception as exc:  # the client's IllegalArgumentException: blank tag/key/property
        raise InvalidMessageError(
            f"topic {message.topic!r}: the RocketMQ 5 client refuses this message: {exc}. Tags, "
            "keys and property names/values must not be blank"
        ) from exc
    return out


def half_view(message: OutgoingMessage, message_id: str) -> Message:
    """The half message as ``execute_local`` sees it: what was sent plus the broker's id."""
    return Message(
        topic=message.topic,
        body=message.body,
        tags=message.tags,
        keys=message.keys,
        properties={**message.properties, UNIQ_KEY: message_id},
        message_id=message_id,
    )


def from_client(message: Any) -> Message:
    """A txmsg ``Message`` for a 5.x client message (check-backs, deliveries)."""
    message_id = str(message.message_id or "")
    props = {str(k): str(v) for k, v in (message.properties or {}).items()}
    props.pop(PROPS_LIST, None)
    if message_id:
        props[UNIQ_KEY] = message_id
    keys = sorted(str(k) for k in (message.keys or ()))
    attempt = int(getattr(message, "delivery_attempt", None) or 1)
    # the FIFO message group is the sharding key of an ordered send; the 5.1 client does not keep
    # the queue id / offset of a received message, so those stay None
    group = getattr(message, "message_group", None)
    return Message(
        topic=str(message.topic),
        body=bytes(message.body or b""),
        tags=message.tag or None,
        keys=KEY_SEPARATOR.join(keys) or None,
        properties=props,
        message_id=message_id or None,
        reconsume_times=max(0, attempt - 1),
        sharding_key=str(group) if group else None,
    )
