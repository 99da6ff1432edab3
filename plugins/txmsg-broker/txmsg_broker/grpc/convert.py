"""``apache.rocketmq.v2.Message`` <-> :class:`~txmsg_broker.message_codec.StoredMessage`.

Why the proxy's property names: a message sent over gRPC is stored exactly as a 5.x proxy hands it to
its broker (``SendMessageActivity.buildMessageProperty``), so a remoting consumer (librocketmq) reads
it like any other message, and the check loop, retry and DLQ code see the properties they know.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

from ..delay import DELAY_LEVELS_S
from ..message_codec import (
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_PGROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRAN_MSG,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    StoredMessage,
)
from .stubs import pb

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_BORN_HOST = "__BORNHOST"
PROPERTY_BORN_TIMESTAMP = "BORN_TIMESTAMP"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
KEY_SEPARATOR = " "

#: properties a 5.x client may not set as user properties (a subset of ``MessageConst.STRING_HASH_SET``
#: that matters here: anything the broker itself interprets)
SYSTEM_PROPERTIES = frozenset(
    {
        PROPERTY_TAGS,
        PROPERTY_KEYS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_TRAN_MSG,
        PROPERTY_PGROUP,
        PROPERTY_DELAY,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QID,
        PROPERTY_CHECK_IMMUNITY,
        PROPERTY_SHARDING_KEY,
        PROPERTY_TRACE_CONTEXT,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_TIMER_DELAY_SEC,
        PROPERTY_TIMER_DELAY_MS,
        PROPERTY_BORN_HOST,
        PROPERTY_BORN_TIMESTAMP,
        PROPERTY_RECONSUME_TIME,
        "TRANSACTION_CHECK_TIMES",
        "MAX_OFFSET",
        "MIN_OFFSET",
        "WAIT",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "CLUSTER",
        "MSG_REGION",
        "TRACE_ON",
    }
)


def topic_message_type(props: dict[str, str]) -> str:
    """``TopicMessageType.parseFromMessageProperty``: the kind of a message from its properties."""
    if props.get(PROPERTY_TRAN_MSG) == "true":
        return "TRANSACTION"
    if any(
        k in props
        for k in (
            PROPERTY_DELAY,
            PROPERTY_TIMER_DELIVER_MS,
            PROPERTY_TIMER_DELAY_SEC,
            PROPERTY_TIMER_DELAY_MS,
        )
    ):
        return "DELAY"
    if PROPERTY_SHARDING_KEY in props:
        return "FIFO"
    return "NORMAL"


def delay_level(deliver_ms: int, scale: float, now_ms: int | None = None) -> int:
    """The first delay level that is at least as late as ``deliver_ms`` (0 = due now).

    Why levels: the embedded broker's scheduler is RocketMQ's level-based ``ScheduleMessageService``;
    this is the proxy's ``useDelayLevel`` mode. The broker's ``delay_scale`` applies as for retries.
    """
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    remaining = deliver_ms - now
    if remaining <= 0:
        return 0
    for index, seconds in enumerate(DELAY_LEVELS_S):
        if seconds * 1000.0 * scale >= remaining:
            return index + 1
    return len(DELAY_LEVELS_S)


def to_millis(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def to_stored(
    message: Any, *, queue_id: int, producer_group: str, peer: str, scale: float
) -> StoredMessage:
    """A validated ``v2.Message`` as the store keeps it (see the module docstring)."""
    sp = message.system_properties
    props: dict[str, str] = dict(message.user_properties)
    if sp.tag:
        props[PROPERTY_TAGS] = sp.tag
    if len(sp.keys):
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(sp.keys)
    props[PROPERTY_UNIQ_KEY] = sp.message_id
    sys_flag = 0
    if sp.body_encoding == pb.Encoding.GZIP:
        sys_flag |= SYSFLAG_COMPRESSED
    if sp.message_type == pb.MessageType.TRANSACTION:
        props[PROPERTY_TRAN_MSG] = "true"
        if sp.HasField("orphaned_transaction_recovery_duration"):
            props[PROPERTY_CHECK_IMMUNITY] = str(
                int(sp.orphaned_transaction_recovery_duration.seconds)
            )
    if sp.HasField("delivery_timestamp"):
        deliver = to_millis(sp.delivery_timestamp)
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver)
        level = delay_level(deliver, scale)
        if level > 0:
            props[PROPERTY_DELAY] = str(level)
    props[PROPERTY_RECONSUME_TIME] = str(sp.delivery_attempt)
    props[PROPERTY_PGROUP] = producer_group
    if sp.message_group:
        props[PROPERTY_SHARDING_KEY] = sp.message_group
    if sp.trace_context:
        props[PROPERTY_TRACE_CONTEXT] = sp.trace_context
    born_host = sp.born_host or peer
    if born_host:
        props[PROPERTY_BORN_HOST] = born_host
    born = (
        to_millis(sp.born_timestamp) if sp.HasField("born_timestamp") else int(time.time() * 1000)
    )
    props[PROPERTY_BORN_TIMESTAMP] = str(born)
    return StoredMessage(
        topic=message.topic.name,
        queue_id=queue_id,
        body=bytes(message.body),
        properties=props,
        born_timestamp=born,
        born_host=peer,
        sys_flag=sys_flag,
    )


def _timestamp(ms: int) -> Any:
    return pb.google_dot_protobuf_dot_timestamp__pb2.Timestamp(
        seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000
    )


def to_proto(msg: StoredMessage, *, topic: str | None = None, namespace: str = "") -> Any:
    """``GrpcConverter.buildMessage``: a stored message as a ``v2.Message`` (CRC32 body digest)."""
    props = msg.properties
    user = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    real_topic = topic or props.get(PROPERTY_REAL_TOPIC) or msg.topic
    tran = props.get(PROPERTY_TRAN_MSG) == "true"
    kind = topic_message_type(props)
    message_type = {
        "TRANSACTION": pb.MessageType.TRANSACTION,
        "DELAY": pb.MessageType.DELAY,
        "FIFO": pb.MessageType.FIFO,
    }.get("TRANSACTION" if tran else kind, pb.MessageType.NORMAL)
    sp = pb.SystemProperties(
        message_id=msg.uniq_key,
        body_digest=pb.Digest(
            type=pb.DigestType.CRC32, checksum=format(zlib.crc32(msg.body) & 0xFFFFFFFF, "08X")
        ),
        body_encoding=pb.Encoding.GZIP
        if msg.sys_flag & SYSFLAG_COMPRESSED
        else pb.Encoding.IDENTITY,
        message_type=message_type,
        born_timestamp=_timestamp(msg.born_timestamp),
        born_host=props.get(PROPERTY_BORN_HOST, msg.born_host.partition(":")[0]),
        store_timestamp=_timestamp(msg.store_timestamp),
        store_host=msg.store_host,
        queue_id=int(props.get(PROPERTY_REAL_QID, msg.queue_id)),
        queue_offset=max(0, msg.queue_offset),
        delivery_attempt=max(1, msg.reconsume_times + 1),
    )
    if msg.tags:
        sp.tag = msg.tags
    keys = props.get(PROPERTY_KEYS, "")
    if keys:
        sp.keys.extend(k for k in keys.split(KEY_SEPARATOR) if k)
    if props.get(PROPERTY_SHARDING_KEY):
        sp.message_group = props[PROPERTY_SHARDING_KEY]
    if props.get(PROPERTY_TIMER_DELIVER_MS, "").isdigit():
        sp.delivery_timestamp.CopyFrom(_timestamp(int(props[PROPERTY_TIMER_DELIVER_MS])))
    if props.get(PROPERTY_TRACE_CONTEXT):
        sp.trace_context = props[PROPERTY_TRACE_CONTEXT]
    return pb.Message(
        topic=pb.Resource(name=real_topic, resource_namespace=namespace),
        user_properties=user,
        system_properties=sp,
        body=msg.body,
    )
