"""The default check-back answers from the transaction record."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import (
    BORN_PROPERTY,
    RecordCheck,
    RecordState,
    SqlAlchemyLocalTransaction,
    born_properties,
    get_record,
    message_born_at,
)
from txmsg.sqla.records import begin_in_flight
from txmsg.states import LocalTransactionState as S

from .business import balance, credit, message
from .conftest import Db

GROUP = "check-group"


def now_ms(offset_s: float = 0.0) -> str:
    return str(int((time.time() + offset_s) * 1000))


def test_committed_record_answers_commit(db: Db) -> None:
    msg = message("c-1")
    tx = SqlAlchemyLocalTransaction(db.sessions, group=GROUP)
    assert tx.execute(msg, lambda s: credit(s, "a", 1)) is S.COMMIT
    assert RecordCheck(db.sessions, group=GROUP)(msg) is S.COMMIT


def test_rolled_back_record_answers_rollback(db: Db) -> None:
    msg = message("c-2")
    tx = SqlAlchemyLocalTransaction(db.sessions, group=GROUP)

    def boom(_: object) -> None:
        raise RuntimeError("x")

    assert tx.execute(msg, boom) is S.ROLLBACK
    assert RecordCheck(db.sessions, group=GROUP)(msg) is S.ROLLBACK


def test_in_flight_record_answers_unknow_until_stale(db: Db) -> None:
    msg = message("c-3")
    assert begin_in_flight(db.sessions, "c-3", group=GROUP, topic=msg.topic) is None
    assert RecordCheck(db.sessions, group=GROUP)(msg) is S.UNKNOW
    assert RecordCheck(db.sessions, group=GROUP, in_flight_timeout=None)(msg) is S.UNKNOW
    record = get_record(db.sessions, "c-3")
    assert record is not None
    assert record.state is RecordState.IN_FLIGHT
    # a check after the in-flight timeout gives up, and fences the key first
    assert RecordCheck(db.sessions, group=GROUP, in_flight_timeout=0)(msg) is S.ROLLBACK
    record = get_record(db.sessions, "c-3")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK


def test_missing_record_young_message_answers_unknow(db: Db) -> None:
    msg = message("c-4", **{BORN_PROPERTY: now_ms(-1)})
    assert RecordCheck(db.sessions, group=GROUP, grace_period=60)(msg) is S.UNKNOW
    assert get_record(db.sessions, "c-4") is None  # nothing written while young


def test_missing_record_old_message_answers_rollback_and_fences(db: Db) -> None:
    msg = message("c-5", **{BORN_PROPERTY: now_ms(-120)})
    assert RecordCheck(db.sessions, group=GROUP, grace_period=60)(msg) is S.ROLLBACK
    record = get_record(db.sessions, "c-5")
    assert record is not None
    assert record.state is RecordState.ROLLED_BACK
    assert record.producer_group == GROUP
    assert record.topic == msg.topic
    # the local transaction showing up late does nothing
    tx = SqlAlchemyLocalTransaction(db.sessions, group=GROUP)
    assert tx.execute(msg, lambda s: credit(s, "late", 1)) is S.ROLLBACK
    assert balance(db.sessions, "late") is None


def test_missing_record_of_unknown_age_is_treated_as_old(db: Db) -> None:
    assert RecordCheck(db.sessions, group=GROUP)(message("c-6")) is S.ROLLBACK


def test_message_without_key_answers_unknow(db: Db) -> None:
    assert RecordCheck(db.sessions, group=GROUP)(Message(topic="t", body=b"")) is S.UNKNOW


def test_born_timestamp_sources() -> None:
    born = message_born_at(Message(topic="t", body=b"", properties={BORN_PROPERTY: "1000"}))
    assert born == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert message_born_at(Message(topic="t", body=b"", properties={BORN_PROPERTY: "x"})) is None
    assert message_born_at(Message(topic="t", body=b"", properties={UNIQ_KEY: "k"})) is None


def test_grace_accepts_timedelta(db: Db) -> None:
    msg = message("c-7", **{BORN_PROPERTY: now_ms(-1)})
    check = RecordCheck(db.sessions, group=GROUP, grace_period=timedelta(minutes=1))
    assert check(msg) is S.UNKNOW


def test_born_properties_make_a_fresh_message_young(db: Db) -> None:
    msg = message("c-8", **born_properties())
    assert RecordCheck(db.sessions, group=GROUP, grace_period=60)(msg) is S.UNKNOW
    assert RecordCheck(db.sessions, group=GROUP, grace_period=0)(msg) is S.ROLLBACK
