"""The business change and the transaction record commit or roll back together."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session
from txmsg_broker.testing import wait_until

from txmsg import ConfigError
from txmsg.message import Message
from txmsg.sqla import (
    RecordCheck,
    RecordState,
    SqlAlchemyLocalTransaction,
    get_record,
)
from txmsg.sqla.models import utcnow
from txmsg.states import LocalTransactionState as S

from .business import balance, credit, message
from .conftest import Db

GROUP = "pg-orders"


def _blocked_by(db: Db, pid: int) -> int:
    """How many PostgreSQL sessions wait for a lock that the session ``pid`` holds."""
    query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    with db.engine.connect() as conn:
        return int(conn.execute(query, {"pid": pid}).scalar() or 0)


def local(db: Db, **kwargs: object) -> SqlAlchemyLocalTransaction:
    return SqlAlchemyLocalTransaction(db.sessions, group=GROUP, **kwargs)  # type: ignore[arg-type]


def test_commit_writes_business_change_and_committed_record(db: Db) -> None:
    msg = message("k-commit")
    state = local(db).execute(msg, lambda s: credit(s, "alice", 10))
    assert state is S.COMMIT
    assert balance(db.sessions, "alice") == 10
    record = get_record(db.sessions, "k-commit")
    assert record is not None
    assert record.state is RecordState.COMMITTED
    assert (record.producer_group, record.topic, record.keys) == (GROUP, "t-orders", "k-k-commit")
    assert record.created_at <= record.updated_at


def test_exception_rolls_back_change_and_leaves_no_committed_record(db: Db) -> None:
    def fail(session: Session) -> None:
        credit(session, "bob", 5)
        session.flush()  # the change really reached the database before the failure
        raise RuntimeError("ledger unavailable")

    assert local(db).execute(message("k-fail"), fail) is S.ROLLBACK
    assert balance(db.sessions, "bob") is None
    record = get_record(db.sessions, "k-fail")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK


def test_exception_state_is_configurable_and_check_then_answers_rollback(db: Db) -> None:
    def fail(session: Session) -> None:
        raise ValueError("bad order")

    msg = message("k-unknow")
    assert local(db, on_error=S.UNKNOW).execute(msg, fail) is S.UNKNOW
    assert RecordCheck(db.sessions, group=GROUP)(msg) is S.ROLLBACK


def test_commit_is_refused_as_error_state(db: Db) -> None:
    with pytest.raises(ConfigError, match="never commits"):
        local(db, on_error=S.COMMIT)


def test_work_returning_rollback_rolls_back_without_exception(db: Db) -> None:
    def decline(session: Session) -> S:
        credit(session, "carol", 1)
        return S.ROLLBACK

    assert local(db).execute(message("k-decline"), decline) is S.ROLLBACK
    assert balance(db.sessions, "carol") is None
    record = get_record(db.sessions, "k-decline")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK


@pytest.mark.parametrize("marker", [True, False])
def test_same_key_runs_the_business_change_once(db: Db, marker: bool) -> None:
    tx = local(db, in_flight_marker=marker)
    msg = message("k-twice")
    assert tx.execute(msg, lambda s: credit(s, "dave", 3)) is S.COMMIT
    assert tx.execute(msg, lambda s: credit(s, "dave", 3)) is S.COMMIT
    assert balance(db.sessions, "dave") == 3


def test_message_without_key_is_rolled_back_untouched(db: Db) -> None:
    ran: list[bool] = []
    state = local(db).execute(Message(topic="t", body=b""), lambda s: ran.append(True))
    assert state is S.ROLLBACK
    assert ran == []


def test_slow_transaction_answers_unknow_then_check_reads_the_record(db: Db) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(session: Session) -> None:
        started.set()
        assert release.wait(30)
        credit(session, "erin", 7)

    tx = local(db, answer_within=0.05)
    msg = message("k-slow")
    check = RecordCheck(db.sessions, group=GROUP)
    assert tx.execute(msg, slow) is S.UNKNOW
    assert started.wait(10)
    assert check(msg) is S.UNKNOW  # still in flight
    release.set()
    tx.close()
    assert check(msg) is S.COMMIT
    assert balance(db.sessions, "erin") == 7


def test_check_fence_wins_over_a_late_local_transaction(db: Db) -> None:
    """A check that gave up (no record, old message) writes ROLLED_BACK first; the local
    transaction arriving afterwards must not apply the business change."""
    msg = message("k-late")
    assert RecordCheck(db.sessions, group=GROUP, grace_period=0)(msg) is S.ROLLBACK
    for marker in (True, False):
        state = local(db, in_flight_marker=marker).execute(msg, lambda s: credit(s, "fay", 1))
        assert state is S.ROLLBACK
    assert balance(db.sessions, "fay") is None


def test_stale_in_flight_is_fenced_and_the_business_commit_rolls_back(db: Db) -> None:
    """The check gives up on an IN_FLIGHT record while its business transaction still runs: the
    business transaction then finds the key settled and rolls back."""
    in_work, fenced = threading.Event(), threading.Event()
    results: list[S] = []

    def work(session: Session) -> None:
        # Wait before the first statement: on SQLite that statement takes the write lock, which
        # the fencing check needs.
        in_work.set()
        assert fenced.wait(30)
        credit(session, "gus", 1)

    msg = message("k-stale")
    tx = local(db)
    t = threading.Thread(target=lambda: results.append(tx.execute(msg, work)))
    t.start()
    assert in_work.wait(10)
    check = RecordCheck(db.sessions, group=GROUP, in_flight_timeout=0)
    record = get_record(db.sessions, "k-stale")
    assert record is not None
    assert record.state is RecordState.IN_FLIGHT
    # in_flight_timeout=0 fences a record touched strictly before now: let the clock pass it
    wait_until(
        lambda: utcnow() > record.updated_at, timeout=5, interval=0.001, message="the clock to tick"
    )
    assert check(msg) is S.ROLLBACK
    fenced.set()
    t.join(30)
    assert results == [S.ROLLBACK]
    assert balance(db.sessions, "gus") is None
    record = get_record(db.sessions, "k-stale")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK


@pytest.mark.parametrize("marker", [True, False])
def test_fence_waits_for_a_committing_business_transaction(db: Db, marker: bool) -> None:
    """The business transaction already wrote its record (uncommitted) when the check fences: the
    check must end up answering COMMIT, never ROLLBACK for a change that commits."""
    if db.name == "sqlite":
        pytest.skip("SQLite serialises writers; covered by the fence-first test")
    msg = message(f"k-race-{marker}")
    tx = local(db, in_flight_marker=marker)
    record_written, go = threading.Event(), threading.Event()
    results: list[S] = []

    # Pause just before COMMIT, after the record statement ran (it holds the row lock / key).
    business_pid: list[int] = []

    def work(session: Session) -> None:
        business_pid.append(int(session.execute(text("SELECT pg_backend_pid()")).scalar_one()))
        credit(session, "hal", 2)

        @event.listens_for(session, "before_commit")
        def _pause(_s: Session) -> None:
            record_written.set()
            assert go.wait(30)

    t = threading.Thread(target=lambda: results.append(tx.execute(msg, work)))
    t.start()
    assert record_written.wait(10)
    answers: list[S] = []
    check = RecordCheck(db.sessions, group=GROUP, grace_period=0, in_flight_timeout=0)
    checker = threading.Thread(target=lambda: answers.append(check(msg)))
    checker.start()
    # the checker's fencing write now waits for the business transaction's lock (the record's row, or
    # its key for the insert); an early answer instead is caught by the asserts below
    wait_until(
        lambda: answers or _blocked_by(db, business_pid[0]) > 0,
        timeout=10,
        message="the check to wait for the business transaction's lock",
    )
    go.set()
    t.join(30)
    checker.join(30)
    assert results == [S.COMMIT]
    assert balance(db.sessions, "hal") == 2
    assert answers == [S.COMMIT]
    assert check(msg) is S.COMMIT


def test_sqlite_uses_wal_and_busy_timeout(db: Db) -> None:
    if db.name != "sqlite":
        pytest.skip("SQLite pragmas")
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 1000


def test_postgres_runs_read_committed(db: Db) -> None:
    if db.name != "postgresql":
        pytest.skip("PostgreSQL isolation")
    with db.engine.connect() as conn:
        level = conn.execute(text("SHOW transaction_isolation")).scalar()
    assert level == "read committed"
