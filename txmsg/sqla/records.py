"""Reading and writing transaction records, with the fencing that keeps them honest.

Every state change is a conditional statement, so the answer a check-back gives and what the
business transaction later does can never disagree:

* the business transaction ends with ``UPDATE ... SET state='COMMITTED' WHERE state='IN_FLIGHT'``
  (or inserts a COMMITTED row when no in-flight marker is used); if that touches no row, the
  transaction was already given up by a check and is rolled back (:class:`TransactionFencedError`);
* a check that gives up writes ``ROLLED_BACK`` only over a missing or (stale) ``IN_FLIGHT`` row.

PostgreSQL (READ COMMITTED) serialises the two on the row lock / primary key and re-evaluates the
``WHERE`` after waiting; SQLite serialises all writers.  Whichever commits first wins, and the
loser sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Insert, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from txmsg.errors import ConfigError, TransactionFencedError, TxMsgError
from txmsg.sqla.engine import SessionFactory, read_only
from txmsg.sqla.models import (
    RecordState,
    TransactionRecord,
    TransactionRecordArchive,
    utcnow,
)
from txmsg.sqla.views import view_of


@dataclass(frozen=True)
class RecordView:
    """A detached copy of a record row."""

    transaction_key: str
    producer_group: str
    topic: str
    state: RecordState
    keys: str | None
    created_at: datetime
    updated_at: datetime


def _view(row: TransactionRecord) -> RecordView:
    return view_of(RecordView, row, state=RecordState(row.state))


def get_record(session_factory: SessionFactory, transaction_key: str) -> RecordView | None:
    """The committed state of a record (a primary-key lookup in a non-locking transaction)."""
    with session_factory() as session, session.begin():
        read_only(session)
        row = session.get(TransactionRecord, transaction_key)
        return None if row is None else _view(row)


def begin_in_flight(
    session_factory: SessionFactory,
    transaction_key: str,
    *,
    group: str,
    topic: str,
    keys: str | None = None,
) -> RecordView | None:
    """Write the IN_FLIGHT marker in its own short transaction.

    Returns None when written, or the existing record when the key is already known (a check
    fenced it, or the local transaction is being run twice): the caller must not run the business
    change then.
    """
    now = utcnow()
    try:
        with session_factory() as session, session.begin():
            session.execute(
                _new_record(transaction_key, group, topic, RecordState.IN_FLIGHT, keys, now)
            )
        return None
    except IntegrityError:
        existing = get_record(session_factory, transaction_key)
        if existing is None:  # deleted in between (retention): report as in flight elsewhere
            raise
        return existing


def mark_committed(
    session: Session,
    transaction_key: str,
    *,
    group: str,
    topic: str,
    keys: str | None = None,
    in_flight_marker: bool = True,
) -> None:
    """Inside the business transaction: make the record COMMITTED, or raise
    :class:`TransactionFencedError` when the key was settled meanwhile."""
    now = utcnow()
    if in_flight_marker:
        result = session.execute(
            update(TransactionRecord)
            .where(
                TransactionRecord.transaction_key == transaction_key,
                TransactionRecord.state == RecordState.IN_FLIGHT.value,
            )
            .values(state=RecordState.COMMITTED.value, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if getattr(result, "rowcount", 0) != 1:
            raise TransactionFencedError(
                f"transaction {transaction_key} is no longer in flight (a check-back settled it); "
                "rolling back the business change to stay consistent with the broker"
            )
        return
    try:
        with session.begin_nested():
            session.execute(
                _new_record(transaction_key, group, topic, RecordState.COMMITTED, keys, now)
            )
    except IntegrityError as exc:
        raise TransactionFencedError(
            f"transaction {transaction_key} already has a record (a check-back settled it); "
            "rolling back the business change"
        ) from exc


def settle_rolled_back(
    session_factory: SessionFactory,
    transaction_key: str,
    *,
    group: str,
    topic: str,
    keys: str | None = None,
    stale_before: datetime | None = None,
) -> RecordView:
    """Make the key ROLLED_BACK unless it is COMMITTED; return the resulting record.

    Inserts a marker when there is no row; flips an IN_FLIGHT row (only one last touched before
    ``stale_before`` when given).  A COMMITTED row is left alone and returned: callers answer from
    what comes back, never from what they hoped to write.
    """
    now = utcnow()
    with session_factory() as session, session.begin():
        condition = [
            TransactionRecord.transaction_key == transaction_key,
            TransactionRecord.state == RecordState.IN_FLIGHT.value,
        ]
        if stale_before is not None:
            condition.append(TransactionRecord.updated_at < stale_before)
        session.execute(
            update(TransactionRecord)
            .where(*condition)
            .values(state=RecordState.ROLLED_BACK.value, updated_at=now)
            .execution_options(synchronize_session=False)
        )
    existing = get_record(session_factory, transaction_key)
    if existing is not None:
        return existing
    try:
        with session_factory() as session, session.begin():
            session.execute(
                _new_record(transaction_key, group, topic, RecordState.ROLLED_BACK, keys, now)
            )
    except IntegrityError:
        pass  # someone else wrote it first: answer from theirs
    found = get_record(session_factory, transaction_key)
    if found is None:
        raise TxMsgError(
            f"transaction record {transaction_key} vanished while settling it; another process "
            "deleted it (purge_records with a too short retention?): keep records longer"
        )
    return found


MIN_RETENTION = timedelta(hours=1)
"""Retention shorter than this could delete a COMMITTED record the broker still checks (a lost
COMMIT is re-checked for ``transactionTimeOut + checkMax * checkInterval``, 15 min by default)
and turn it into a ROLLBACK answer."""


def purge_records(
    session_factory: SessionFactory,
    older_than: timedelta,
    *,
    archive: bool = False,
    batch_size: int = 500,
    now: datetime | None = None,
    allow_short_retention: bool = False,
) -> int:
    """Delete (or move to ``txmsg_transaction_record_archive``) records not updated for
    ``older_than``; returns how many.  Works in batches so it never holds long locks.

    IN_FLIGHT records are kept unless they are that old too (their process died long ago; the
    broker has discarded the message after its last check).
    """
    if older_than < MIN_RETENTION and not allow_short_retention:
        raise ConfigError(
            f"retention {older_than} is shorter than {MIN_RETENTION}: the broker may still check "
            "those transactions; pass allow_short_retention=True if your broker's check horizon "
            "is shorter"
        )
    if batch_size <= 0:
        raise ConfigError("batch_size must be positive (rows per delete batch)")
    cutoff = (now or utcnow()) - older_than
    total = 0
    while True:
        with session_factory() as session, session.begin():
            rows = list(
                session.scalars(
                    select(TransactionRecord)
                    .where(TransactionRecord.updated_at < cutoff)
                    .order_by(TransactionRecord.updated_at)
                    .limit(batch_size)
                )
            )
            if not rows:
                return total
            keys = [row.transaction_key for row in rows]
            if archive:
                archived_at = utcnow()
                session.execute(
                    delete(TransactionRecordArchive).where(
                        TransactionRecordArchive.transaction_key.in_(keys)
                    )
                )
                session.execute(
                    insert(TransactionRecordArchive),
                    [
                        {
                            "transaction_key": row.transaction_key,
                            "producer_group": row.producer_group,
                            "topic": row.topic,
                            "state": row.state,
                            "keys": row.keys,
                            "created_at": row.created_at,
                            "updated_at": row.updated_at,
                            "archived_at": archived_at,
                        }
                        for row in rows
                    ],
                )
            session.execute(
                delete(TransactionRecord)
                .where(TransactionRecord.transaction_key.in_(keys))
                .execution_options(synchronize_session=False)
            )
            total += len(keys)
        if len(keys) < batch_size:
            return total


def count_records(session_factory: SessionFactory, *, group: str | None = None) -> dict[str, int]:
    """Records per state (optionally of one producer group): handy for dashboards and tests."""

    with session_factory() as session, session.begin():
        read_only(session)
        query = select(TransactionRecord.state, func.count()).group_by(TransactionRecord.state)
        if group is not None:
            query = query.where(TransactionRecord.producer_group == group)
        counts = {state.value: 0 for state in RecordState}
        for state, n in session.execute(query):
            counts[str(state)] = int(n)
        return counts


def _new_record(
    transaction_key: str,
    group: str,
    topic: str,
    state: RecordState,
    keys: str | None,
    now: datetime,
) -> Insert:
    """The INSERT of a fresh record: the marker, the commit and the rollback write the same row
    but for its state, and a conflict on the key is what fences each of them."""
    return insert(TransactionRecord).values(
        transaction_key=transaction_key,
        producer_group=group,
        topic=topic,
        state=state.value,
        keys=_clip(keys),
        created_at=now,
        updated_at=now,
    )


def _clip(keys: str | None) -> str | None:
    return None if keys is None else keys[:255]
