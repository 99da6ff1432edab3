"""Pop consumption over the broker's store: invisible time, redelivery, FIFO blocking, DLQ.

What a 5.x broker does with ``PopMessageProcessor`` / ``AckMessageProcessor`` /
``ChangeInvisibleTimeProcessor`` and its revive service, reduced to the state one embedded broker needs:

* a pop reads the consume queues of the topic itself (the same queues remoting producers and consumers
  use), all readable queues of the topic when the client names none (queue id -1, as the proxy asks);
* each delivery is in flight until acked; once its invisible time passes it is delivered again with
  ``delivery_attempt + 1`` (the broker's revive + retry topic, kept here as in-flight state: the
  message id, body and queue offset stay the same);
* a message whose ``reconsumeTimes`` reached the group's max attempts goes to ``%DLQ%<group>`` instead
  of being delivered (``PopMessageResultFilterImpl`` -> TO_DLQ), like a remoting send-back would; not
  when the topic read is itself a DLQ (its copies carry that many reconsume times: a real broker would
  forward them to yet another DLQ, which helps nobody who reads a DLQ to inspect or replay it);
* FIFO (orderly pop): a queue with an invisible delivery delivers nothing else, so the next message of a
  message group (always one queue) comes only after the previous one was acked or its time ran out;
* progress is the group's ordinary consumer offset (``store.commit_offset``): the first offset not yet
  acked, so after a restart unacked messages are delivered again (at least once). Offsets are per
  group, so gRPC groups and remoting groups never share progress.

Deliveries of push consumers (``auto_renew``) stay invisible while their client is connected, like the
proxy's receipt-handle renewal; when the client goes away they become visible at once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..message_codec import (
    PROPERTY_DELAY,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
)
from ..topics import DLQ_PREFIX
from .receipts import NORMAL_TOPIC, ORDER_REVIVE_QUEUE, ReceiptHandle, now_ms

if TYPE_CHECKING:
    from ..broker import Broker

POP_THREAD = "PopServiceThread"
#: how often a held receive re-checks push-consumer deliveries whose client may have gone
RENEW_CHECK_S = 1.0
NEVER = 1 << 62


@dataclass
class Delivery:
    """One in-flight delivery of the message at ``offset`` (the receipt handle names it)."""

    offset: int
    pop_time: int
    invisible_ms: int
    attempt: int
    client_id: str
    auto_renew: bool = False

    @property
    def visible_at(self) -> int:
        return self.pop_time + self.invisible_ms


@dataclass
class QueueState:
    """Pop progress of one group on one queue."""

    next_offset: int
    committed: int
    inflight: dict[int, Delivery] = field(default_factory=dict)

    def commit_point(self) -> int:
        return min(self.inflight) if self.inflight else self.next_offset


@dataclass
class Popped:
    msg: StoredMessage
    delivery: Delivery
    handle: ReceiptHandle


class PopService:
    """All pop state of one broker; used only on the broker's event loop."""

    def __init__(self, broker: Broker, client_alive: Callable[[str], bool]) -> None:
        self.broker = broker
        self.store = broker.store
        self.client_alive = client_alive
        self.queues: dict[tuple[str, str, int], QueueState] = {}
        self._rr: dict[tuple[str, str], itertools.count[int]] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._loop_thread: int | None = None
        self.stopping = False
        self.store.on_put(self._on_put)
        broker.on_start(self._started)
        broker.on_stopping(self._release_all)

    # -- wake-ups --------------------------------------------------------------------------------
    def _started(self) -> None:
        self._loop_thread = threading.get_ident()

    def _on_put(self, msg: StoredMessage) -> None:
        loop = self.broker.loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            self.notify(msg.topic)
        else:
            loop.call_soon_threadsafe(self.notify, msg.topic)

    def notify(self, topic: str) -> None:
        """Something became receivable on ``topic`` (a put, a nack, an ack that unblocks FIFO)."""
        for fut in self._waiters.pop(topic, ()):
            if not fut.done():
                fut.set_result(None)

    async def _release_all(self) -> None:
        self.stopping = True
        for topic in list(self._waiters):
            self.notify(topic)

    async def wait(self, topic: str, timeout_s: float) -> None:
        """Until :meth:`notify` for ``topic`` or the timeout (the caller pops again either way)."""
        if timeout_s <= 0 or self.stopping:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(topic, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(topic)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(topic, None)

    # -- state -----------------------------------------------------------------------------------
    def state(self, group: str, topic: str, queue_id: int) -> QueueState:
        key = (group, topic, queue_id)
        st = self.queues.get(key)
        if st is None:
            stored = self.store.query_offset(group, topic, queue_id)
            # ConsumeInitMode.MAX with initPopOffsetByCheckMsgInMem: a queue whose head is still there is
            # read from its head, like a new remoting group on this broker (see offsets.query_offset)
            start = (
                stored
                if stored is not None and stored >= 0
                else self.store.min_offset(topic, queue_id)
            )
            st = self.queues[key] = QueueState(next_offset=start, committed=start)
        return st

    def _commit(self, group: str, topic: str, queue_id: int, st: QueueState) -> None:
        point = st.commit_point()
        if point != st.committed:
            st.committed = point
            self.store.commit_offset(group, topic, queue_id, point)

    def visible(self, d: Delivery, now: int) -> bool:
        if d.auto_renew and self.client_alive(d.client_id):
            return False
        return d.auto_renew or d.visible_at <= now

    def next_wake_s(
        self, group: str, topic: str, queue_ids: Iterable[int], now: int
    ) -> float | None:
        """Seconds until an in-flight delivery of these queues may become visible (None: never)."""
        best: float | None = None
        for qid in queue_ids:
            st = self.queues.get((group, topic, qid))
            if st is None:
                continue
            for d in st.inflight.values():
                wait = RENEW_CHECK_S if d.auto_renew else max(0.0, (d.visible_at - now) / 1000.0)
                best = wait if best is None else min(best, wait)
        return best

    # -- pop -------------------------------------------------------------------------------------
    def pop(
        self,
        *,
        group: str,
        topic: str,
        queue_ids: list[int],
        batch: int,
        invisible_ms: int,
        fifo: bool,
        max_attempts: int,
        tags: set[str] | None,
        client_id: str,
        auto_renew: bool,
    ) -> list[Popped]:
        """Up to ``batch`` deliveries from ``queue_ids`` (rotating the start queue per call)."""
        if not queue_ids:
            return []
        if topic.startswith(DLQ_PREFIX):
            max_attempts = NEVER  # whoever reads a DLQ gets its messages; there is no DLQ of a DLQ
        now = now_ms()
        rr = self._rr.setdefault((group, topic), itertools.count())
        start = next(rr) % len(queue_ids)
        out: list[Popped] = []
        for qid in queue_ids[start:] + queue_ids[:start]:
            if len(out) >= batch:
                break
            st = self.state(group, topic, qid)
            out.extend(
                self._pop_queue(
                    group,
                    topic,
                    qid,
                    st,
                    batch - len(out),
                    now,
                    invisible_ms,
                    fifo,
                    max_attempts,
                    tags,
                    client_id,
                    auto_renew,
                )
            )
            self._commit(group, topic, qid, st)
        return out

    def _pop_queue(
        self,
        group: str,
        topic: str,
        qid: int,
        st: QueueState,
        want: int,
        now: int,
        invisible_ms: int,
        fifo: bool,
        max_attempts: int,
        tags: set[str] | None,
        client_id: str,
        auto_renew: bool,
    ) -> list[Popped]:
        if fifo and any(not self.visible(d, now) for d in st.inflight.values()):
            return []  # orderly pop: the queue is blocked until its deliveries are acked or time out
        out: list[Popped] = []

        def deliver(msg: StoredMessage, attempt: int) -> None:
            d = Delivery(msg.queue_offset, now, invisible_ms, attempt, client_id, auto_renew)
            st.inflight[msg.queue_offset] = d
            handle = ReceiptHandle(
                start_offset=msg.queue_offset,
                pop_time=now,
                invisible_ms=invisible_ms,
                revive_queue_id=ORDER_REVIVE_QUEUE if fifo else 0,
                topic_type=NORMAL_TOPIC,
                broker_name=self.broker.broker_name,
                queue_id=qid,
                offset=msg.queue_offset,
                commit_log_offset=msg.commit_log_offset,
            )
            out.append(Popped(msg, d, handle))

        # deliveries whose invisible time ran out come back first, in queue order
        for offset in sorted(st.inflight):
            if len(out) >= want:
                return out
            d = st.inflight[offset]
            if not self.visible(d, now):
                continue
            found = self.store.get(topic, qid, offset, 1)
            if not found:
                del st.inflight[offset]
                continue
            if d.attempt >= max_attempts:
                del st.inflight[offset]
                self.to_dlq(group, found[0], d.attempt, max_attempts)
                continue
            deliver(found[0], d.attempt + 1)
        max_offset = self.store.max_offset(topic, qid)
        while len(out) < want and st.next_offset < max_offset:
            batch = self.store.get(topic, qid, st.next_offset, max(want - len(out), 1))
            if not batch:
                break
            for msg in batch:
                if len(out) >= want:
                    break
                st.next_offset = msg.queue_offset + 1
                if tags is not None and msg.tags not in tags:
                    continue  # NO_MATCH: acked for this group at once
                if msg.reconsume_times >= max_attempts:
                    self.to_dlq(group, msg, msg.reconsume_times, max_attempts)
                    continue
                deliver(msg, msg.reconsume_times + 1)
        return out

    # -- ack / change / DLQ ----------------------------------------------------------------------
    def delivery(self, group: str, topic: str, handle: ReceiptHandle) -> Delivery | None:
        """The in-flight delivery ``handle`` names (None: acked, redelivered since, or never popped)."""
        st = self.queues.get((group, topic, handle.queue_id))
        d = st.inflight.get(handle.offset) if st is not None else None
        return d if d is not None and d.pop_time == handle.pop_time else None

    def ack(self, group: str, topic: str, handle: ReceiptHandle) -> bool:
        """Ack the delivery; False if the handle names no current delivery (an ack of it is a no-op)."""
        d = self.delivery(group, topic, handle)
        if d is None:
            return False
        st = self.queues[(group, topic, handle.queue_id)]
        del st.inflight[handle.offset]
        self._commit(group, topic, handle.queue_id, st)
        self.notify(topic)  # a FIFO queue may be free again
        return True

    def change(
        self, group: str, topic: str, handle: ReceiptHandle, invisible_ms: int
    ) -> ReceiptHandle:
        """New invisible time counted from now; the new handle (the old one no longer acks)."""
        now = now_ms()
        new = replace(handle, pop_time=now, invisible_ms=invisible_ms)
        d = self.delivery(group, topic, handle)
        if d is not None:
            d.pop_time = now
            d.invisible_ms = invisible_ms
            d.auto_renew = False
            self.notify(topic)
        return new

    def to_dlq(
        self, group: str, msg: StoredMessage, reconsume_times: int, max_attempts: int
    ) -> StoredMessage:
        """Store a copy in ``%DLQ%<group>`` (``consumerSendMsgBack`` with delay level -1)."""
        topic = DLQ_PREFIX + group
        cfg, created = self.broker.topics.create_if_absent(topic, 1)
        log = self.broker.logs.broker
        if created:
            log.info(POP_THREAD, f"create new topic {cfg.describe()}")
        log.info(
            POP_THREAD,
            f"send msg to DLQ {topic}, owner group: {group}, reconsumeTimes: {reconsume_times}, "
            f"maxReconsumeTimes: {max_attempts - 1}, msgId: {msg.uniq_key}",
        )
        props = dict(msg.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, msg.topic)
        props[PROPERTY_ORIGIN_MESSAGE_ID] = props.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id
        props[PROPERTY_WAIT] = "false"
        props.pop(PROPERTY_DELAY, None)
        copy = replace(
            msg,
            topic=topic,
            queue_id=0,
            properties=props,
            reconsume_times=reconsume_times,
            sys_flag=msg.sys_flag & ~TRANSACTION_TYPE_MASK,
        )
        return self.broker.put_message(copy)
