"""Record retention: delete or archive old records, keep young ones."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, inspect, select

from txmsg import ConfigError
from txmsg.sqla import (
    SqlAlchemyLocalTransaction,
    TransactionRecordArchive,
    count_records,
    get_record,
    purge_records,
)
from txmsg.sqla.models import utcnow

from .business import credit, message
from .conftest import Db


def fill(db: Db, n: int) -> None:
    tx = SqlAlchemyLocalTransaction(db.sessions, group="ret")
    for i in range(n):
        tx.execute(message(f"r-{i}"), lambda s, i=i: credit(s, f"acc{i % 3}", 1))


def test_purge_deletes_only_old_records_in_batches(db: Db) -> None:
    fill(db, 7)
    week = timedelta(days=7)
    assert purge_records(db.sessions, week) == 0
    assert count_records(db.sessions)["COMMITTED"] == 7
    assert purge_records(db.sessions, week, now=utcnow() + timedelta(days=8), batch_size=3) == 7
    assert get_record(db.sessions, "r-0") is None
    assert count_records(db.sessions, group="ret")["COMMITTED"] == 0


def test_purge_can_archive(db: Db) -> None:
    fill(db, 4)
    later = utcnow() + timedelta(days=30)
    assert purge_records(db.sessions, timedelta(days=7), archive=True, now=later) == 4
    with db.sessions() as session:
        archived = session.scalar(select(func.count()).select_from(TransactionRecordArchive))
        row = session.get(TransactionRecordArchive, "r-1")
    assert archived == 4
    assert row is not None
    assert row.state == "COMMITTED"
    assert row.producer_group == "ret"


def test_short_retention_is_refused_unless_allowed(db: Db) -> None:
    with pytest.raises(ConfigError, match="check horizon"):
        purge_records(db.sessions, timedelta(minutes=5))
    fill(db, 1)
    assert purge_records(db.sessions, timedelta(0), allow_short_retention=True) == 1


def test_check_query_is_a_primary_key_lookup_and_retention_has_an_index(db: Db) -> None:
    insp = inspect(db.engine)
    assert insp.get_pk_constraint("txmsg_transaction_record")["constrained_columns"] == [
        "transaction_key"
    ]
    indexed = {tuple(ix["column_names"]) for ix in insp.get_indexes("txmsg_transaction_record")}
    assert ("updated_at",) in indexed
    dedup_pk = insp.get_pk_constraint("txmsg_consumed_message")["constrained_columns"]
    assert dedup_pk == ["consumer_group", "message_key"]
