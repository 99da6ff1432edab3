"""UPDATE_AND_CREATE_TOPIC (17), as ``mqadmin updateTopic`` sends it (RocketMQ 5 ``attributes`` included);
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200, ``mqadmin updateSubGroup``) is :mod:`.subscription_groups`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import subscription_groups
from .codec import SYSTEM_ERROR, UPDATE_AND_CREATE_TOPIC, RemotingCommand
from .topics import (
    DEFAULT_PERM,
    MESSAGE_TYPE_ATTRIBUTE,
    MESSAGE_TYPES,
    SYSTEM_TOPICS,
    TopicConfig,
    parse_attributes,
    validate_topic_name,
)
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker


def install(broker: Broker) -> None:
    async def update_and_create_topic(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext("topic")
        problem = validate_topic_name(topic)
        if problem is not None:
            return cmd.error(SYSTEM_ERROR, f"The specified topic is invalid: {problem}")
        if topic in SYSTEM_TOPICS:
            return cmd.error(SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
        queues_read = cmd.ext_int("readQueueNums", 8)
        queues_write = cmd.ext_int("writeQueueNums", queues_read)
        if not (1 <= queues_read <= 1024 and 1 <= queues_write <= 1024):
            return cmd.error(SYSTEM_ERROR, "queue numbers must be between 1 and 1024")
        attrs = parse_attributes(cmd.ext("attributes"))
        mtype = attrs.get(MESSAGE_TYPE_ATTRIBUTE)
        if mtype is not None:
            if mtype.upper() not in MESSAGE_TYPES:
                return cmd.error(
                    SYSTEM_ERROR,
                    f"value of attribute {MESSAGE_TYPE_ATTRIBUTE} must be one of {', '.join(MESSAGE_TYPES)}",
                )
            attrs[MESSAGE_TYPE_ATTRIBUTE] = mtype.upper()
        existing = broker.topics.get(topic)
        merged = dict(existing.attributes) if existing is not None else {}
        merged.update(attrs)
        cfg = TopicConfig(
            topic_name=topic,
            read_queue_nums=queues_read,
            write_queue_nums=queues_write,
            perm=cmd.ext_int("perm", DEFAULT_PERM) & 0x7 or DEFAULT_PERM,
            topic_sys_flag=cmd.ext_int("topicSysFlag", 0),
            order=cmd.ext_bool("order"),
            attributes=merged,
        )
        broker.topics.put(cfg)
        await broker.publish_routes()  # Java's registerIncrementBrokerData: routed before we answer
        broker.logs.broker.info(
            "AdminBrokerThread_1",
            f"updateAndCreateTopic called by {conn.remote_addr}, {cfg.describe()}",
        )
        return cmd.response()

    broker.register(UPDATE_AND_CREATE_TOPIC, update_and_create_topic, inline=True)
    subscription_groups.install(broker)
