"""Consumer group membership: who is in a group, telling its members when that changes, and dropping
members that went silent.

Why: librocketmq rebalances queues over the client ids GET_CONSUMER_LIST_BY_GROUP returns, and only
re-asks when told (NOTIFY_CONSUMER_IDS_CHANGED). A hung client that never closes its connection would
keep its queues forever, so, like Java's ``ClientHousekeepingService``, a channel without a heartbeat for
``CHANNEL_EXPIRED_MS`` is removed and closed.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from .codec import NOTIFY_CONSUMER_IDS_CHANGED, SYSTEM_ERROR, RemotingCommand
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker

#: Java's ``channelExpiredTimeout``: a consumer silent this long (no heartbeat) loses its queues
CHANNEL_EXPIRED_MS = 120_000
CHANNEL_SCAN_INTERVAL_S = 10.0


class Membership:
    """GET_CONSUMER_LIST_BY_GROUP, change notifications and the expiry scan of one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._notify_pending: set[str] = set()

    def start(self) -> None:
        """Start the periodic expiry scan (on the broker's loop; cancelled when the broker stops)."""
        self.broker.spawn(self._expire_loop())

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(CHANNEL_SCAN_INTERVAL_S)
            self.expire_channels()

    def expire_channels(self, now_ms: int | None = None) -> int:
        """Drop consumer channels without a heartbeat for ``CHANNEL_EXPIRED_MS`` (Java's scan): a hung
        client must not keep its queues forever. Like Java, the channel is closed too."""
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        expired = 0
        for group, info in list(self.broker.clients.consumers.items()):
            for conn, channel in list(info.channels.items()):
                if now - channel.last_update <= CHANNEL_EXPIRED_MS:
                    continue
                self.broker.logs.broker.warn(
                    "ClientHousekeepingScheduledThread",
                    f"SCAN: remove expired channel from ConsumerManager consumerTable. "
                    f"channel={conn.remote_addr}, consumerGroup={group}",
                )
                self.broker.clients.unregister_consumer(group, conn)
                conn.close()
                expired += 1
        return expired

    async def consumer_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group = cmd.ext("consumerGroup")
        ids = self.broker.clients.consumer_client_ids(group)
        if not ids:
            return cmd.error(
                SYSTEM_ERROR,
                f"no consumer for this group, {group}: the consumer must send a heartbeat first",
            )
        return cmd.response(
            body=json.dumps({"consumerIdList": ids}, separators=(",", ":")).encode()
        )

    def on_client_event(self, event: str, group: str, conn: Connection) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED to the group's consumers when members/subscriptions change."""
        if event not in ("consumer_changed", "consumer_unregistered"):
            return
        loop = self.broker.loop
        if loop is None or group in self._notify_pending:
            return
        self._notify_pending.add(group)
        # coalesce all changes of one loop iteration (a heartbeat can touch several groups/channels)
        loop.call_soon(self._notify, group)

    def _notify(self, group: str) -> None:
        self._notify_pending.discard(group)
        for target in self.broker.clients.consumer_connections(group):
            target.send_oneway(NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
