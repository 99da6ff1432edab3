"""HEART_BEAT (34) and UNREGISTER_CLIENT (35): who is connected, in which groups.

Consumer groups get their ``%RETRY%<group>`` topic (1 queue) here, as Java does. NOTIFY_CONSUMER_IDS_CHANGED
is left to the consumer service, which listens to ``broker.clients`` events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .clients import CONSUME_TYPES, MESSAGE_MODELS
from .codec import HEART_BEAT, SYSTEM_ERROR, UNREGISTER_CLIENT, RemotingCommand
from .topics import RETRY_PREFIX
from .transport import Connection
from .txlog import ThreadNames

if TYPE_CHECKING:
    from .broker import Broker


def register_producer(
    broker: Broker, group: str, conn: Connection, thread: str, client_id: str | None = None
) -> None:
    """Register a producer channel, logging the real broker's line the first time."""
    channel = broker.clients.register_producer(group, conn, client_id)
    if channel is not None:
        broker.logs.broker.info(
            thread, f"new producer connected, group: {group} channel: {channel.describe()}"
        )


def learn_producer_from_request(
    broker: Broker, group: str, conn: Connection, thread: Callable[[], str]
) -> None:
    """The opt-in shortcut of sends / END_TRANSACTION: register ``conn`` for ``group`` when
    ``learn_producers_from_sends`` is on (a real broker learns producers from HEART_BEAT only)."""
    if (
        group
        and broker.config.learn_producers_from_sends
        and conn not in broker.clients.producers.get(group, ())
    ):
        register_producer(broker, group, conn, thread())


def install(broker: Broker) -> None:
    heartbeat_threads = ThreadNames("HeartbeatThread_", 2)
    manage_threads = ThreadNames("ClientManageThread_", 32)

    async def heartbeat(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        try:
            data: Any = json.loads(cmd.body or b"{}")
        except (
            UnicodeDecodeError,
            ValueError,
            RecursionError,
        ) as exc:  # RecursionError: nested too deep
            return cmd.error(SYSTEM_ERROR, f"heartbeat body is not valid JSON: {exc}")
        if not isinstance(data, dict):
            return cmd.error(SYSTEM_ERROR, "heartbeat body must be a JSON object")
        client_id = str(data.get("clientID") or conn.remote_addr)
        conn.client_id = client_id
        thread = heartbeat_threads.next()
        for producer in data.get("producerDataSet") or []:
            if isinstance(producer, dict) and producer.get("groupName"):
                register_producer(broker, str(producer["groupName"]), conn, thread, client_id)
        for consumer in data.get("consumerDataSet") or []:
            if not isinstance(consumer, dict) or not consumer.get("groupName"):
                continue
            group = str(consumer["groupName"])
            retry_cfg, created = broker.topics.create_if_absent(RETRY_PREFIX + group, 1)
            if created:
                broker.logs.broker.info(thread, f"create new topic {retry_cfg.describe()}")
            info, new_channel, changed = broker.clients.register_consumer(conn, client_id, consumer)
            if changed:
                for sub in info.subscriptions.values():
                    broker.logs.broker.info(
                        thread,
                        f"subscription changed, add new topic, group: {group} SubscriptionData "
                        f"[classFilterMode=false, topic={sub.topic}, subString={sub.sub_string}, "
                        f"tagsSet={sub.tags}, codeSet=[], subVersion={sub.sub_version}, expressionType=TAG]",
                    )
            if new_channel:
                channel = info.channels[conn]
                broker.logs.broker.info(
                    thread,
                    f"new consumer connected, group: {group} "
                    f"{CONSUME_TYPES.get(info.consume_type, 'CONSUME_PASSIVELY')} "
                    f"{MESSAGE_MODELS.get(info.message_model, 'CLUSTERING')} channel: {channel.describe()}",
                )
        return cmd.response()

    async def unregister(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        thread = manage_threads.next()
        producer_group = cmd.ext("producerGroup")
        consumer_group = cmd.ext("consumerGroup")
        if producer_group and broker.clients.unregister_producer(producer_group, conn):
            broker.logs.broker.info(
                thread, f"unregister a producer group[{producer_group}] from groupChannelTable"
            )
        if consumer_group and broker.clients.unregister_consumer(consumer_group, conn):
            info = broker.clients.consumer_group(consumer_group)
            if info is not None and not info.channels:
                broker.logs.broker.info(
                    thread,
                    f"unregister consumer ok, no any connection, and remove consumer group, {consumer_group}",
                )
        return cmd.response()

    broker.register(HEART_BEAT, heartbeat, inline=True)
    broker.register(UNREGISTER_CLIENT, unregister, inline=True)
