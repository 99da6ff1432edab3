"""``RocketMQBackend.subscribe(..., orderly=True)`` with the real librocketmq 2.1.0 orderly push
consumer against the embedded broker (queue locks through LOCK_BATCH_MQ): per-queue order with
several threads, and a handler answering False suspends only its queue and gets the same
message again."""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from rmq_helpers import create_topic, unique, wait_until
from txmsg_rocketmq.backend import RocketMQBackend
from txmsg_rocketmq.sender import queue_index

from txmsg.message import Message, OutgoingMessage

QUEUES = 4


class Recorder:
    """Every hand-over: (key, seq, queue, offset, thread, start, end, message id, reconsume)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []
        self.busy: dict[int | None, int] = defaultdict(int)
        self.overlap_in_a_queue = False

    def begin(self, message: Message) -> dict[str, Any]:
        key, seq = message.body.decode().split("/")
        call = {
            "key": key,
            "seq": int(seq),
            "queue": message.queue_id,
            "offset": message.queue_offset,
            "sharding_key": message.sharding_key,
            "thread": threading.get_ident(),
            "start": time.monotonic(),
            "id": message.message_id,
            "reconsume": message.reconsume_times,
        }
        with self.lock:
            self.busy[message.queue_id] += 1
            if self.busy[message.queue_id] > 1:
                self.overlap_in_a_queue = True
        return call

    def end(self, call: dict[str, Any], ok: bool) -> None:
        call["end"] = time.monotonic()
        call["ok"] = ok
        with self.lock:
            self.busy[call["queue"]] -= 1
            self.calls.append(call)

    def successes(self) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.calls if c["ok"]]


def _send(backend: RocketMQBackend, topic: str, key: str, seqs: range) -> None:
    sender = backend.create_sender(unique("ord_pg"))
    for n in seqs:
        sender.send(OutgoingMessage(topic=topic, body=f"{key}/{n}".encode(), sharding_key=key))


def test_each_key_is_consumed_in_order_while_threads_serve_other_queues(
    backend: RocketMQBackend, txmsg_broker: Any
) -> None:
    topic = unique("ord_topic")
    create_topic(txmsg_broker.namesrv_addr, topic)
    keys = [f"order-{i}" for i in range(8)]
    assert len({queue_index(k, QUEUES) for k in keys}) >= 3
    sender = backend.create_sender(unique("ord_pg"))
    for n in range(25):  # interleaved, as live traffic would be
        for key in keys:
            sender.send(OutgoingMessage(topic=topic, body=f"{key}/{n}".encode(), sharding_key=key))
    rec = Recorder()

    def handle(message: Message) -> bool:
        call = rec.begin(message)
        time.sleep(0.003)
        rec.end(call, True)
        return True

    backend.subscribe(topic, unique("ord_cg"), handle, concurrency=4, orderly=True)
    wait_until(lambda: len(rec.successes()) >= 200, timeout=60)
    calls = rec.successes()
    assert len(calls) == 200  # each message exactly once
    for key in keys:
        mine = [c for c in calls if c["key"] == key]
        assert [c["seq"] for c in mine] == list(range(25))
        assert {c["queue"] for c in mine} == {queue_index(key, QUEUES)}
        assert {c["sharding_key"] for c in mine} == {key}
    per_queue: dict[int, list[int]] = defaultdict(list)
    for c in calls:
        per_queue[c["queue"]].append(c["offset"])
    assert all(offsets == sorted(offsets) for offsets in per_queue.values())
    assert not rec.overlap_in_a_queue  # one message at a time per queue
    assert len({c["thread"] for c in calls}) > 1  # other queues on other threads


@pytest.mark.wall_clock  # librocketmq's own ~1 s suspension of the queue is what it measures
def test_false_suspends_only_its_queue_and_hands_the_same_message_again(
    backend: RocketMQBackend, txmsg_broker: Any
) -> None:
    topic = unique("ord_topic")
    create_topic(txmsg_broker.namesrv_addr, topic)
    poison = "refund-1"
    other = next(
        k
        for k in (f"refund-{i}" for i in range(2, 100))
        if queue_index(k, QUEUES) != queue_index(poison, QUEUES)
    )
    rec = Recorder()
    failures = {"left": 2}

    def handle(message: Message) -> bool:
        call = rec.begin(message)
        ok = True
        if message.body == f"{poison}/0".encode() and failures["left"] > 0:
            failures["left"] -= 1
            ok = False
        rec.end(call, ok)
        return ok

    backend.subscribe(topic, unique("ord_cg"), handle, concurrency=2, orderly=True)
    # rebalanced and locked (an event, not a 1 s sleep): a probe in the poisoned queue and one in
    # the other queue are consumed, so the sends below arrive at a client consuming both queues
    probes = {
        next(
            k
            for k in (f"probe-{i}" for i in range(100))
            if queue_index(k, QUEUES) == queue_index(key, QUEUES)
        )
        for key in (poison, other)
    }
    for probe in probes:
        _send(backend, topic, probe, range(1))
    wait_until(lambda: {c["key"] for c in rec.successes()} >= probes, timeout=30)
    _send(backend, topic, poison, range(1))
    wait_until(lambda: any(c["key"] == poison for c in rec.calls), timeout=30)
    # New messages for the suspended queue make librocketmq 2.1.0 resubmit it at once; the
    # backend must keep the suspension anyway (see PushConsumer._orderly).
    _send(backend, topic, poison, range(1, 2))
    _send(backend, topic, other, range(10))
    wait_until(lambda: len(rec.successes()) == 12 + len(probes), timeout=60)
    with rec.lock:
        calls = list(rec.calls)
    first = [c for c in calls if c["key"] == poison and c["seq"] == 0]
    assert [c["ok"] for c in first] == [False, False, True]
    assert len({c["id"] for c in first}) == 1  # the same message, handed again
    reconsume = [c["reconsume"] for c in first]  # counted by the client, locally
    assert reconsume[0] == 0
    assert reconsume == sorted(set(reconsume))
    assert all(b["start"] - a["end"] >= 0.9 for a, b in itertools.pairwise(first))  # suspended ~1 s
    second = next(c for c in calls if c["key"] == poison and c["seq"] == 1)
    assert second["start"] >= first[-1]["end"]  # nothing behind it in its queue overtook it
    others = [c for c in calls if c["key"] == other]
    assert [c["seq"] for c in others] == list(range(10))
    # the other queue kept flowing while the poisoned one waited
    assert max(c["end"] for c in others) < first[-1]["start"]
