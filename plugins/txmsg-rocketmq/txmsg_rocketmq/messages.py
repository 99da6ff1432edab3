"""Converting between txmsg messages and librocketmq message handles.

Why these rules:

* librocketmq's C API returns strings as ``char*`` and the wrapper hands them out as ``bytes``
  (``msg.keys`` is ``bytes``); listeners get ``str`` everywhere (UTF-8, undecodable bytes
  replaced, never an exception on the callback thread).
* The C API cannot list a message's properties, only read one by name.  So at send time we add
  ``TXMSG_PROPS`` = the user property names, and read exactly those back in ``check_local`` and
  in consumers.  Standard ones (``UNIQ_KEY``, ``KEYS``, ``TAGS``...) are always read.
* ``GetMessageBody`` returns a NUL-terminated ``char*`` with no length, so a body containing
  ``\\x00`` would arrive truncated.  Such bodies are sent base64-encoded with ``TXMSG_ENC=b64``
  and decoded back here; every other body is sent as is (other consumers see it unchanged).
* In the local-transaction callback the handle is the ``CMessage*`` we created, not a
  ``CMessageExt*``: only the ``GetOrigin*`` getters are defined behaviour there.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping
from typing import Any

from txmsg.message import SHARDING_KEY, UNIQ_KEY, Message, OutgoingMessage

from ._errors import InvalidMessageError
from .native import Native

PROPS_LIST = "TXMSG_PROPS"
_UNIQ_KEY_BYTES = UNIQ_KEY.encode()
ENCODING = "TXMSG_ENC"
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
_SYSTEM_PROPS = (
    UNIQ_KEY,
    "KEYS",
    "TAGS",
    "TRAN_MSG",
    "PGROUP",
    "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID",
    SHARDING_KEY,
)
_NAMES: dict[str, bytes] = {}
"""Property names as the C API takes them, encoded once (each consumed message reads a dozen)."""
_NAMES_KEPT = 1024
# RocketMQ separates properties with \x01 (name/value) and \x02 (pairs) on the wire.
_FORBIDDEN = ("\x01", "\x02")


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    return raw.decode("utf-8", "replace")


def _enc(value: str) -> bytes:
    return value.encode("utf-8")


def validate_properties(properties: Mapping[str, str]) -> None:
    """Reject names/values librocketmq would corrupt on the wire, saying what to change."""
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidMessageError(
                f"message property {name!r}={value!r}: names and values must be str; "
                "convert them before sending"
            )
        if not name or "," in name or any(c in name + value for c in _FORBIDDEN):
            raise InvalidMessageError(
                f"message property {name!r}: names must be non-empty without ',' and neither "
                "names nor values may contain \\x01 or \\x02 (RocketMQ's separators)"
            )
        if name in (PROPS_LIST, ENCODING, SHARDING_KEY):
            raise InvalidMessageError(f"message property {name!r} is reserved by txmsg; rename it")


def build(native: Native, message: OutgoingMessage) -> int:
    """Create a ``CMessage*`` for ``message``; the caller must ``DestroyMessage`` it."""
    validate_properties(message.properties)
    dll = native.dll
    handle = dll.CreateMessage(_enc(message.topic))
    if not handle:
        raise MemoryError("librocketmq could not allocate a message (CreateMessage returned NULL)")
    try:
        body = message.body
        if b"\x00" in body:
            body = base64.b64encode(body)
            dll.SetMessageProperty(handle, _enc(ENCODING), b"b64")
        dll.SetByteMessageBody(handle, body, len(body))
        if message.tags:
            dll.SetMessageTags(handle, _enc(message.tags))
        if message.keys:
            dll.SetMessageKeys(handle, _enc(message.keys))
        for name, value in message.properties.items():
            dll.SetMessageProperty(handle, _enc(name), _enc(value))
        if message.properties:
            dll.SetMessageProperty(handle, _enc(PROPS_LIST), _enc(",".join(message.properties)))
        if message.sharding_key:
            dll.SetMessageProperty(handle, _enc(SHARDING_KEY), _enc(message.sharding_key))
        if message.delay_level:
            dll.SetDelayTimeLevel(handle, int(message.delay_level))
        if message.check_immunity_seconds is not None:
            dll.SetMessageProperty(
                handle, _enc(CHECK_IMMUNITY), _enc(str(int(message.check_immunity_seconds)))
            )
    except BaseException:
        dll.DestroyMessage(handle)
        raise
    return int(handle)


def local_view(native: Native, handle: Any, sent: OutgoingMessage, group: str) -> Message:
    """The message ``execute_local`` sees: what we sent plus the ``UNIQ_KEY`` the client gave it.

    Built from ``sent`` instead of reading a dozen fields back through ctypes (that was most of
    txmsg's per-send overhead); only the id comes from the handle.
    """
    uniq = _text(native.dll.GetOriginMessageProperty(handle, _UNIQ_KEY_BYTES)) or None
    properties = dict(sent.properties)
    if uniq:
        properties[UNIQ_KEY] = uniq
    properties["TRAN_MSG"] = "true"
    properties["PGROUP"] = group
    if sent.keys:
        properties["KEYS"] = sent.keys
    if sent.tags:
        properties["TAGS"] = sent.tags
    return Message(
        topic=sent.topic,
        body=sent.body,
        tags=sent.tags or None,
        keys=sent.keys or None,
        properties=properties,
        message_id=uniq,
    )


DISCARD_PROPS = ("REAL_TOPIC", "REAL_QID", "TRANSACTION_CHECK_TIMES", "TRAN_PREPARED_QUEUE_OFFSET")
"""What a discarded half message (``TRANS_CHECK_MAX_TIME_TOPIC``) carries beyond the standard
properties: its real topic and queue, how often it was checked (txmsg.rescue reads them)."""


def read(
    native: Native,
    handle: Any,
    *,
    origin: bool,
    queue: bool = False,
    extra: tuple[str, ...] = (),
) -> Message:
    """Read a message handle into a :class:`Message` (``origin``: a ``CMessage*`` we created).

    ``queue``: also read the queue id and offset (a consumed ``CMessageExt*``; check-backs leave
    them out, their queue is the broker's internal half-message queue).  ``extra``: broker
    properties to read too (the C API reads properties by name only), e.g. :data:`DISCARD_PROPS`
    for the consumer of the discard topic."""
    dll = native.dll
    if origin:
        get_topic, get_body = dll.GetOriginMessageTopic, dll.GetOriginMessageBody
        get_prop = dll.GetOriginMessageProperty
    else:
        get_topic, get_body = dll.GetMessageTopic, dll.GetMessageBody
        get_prop = dll.GetMessageProperty

    def prop(name: str) -> str | None:
        encoded = _NAMES.get(name)
        if encoded is None:
            encoded = _enc(name)
            if len(_NAMES) < _NAMES_KEPT:
                _NAMES[name] = encoded
        raw = get_prop(handle, encoded)
        return raw.decode("utf-8", "replace") if raw else None

    properties: dict[str, str] = {}
    for name in (*_SYSTEM_PROPS, *extra) if extra else _SYSTEM_PROPS:
        value = prop(name)
        if value is not None:
            properties[name] = value
    listed = prop(PROPS_LIST)
    if listed:
        for name in listed.split(","):
            value = prop(name)
            if value is not None:
                properties[name] = value
    body = get_body(handle) or b""
    if prop(ENCODING) == "b64":
        with contextlib.suppress(ValueError):  # not ours after all: hand over what arrived
            body = base64.b64decode(body, validate=True)
    message_id: str | None
    reconsume_times = 0
    if origin:
        message_id = properties.get(UNIQ_KEY)
    else:
        message_id = _text(dll.GetMessageId(handle))
        reconsume_times = int(dll.GetMessageReconsumeTimes(handle))
    queue_id: int | None = None
    queue_offset: int | None = None
    if queue and not origin:
        queue_id = int(dll.GetMessageQueueId(handle))
        queue_offset = int(dll.GetMessageQueueOffset(handle))
    return Message(
        topic=_text(get_topic(handle)) or "",
        body=bytes(body),
        # librocketmq's getTags()/getKeys() read these very properties: not asked twice
        tags=properties.get("TAGS"),
        keys=properties.get("KEYS"),
        properties=properties,
        message_id=message_id,
        reconsume_times=reconsume_times,
        sharding_key=properties.get(SHARDING_KEY),
        queue_id=queue_id,
        queue_offset=queue_offset,
    )
