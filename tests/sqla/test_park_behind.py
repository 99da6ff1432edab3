"""Messages of a parked key with the in-flight journal (txmsg.orderly._ParkBehind): acknowledged
once the journal's spool holds them, written into the parking table in batches by one thread.

What must hold: the key's order in the table, nothing lost when the process is SIGKILLed before
the batch is written (the spool has them; the group's next consumer parks them), and messages
that wait while a replay releases the key go to the listener, in order, before later ones.  Runs
on SQLite, and on PostgreSQL when TXMSG_TEST_PG_URL is set."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from txmsg.message import UNIQ_KEY
from txmsg.orderly import OrderlyHandler, orderly_handler
from txmsg.sqla import parked_keys, parked_messages, parking
from txmsg.sqla.journal import InflightJournal
from txmsg.sqla.models import utcnow
from txmsg.sqla.spool import DIRECTORY_ENV, read_entries

from .conftest import Db
from .test_journal import GROUP, TOPIC, Recorder, msg, rows, spec_for


@pytest.fixture(autouse=True)
def spool_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(DIRECTORY_ENV, str(tmp_path / "spools"))
    return tmp_path / "spools"


def batched(db: Db, listener: Recorder, *, linger: float = 60.0) -> OrderlyHandler:
    """A journaled handler whose batches wait ``linger`` s (or :meth:`close`) to be written."""
    spec = spec_for(db, listener)
    assert spec.session_factory is not None
    return OrderlyHandler(
        spec,
        spec.session_factory,
        (),
        InflightJournal(spec.session_factory, GROUP),
        park_behind_linger=linger,
    )


def parked(db: Db, key: str = "order-1") -> list[str]:
    return [p.message_key for p in parked_messages(db.sessions, GROUP, key)]


def open_in_spool(handle: OrderlyHandler) -> list[str]:
    assert handle.journal is not None
    assert handle.journal._spool is not None
    path = handle.journal._spool.path
    assert path is not None
    return [m.properties[UNIQ_KEY] for m in read_entries(path.read_bytes())[1]]


def test_messages_behind_a_parked_key_are_written_in_one_batch_in_order(db: Db) -> None:
    listener = Recorder(poison=frozenset({"p1"}))
    handle = batched(db, listener)
    assert handle(msg("p1", 0)) is True  # fails twice: parked at once, as before
    assert parked(db) == ["p1"]
    assert handle(msg("m2", 1)) is True  # acknowledged ...
    assert handle(msg("x1", 2, key="order-2")) is True  # other keys are not held
    assert handle(msg("m3", 3)) is True
    assert parked(db) == ["p1"]  # ... but not written yet
    assert open_in_spool(handle) == ["m2", "m3"]  # the journal holds them meanwhile
    assert listener.handled == ["x1"]
    handle.close()  # writes the batch
    assert handle._behind is not None
    assert handle._behind.batches == 1
    assert parked(db) == ["p1", "m2", "m3"]
    assert rows(db) == []
    assert handle.journal is not None
    assert handle.journal._spool is not None
    assert handle.journal._spool.open_entries() == 0


def test_a_waiting_message_stays_in_the_spool(db: Db) -> None:
    # A row would make the key's next message take the table's path and wait for this one.
    listener = Recorder(poison=frozenset({"p1"}))
    handle = batched(db, listener)
    assert handle(msg("p1", 0)) is True
    assert handle(msg("m2", 1)) is True
    assert handle.journal is not None
    assert handle.journal.promote(everything=True) == 0
    assert rows(db) == []
    assert handle(msg("m3", 2)) is True
    handle.close()
    assert parked(db) == ["p1", "m2", "m3"]


def test_a_message_with_a_journal_row_is_parked_at_once(db: Db) -> None:
    listener = Recorder(poison=frozenset({"p1"}))
    handle = batched(db, listener)
    assert handle(msg("p1", 0)) is True
    assert handle.journal is not None
    handle.journal._added[(TOPIC, "order-1")] = float("inf")  # as after a handed-back message
    assert handle(msg("m2", 1)) is True
    assert parked(db) == ["p1", "m2"]  # not batched: its row is gone when it is acknowledged
    assert rows(db) == []
    handle.close()


def test_the_writer_thread_writes_within_the_linger(db: Db) -> None:
    listener = Recorder(poison=frozenset({"p1"}))
    handle = batched(db, listener, linger=0.01)
    try:
        assert handle(msg("p1", 0)) is True
        for i in range(1, 6):
            assert handle(msg(f"m{i}", i)) is True
        deadline = utcnow() + timedelta(seconds=20)
        while len(parked(db)) < 6 and utcnow() < deadline:
            threading.Event().wait(0.02)
        assert parked(db) == ["p1", "m1", "m2", "m3", "m4", "m5"]
        assert open_in_spool(handle) == []
    finally:
        handle.close()


def test_messages_waiting_when_a_replay_releases_the_key_go_to_the_listener_in_order(
    db: Db,
) -> None:
    listener = Recorder(poison=frozenset({"p1"}))
    handle = batched(db, listener)
    assert handle(msg("p1", 0)) is True
    assert handle(msg("m2", 1)) is True  # waits for the batch
    listener.poison = frozenset()
    report = parking.replay(spec_for(db, listener), db.sessions, GROUP, key="order-1")
    assert report.ok
    assert report.keys[0].unparked
    assert listener.handled == ["p1"]
    assert handle(msg("m3", 2)) is True  # the key has a message waiting: m3 waits behind it
    assert listener.handled == ["p1"]
    handle.close()  # the writer finds no key row: m2, then m3, to the listener
    assert listener.handled == ["p1", "m2", "m3"]
    assert parked_keys(db.sessions, GROUP) == []
    assert rows(db) == []


def test_a_batch_the_database_refuses_waits_in_the_journal(db: Db) -> None:
    listener = Recorder(poison=frozenset({"p1"}))
    handle = batched(db, listener, linger=0.0)
    behind = handle._behind
    assert behind is not None
    behind.retry_after = 0.05
    assert handle(msg("p1", 0)) is True
    with db.engine.begin() as conn:
        conn.execute(text("ALTER TABLE txmsg_parked_message RENAME TO parked_away"))
    try:
        assert handle(msg("m2", 1)) is True
        threading.Event().wait(0.3)  # a few tries fail
        assert open_in_spool(handle) == ["m2"]
    finally:
        with db.engine.begin() as conn:
            conn.execute(text("ALTER TABLE parked_away RENAME TO txmsg_parked_message"))
    deadline = utcnow() + timedelta(seconds=20)
    while parked(db) != ["p1", "m2"] and utcnow() < deadline:
        threading.Event().wait(0.05)
    handle.close()
    assert parked(db) == ["p1", "m2"]
    assert listener.handled == []


# ---- SIGKILL before the batch is written ---------------------------------------------------------
PARKING_CHILD = """
import os, signal, sys
import txmsg.sqla
from txmsg.consumer import build_consumer_spec
from txmsg.message import Message, SHARDING_KEY, UNIQ_KEY
from txmsg.orderly import OrderlyHandler
from txmsg.sqla.journal import InflightJournal

url, group, topic, options = sys.argv[1:5]
engine = txmsg.sqla.create_engine(url, **({"connect_args": {"options": options}} if options else {}))
sessions = txmsg.sqla.make_session_factory(engine)

def listener(message):
    if message.properties[UNIQ_KEY] == "p1":
        raise RuntimeError("poison")

spec = build_consumer_spec(
    listener, topic=topic, group=group, orderly=True, max_orderly_retries=2,
    orderly_retry_delay=0.0, session_factory=sessions,
)
handle = OrderlyHandler(
    spec, sessions, (), InflightJournal(sessions, group), park_behind_linger=3600.0
)
for uid, offset in (("p1", 4), ("m2", 5), ("m3", 6)):
    message = Message(
        topic=topic, body=uid.encode(), properties={UNIQ_KEY: uid, SHARDING_KEY: "order-1"},
        message_id="msgid-" + uid, sharding_key="order-1", queue_id=3, queue_offset=offset,
    )
    assert handle(message) is True  # p1 parked; m2 and m3 acknowledged, waiting for the batch
print(handle.journal.spool_directory, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # before the batch is written
"""


def kill_before_the_batch(db: Db) -> Path:
    options = ""
    if db.name == "postgresql":
        with db.engine.connect() as conn:
            options = f"-csearch_path={conn.execute(text('SHOW search_path')).scalar()}"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            PARKING_CHILD,
            db.engine.url.render_as_string(False),
            GROUP,
            TOPIC,
            options,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    assert parked(db) == ["p1"]  # m2 and m3 were acknowledged, in the spool only
    directory = Path(child.stdout.strip())
    assert len(list(directory.glob("*.spool"))) == 1
    return directory


def test_killed_before_the_batch_the_next_consumer_parks_them_before_the_keys_next_one(
    db: Db,
) -> None:
    directory = kill_before_the_batch(db)
    listener = Recorder()
    handle = batched(db, listener)
    assert handle(msg("m4", 7)) is True
    handle.close()
    assert parked(db) == ["p1", "m2", "m3", "m4"]
    assert listener.handled == []
    assert rows(db) == []
    assert list(directory.glob("*.spool")) == []


def test_killed_before_the_batch_the_sweeper_parks_them_when_nothing_follows(db: Db) -> None:
    kill_before_the_batch(db)
    listener = Recorder()
    handle = orderly_handler(spec_for(db, listener), journal=True)
    try:
        deadline = utcnow() + timedelta(seconds=30)
        while parked(db) != ["p1", "m2", "m3"] and utcnow() < deadline:
            threading.Event().wait(0.1)
    finally:
        handle.close()
    assert parked(db) == ["p1", "m2", "m3"]
    assert listener.handled == []
    assert rows(db) == []
