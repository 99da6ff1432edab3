"""A FIFO consumer SIGKILLed while its callback runs loses nothing, without the in-flight journal.

``RocketMQ5Backend.capabilities.orderly_crash_safe`` is True: the FIFO consumer
(``txmsg_rocketmq5.fifo``) acks each message on its own after its handler, so a message whose
consumer died is not acked and the broker hands it again once the invisible time of its receive
runs out - and holds the rest of its FIFO queue until then.  txmsg therefore skips the in-flight
journal (``txmsg_orderly_inflight``) that the ``rocketmq`` backend needs (librocketmq hazard #10,
``tests/rocketmq/test_orderly_crash.py``).  These tests prove both halves on the embedded broker's
gRPC endpoint.

The consumer runs as a child process (``fifo_crash_child.py``; what the test shares with
``tests/rocketmq/test_orderly_crash.py`` is in ``tests/crash_kit.py``) on a one-queue FIFO topic
with an orderly group.  Its listener holds message ``k/1`` in its callback; the test SIGKILLs the process
there and starts a new one.  Every check reads the child's database: each message applied exactly
once, in the key's order, ``k/1`` on its second delivery attempt and not before the invisible time
ran out; and no row was ever written to the journal table (an SQLite trigger counts inserts).

The invisible time is a module constant of the backend (``receive.INVISIBLE_S``, 60 s; there is no
setting).  The children shorten it to ``INVISIBLE_S`` below, so a test takes ~20 s instead of
~70 s; the mechanism (the broker's invisible time, not anything of the client) is the same.

``CRASH_JOURNAL=1 pytest tests/rocketmq5/test_fifo_crash.py`` runs the consumers with the journal
(see ``fifo_crash_child.py``): the journal checks then fail, showing they can.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_kit import KEY, Child, CrashScene, key_sender
from sqlalchemy import create_engine, text
from txmsg_broker.testing import create_group, create_topic, unique, wait_until

from tests.clockwork import consumed, stored
from txmsg import SendResult, TxMsg
from txmsg.sqla import create_tables

#: real time is the point: the broker hands ``k/1`` again when the gRPC invisible time of the dead
#: consumer's receive runs out, wall time by design (also on a manual clock)
pytestmark = pytest.mark.wall_clock

CHILD = Path(__file__).with_name("fifo_crash_child.py")
INVISIBLE_S = int(os.environ.get("FIFO_CRASH_INVISIBLE_S", "10"))
"""The children's invisible time per receive (a RocketMQ 5 proxy's minimum; the backend's own: 60,
which ``FIFO_CRASH_INVISIBLE_S=60`` runs the tests with, ~70 s each)."""


class Scene(CrashScene[str]):
    """``send(seq)`` answers the message's id."""

    def applied_rows(self) -> list[tuple[str, int, int, float]]:
        """(key, seq, delivery attempt, time.time() applied) in the order they were applied."""
        query = "SELECT key, seq, attempt, applied_at FROM crash_applied ORDER BY id"
        rows = self.rows("crash_applied", query)
        return [(str(k), int(s), int(a), float(t)) for k, s, a, t in rows]

    def journal(self) -> tuple[int, int]:
        """(rows now in ``txmsg_orderly_inflight``, rows ever inserted into it)."""
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                now = conn.execute(text("SELECT count(*) FROM txmsg_orderly_inflight")).scalar_one()
                ever = conn.execute(text("SELECT n FROM crash_journal_inserts")).scalar_one()
                return int(now), int(ever)
        finally:
            engine.dispose()


def message_id_of(result: SendResult) -> str:
    assert result.message_id
    return str(result.message_id)


@pytest.fixture
def scene(
    txmsg_grpc_broker: Any, make_app: Callable[..., TxMsg], tmp_path: Path
) -> Iterator[Scene]:
    topic, group, producer_group = unique("F5Crash"), unique("F5CrashCG"), unique("F5CrashPG")
    create_topic(txmsg_grpc_broker.namesrv_addr, topic, queues=1, message_type="FIFO")
    create_group(txmsg_grpc_broker.namesrv_addr, group, orderly=True)  # the proxy pops it in order
    db_url = f"sqlite:///{tmp_path / 'consumer.db'}"
    engine = create_engine(db_url)
    create_tables(engine)  # the journal table exists (create_tables makes it on every backend) ...
    with engine.begin() as conn:  # ... and this counts every row ever written to it
        conn.execute(text("CREATE TABLE crash_journal_inserts (n INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO crash_journal_inserts (n) VALUES (0)"))
        conn.execute(
            text(
                "CREATE TRIGGER crash_count_journal AFTER INSERT ON txmsg_orderly_inflight "
                "BEGIN UPDATE crash_journal_inserts SET n = n + 1; END"
            )
        )
    engine.dispose()
    scene = Scene(
        txmsg_grpc_broker,
        topic,
        group,
        db_url,
        tmp_path,
        key_sender(make_app(), topic, producer_group, message_id_of),
        CHILD,
        {
            "CRASH_ENDPOINTS": txmsg_grpc_broker.grpc_endpoint,
            "CRASH_INVISIBLE_S": str(INVISIBLE_S),
        },
    )
    yield scene
    scene.stop_children()


def kill_in_flight(scene: Scene) -> tuple[Child, float]:
    """Send ``k/1``, let the first consumer hold it in its callback, SIGKILL that consumer and
    start a new one; the new consumer and the time ``k/1`` was handed to the dead one."""
    first, message_id, note = scene.hold_first()
    held = json.loads(note)
    assert (held["message_id"], held["attempt"]) == (message_id, 1)
    # the moment the rocketmq backend's journal would hold k/1: here nothing is in it
    assert scene.journal() == (0, 0)
    first.kill()
    killed_after = time.time() - float(held["at"])
    assert killed_after < INVISIBLE_S / 2, (
        f"killed {killed_after:.1f} s into the callback: too late"
    )
    assert scene.applied() == []
    print(f"{KEY}/1 killed {killed_after:.1f} s into its callback")
    return scene.start(), float(held["at"])


def assert_redelivered(scene: Scene, held_at: float) -> None:
    """``k/1`` was applied once, on its second delivery, after the invisible time ran out."""
    ((_, _, attempt, applied_at),) = [r for r in scene.applied_rows() if r[:2] == (KEY, 1)]
    assert attempt == 2, "k/1 not applied on the broker's second hand-out"
    # handed again only when the invisible time of the dead consumer's receive ran out (the
    # receive came a little before the callback started: hence the 1 s slack)
    assert applied_at - held_at >= INVISIBLE_S - 1, (
        f"redelivered after {applied_at - held_at:.1f} s"
    )
    print(f"{KEY}/1 applied {applied_at - held_at:.1f} s after the dead consumer got it")


def wait_all_acked(scene: Scene) -> None:
    """Wait until the group's progress on the queue (the first offset not yet acked: the pop
    path's consumer offset) reaches the queue's end: every message acked, none left for the
    broker to hand out again once an invisible time runs out.  What a 1 s sleep for "a late
    duplicate would show now" hoped for, as an event."""
    wait_until(
        lambda: (
            consumed(scene.broker.broker_addr, scene.group, scene.topic, queues=1)
            >= stored(scene.broker.broker_addr, scene.topic, queues=1)
        ),
        timeout=30,
        message="every message of the queue acked",
    )


def stop_and_check_journal(scene: Scene, child: Child) -> None:
    child.finish()
    assert scene.journal() == (0, 0), "the rocketmq5 backend wrote to the in-flight journal"


@pytest.mark.slow
def test_the_killed_message_is_handed_again_then_the_next_follows(scene: Scene) -> None:
    started = time.monotonic()
    second, held_at = kill_in_flight(scene)
    scene.wait_applied(1, second, timeout=INVISIBLE_S + 30)
    assert_redelivered(scene, held_at)
    wait_all_acked(scene)  # nothing the broker could hand again: no late duplicate
    assert scene.applied() == [(KEY, 1)], "k/1 applied twice"
    scene.send(2)
    scene.wait_applied(2, second, timeout=30)
    wait_all_acked(scene)
    assert scene.applied() == [(KEY, 1), (KEY, 2)], "applied out of order or twice"
    stop_and_check_journal(scene, second)
    assert scene.applied() == [(KEY, 1), (KEY, 2)]
    print(f"whole scenario: {time.monotonic() - started:.1f} s")


@pytest.mark.slow
def test_the_next_message_sent_meanwhile_waits_for_the_killed_one(scene: Scene) -> None:
    """``k/2`` sent while ``k/1`` is invisible: the FIFO queue hands out nothing before ``k/1``."""
    started = time.monotonic()
    second, held_at = kill_in_flight(scene)
    scene.send(2)
    scene.wait_applied(2, second, timeout=INVISIBLE_S + 30)
    wait_all_acked(scene)  # nothing the broker could hand again: no late duplicate
    assert scene.applied() == [(KEY, 1), (KEY, 2)], "k/1 lost, applied out of order or twice"
    assert_redelivered(scene, held_at)
    stop_and_check_journal(scene, second)
    print(f"whole scenario: {time.monotonic() - started:.1f} s")
