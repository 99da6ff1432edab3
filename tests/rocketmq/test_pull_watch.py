"""Push consumers pull asynchronously (held by the broker) and restart when a queue stalls.

librocketmq 2.1.0's synchronous pull is never held, so an idle consumer re-pulls its queues back
to back; the asynchronous one is held, but can stop pulling a queue for good after a rebalance
(docs/librocketmq-hazards.md #5).  These check what the repair rests on: the client's own report
of its queues, the stall rule, and a restart that loses nothing.  The stall itself cannot be
made on demand (it needs a pull result to land in a window of a rebalance); the restart is
forced instead by a watcher that finds every queue late.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from rmq_helpers import create_topic, unique, wait_until
from txmsg_rocketmq.consumer import PushConsumer
from txmsg_rocketmq.pull_watch import HeldQueue, parse, stalled

from txmsg.message import Message, OutgoingMessage
from txmsg.states import LocalTransactionState as S

# the shape librocketmq 2.1.0 writes (ConsumerRunningInfo::encode): mqTable keyed by the queue's
# JSON object, before the valid-JSON rest
REPORT = (
    '{"mqTable":{{\n   "brokerName" : "broker-a",\n   "queueId" : 0,\n   "topic" : "%RETRY%G"\n}'
    ':{\n   "cachedMsgCount" : 0,\n   "droped" : false,\n   "lastPullTimestamp" : "0",\n'
    '   "locked" : false\n}\n,{\n   "brokerName" : "broker-b",\n   "queueId" : 3,\n'
    '   "topic" : "T"\n}:{\n   "cachedMsgCount" : 2,\n   "lastConsumeTimestamp" : "5",\n'
    '   "lastPullTimestamp" : "1795963051114",\n   "tryUnlockTimes" : 0\n}\n},'
    '"jstack":"","properties":{"PROP_CONSUMEORDERLY":"false"}}\n'
)


def test_the_client_report_is_read_queue_by_queue() -> None:
    assert parse(REPORT) == [
        HeldQueue(topic="%RETRY%G", broker="broker-a", queue_id=0, last_pull_ms=0),
        HeldQueue(topic="T", broker="broker-b", queue_id=3, last_pull_ms=1795963051114),
    ]
    assert parse('{"mqTable":},"jstack":""}') == []  # no queue held (librocketmq's own form)


def test_a_queue_is_stalled_once_its_last_pull_stays_the_same_for_stall_after() -> None:
    seen: dict[tuple[str, str, int], tuple[int, float]] = {}
    pulled = HeldQueue("T", "b", 0, last_pull_ms=100_000)
    never = HeldQueue("T", "b", 1, last_pull_ms=0)
    assert stalled([pulled, never], seen, now=1000.0, stall_after=60) == []
    assert seen == {("T", "b", 0): (100_000, 1000.0), ("T", "b", 1): (0, 1000.0)}
    assert stalled([pulled, never], seen, now=1060.0, stall_after=60) == []
    again = HeldQueue("T", "b", 0, last_pull_ms=160_000)  # pulled again meanwhile
    assert stalled([again, never], seen, now=1060.5, stall_after=60) == [never]
    assert stalled([again, never], seen, now=1120.6, stall_after=60) == [again, never]
    fresh = HeldQueue("T", "b", 0, last_pull_ms=200_000)
    assert stalled([fresh], seen, now=2000.0, stall_after=60) == []
    assert set(seen) == {("T", "b", 0)}  # a queue no longer held is forgotten


def test_an_idle_consumer_holds_its_queues_with_held_pulls(backend: Any, txmsg_broker: Any) -> None:
    """Every queue (the topic's and the retry queue) is listed, and an idle queue is pulled
    again only when the broker ends its hold (15 s), not as soon as the answer arrives, as a
    synchronous pull would (what that costs: ``python -m benchmarks.idle_consumer_cpu``)."""
    topic, group = unique("pw_topic"), unique("pw_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "MIXED")
    stop = backend.subscribe(topic, group, lambda m: True)
    try:
        consumer: PushConsumer = backend._consumers[group]
        assert consumer.watcher is not None
        assert not consumer.sync_pull

        def held() -> dict[tuple[str, int], int]:
            return {(q.topic, q.queue_id): q.last_pull_ms for q in consumer._held() or []}

        wait_until(lambda: len(held()) == 5, timeout=60)
        first = held()
        assert set(first) == {*((topic, i) for i in range(4)), (f"%RETRY%{group}", 0)}
        # a queue's first pull may be answered at once (seen: pulled again 84 ms later, on a
        # loaded machine); the steady state is what follows: every queue pulled again once
        wait_until(lambda: all(held()[k] != first[k] for k in first), timeout=60)
        before = held()
        # the next pull of a queue (an event: its last pull time changes) comes a hold later
        wait_until(lambda: any(held()[k] != before[k] for k in before), timeout=60)
        after = held()
        gaps = [after[k] - before[k] for k in before if after[k] != before[k]]
        assert min(gaps) >= 10_000, gaps
    finally:
        stop()


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_restarted_consumer_loses_nothing(backend: Any, txmsg_broker: Any, orderly: bool) -> None:
    """A watcher that finds every queue late restarts the consumer again and again while
    messages arrive; every message is still handled (at least once, RocketMQ's promise), also
    by an orderly consumer (whose queue locks the new consumer takes over)."""
    topic, group = unique("pwr_topic"), unique("pwr_group")
    create_topic(txmsg_broker.namesrv_addr, topic, "MIXED")
    seen: set[bytes] = set()
    lock = threading.Lock()

    def handle(message: Message) -> bool:
        with lock:
            seen.add(message.body)
        return True

    consumer = PushConsumer(
        backend.native,
        group=group,
        topic=topic,
        tags="*",
        handler=handle,
        name_server=txmsg_broker.namesrv_addr,
        instance_name=unique("pwr_inst"),
        concurrency=2,
        max_reconsume=16,
        orderly=orderly,
        stall_after=0.0,
        watch_every=0.5,
    )
    pool = backend.create_transactional_sender(
        unique("pwr_producer"), lambda m: S.COMMIT, check_concurrency=1
    )
    try:
        sent: list[bytes] = []
        for i in range(40):
            body = f"m{i}".encode()
            pool.send_in_transaction(OutgoingMessage(topic=topic, body=body), lambda m: S.COMMIT)
            sent.append(body)
            if i % 10 == 9:  # a new native consumer took over before the next ten
                starts = consumer.starts

                def restarted(n: int = starts) -> bool:
                    return consumer.starts > n

                wait_until(restarted, timeout=60)  # a new native consumer (its address may be
                # the old one's: freed, then reused by the allocator)
        assert consumer.watcher is not None
        consumer.watcher.stop()  # what was refused during a restart comes back from the broker
        wait_until(lambda: seen >= set(sent), timeout=120)
    finally:
        consumer.stop(timeout=20)
