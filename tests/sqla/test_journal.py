"""The in-flight journal of orderly listeners (txmsg.sqla.journal): a consumer that died inside an
orderly callback (librocketmq 2.1.0 may already have committed the queue's offset past that
message, docs/librocketmq-hazards.md #10) loses nothing, and the key's order holds.

"A consumer that died" is a journal row whose owner is a process of this host that no longer
exists (a real exited child's pid), or whose lease ran out.  Runs on SQLite, and on PostgreSQL
when TXMSG_TEST_PG_URL is set."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update

from txmsg.consumer import ConsumerSpec, build_consumer_spec
from txmsg.message import SHARDING_KEY, UNIQ_KEY, Message
from txmsg.orderly import OrderlyHandler, orderly_handler
from txmsg.sqla import parked_messages, parking
from txmsg.sqla.journal import InflightJournal, host_identity
from txmsg.sqla.models import ConsumedMessage, OrderlyInflight, utcnow
from txmsg.sqla.spool import DIRECTORY_ENV, Spool, group_directory, read_entries

from .conftest import Db, make_db

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


def handler_for(spec: ConsumerSpec, *, refresh_interval: float = 0.0) -> OrderlyHandler:
    """The handler without its sweeper thread: these tests run the sweeper by hand.  Its
    snapshot of the keys with rows is read again before every message unless told otherwise
    (rows appear here between two messages of one queue, which a real queue does not do: see
    ``test_a_row_appearing_mid_stream_is_seen_within_the_refresh_interval``)."""
    assert spec.session_factory is not None
    return OrderlyHandler(
        spec,
        spec.session_factory,
        (),
        InflightJournal(spec.session_factory, GROUP),
        refresh_interval=refresh_interval,
    )


@pytest.fixture(autouse=True)
def spool_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's spools in its own directory (on PostgreSQL they would share one by URL)."""
    monkeypatch.setenv(DIRECTORY_ENV, str(tmp_path / "spools"))
    return tmp_path / "spools"


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


# ---- the spool: every message's record, in a file of this process --------------------------------
SPOOLING_CHILD = """
import os, signal, sys
import txmsg.sqla
from txmsg.message import Message, SHARDING_KEY, UNIQ_KEY
from txmsg.sqla.journal import InflightJournal

options = sys.argv[4]  # PostgreSQL: the test's schema (search_path), as the parent connects
engine = txmsg.sqla.create_engine(
    sys.argv[1], **({"connect_args": {"options": options}} if options else {})
)
journal = InflightJournal(txmsg.sqla.make_session_factory(engine), sys.argv[2])
journal.refresh()
for uid, offset in (("m0", 4), ("m1", 5)):
    message = Message(
        topic=sys.argv[3], body=uid.encode(), properties={UNIQ_KEY: uid, SHARDING_KEY: "order-1"},
        message_id="msgid-" + uid, sharding_key="order-1", queue_id=3, queue_offset=offset,
    )
    ticket = journal.admit(message).ticket
    assert ticket is not None and ticket.seq is not None and ticket.row_id is None
    if uid == "m0":
        journal.done(ticket)  # consumed: nothing to recover
print(journal.spool_directory, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # inside m1's callback
"""


def connect_options(db: Db) -> str:
    """What the child passes as libpq ``options`` to see the test's schema (``""`` on SQLite):
    each PostgreSQL test has its own schema, set through ``search_path`` and not the URL."""
    if db.name != "postgresql":
        return ""
    with db.engine.connect() as conn:
        return f"-csearch_path={conn.execute(text('SHOW search_path')).scalar()}"


def kill_inside_m1(db: Db) -> Path:
    """A real process that spools m0 (consumed) and m1, and is SIGKILLed inside m1's callback:
    nothing in the table, m1 only in its spool file.  Returns the spool directory."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            SPOOLING_CHILD,
            str(db.engine.url.render_as_string(False)),
            GROUP,
            TOPIC,
            connect_options(db),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    assert rows(db) == []
    directory = Path(child.stdout.strip())
    assert len(list(directory.glob("*.spool"))) == 1
    return directory


def test_a_killed_process_spool_is_finished_before_the_keys_next_message(db: Db) -> None:
    directory = kill_inside_m1(db)
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["m1", "m2"]  # m0 was consumed before the kill: not again
    assert rows(db) == []
    assert handle.journal is not None
    assert handle.journal._spool is not None
    own = handle.journal._spool.path  # this handler's live spool (its messages' first record)
    # the killed process's spool: moved into the table, then finished
    assert [path for path in directory.glob("*.spool") if path != own] == []


def test_a_killed_process_spool_is_finished_at_start_when_nothing_follows(db: Db) -> None:
    kill_inside_m1(db)
    listener = Recorder()
    spec = spec_for(db, listener)
    handle = orderly_handler(spec, journal=True)  # start() moves it into the table
    try:
        assert handle.journal is not None
        assert handle.journal.imported == 1
        deadline = utcnow() + timedelta(seconds=20)
        while listener.handled != ["m1"] and utcnow() < deadline:
            threading.Event().wait(0.1)
        assert listener.handled == ["m1"]
    finally:
        handle.close()
    assert rows(db) == []


KILLED_IN_REFRESH_CHILD = """
import os, signal, sys
import txmsg.sqla
from txmsg.consumer import build_consumer_spec
from txmsg.message import Message, SHARDING_KEY, UNIQ_KEY
from txmsg.orderly import OrderlyHandler
from txmsg.sqla.journal import InflightJournal

options = sys.argv[4]
engine = txmsg.sqla.create_engine(
    sys.argv[1], **({"connect_args": {"options": options}} if options else {})
)
sessions = txmsg.sqla.make_session_factory(engine)
spec = build_consumer_spec(
    lambda message: None, topic=sys.argv[3], group=sys.argv[2], orderly=True,
    session_factory=sessions,
)
journal = InflightJournal(sessions, sys.argv[2])
handle = OrderlyHandler(spec, sessions, (), journal, refresh_interval=0.0)

def killed(*args, **kwargs):  # the database read before the listener, where the kill lands
    print(journal.spool_directory, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

handle.parked.refresh = killed
handle(Message(
    topic=sys.argv[3], body=b"m1", properties={UNIQ_KEY: "m1", SHARDING_KEY: "order-1"},
    message_id="msgid-m1", sharding_key="order-1", queue_id=3, queue_offset=5,
))
"""


def test_a_kill_while_the_handler_reads_the_database_loses_nothing(db: Db) -> None:
    """The message is in the spool before anything reads the database (hazard #10: the offset
    may be past it already).  CI's outbox chaos run of 2026-11-29 lost two messages of one
    transfer when the journal's record came only after those reads."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_IN_REFRESH_CHILD,
            str(db.engine.url.render_as_string(False)),
            GROUP,
            TOPIC,
            connect_options(db),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    assert rows(db) == []
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["m1", "m2"]
    assert rows(db) == []


def test_a_message_handed_back_before_its_listener_leaves_no_spool_entry(db: Db) -> None:
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    OrderlyInflight.__table__.drop(db.engine)  # type: ignore[attr-defined]
    assert handle(msg("a", 0)) is False
    assert handle.journal is not None
    spool = handle.journal._spool
    assert spool is not None
    assert spool.open_entries() == 0


def test_a_live_process_spool_is_not_taken(db: Db) -> None:
    # another live consumer of the group on this host, inside m1's callback
    other = InflightJournal(db.sessions, GROUP)
    other.refresh()
    ticket = other.admit(msg("m1", 5)).ticket
    assert ticket is not None
    assert ticket.seq is not None
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("x1", 6, key="order-2")) is True
    assert handle.journal is not None
    assert handle.journal.imported == 0  # its lock is held
    assert listener.handled == ["x1"]
    other.done(ticket)
    other.close()
    assert list(other.spool_directory.glob("*.spool")) == [handle.journal._spool.path]  # type: ignore[union-attr]


def test_a_queue_that_comes_while_another_live_process_runs_its_key_waits(db: Db) -> None:
    """librocketmq 2.1.0 hands a queue to another consumer in a rebalance without waiting for
    the callback running on it, with the offset possibly past that message (hazard #10).  The
    new owner gets the key's next message while the old owner's callback (in its spool only)
    still runs: it must hand it back until that callback ended, not apply it first."""
    other = InflightJournal(db.sessions, GROUP)  # the queue's previous owner, inside m1
    other.refresh()
    ticket = other.admit(msg("m1", 5)).ticket
    assert ticket is not None
    listener = Recorder()
    handle = handler_for(spec_for(db, listener), refresh_interval=60.0)
    assert handle(msg("m2", 6)) is False  # the queue just came: m1 of order-1 still runs
    assert handle(msg("x1", 2, key="order-2", queue=1)) is True  # other keys flow
    assert handle(msg("m2", 6)) is False  # looked at again while the key is held
    assert listener.handled == ["x1"]
    other.done(ticket)
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["x1", "m2"]
    assert handle(msg("m3", 7)) is True  # not held any more: no look at the spools
    other.close()
    handle.close()


def test_a_queue_seen_before_does_not_look_at_other_spools(db: Db) -> None:
    """The look is for a queue that just came: a queue this process holds does not pay it."""
    listener = Recorder()
    handle = handler_for(spec_for(db, listener), refresh_interval=60.0)
    assert handle(msg("m1", 5)) is True  # the queue comes (nothing held elsewhere)
    other = InflightJournal(db.sessions, GROUP)  # a second live process: a different key
    other.refresh()
    ticket = other.admit(msg("y1", 9, key="order-1", queue=2)).ticket
    assert ticket is not None
    assert handle(msg("m2", 6)) is True  # same queue, seen a moment ago: no look
    assert listener.handled == ["m1", "m2"]
    other.done(ticket)
    other.close()
    handle.close()


def test_a_torn_last_record_is_skipped(tmp_path: Path) -> None:
    # what a machine crash can leave: the tail of the file missing, or half a line
    spool = Spool(tmp_path, "host:1:token")
    first = spool.begin(msg("a", 0))
    spool.begin(msg("b", 1))
    spool.end(first)
    spool.begin(msg("c", 2))
    assert spool.path is not None
    data = spool.path.read_bytes()
    owner, messages = read_entries(data[:-7])  # c's record cut short
    assert owner == "host:1:token"
    assert [m.properties[UNIQ_KEY] for m in messages] == ["b"]
    assert messages[0] == msg("b", 1)
    spool.close()
    assert spool.path.exists()  # b and c are open: left for the host's next consumer


def test_a_long_running_listener_gets_a_row_and_loses_it_when_done(db: Db) -> None:
    seen_rows: list[list[tuple[str, str]]] = []
    handle: OrderlyHandler

    def listener(message: Message) -> None:
        assert handle.journal is not None
        handle.journal.promote(everything=True)  # what the journal's thread does after 0.5 s
        seen_rows.append(rows(db))

    handle = handler_for(spec_for(db, listener))
    assert handle(msg("a", 0)) is True
    assert handle.journal is not None
    assert seen_rows == [[("a", handle.journal.owner)]]  # another host could finish it now
    assert rows(db) == []


def test_an_idempotent_long_running_listener_deletes_its_row_with_its_effects(
    db: Db, tmp_path: Path
) -> None:
    with contextlib.closing(_short_busy_timeout(db, tmp_path)) as dbs:
        _idempotent_long_running_listener(next(dbs))


def _short_busy_timeout(db: Db, tmp_path: Path) -> Generator[Db, None, None]:
    """``db``, or on SQLite a fresh database whose writers wait 0.5 s for the write lock.  SQLite
    has one write lock and the idempotent listener's own transaction holds it: promote() (its own
    connection) waits the busy timeout and fails, writing nothing, once per attempt - 2 x the
    default 30 s made this test take 60 s; 0.5 s takes the same path."""
    if db.name == "sqlite":
        yield from make_db("sqlite", tmp_path / "short-busy", sqlite_busy_timeout_ms=500)
    else:
        yield db


def _idempotent_long_running_listener(db: Db) -> None:
    handle: OrderlyHandler

    def apply(message: Message, session: Any) -> None:
        assert handle.journal is not None
        handle.journal.promote(everything=True)

    handle = handler_for(spec_for(db, apply, idempotent=True))
    assert handle(msg("a", 0)) is True
    assert rows(db) == []


def test_a_row_appearing_mid_stream_is_seen_within_the_refresh_interval(
    db: Db, dead_pid: int
) -> None:
    # The snapshot of keys with rows is trusted for refresh_interval seconds on a queue this
    # process keeps consuming (no other consumer can have had that queue meanwhile); a queue
    # that comes to the process (not seen for that long) reads it again first.
    listener = Recorder()
    handle = handler_for(spec_for(db, listener), refresh_interval=3600.0)
    assert handle(msg("a", 0, queue=3)) is True
    leave_row(db, msg("m1", 5, queue=4), owner=f"{host_identity()}:{dead_pid}:gone")
    assert handle(msg("m2", 6, queue=4)) is True  # queue 4 is new here: read again, m1 first
    assert listener.handled == ["a", "m1", "m2"]
    assert rows(db) == []


def test_a_key_parked_elsewhere_is_seen_when_its_queue_comes_here(db: Db) -> None:
    listener = Recorder()
    handle = handler_for(spec_for(db, listener), refresh_interval=3600.0)
    assert handle(msg("a", 0, queue=3)) is True
    # the consumer that had queue 4 parked order-1 there, then the queue moved to us
    parking.park(db.sessions, GROUP, msg("p1", 4, queue=4), error="boom", attempts=2)
    assert handle(msg("m2", 5, queue=4)) is True
    assert listener.handled == ["a"]
    assert [p.message_key for p in parked_messages(db.sessions, GROUP, "order-1")] == [
        "p1",
        "m2",
    ]


def test_a_key_released_elsewhere_is_handled_here(db: Db) -> None:
    listener = Recorder(poison=frozenset({"p1"}))
    handle = handler_for(spec_for(db, listener), refresh_interval=3600.0)
    assert handle(msg("p1", 0)) is True  # parked: the cache knows at once
    assert "order-1" in handle.parked
    listener.poison = frozenset()
    report = parking.replay(spec_for(db, listener), db.sessions, GROUP, key="order-1")
    assert report.ok
    assert handle(msg("m2", 1)) is True  # the stale "parked" is corrected by park_behind
    assert listener.handled == ["p1", "m2"]
    assert "order-1" not in handle.parked


def test_a_spool_of_another_host_is_not_read(db: Db, spool_directory: Path) -> None:
    # The boundary of the spool: it is read on the host that wrote it.  A consumer that died
    # less than promote_after into m1's callback on a host that never runs the group again
    # leaves m1 in a file nobody here reads (docs/guide/ordered.md, "What the journal protects
    # against"); the key's next message goes on without it.
    elsewhere = Spool(group_directory(spool_directory, "other-host#1", GROUP), "other-host#1:7:x")
    elsewhere.begin(msg("m1", 5))
    elsewhere.close()  # its lock goes, as with a dead process; m1 stays open in the file
    listener = Recorder()
    handle = handler_for(spec_for(db, listener))
    assert handle(msg("m2", 6)) is True
    assert listener.handled == ["m2"]
    assert handle.journal is not None
    assert handle.journal.imported == 0
    assert elsewhere.path is not None
    assert elsewhere.path.exists()
