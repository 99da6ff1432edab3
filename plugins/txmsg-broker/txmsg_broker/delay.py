"""Delayed delivery: messages with a ``DELAY`` level wait in ``SCHEDULE_TOPIC_XXXX`` until they are due.

Why it works like Java's ``ScheduleMessageService``: a put filter moves a delayed message into
``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` (keeping its real topic and queue in properties), and one
task per level delivers that queue's messages in order once ``store time + level delay`` has passed.
Scheduled messages are ordinary stored messages and each level's progress is a consumer offset (group
``SCHEDULE_GROUP``), so after a restart (even ``kill -9``) every due message is delivered and every
pending one gets its timer back. Delivery is at-least-once, as in Java.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .message_codec import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
)
from .store import NotWritableError
from .topics import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from .broker import Broker

#: RocketMQ's ``messageDelayLevel`` default, level 1..18
DELAY_LEVELS_S: tuple[float, ...] = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
MAX_DELAY_LEVEL = len(DELAY_LEVELS_S)
#: the consumer-offset group under which the scheduler records its progress per delay level
SCHEDULE_GROUP = "SCHEDULE_GROUP"
#: messages read from a level's queue at a time
_BATCH = 32
#: seconds before a delayed message the store could not append (full disk) is tried again
_DISK_FULL_RETRY_S = 1.0


def delay_ms(level: int, scale: float) -> float:
    """Delay of a (clamped) level in milliseconds, multiplied by the broker's ``delay_scale``."""
    level = max(1, min(MAX_DELAY_LEVEL, level))
    return DELAY_LEVELS_S[level - 1] * 1000.0 * scale


def schedule_filter(msg: StoredMessage) -> StoredMessage:
    """Put filter: a message with ``DELAY`` goes to ``SCHEDULE_TOPIC_XXXX`` queue level-1 first.

    Half and rolled-back transactional messages keep their topic: they are delayed (if at all) only
    once committed."""
    raw = msg.properties.get(PROPERTY_DELAY)
    if not raw or msg.topic == SCHEDULE_TOPIC:
        return msg
    txn = msg.sys_flag & TRANSACTION_TYPE_MASK
    if txn in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE):
        return msg
    try:
        level = int(raw)
    except ValueError:
        return msg
    if level <= 0:
        return msg
    level = min(MAX_DELAY_LEVEL, level)
    props = dict(msg.properties)
    props[PROPERTY_DELAY] = str(level)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QID] = str(msg.queue_id)
    return replace(msg, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props)


class DelayScheduler:
    """One delivery task per delay level that has messages; woken by puts into its queue."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self._events: dict[int, asyncio.Event] = {}
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self.started = False

    def start(self) -> None:
        """On the broker's loop once it runs: rebuild the timers of every level from the store."""
        self.started = True
        for queue_id in self.store.queue_ids(SCHEDULE_TOPIC):
            self._ensure_level(queue_id)

    def wake(self, queue_id: int) -> None:
        """A message was put into ``SCHEDULE_TOPIC_XXXX`` queue ``queue_id``."""
        self._ensure_level(queue_id)
        event = self._events.get(queue_id)
        if event is not None:
            event.set()

    def _ensure_level(self, queue_id: int) -> None:
        if not self.started or not 0 <= queue_id < MAX_DELAY_LEVEL:
            return
        task = self._tasks.get(queue_id)
        if task is not None and not task.done():
            return
        self._events.setdefault(queue_id, asyncio.Event())
        self._tasks[queue_id] = self.broker.spawn(self._run_level(queue_id))

    async def _run_level(self, queue_id: int) -> None:
        """Deliver one delay level's messages in order, each once its time has come."""
        event = self._events[queue_id]
        clock = self.broker.clock  # the store stamps store times with it too (manual in tests)
        scale = self.broker.config.delay_scale
        delay = delay_ms(queue_id + 1, scale)
        offset = self.store.query_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, queue_id) or 0
        while True:
            batch = self.store.get(SCHEDULE_TOPIC, queue_id, offset, _BATCH)
            if not batch:
                event.clear()
                if self.store.max_offset(SCHEDULE_TOPIC, queue_id) > offset:
                    continue
                await clock.wait(event, None)
                continue
            for msg in batch:
                wait_s = (msg.store_timestamp + delay - clock.now()) / 1000.0
                if wait_s > 0:
                    await clock.sleep(wait_s)
                while True:  # a full disk: keep the message and retry it (4.9.8 retries later too)
                    try:
                        self._deliver(msg)
                    except NotWritableError:
                        await clock.sleep(_DISK_FULL_RETRY_S)
                        continue
                    except Exception as exc:  # noqa: BLE001 - a bad record must not stop the level forever
                        self.broker.logs.broker.error(
                            "ScheduleMessageTimerThread",
                            f"delayed delivery of {msg.msg_id} failed: {exc!r}",
                        )
                    break
                offset = msg.queue_offset + 1
                self.store.commit_offset(SCHEDULE_GROUP, SCHEDULE_TOPIC, queue_id, offset)

    def _deliver(self, msg: StoredMessage) -> None:
        props = dict(msg.properties)
        props.pop(PROPERTY_DELAY, None)
        topic = props.get(PROPERTY_REAL_TOPIC)
        if not topic:
            raise ValueError("scheduled message without REAL_TOPIC")
        try:
            queue_id = int(props.get(PROPERTY_REAL_QID, "0"))
        except ValueError:
            queue_id = 0
        self.broker.put_message(replace(msg, topic=topic, queue_id=queue_id, properties=props))
