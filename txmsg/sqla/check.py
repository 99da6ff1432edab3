"""The default ``check_local``: answer a check-back from the transaction record.

=====================================  ==========================================================
record                                  answer
=====================================  ==========================================================
COMMITTED                               COMMIT
ROLLED_BACK                             ROLLBACK
IN_FLIGHT, touched < in_flight_timeout  UNKNOW (the local transaction is still running)
IN_FLIGHT, older than in_flight_timeout ROLLBACK, after fencing the row (its process died, or it
                                        runs so long the broker would give up anyway)
none, message younger than grace        UNKNOW (the local transaction may not have started yet)
none, older than grace (or age unknown) ROLLBACK, after writing a ROLLED_BACK marker
=====================================  ==========================================================

"Fencing" means the ROLLBACK answer is first written to the record with a conditional statement
(see :mod:`txmsg.sqla.records`); a business transaction that tries to commit afterwards finds the
key settled and rolls back.  So a check can never answer ROLLBACK for a change that later commits,
however the clocks or timings turn out.

The message's age comes from its born timestamp when the backend provides one (a
``born_timestamp`` attribute in ms or a datetime, or a ``TXMSG_BORN_MS`` property); without it a
missing record is treated as old: with the default in-flight marker a missing record only means
the local transaction never started (check-backs come ``transactionTimeOut`` after the send).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from txmsg.errors import ConfigError
from txmsg.message import Message
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.models import RecordState, utcnow
from txmsg.sqla.records import get_record, settle_rolled_back
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.transaction")

BORN_PROPERTY = "TXMSG_BORN_MS"
"""Optional message property: epoch milliseconds when the message was created."""


def born_properties() -> dict[str, str]:
    """Message properties recording "born now"; pass them to ``send_in_transaction`` so the
    record check knows a message's age even when the backend does not report it."""
    return {BORN_PROPERTY: str(int(time.time() * 1000))}


def message_born_at(message: Message) -> datetime | None:
    """When the message was born, if the backend or the sender recorded it."""
    for attr in ("born_timestamp", "born_timestamp_ms", "born_at"):
        value = getattr(message, attr, None)
        born = _as_datetime(value)
        if born is not None:
            return born
    props = getattr(message, "properties", None) or {}
    raw = props.get(BORN_PROPERTY)
    if raw:
        try:
            return _as_datetime(int(raw))
        except ValueError:
            return None
    return None


def _as_datetime(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(float(value) / 1000.0, UTC)
    return None


def _seconds(value: float | timedelta | None) -> timedelta | None:
    if value is None:
        return None
    delta = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if delta < timedelta(0):
        raise ConfigError(
            f"durations must not be negative, got {value!r}: use seconds >= 0 or a timedelta"
        )
    return delta


class RecordCheck:
    """Callable ``check(message) -> LocalTransactionState`` answering from the record table.

    ``grace_period``: how long a message without any record is given to start its local
    transaction.  ``in_flight_timeout``: how long an IN_FLIGHT record may stay untouched before
    the check gives up on it (None = never; the broker then discards the message after its last
    check, which is the same outcome but leaves a late commit possible).  Keep it below the
    broker's check horizon (``transactionTimeOut + checkMax * interval``) and above your longest
    local transaction.
    """

    def __init__(
        self,
        session_factory: SessionFactory,
        *,
        group: str,
        grace_period: float | timedelta = 10.0,
        in_flight_timeout: float | timedelta | None = 600.0,
    ) -> None:
        self.session_factory = session_factory
        self.group = group
        self.grace_period = _seconds(grace_period) or timedelta(0)
        self.in_flight_timeout = _seconds(in_flight_timeout)

    def __call__(self, message: Message) -> LocalTransactionState:
        key = message.transaction_key
        if not key:
            log.error(
                "group=%s topic=%s: check-back without a transaction key (UNIQ_KEY); answering "
                "UNKNOW",
                self.group,
                message.topic,
            )
            return LocalTransactionState.UNKNOW
        now = utcnow()
        record = get_record(self.session_factory, key)
        if record is not None:
            if record.producer_group != self.group:
                log.warning(
                    "key=%s: record belongs to group %s but group %s was asked; answering from it",
                    key,
                    record.producer_group,
                    self.group,
                )
            if record.state is RecordState.COMMITTED:
                return LocalTransactionState.COMMIT
            if record.state is RecordState.ROLLED_BACK:
                return LocalTransactionState.ROLLBACK
            timeout = self.in_flight_timeout
            if timeout is None or now - record.updated_at < timeout:
                return LocalTransactionState.UNKNOW
            log.warning(
                "group=%s key=%s: in flight since %s, longer than %s; fencing it and answering "
                "ROLLBACK",
                self.group,
                key,
                record.updated_at.isoformat(),
                timeout,
            )
            settled = settle_rolled_back(
                self.session_factory,
                key,
                group=self.group,
                topic=message.topic,
                keys=message.keys,
                stale_before=now - timeout,
            )
            return _answer(settled.state)
        born = message_born_at(message)
        if born is not None and now - born < self.grace_period:
            return LocalTransactionState.UNKNOW
        log.info(
            "group=%s key=%s: no transaction record and the message is %s old; writing a rollback "
            "marker and answering ROLLBACK",
            self.group,
            key,
            "of unknown age, treated as" if born is None else str(now - born),
        )
        settled = settle_rolled_back(
            self.session_factory, key, group=self.group, topic=message.topic, keys=message.keys
        )
        return _answer(settled.state)


def _answer(state: RecordState) -> LocalTransactionState:
    if state is RecordState.COMMITTED:
        return LocalTransactionState.COMMIT
    if state is RecordState.ROLLED_BACK:
        return LocalTransactionState.ROLLBACK
    return LocalTransactionState.UNKNOW
