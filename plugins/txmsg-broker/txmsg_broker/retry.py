"""CONSUMER_SEND_MSG_BACK: a message the consumer failed on goes to the group's retry topic or its DLQ.

Why Java's algorithm exactly: librocketmq relies on it for its back-off. The message is stored again in
``%RETRY%<group>`` with ``DELAY = 3 + reconsumeTimes`` (so :mod:`.delay` holds it back through
``SCHEDULE_TOPIC_XXXX``), or in ``%DLQ%<group>`` once ``reconsumeTimes >= maxReconsumeTimes`` (or when
the client asks for the DLQ with a negative delay level). The copy keeps the original message id and
topic in its properties so the consumer sees the same message again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .codec import SYSTEM_ERROR, RemotingCommand
from .delay import MAX_DELAY_LEVEL
from .message_codec import (
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT,
    TRANSACTION_TYPE_MASK,
)
from .store import NotWritableError
from .topics import DLQ_PREFIX, RETRY_PREFIX, validate_topic_name
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker

#: Java's default ``maxReconsumeTimes`` when a client does not send one
DEFAULT_MAX_RECONSUME_TIMES = 16


class RetryHandler:
    """The send-back handler of one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def send_back(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = cmd.ext("group")
        if not group:
            raise ValueError("missing header field 'group'")
        problem = validate_topic_name(RETRY_PREFIX + group) or validate_topic_name(
            DLQ_PREFIX + group
        )
        if problem is not None:
            raise ValueError(f"consumer group {group!r} cannot name a retry/DLQ topic: {problem}")
        phys = cmd.ext_int("offset")
        delay_level = cmd.ext_int("delayLevel", 0)
        max_times = cmd.ext_int("maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
        msg = self.broker.store.lookup(phys)
        if msg is None:
            return cmd.error(SYSTEM_ERROR, f"look message by offset failed, {phys}")
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        origin = props.get(PROPERTY_ORIGIN_MESSAGE_ID) or cmd.ext("originMsgId") or msg.msg_id
        props[PROPERTY_ORIGIN_MESSAGE_ID] = origin
        props[PROPERTY_WAIT] = "false"
        props.pop(PROPERTY_DELAY, None)
        if msg.reconsume_times >= max_times or delay_level < 0:
            topic = DLQ_PREFIX + group
            cfg, created = self.broker.topics.create_if_absent(topic, 1)
            if created:
                self.broker.logs.broker.info(
                    "SendMessageThread_1", f"create new topic {cfg.describe()}"
                )
            self.broker.logs.broker.info(
                "SendMessageThread_1",
                f"send msg to DLQ {topic}, owner group: {group}, reconsumeTimes: {msg.reconsume_times}, "
                f"maxReconsumeTimes: {max_times}, msgId: {msg.uniq_key}",
            )
        else:
            topic = RETRY_PREFIX + group
            self.broker.topics.create_if_absent(topic, 1)
            level = delay_level if delay_level > 0 else 3 + msg.reconsume_times
            props[PROPERTY_DELAY] = str(min(MAX_DELAY_LEVEL, level))
        new = replace(
            msg,
            topic=topic,
            queue_id=0,
            properties=props,
            reconsume_times=msg.reconsume_times + 1,
            sys_flag=msg.sys_flag & ~TRANSACTION_TYPE_MASK,
        )
        try:
            self.broker.put_message(new)
        except NotWritableError:  # 4.9.8 answers a failed send-back put with the status name
            return cmd.error(SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE")
        return cmd.response()
