"""A listener base class whose users write the business change and nothing else.

::

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder(RecordBackedListener):
        def execute_in_transaction(self, session, message, arg):
            session.get(Order, arg).status = "PAID"

``execute_local`` runs :meth:`execute_in_transaction` in one database transaction with the
transaction record; ``check_local`` answers from the record (:class:`txmsg.sqla.check.RecordCheck`).
Both can still be overridden.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from txmsg.listener import bound_spec
from txmsg.message import Message
from txmsg.sqla.check import RecordCheck
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.local import SqlAlchemyLocalTransaction, listener_group
from txmsg.states import LocalTransactionState


class RecordBacked:
    """What the sync and the asyncio record-backed listeners share: the record's settings (class
    attributes are the defaults, the constructor's arguments override them per instance), the
    producer group and the answer to a failed business change."""

    grace_period: float | timedelta = 10.0
    in_flight_timeout: float | timedelta | None = 600.0
    in_flight_marker: bool = True

    def _settings(
        self,
        group: str | None,
        grace_period: float | timedelta | None,
        in_flight_timeout: float | timedelta | None,
    ) -> None:
        if group is not None:
            self.producer_group = group
        if grace_period is not None:
            self.grace_period = grace_period
        if in_flight_timeout is not None:
            self.in_flight_timeout = in_flight_timeout

    @property
    def group(self) -> str:
        """The producer group this instance answers for: the one of the app that started it
        (bound to this instance, since another app may declare the class under another group),
        else ``producer_group`` (the constructor's ``group=``)."""
        return listener_group(self)

    @property
    def execute_exception_state(self) -> LocalTransactionState:
        """ROLLBACK (the database transaction was rolled back), unless the app's declaration
        said otherwise with ``execute_exception_state=``."""
        spec = bound_spec(self)
        chosen = spec.execute_exception_state if spec is not None else None
        return chosen or LocalTransactionState.ROLLBACK


class RecordBackedListener(RecordBacked):
    """Base class for record-backed transactional listeners.

    Class attributes are the defaults; the constructor overrides them per instance.

    An exception in the business change rolls the database transaction back and answers
    ROLLBACK: here txmsg *knows* the local transaction did not happen, which is the one case where
    txmsg's rule (:data:`txmsg.defaults.EXECUTE_EXCEPTION_STATE`: UNKNOW, the check-back decides)
    gives way.  ``execute_exception_state=UNKNOW`` on the decorator overrides it, as for any
    listener.
    """

    answer_within: float | None = None
    background_workers: int = 8
    """Threads that finish local transactions past ``answer_within`` (slow ones queue here)."""

    def __init__(
        self,
        session_factory: SessionFactory,
        *,
        group: str | None = None,
        grace_period: float | timedelta | None = None,
        in_flight_timeout: float | timedelta | None = None,
        answer_within: float | None = None,
        background_workers: int | None = None,
    ) -> None:
        self.session_factory = session_factory
        self._settings(group, grace_period, in_flight_timeout)
        if answer_within is not None:
            self.answer_within = answer_within
        if background_workers is not None:
            self.background_workers = background_workers
        self._local: SqlAlchemyLocalTransaction | None = None
        self._check: RecordCheck | None = None
        self._lazy_lock = threading.Lock()  # execute/check run on many threads from the start

    # -- what subclasses write ------------------------------------------------------------------
    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> object:
        """The business change, inside the open transaction.  Raise (or return ROLLBACK) to roll
        back; return None to commit."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement execute_in_transaction(session, message, arg)"
        )

    # -- the listener protocol ------------------------------------------------------------------
    def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
        return self.local_transaction.execute(
            message, lambda session: self.execute_in_transaction(session, message, arg)
        )

    def check_local(self, message: Message) -> LocalTransactionState:
        return self.record_check(message)

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def local_transaction(self) -> SqlAlchemyLocalTransaction:
        with self._lazy_lock:
            if self._local is None:
                self._local = SqlAlchemyLocalTransaction(
                    self.session_factory,
                    group=self.group,
                    on_error=self.execute_exception_state,
                    in_flight_marker=self.in_flight_marker,
                    answer_within=self.answer_within,
                    background_workers=self.background_workers,
                )
            return self._local

    @property
    def record_check(self) -> RecordCheck:
        with self._lazy_lock:
            if self._check is None:
                self._check = RecordCheck(
                    self.session_factory,
                    group=self.group,
                    grace_period=self.grace_period,
                    in_flight_timeout=self.in_flight_timeout,
                )
            return self._check

    def close(self) -> None:
        """Wait for local transactions still running after an UNKNOW answer.

        :meth:`txmsg.TxMsg.close` calls this after the group's producer has closed.
        """
        if self._local is not None:
            self._local.close()
