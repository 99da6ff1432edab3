"""Which client connections belong to which producer / consumer group.

Learned from HEART_BEAT, as a real broker does.  ``learn_producers_from_sends`` (off by default, a
non-standard shortcut) also registers producers from their sends and END_TRANSACTION. Check-backs pick
channels of a producer group round-robin, as Java's ``ProducerManager.getAvailableChannel`` does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .transport import Connection

log = logging.getLogger("txmsg_broker.clients")

CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}
MESSAGE_MODELS = {0: "BROADCASTING", 1: "CLUSTERING"}

#: listener(event, group, connection); events: "producer_registered", "producer_unregistered",
#: "consumer_registered", "consumer_changed", "consumer_unregistered"
ClientListener = Callable[[str, str, Connection], None]


@dataclass
class ClientChannel:
    conn: Connection
    client_id: str
    language: str
    version: int
    last_update: int = field(default_factory=lambda: int(time.time() * 1000))

    def describe(self) -> str:
        """Java's ClientChannelInfo.toString."""
        return (
            f"ClientChannelInfo [channel={self.conn.describe()}, clientId={self.client_id}, "
            f"language={self.language}, version={self.version}, "
            f"lastUpdateTimestamp={self.last_update}]"
        )


@dataclass
class SubscriptionData:
    topic: str
    sub_string: str = "*"
    sub_version: str = "0"
    tags: list[str] = field(default_factory=list)


@dataclass
class ConsumerGroupInfo:
    group: str
    consume_type: int = 1
    message_model: int = 1
    channels: dict[Connection, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)

    def client_ids(self) -> list[str]:
        return sorted({c.client_id for c in self.channels.values() if not c.conn.closed})


class ClientRegistry:
    """Producer and consumer group membership. Used only from the broker's event loop thread."""

    def __init__(self) -> None:
        self.producers: dict[str, dict[Connection, ClientChannel]] = {}
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self._rr: dict[str, int] = {}
        self.listeners: list[ClientListener] = []

    def add_listener(self, listener: ClientListener) -> None:
        self.listeners.append(listener)

    def _fire(self, event: str, group: str, conn: Connection) -> None:
        for listener in list(self.listeners):
            try:
                listener(event, group, conn)
            except Exception:
                log.exception("client listener failed")

    # -- producers ------------------------------------------------------------------------------
    def register_producer(
        self, group: str, conn: Connection, client_id: str | None = None
    ) -> ClientChannel | None:
        """Register (or refresh) a producer channel; returns the channel if it is new."""
        if conn.closed or not group:
            return None
        channels = self.producers.setdefault(group, {})
        existing = channels.get(conn)
        if existing is not None:
            existing.last_update = int(time.time() * 1000)
            if client_id and existing.client_id != client_id:
                existing.client_id = client_id
            return None
        channel = ClientChannel(
            conn, client_id or conn.client_id or conn.remote_addr, conn.language, conn.version
        )
        channels[conn] = channel
        self._fire("producer_registered", group, conn)
        return channel

    def unregister_producer(self, group: str, conn: Connection) -> bool:
        channels = self.producers.get(group)
        if not channels or conn not in channels:
            return False
        del channels[conn]
        if not channels:
            del self.producers[group]
        self._fire("producer_unregistered", group, conn)
        return True

    def producer_channels(self, group: str) -> list[ClientChannel]:
        return [c for c in self.producers.get(group, {}).values() if not c.conn.closed]

    def next_producer_channel(self, group: str) -> Connection | None:
        """Round-robin over the group's live channels (None if the group has none)."""
        channels = self.producer_channels(group)
        if not channels:
            return None
        index = self._rr.get(group, -1) + 1
        self._rr[group] = index
        return channels[index % len(channels)].conn

    # -- consumers ------------------------------------------------------------------------------
    def register_consumer(
        self, conn: Connection, client_id: str, data: dict[str, Any]
    ) -> tuple[ConsumerGroupInfo, bool, bool]:
        """Register from one heartbeat ``consumerDataSet`` entry: (info, new_channel, subscriptions_changed)."""
        group = str(data.get("groupName", ""))
        info = self.consumers.get(group)
        if info is None:
            info = self.consumers[group] = ConsumerGroupInfo(group)
        info.consume_type = _int(data.get("consumeType"), 1)
        info.message_model = _int(data.get("messageModel"), 1)
        new_channel = conn not in info.channels
        if new_channel:
            info.channels[conn] = ClientChannel(conn, client_id, conn.language, conn.version)
        else:
            info.channels[conn].last_update = int(time.time() * 1000)
            info.channels[conn].client_id = client_id
        changed = False
        for sub in data.get("subscriptionDataSet") or []:
            if not isinstance(sub, dict):
                continue
            topic = str(sub.get("topic", ""))
            if not topic:
                continue
            tags = sub.get("tagsSet") or []
            new = SubscriptionData(
                topic=topic,
                sub_string=str(sub.get("subString", "*")),
                sub_version=str(sub.get("subVersion", "0")),
                tags=[str(t).strip() for t in tags if str(t).strip()],
            )
            old = info.subscriptions.get(topic)
            if old is None or old.sub_string != new.sub_string:
                changed = True
            info.subscriptions[topic] = new
        self._fire(
            "consumer_changed" if (new_channel or changed) else "consumer_registered", group, conn
        )
        return info, new_channel, changed

    def unregister_consumer(self, group: str, conn: Connection) -> bool:
        info = self.consumers.get(group)
        if info is None or conn not in info.channels:
            return False
        del info.channels[conn]
        self._fire("consumer_unregistered", group, conn)
        return True

    def consumer_group(self, group: str) -> ConsumerGroupInfo | None:
        return self.consumers.get(group)

    def consumer_client_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        return info.client_ids() if info is not None else []

    def consumer_connections(self, group: str) -> list[Connection]:
        info = self.consumers.get(group)
        if info is None:
            return []
        return [c for c in info.channels if not c.closed]

    # -- connections ----------------------------------------------------------------------------
    def remove_connection(self, conn: Connection) -> list[tuple[str, str, ClientChannel]]:
        """Forget a closed connection everywhere; returns (kind, group, channel) removed."""
        removed: list[tuple[str, str, ClientChannel]] = []
        for group in list(self.producers):
            channel = self.producers[group].get(conn)
            if channel is not None:
                self.unregister_producer(group, conn)
                removed.append(("producer", group, channel))
        for group, info in list(self.consumers.items()):
            channel = info.channels.get(conn)
            if channel is not None:
                self.unregister_consumer(group, conn)
                removed.append(("consumer", group, channel))
        return removed


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
