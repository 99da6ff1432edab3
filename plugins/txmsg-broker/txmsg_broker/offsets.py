"""Consumer offsets and queue bounds: QUERY/UPDATE_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET,
SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME.

Why so little logic: the store keeps the committed offsets durably; these handlers only translate the
wire format (every number a JSON *string*, which librocketmq requires) and reproduce Java's answers
for the corner cases a client's rebalance depends on.
"""

from __future__ import annotations

from .codec import QUERY_NOT_FOUND, SYSTEM_ERROR, RemotingCommand
from .store import MessageStore
from .transport import Connection


class OffsetHandlers:
    """The offset request handlers over one store."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    async def query_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """Stored offset, else Java's answer for a queue that still starts at 0: offset 0.

        (Java answers QUERY_NOT_FOUND only once the queue's head is no longer in memory; our queues never
        lose their head, so a new group consumes what is already there, exactly like a young Java broker.)
        """
        group = cmd.ext("consumerGroup")
        topic = cmd.ext("topic")
        queue_id = cmd.ext_int("queueId")
        stored = self.store.query_offset(group, topic, queue_id)
        if stored is not None and stored >= 0:
            return cmd.response(ext_fields={"offset": str(stored)})
        if self.store.min_offset(topic, queue_id) <= 0:
            return cmd.response(ext_fields={"offset": "0"})
        return cmd.response(
            QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
        )

    async def update_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | None:
        group = cmd.ext("consumerGroup")
        topic = cmd.ext("topic")
        if not group or not topic:
            raise ValueError("UPDATE_CONSUMER_OFFSET needs 'consumerGroup' and 'topic'")
        queue_id = cmd.ext_int("queueId")
        offset = cmd.ext_int("commitOffset")
        if queue_id < 0 or offset < 0:
            raise ValueError("queueId and commitOffset must not be negative")
        self.store.commit_offset(group, topic, queue_id, offset)
        return None if cmd.is_oneway else cmd.response()

    async def max_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = self.store.max_offset(cmd.ext("topic"), cmd.ext_int("queueId"))
        return cmd.response(ext_fields={"offset": str(offset)})

    async def min_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        offset = self.store.min_offset(cmd.ext("topic"), cmd.ext_int("queueId"))
        return cmd.response(ext_fields={"offset": str(offset)})

    async def search_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """First queue offset whose store time is >= ``timestamp`` (binary search; max offset if none)."""
        topic = cmd.ext("topic")
        queue_id = cmd.ext_int("queueId")
        ts = cmd.ext_int("timestamp")
        lo, hi = self.store.min_offset(topic, queue_id), self.store.max_offset(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            found = self.store.get(topic, queue_id, mid, 1)
            if found and found[0].store_timestamp < ts:
                lo = mid + 1
            else:
                hi = mid
        return cmd.response(ext_fields={"offset": str(lo)})

    async def earliest_time(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext("topic")
        queue_id = cmd.ext_int("queueId")
        found = self.store.get(topic, queue_id, self.store.min_offset(topic, queue_id), 1)
        if not found:
            return cmd.error(SYSTEM_ERROR, f"no message in {topic} queue {queue_id}")
        return cmd.response(ext_fields={"timestamp": str(found[0].store_timestamp)})
