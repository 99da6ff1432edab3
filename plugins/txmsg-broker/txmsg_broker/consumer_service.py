"""The consumer side of the broker, assembled from one module per job (``docs/rocketmq-facts.md``,
protocol quirks):

* :mod:`.pull` - PULL_MESSAGE; :mod:`.long_poll` - pulls held until a put arrives;
* :mod:`.offsets` - consumer offsets and queue bounds;
* :mod:`.membership` - group members, change notifications, expiry of silent consumers;
* :mod:`.queue_locks` - orderly-consumption queue locks;
* :mod:`.retry` - CONSUMER_SEND_MSG_BACK to ``%RETRY%``/``%DLQ%``;
* :mod:`.delay` - delay levels through ``SCHEDULE_TOPIC_XXXX``.

This module only wires them to the broker: request codes, the put hook that wakes held pulls and the
scheduler, and start/stop. The broker imports it at construction and calls :func:`install`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from .codec import (
    CONSUMER_SEND_MSG_BACK,
    GET_CONSUMER_LIST_BY_GROUP,
    GET_EARLIEST_MSG_STORETIME,
    GET_MAX_OFFSET,
    GET_MIN_OFFSET,
    LOCK_BATCH_MQ,
    PULL_MESSAGE,
    QUERY_CONSUMER_OFFSET,
    SEARCH_OFFSET_BY_TIMESTAMP,
    UNLOCK_BATCH_MQ,
    UPDATE_CONSUMER_OFFSET,
)
from .delay import DelayScheduler, schedule_filter
from .long_poll import LongPolls
from .membership import Membership
from .message_codec import StoredMessage
from .offsets import OffsetHandlers
from .pull import PullHandler
from .queue_locks import QueueLocks
from .retry import RetryHandler
from .topics import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from .broker import Broker


class ConsumerService:
    """The consumer-side parts of one broker (``broker.consumers``) and the hooks between them."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.long_polls = LongPolls()
        self.pulls = PullHandler(broker.store, broker.topics, self.long_polls)
        self.offsets = OffsetHandlers(broker.store)
        self.membership = Membership(broker)
        self.locks = QueueLocks(broker.config.rebalance_lock_max_live_time_ms / 1000, broker.clock)
        self.retry = RetryHandler(broker)
        self.scheduler = DelayScheduler(broker)
        self._loop_thread: int | None = None
        self.started = False

    def start(self) -> None:
        """Called on the broker's loop once it runs: scheduler timers from the store, expiry scan."""
        self._loop_thread = threading.get_ident()
        self.started = True
        self.scheduler.start()
        self.membership.start()

    async def before_stop(self) -> None:
        """Answer every held pull now (PULL_NOT_FOUND) so clients do not sit out librocketmq's 30 s
        async timeout: it does not fail pending requests when the connection drops."""
        self.long_polls.release_all()
        for _ in range(3):  # let the woken pull handlers write their responses
            await asyncio.sleep(0)
        for conn in list(self.broker.server.connections):
            await conn.drain_if_needed()

    def on_put(self, msg: StoredMessage) -> None:
        """Store hook: wake the pulls held on the message's queue (and the scheduler), on the loop."""
        loop = self.broker.loop
        if loop is None or not self.started:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake(msg.topic, msg.queue_id)
        else:
            loop.call_soon_threadsafe(self._wake, msg.topic, msg.queue_id)

    def _wake(self, topic: str, queue_id: int) -> None:
        self.long_polls.wake(topic, queue_id)
        if topic == SCHEDULE_TOPIC:
            self.scheduler.wake(queue_id)


def install(broker: Broker) -> ConsumerService:
    """Register the consumer-side handlers on ``broker`` and hook its start-up and shutdown."""
    service = ConsumerService(broker)
    broker.consumers = service
    broker.store.on_put(service.on_put)
    broker.add_put_filter(schedule_filter)
    broker.clients.add_listener(service.membership.on_client_event)
    broker.register(PULL_MESSAGE, service.pulls.pull)
    offsets = service.offsets
    broker.register(QUERY_CONSUMER_OFFSET, offsets.query_offset, inline=True)
    broker.register(UPDATE_CONSUMER_OFFSET, offsets.update_offset, inline=True)
    broker.register(GET_MAX_OFFSET, offsets.max_offset, inline=True)
    broker.register(GET_MIN_OFFSET, offsets.min_offset, inline=True)
    broker.register(SEARCH_OFFSET_BY_TIMESTAMP, offsets.search_offset, inline=True)
    broker.register(GET_EARLIEST_MSG_STORETIME, offsets.earliest_time, inline=True)
    broker.register(GET_CONSUMER_LIST_BY_GROUP, service.membership.consumer_list, inline=True)
    broker.register(CONSUMER_SEND_MSG_BACK, service.retry.send_back, inline=True)
    broker.register(LOCK_BATCH_MQ, service.locks.lock, inline=True)
    broker.register(UNLOCK_BATCH_MQ, service.locks.unlock, inline=True)
    broker.on_start(service.start)
    broker.on_stopping(service.before_stop)
    return service
