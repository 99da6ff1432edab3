"""An orderly consumer SIGKILLed while its callback runs loses nothing (librocketmq hazard #10).

librocketmq 2.1.0's orderly push consumer commits a queue's consume offset past a message whose
callback is still running (docs/librocketmq-hazards.md, item 10).  Killed in that window, the
process takes the message with it: the queue's next owner starts after it.  txmsg's in-flight
journal (docs/guide/ordered.md) keeps the message in the listener's database until it is consumed,
and a later consumer of the group finishes it.

The consumer runs as a child process (``orderly_crash_child.py``; what the test shares with
``tests/rocketmq5/test_fifo_crash.py`` is in ``tests/crash_kit.py``) on a one-queue topic.  Its
listener holds message ``k/1`` in its callback; the test waits until the broker's committed
offset of the group is past that message (the hazard's window, asserted), SIGKILLs the process and
starts a new one.  Every check reads the child's database: each message applied exactly once, in
the key's order.

``CRASH_NO_JOURNAL=1 pytest tests/rocketmq/test_orderly_crash.py`` runs the consumers without the
journal (see ``orderly_crash_child.py``): the window is hit the same way and both tests fail, ``k/1``
never applied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_kit import KEY, Child, CrashScene, key_sender
from rmq_helpers import unique, wait_until
from txmsg_broker import fastjson
from txmsg_broker.codec import (
    GET_BROKER_CLUSTER_INFO,
    GET_CONSUMER_LIST_BY_GROUP,
    QUERY_CONSUMER_OFFSET,
    SUCCESS,
    UNLOCK_BATCH_MQ,
)
from txmsg_broker.rawclient import call
from txmsg_broker.testing import create_group, create_topic

from txmsg import SendResult, TxMsg

CHILD = Path(__file__).with_name("orderly_crash_child.py")


class Scene(CrashScene[int]):
    """``send(seq)`` answers the message's queue offset."""

    def committed(self) -> int:
        """The group's consume offset of queue 0 as the broker holds it (-1: none)."""
        response = call(
            self.broker.broker_addr,
            QUERY_CONSUMER_OFFSET,
            {"consumerGroup": self.group, "topic": self.topic, "queueId": 0},
        )
        return int(response.ext_fields.get("offset", "-1")) if response.code == SUCCESS else -1

    def consumers(self) -> list[str]:
        """The client ids of the group's live consumers, as the broker sees them."""
        response = call(
            self.broker.broker_addr, GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group}
        )
        if response.code != SUCCESS:
            return []
        return [str(c) for c in fastjson.loads(response.body)["consumerIdList"]]

    def unlock_queue_of(self, client_id: str) -> None:
        """Free queue 0's orderly lock held by ``client_id``: what the broker does on its own
        60 s after the holder's last renewal (``rebalanceLockMaxLiveTime``, as Java's)."""
        info = fastjson.loads(call(self.broker.namesrv_addr, GET_BROKER_CLUSTER_INFO).body)
        (broker_name,) = info["brokerAddrTable"]
        body = {
            "consumerGroup": self.group,
            "clientId": client_id,
            "mqSet": [{"topic": self.topic, "brokerName": broker_name, "queueId": 0}],
        }
        response = call(self.broker.broker_addr, UNLOCK_BATCH_MQ, {}, json.dumps(body).encode())
        assert response.code == SUCCESS, response.remark

    def in_flight(self) -> int:
        """Rows left in the in-flight journal (docs/guide/ordered.md)."""
        rows = self.rows("txmsg_orderly_inflight", "SELECT count(*) FROM txmsg_orderly_inflight")
        return int(rows[0][0]) if rows else 0


def offset_of(result: SendResult) -> int:
    assert result.offset is not None
    return result.offset


@pytest.fixture
def scene(txmsg_broker: Any, make_app: Callable[..., TxMsg], tmp_path: Path) -> Iterator[Scene]:
    topic, group, producer_group = unique("crash_t"), unique("crash_cg"), unique("crash_pg")
    create_topic(txmsg_broker.namesrv_addr, topic, queues=1)
    create_group(txmsg_broker.namesrv_addr, group, orderly=True)
    scene = Scene(
        txmsg_broker,
        topic,
        group,
        f"sqlite:///{tmp_path / 'consumer.db'}",
        tmp_path,
        key_sender(make_app(), topic, producer_group, offset_of),
        CHILD,
        {
            "CRASH_NAMESRV": txmsg_broker.namesrv_addr,
            "CRASH_LOG_DIR": str(tmp_path / "client-logs"),
        },
    )
    yield scene
    scene.stop_children()


def kill_in_flight(scene: Scene) -> tuple[Child, int]:
    """Send ``k/1``, let the first consumer hold it in its callback until the broker's offset is
    past it (hazard #10's window, asserted), SIGKILL that consumer and start a new one: the new
    consumer and ``k/1``'s queue offset."""
    first, offset, note = scene.hold_first()
    assert int(note) == offset
    held_at = time.monotonic()
    wait_until(
        lambda: scene.committed() > offset,
        timeout=40,
        message=lambda: (
            f"the broker's offset to pass {KEY}/1 (offset {offset}) while its callback runs: "
            f"librocketmq hazard #10 did not reproduce (offset {scene.committed()})"
        ),
    )
    (dead,) = scene.consumers()
    print(
        f"hazard window: offset {scene.committed()} committed past {KEY}/1 (offset {offset}) "
        f"{time.monotonic() - held_at:.1f} s into its callback"
    )
    first.kill()
    assert scene.applied() == []
    # The dead client's queue lock would keep the queue from the new consumer for up to 60 s;
    # the test frees it at once (the journal's recovery does not depend on that wait).
    scene.unlock_queue_of(dead)
    return scene.start(), offset


def wait_all_consumed(scene: Scene, last: int) -> None:
    """Wait until the broker holds the group's offset past ``last``, the queue's last message:
    the new consumer took and acknowledged everything, the broker has nothing to hand out again
    (what a 1 s sleep for "a late duplicate would show now" hoped for, as an event)."""
    wait_until(
        lambda: scene.committed() > last,
        timeout=30,
        message=lambda: f"the group's offset past {last} (now {scene.committed()})",
    )


def test_the_next_message_of_the_key_comes_after_the_lost_one(scene: Scene) -> None:
    second, _ = kill_in_flight(scene)
    killed = time.monotonic()
    last = scene.send(2)
    scene.wait_applied(2, second, timeout=45)
    print(f"{KEY}/2 applied {time.monotonic() - killed:.1f} s after the kill")
    wait_all_consumed(scene, last)
    assert scene.applied() == [(KEY, 1), (KEY, 2)], "k/1 lost, applied out of order or twice"
    second.finish()
    assert scene.applied() == [(KEY, 1), (KEY, 2)]
    assert scene.in_flight() == 0


def test_the_lost_message_is_applied_when_nothing_follows_it(scene: Scene) -> None:
    second, last = kill_in_flight(scene)
    killed = time.monotonic()
    scene.wait_applied(1, second, timeout=30)
    print(f"applied {time.monotonic() - killed:.1f} s after the kill")
    wait_all_consumed(scene, last)
    assert scene.applied() == [(KEY, 1)], "k/1 applied twice"
    second.finish()
    assert scene.applied() == [(KEY, 1)]
    assert scene.in_flight() == 0
