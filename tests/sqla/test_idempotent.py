"""Idempotent consumers: effects and dedup row commit together; duplicates are absorbed."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

from txmsg import ListenerDefinitionError, TxMsgError
from txmsg.message import Message
from txmsg.sqla import consumed_count, duplicates_absorbed, purge_consumed, wrap_idempotent
from txmsg.sqla.models import utcnow

from .business import Ledger, ledger_rows, message
from .conftest import Db


def apply_ledger(msg: Message, session: Session) -> None:
    session.add(Ledger(message_key=msg.transaction_key or "", amount=5))


def test_first_delivery_applies_duplicates_are_absorbed_and_counted(
    db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = wrap_idempotent(apply_ledger, db.sessions, "points", "order-paid")
    msg = message("m-1", topic="order-paid")
    consumer(msg)
    with caplog.at_level(logging.INFO, logger="txmsg.idempotent"):
        consumer(msg)  # redelivered copy: same UNIQ_KEY
        consumer(Message(topic="order-paid", body=b"", properties=dict(msg.properties)))
    assert ledger_rows(db.sessions) == [("m-1", 5)]
    assert (consumer.applied, consumer.duplicates) == (1, 2)
    assert duplicates_absorbed(db.sessions, "points") == 2
    assert duplicates_absorbed(db.sessions, "other") == 0
    assert consumed_count(db.sessions, "points") == 1
    assert sum("duplicate delivery absorbed" in r.getMessage() for r in caplog.records) == 2


def test_groups_are_independent(db: Db) -> None:
    msg = message("m-2")
    wrap_idempotent(apply_ledger, db.sessions, "points", "t")(msg)
    wrap_idempotent(apply_ledger, db.sessions, "cart", "t")(msg)
    assert len(ledger_rows(db.sessions)) == 2
    assert duplicates_absorbed(db.sessions) == 0


def test_handler_failure_rolls_back_dedup_row_and_is_retried(db: Db) -> None:
    attempts: list[int] = []

    def flaky(msg: Message, session: Session) -> None:
        apply_ledger(msg, session)
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("downstream down")

    consumer = wrap_idempotent(flaky, db.sessions, "logistics", "t")
    msg = message("m-3")
    with pytest.raises(RuntimeError):
        consumer(msg)
    assert ledger_rows(db.sessions) == []
    assert consumed_count(db.sessions, "logistics") == 0
    consumer(msg)  # the redelivery applies it
    assert ledger_rows(db.sessions) == [("m-3", 5)]
    assert consumer.duplicates == 0


def test_concurrent_copies_apply_once(db: Db) -> None:
    barrier = threading.Barrier(4)
    consumer = wrap_idempotent(apply_ledger, db.sessions, "points", "t")
    errors: list[BaseException] = []

    def deliver() -> None:
        barrier.wait(10)
        try:
            consumer(message("m-4"))
        except BaseException as exc:  # noqa: BLE001 - any failure in the thread is reported below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert ledger_rows(db.sessions) == [("m-4", 5)]
    assert (consumer.applied, consumer.duplicates) == (1, 3)
    assert duplicates_absorbed(db.sessions, "points") == 3


def test_needs_session_factory_and_key(db: Db) -> None:
    with pytest.raises(ListenerDefinitionError, match="session_factory"):
        wrap_idempotent(apply_ledger, None, "g", "t")
    consumer = wrap_idempotent(apply_ledger, db.sessions, "g", "t")
    with pytest.raises(TxMsgError, match="UNIQ_KEY"):
        consumer(Message(topic="t", body=b""))


def test_message_id_is_the_fallback_key(db: Db) -> None:
    consumer = wrap_idempotent(apply_ledger, db.sessions, "g", "t")
    consumer(Message(topic="t", body=b"", message_id="ID-1"))
    consumer(Message(topic="t", body=b"", message_id="ID-1"))
    assert consumer.duplicates == 1


def test_purge_consumed_forgets_old_rows(db: Db) -> None:
    consumer = wrap_idempotent(apply_ledger, db.sessions, "g", "t")
    consumer(message("m-5"))
    assert purge_consumed(db.sessions, timedelta(days=2)) == 0
    assert purge_consumed(db.sessions, timedelta(days=2), now=utcnow() + timedelta(days=3)) == 1
    assert consumed_count(db.sessions) == 0
