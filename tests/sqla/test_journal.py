"""The in-flight journal of orderly listeners (txmsg.sqla.journal): a consumer that died inside an
orderly callback (librocketmq 2.1.0 may already have committed the queue's offset past that
message, docs/librocketmq-hazards.md #10) loses nothing, and the key's order holds.

"A consumer that died" is a journal row whose owner is a process of this host that no longer
exists (a real exited child's pid), or whose lease ran out.  Runs on SQLite, and on PostgreSQL
when TXMSG_TEST_PG_URL is set."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from txmsg.consumer import ConsumerSpec, build_consumer_spec
from txmsg.message import SHARDING_KEY, UNIQ_KEY, Message
from txmsg.orderly import OrderlyHandler, orderly_handler
from txmsg.sqla import parked_messages
from txmsg.sqla.journal import InflightJournal, host_identity
from txmsg.sqla.models import ConsumedMessage, OrderlyInflight, utcnow

from .conftest import Db

GROUP = "journal-consumer"
TOPIC = "journal-topic"


def msg(uid: str, offset: int, key: str = "order-1", queue: int = 3) -> Message:
    return Message(
        topic=TOPIC,
        body=uid.encode(),
        tags="t",
        keys=f"k-{uid}",
        properties={UNIQ_KEY: uid, SHARDING_KEY: key},
        message_id=f"msgid-{uid}",
        sharding_key=key,
        queue_id=queue,
        queue_offset=offset,
    )


class Recorder:
    """An orderly listener that records the uids it handled; ``poison`` ones always fail."""

    def __init__(self, poison: frozenset[str] = frozenset()) -> None:
        self.handled: list[str] = []
        self.poison = poison
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        uid = message.properties[UNIQ_KEY]
        if uid in self.poison:
            raise RuntimeError(f"poison {uid}")
        with self.lock:
            self.handled.append(uid)


def spec_for(db: Db, fn: Any, *, idempotent: bool = False) -> ConsumerSpec:
    return build_consumer_spec(
        fn,
        topic=TOPIC,
        group=GROUP,
        orderly=True,
        max_orderly_retries=2,
        orderly_retry_delay=0.0,
        idempotent=idempotent,
        session_factory=db.sessions,
    )


def handler_for(spec: ConsumerSpec) -> OrderlyHandler:
    """The handler without its sweeper thread: these tests run the sweeper by hand."""
    assert spec.session_factory is not None
    return OrderlyHandler(
        spec, spec.session_factory, (), InflightJournal(spec.session_factory, GROUP)
    )


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def leave_row(db: Db, message: Message, owner: str, lease: float = 30.0) -> None:
    """What a consumer killed inside the callback of ``message`` leaves behind."""
    journal = InflightJournal(db.sessions, GROUP, lease=lease)
    journal.owner = owner
    entry = journal.enter(message)
    assert entry.row_id is not None


def rows(db: Db) -> list[tuple[str, str]]:
    with db.sessions() as session:
        return [
            (r.message_key, r.owner)
            for r in session.scalars(select(OrderlyInflight).order_by(OrderlyInflight.id))
        ]


def test_a_consumed_message_leaves_no_row(db: Db) -> None:
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("a", 0)) is True
    assert handle(msg("b", 1)) is True
    assert listener.handled == ["a", "b"]
    assert rows(db) == []


def test_dead_consumers_message_is_handled_before_the_keys_next_one(
    db: Db, dead_pid: int, caplog: pytest.LogCaptureFixture
) -> None:
    # the killed consumer was inside "m1"; the broker's offset already points past it
    leave_row(db, msg("m1", 5), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["m1", "m2"]
    assert rows(db) == []
    said = [r.getMessage() for r in caplog.records if r.name == "txmsg.journal"]
    assert len(said) == 1
    assert f":{dead_pid}:gone (gone), before the key's next message;" in said[0]


def test_other_keys_do_not_wait_for_a_leftover(db: Db, dead_pid: int) -> None:
    leave_row(db, msg("m1", 5), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("x1", 6, key="order-2")) is True
    assert listener.handled == ["x1"]
    assert [key for key, _ in rows(db)] == ["m1"]


def test_a_live_consumers_message_makes_the_key_wait(db: Db) -> None:
    # another host's consumer still renews its lease: its message is being handled
    leave_row(db, msg("m1", 5), owner="elsewhere:4242:alive")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is False  # the queue is suspended and m2 handed again later
    assert listener.handled == []
    # the same message handed again is not written twice
    assert handle(msg("m2", 6)) is False
    assert sorted(key for key, _ in rows(db)) == ["m1", "m2"]

    # the lease runs out (the other consumer died without a trace on this host)
    with db.sessions() as session, session.begin():
        session.execute(
            update(OrderlyInflight)
            .where(OrderlyInflight.message_key == "m1")
            .values(lease_until=utcnow() - timedelta(seconds=1))
        )
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["m1", "m2"]
    assert rows(db) == []


def test_a_redelivered_message_reuses_the_dead_consumers_row(db: Db, dead_pid: int) -> None:
    # killed inside "m1" before the offset moved: the broker hands m1 itself again
    leave_row(db, msg("m1", 5), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m1", 5)) is True
    assert listener.handled == ["m1"]
    assert rows(db) == []


def test_a_row_later_in_the_queue_is_left_to_its_redelivery(db: Db, dead_pid: int) -> None:
    # killed inside m3 while the broker's offset still pointed at m2 (persisted late)
    leave_row(db, msg("m3", 7), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["m2"]
    assert handle(msg("m3", 7)) is True
    assert listener.handled == ["m2", "m3"]


def test_a_leftover_on_the_keys_old_queue_comes_first(db: Db, dead_pid: int) -> None:
    # the topic got more queues while the consumer was dead: the key now hashes to queue 5
    leave_row(db, msg("m1", 5, queue=3), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 0, queue=5)) is True
    assert listener.handled == ["m1", "m2"]
    assert rows(db) == []


def test_a_newer_row_on_another_queue_is_not_taken_for_an_earlier_one(
    db: Db, dead_pid: int
) -> None:
    # m1's row is older (a redelivery reuses it): a dead consumer's m5 on another queue comes later
    leave_row(db, msg("m1", 5, queue=3), owner=f"{host_identity()}:{dead_pid}:a")
    leave_row(db, msg("m5", 0, queue=5), owner=f"{host_identity()}:{dead_pid}:b")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m1", 5, queue=3)) is True
    assert listener.handled == ["m1"]
    assert [key for key, _ in rows(db)] == ["m5"]


def test_the_sweeper_finishes_a_leftover_nobody_asks_for(db: Db, dead_pid: int) -> None:
    # the key's last message was the one in flight: no later message will bring it up
    leave_row(db, msg("m1", 5), owner=f"{host_identity()}:{dead_pid}:gone")
    leave_row(db, msg("m2", 6), owner=f"{host_identity()}:{dead_pid}:gone")
    leave_row(db, msg("y1", 9, key="order-2"), owner="elsewhere:1:alive")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle.journal is not None
    assert handle.journal.sweep(handle._handle) == 2
    assert listener.handled == ["m1", "m2"]
    assert [key for key, _ in rows(db)] == ["y1"]  # its owner lives
    assert handle.journal.recovered == 2


def test_the_sweeper_thread_runs_on_its_own(db: Db, dead_pid: int) -> None:
    leave_row(db, msg("m1", 5), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    spec = spec_for(db, listener)
    handle = orderly_handler(spec, journal=True)
    try:
        deadline = utcnow() + timedelta(seconds=20)
        while listener.handled != ["m1"] and utcnow() < deadline:
            threading.Event().wait(0.1)
        assert listener.handled == ["m1"]
    finally:
        handle.close()
    assert rows(db) == []


def test_a_poisoned_leftover_is_parked_and_its_row_goes(db: Db, dead_pid: int) -> None:
    leave_row(db, msg("p1", 5), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder(poison=frozenset({"p1"}))
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is True  # parked behind p1, in order
    assert [p.message_key for p in parked_messages(db.sessions, GROUP, "order-1")] == [
        "p1",
        "m2",
    ]
    assert rows(db) == []


def test_idempotent_listener_drops_the_row_with_its_effects(db: Db, dead_pid: int) -> None:
    seen: list[str] = []

    def apply(message: Message, session: Any) -> None:
        seen.append(message.properties[UNIQ_KEY])

    spec = spec_for(db, apply, idempotent=True)
    handle = handler_for(spec)
    assert handle(msg("a", 0)) is True
    # a dead consumer's row of a message that WAS applied (killed after the commit of another
    # process's... duplicate): it is absorbed, not applied twice, and the row goes
    leave_row(db, msg("a", 0), owner=f"{host_identity()}:{dead_pid}:gone")
    assert handle(msg("b", 1)) is True
    assert seen == ["a", "b"]
    with db.sessions() as session:
        consumed = session.scalars(select(ConsumedMessage.message_key)).all()
    assert sorted(consumed) == ["a", "b"]
    assert rows(db) == []


def test_listener_failure_keeps_no_half_state(db: Db) -> None:
    class Flaky:
        calls = 0

        def __call__(self, message: Message, session: Any) -> None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("once")

    spec = spec_for(db, Flaky(), idempotent=True)
    handle = handler_for(spec)
    assert handle(msg("a", 0)) is True  # retried in place, applied on the second attempt
    assert rows(db) == []


def test_database_down_hands_the_message_again(db: Db) -> None:
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    OrderlyInflight.__table__.drop(db.engine)  # type: ignore[attr-defined]
    assert handle(msg("a", 0)) is False
    assert listener.handled == []


def test_a_message_handed_back_stays_ours_until_its_lease_runs_out(db: Db) -> None:
    class Stop(BaseException):
        """Not the message's fault (like KeyboardInterrupt): the handler answers False."""

    calls: list[str] = []

    def listener(message: Message) -> None:
        calls.append(message.properties[UNIQ_KEY])
        if len(calls) == 1:
            raise Stop

    handle = handler_for(spec_for(db, listener))
    assert handle.journal is not None
    assert handle(msg("a", 0)) is False
    assert [key for key, _ in rows(db)] == ["a"]
    # the queue hands it to this consumer again in a moment: the sweeper must not race it
    assert handle.journal.sweep(handle._handle) == 0
    assert handle(msg("a", 0)) is True
    assert calls == ["a", "a"]
    assert rows(db) == []

    # handed back, then the queue moved elsewhere: once the lease ran out the sweeper finishes it
    calls.clear()
    assert handle(msg("b", 1)) is False
    with db.sessions() as session, session.begin():
        session.execute(update(OrderlyInflight).values(lease_until=utcnow() - timedelta(seconds=1)))
    assert handle.journal.sweep(handle._handle) == 1
    assert calls == ["b", "b"]
    assert rows(db) == []


def test_a_process_in_another_pid_namespace_is_not_taken_for_dead(db: Db, dead_pid: int) -> None:
    # same host name, other pid namespace (a container on the host's network): its pids are not
    # ours to check, so only its lease can say it is gone
    leave_row(db, msg("m1", 5), owner=f"{host_identity()}0:{dead_pid}:other-namespace")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is False
    assert listener.handled == []


def test_the_sweeper_keeps_a_key_behind_its_live_earlier_row(db: Db, dead_pid: int) -> None:
    # m1 is being finished by a live consumer elsewhere; m2's consumer died: m2 must wait
    leave_row(db, msg("m1", 5), owner="elsewhere:1:alive")
    leave_row(db, msg("m2", 6), owner=f"{host_identity()}:{dead_pid}:gone")
    leave_row(db, msg("z1", 9, key="order-9"), owner=f"{host_identity()}:{dead_pid}:gone")
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle.journal is not None
    assert handle.journal.sweep(handle._handle) == 1
    assert listener.handled == ["z1"]
    assert [key for key, _ in rows(db)] == ["m1", "m2"]
