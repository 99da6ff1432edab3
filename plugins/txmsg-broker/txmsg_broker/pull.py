"""PULL_MESSAGE: read a consume queue from an offset, filtered by tag, held while there is nothing new.

Why it answers the way it does (``docs/rocketmq-facts.md``, protocol quirks):

* The answer codes and remarks (``OFFSET_TOO_SMALL``, ``OFFSET_OVERFLOW_ONE`` ...) and the
  ``nextBeginOffset`` rules are Java's, because librocketmq's offset correction depends on them.
* Every numeric response field is a JSON *string*: librocketmq silently reads numbers as 0.
* A pull with the SUSPEND flag that finds nothing is held (see :mod:`.long_poll`) up to the client's
  ``suspendTimeoutMillis``, capped below librocketmq's 30 s async timeout, which would close the whole
  connection.
"""

from __future__ import annotations

import time

from .codec import (
    PULL_NOT_FOUND,
    PULL_OFFSET_MOVED,
    PULL_RETRY_IMMEDIATELY,
    SUCCESS,
    TOPIC_NOT_EXIST,
    RemotingCommand,
)
from .long_poll import LongPolls
from .message_codec import encode_message
from .store import MessageStore
from .topics import TopicManager
from .transport import Connection

# PullSysFlag bits
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2

#: librocketmq gives an async pull 30 s before it closes the connection; never hold that long
MAX_SUSPEND_MS = 25_000
DEFAULT_SUSPEND_MS = 15_000
MAX_PULL_MSGS = 32
#: bytes per pull response (Java: 256 KiB for in-memory messages); at least one message always goes
MAX_PULL_BYTES = 4 * 1024 * 1024


def parse_subscription(expression: str) -> set[str] | None:
    """Tag set of a TAG expression (``"A || B"``); None means "everything" (``*`` or empty)."""
    expression = (expression or "").strip()
    if expression in ("", "*"):
        return None
    tags = {t.strip() for t in expression.split("||") if t.strip()}
    return tags or None


class PullHandler:
    """The PULL_MESSAGE handler: one read of the queue, repeated after each wake while held."""

    def __init__(self, store: MessageStore, topics: TopicManager, long_polls: LongPolls) -> None:
        self.store = store
        self.topics = topics
        self.long_polls = long_polls

    async def pull(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext("topic")
        if not topic:
            raise ValueError("missing header field 'topic'")
        queue_id = cmd.ext_int("queueId")
        offset = cmd.ext_int("queueOffset")
        max_nums = max(1, min(MAX_PULL_MSGS, cmd.ext_int("maxMsgNums", MAX_PULL_MSGS)))
        sys_flag = cmd.ext_int("sysFlag", 0)
        group = cmd.ext("consumerGroup")
        if queue_id < 0:
            raise ValueError(f"header field 'queueId' must not be negative, got {queue_id}")
        if self.topics.get(topic) is None:
            return cmd.error(
                TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please! Create it with `txmsg topic create {topic}`.",
            )
        if sys_flag & PULL_FLAG_COMMIT_OFFSET and group:
            commit = cmd.ext_int("commitOffset", -1)
            if commit > 0:
                self.store.commit_offset(group, topic, queue_id, commit)
        tags = parse_subscription(cmd.ext("subscription", "*"))
        suspend_ms = cmd.ext_int("suspendTimeoutMillis", DEFAULT_SUSPEND_MS)
        suspend_ms = max(0, min(MAX_SUSPEND_MS, suspend_ms))
        deadline = time.monotonic() + suspend_ms / 1000.0
        while True:
            response = self._pull_once(cmd, topic, queue_id, offset, max_nums, tags)
            may_hold = sys_flag & PULL_FLAG_SUSPEND and response.code == PULL_NOT_FOUND
            remaining = deadline - time.monotonic()
            if not may_hold or remaining <= 0 or conn.closed or self.long_polls.stopping:
                return response
            await self.long_polls.wait_for_put(conn, topic, queue_id, remaining)

    def _pull_once(
        self,
        cmd: RemotingCommand,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        tags: set[str] | None,
    ) -> RemotingCommand:
        min_off = self.store.min_offset(topic, queue_id)
        max_off = self.store.max_offset(topic, queue_id)

        def answer(
            code: int, next_offset: int, body: bytes = b"", remark: str | None = None
        ) -> RemotingCommand:
            return cmd.response(
                code,
                remark,
                ext_fields={
                    "nextBeginOffset": str(next_offset),
                    "minOffset": str(min_off),
                    "maxOffset": str(max_off),
                    "suggestWhichBrokerId": "0",
                },
                body=body,
            )

        if max_off == 0:
            if offset == 0:
                return answer(PULL_NOT_FOUND, 0, remark="NO_MESSAGE_IN_QUEUE")
            return answer(PULL_OFFSET_MOVED, 0, remark="NO_MESSAGE_IN_QUEUE")
        if offset < min_off:
            return answer(PULL_OFFSET_MOVED, min_off, remark="OFFSET_TOO_SMALL")
        if offset == max_off:
            return answer(PULL_NOT_FOUND, offset, remark="OFFSET_OVERFLOW_ONE")
        if offset > max_off:
            return answer(PULL_OFFSET_MOVED, max_off, remark="OFFSET_OVERFLOW_BADLY")
        if tags is None:
            records = self.store.get_raw(topic, queue_id, offset, max_nums)
            chunks: list[bytes] = []
            size = 0
            for record in records:
                if chunks and size + len(record) > MAX_PULL_BYTES:
                    break
                chunks.append(record)
                size += len(record)
            if not chunks:
                return answer(PULL_OFFSET_MOVED, max_off, remark="OFFSET_FOUND_NULL")
            return answer(SUCCESS, offset + len(chunks), b"".join(chunks), "FOUND")
        msgs = self.store.get(topic, queue_id, offset, max_nums)
        chunks = []
        size = 0
        scanned = 0
        for msg in msgs:
            if msg.tags in tags:
                record = encode_message(msg)
                if chunks and size + len(record) > MAX_PULL_BYTES:
                    break
                chunks.append(record)
                size += len(record)
            scanned += 1
        if not msgs:
            return answer(PULL_OFFSET_MOVED, max_off, remark="OFFSET_FOUND_NULL")
        if not chunks:
            return answer(PULL_RETRY_IMMEDIATELY, offset + scanned, remark="NO_MATCHED_MESSAGE")
        return answer(SUCCESS, offset + scanned, b"".join(chunks), "FOUND")
