"""``Outbox``: messages written in the service's own database transaction, sent after it commits.

::

    outbox = app.add_outbox(group="order-outbox", session_factory=Session)

    with Session() as session, session.begin():
        order.status = "PAID"                                   # your change
        outbox.send(session, "order-events", {"id": order.id, "event": "paid"},
                    sharding_key=order.id)                      # same transaction
    # committed: the relay sends it (ordered by order id) within milliseconds

Why an outbox beside transactional (half) messages: the message is a row of the business
transaction, so it exists exactly when the business change does, with no check-back to write;
and what half messages cannot do works: ordered *and* transactional messages (a RocketMQ 5 topic
is either FIFO or TRANSACTION, a 4.x transactional send cannot choose its queue), several
messages to several topics in one transaction, delayed ones.  The price: the relay's database
work, and delivery after the commit instead of with it (docs/guide/outbox.md compares them).

Nothing leaves before the commit and a rollback leaves nothing: :meth:`Outbox.send` only inserts
a row in the caller's session.  The relay (:mod:`txmsg.sqla.outbox.relay`) is woken by that
session's commit through one ``after_commit`` listener on SQLAlchemy's ``Session`` class (it looks
for a marker :meth:`Outbox.send` leaves in ``session.info``; sessions that wrote no outbox row pay
two dictionary lookups per commit).  On SQLite the same transaction deletes the rows this
process's relay has sent since (:mod:`txmsg.sqla.outbox.ledger`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from txmsg.errors import InvalidMessageError, LifecycleError
from txmsg.names import rocketmq_rule
from txmsg.otel import gauges
from txmsg.outbox_options import OutboxOptions, build_outbox_options
from txmsg.registry import declares_with
from txmsg.sending import RowOptions, check_keywords
from txmsg.sqla.outbox import notify, store
from txmsg.sqla.outbox.claims import DELETES_MARK
from txmsg.sqla.outbox.policy import RetryPolicy
from txmsg.sqla.outbox.relay import DeadHook, OutboxSender, Relay, RelayStats
from txmsg.sqla.outbox.writer import OutboxReceipt, row_values, write_row

log = logging.getLogger("txmsg.outbox")

WAKE_MARK = "txmsg_outbox_wake"
"""``session.info`` key: the outboxes whose relays the session's next commit wakes."""

_listening = False
_listening_lock = threading.Lock()


def _after_commit(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint released: the rows are not committed yet
    info = session.info
    notify.forget(info)
    if DELETES_MARK in info:
        for ledger, token in info.pop(DELETES_MARK):
            ledger.done(token)
    outboxes = info.pop(WAKE_MARK, None)
    if outboxes:
        for outbox in outboxes:
            outbox.wake()


def _after_rollback(session: Session) -> None:
    if session.in_nested_transaction():
        return  # a savepoint rolled back: the transaction's own rows and deletes stand
    info = session.info
    info.pop(WAKE_MARK, None)
    notify.forget(info)
    _release_deletes(info)


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    # a session closed with its transaction open ends it without after_rollback
    if transaction.parent is None:
        notify.forget(session.info)
        _release_deletes(session.info)


def _release_deletes(info: dict[Any, Any]) -> None:
    if DELETES_MARK in info:
        for ledger, token in info.pop(DELETES_MARK):
            ledger.release(token)


def _listen_once() -> None:
    """Install the ``Session`` class listeners (once per process)."""
    global _listening
    with _listening_lock:
        if not _listening:
            event.listen(Session, "after_commit", _after_commit)
            event.listen(Session, "after_rollback", _after_rollback)
            event.listen(Session, "after_transaction_end", _after_transaction_end)
            _listening = True


@dataclass(frozen=True)
class OutboxStats:
    """An outbox's backlog in its database and, when this process runs its relay, the relay's
    figures."""

    group: str
    unsent: int
    """Rows not sent yet: due, in back-off, or behind an earlier row of their key."""
    oldest_unsent_age: float | None
    """Seconds since the oldest unsent row was written (None when nothing is unsent): the
    figure to alert on, since a growing one means the relay is not keeping up or is stuck."""
    dead: int
    """Rows that will not be sent until ``txmsg outbox retry``."""
    relay: RelayStats | None
    """This process's relay of the outbox (None when it runs elsewhere)."""


class Outbox:
    """An outbox of one producer group in one database.  Declare it with
    :meth:`txmsg.TxMsg.add_outbox`; the app runs its relay between ``start()`` and ``close()``.

    The options (keyword-only, as ``add_outbox`` takes them) are those of
    :func:`txmsg.outbox_options.build_outbox_options`; an outbox made here checks topics by
    RocketMQ's rules, one the app makes by its backend's too.
    """

    @declares_with(build_outbox_options)
    def __init__(self, **options: Any) -> None:
        self._configure(build_outbox_options((rocketmq_rule,), **options))

    @classmethod
    def of(cls, options: OutboxOptions) -> Outbox:
        """The outbox of validated ``options`` (how ``TxMsg.add_outbox`` makes one)."""
        outbox = cls.__new__(cls)
        outbox._configure(options)
        return outbox

    def _configure(self, options: OutboxOptions) -> None:
        self.options = options
        self.group = options.group
        self.session_factory = options.session_factory
        self.relay_in_process = options.relay
        self.retry = options.retry if options.retry is not None else RetryPolicy()
        self.poll_interval = options.poll_interval
        self.batch_size = options.batch_size
        self.max_body_bytes = options.max_body_bytes
        self.lease = options.lease
        self.send_timeout = options.send_timeout
        self.name_rules = options.name_rules
        self._relay: Relay | None = None
        self._channel = notify.channel_of(self.group)
        self._watching: list[int] = []
        self._lock = threading.Lock()
        _listen_once()

    # ---- writing --------------------------------------------------------------------------------
    def send(
        self,
        session: Session | scoped_session[Session],
        topic: str,
        payload: Any,
        **options: Unpack[RowOptions],
    ) -> OutboxReceipt:
        """Write ``payload`` for ``topic`` into the outbox, in ``session``'s transaction.

        Nothing is sent now: the relay sends the row after the transaction commits, and a
        rollback leaves nothing.  The options are :class:`txmsg.sending.RowOptions`: those of
        ``Producer.send`` and ``sharding_key``, with which the key's rows are sent with
        ``send_orderly`` (RocketMQ 5: the FIFO message group), one at a time, in the order their
        transactions committed (a second transaction writing the same key waits here until the
        first one ends).  A delay counts from the relay's send; ``TXMSG_DEDUP_KEY`` is set by
        the relay.

        Returns the row's id, stable message key and ``seq``.

        Raises:
            InvalidNameError: the topic name is refused by RocketMQ or the app's backend.
            InvalidMessageError: the payload cannot be converted or is over ``max_body_bytes``;
                an invalid option (a delayed ordered message, a reserved property, ...); or
                ``session`` is not a SQLAlchemy ``Session`` (or ``scoped_session``).
        """
        if isinstance(session, scoped_session):
            session = session()  # the thread's (or request's) current session
        if not isinstance(session, Session):
            raise InvalidMessageError(
                f"outbox {self.group}: send() writes in your transaction, so it needs your "
                f"SQLAlchemy Session (outbox.send(session, topic, payload)), not "
                f"{type(session).__name__}"
            )
        check_keywords("send", options, RowOptions)
        values = row_values(
            self.group,
            topic,
            payload,
            options,
            name_rules=self.name_rules,
            max_body_bytes=self.max_body_bytes,
        )
        relay = self._relay
        channel = None
        if (relay is None or relay.state == "closed") and notify.needed(session, self._channel):
            channel = self._channel  # the relay runs elsewhere: wake it at our commit (PG)
        receipt = write_row(session, values, notify=channel)
        if channel is not None:
            notify.mark(session, channel)
        if relay is not None:
            relay.delete_sent_in(session)  # SQLite: the rows it sent, under our write lock
        session.info.setdefault(WAKE_MARK, set()).add(self)
        return receipt

    # ---- the relay ------------------------------------------------------------------------------
    def start_relay(self, sender: OutboxSender, *, hooks: Sequence[DeadHook] = ()) -> Relay:
        """Start this process's relay of the outbox, sending with ``sender`` (the group's
        :class:`txmsg.Producer`); ``hooks`` get each dead row.  The app calls it at ``start()``.

        Raises:
            LifecycleError: a relay of this outbox runs in this process already.
            ConfigError: as :meth:`Relay.start`.
        """
        with self._lock:
            if self._relay is not None and self._relay.state != "closed":
                raise LifecycleError(
                    f"outbox {self.group!r} already has a relay in this process; close it first"
                )
            relay = Relay(self, sender, hooks=hooks)
            relay.start()
            self._relay = relay
            if not self._watching:  # txmsg.outbox.* gauges while the relay runs here
                self._watching = gauges.watch_outbox(self.group, self._backlog)
            return relay

    def _backlog(self) -> tuple[int, float | None]:
        (backlog,) = self._backlogs()
        return backlog.unsent, backlog.oldest_unsent_age()

    def _backlogs(self) -> list[store.Backlog]:
        relay = self._relay
        # the keys before the read (see LeasedRows.cycle): sent rows deleted meanwhile are gone
        sent = relay.sent_not_deleted() if relay is not None else []
        return store.backlogs(self.session_factory, self.group, sent=sent)

    @property
    def relay(self) -> Relay | None:
        """This process's relay of the outbox (None when it has none)."""
        return self._relay

    def wake(self) -> None:
        """Wake this process's relay (the commit of a session that wrote rows does)."""
        relay = self._relay
        if relay is not None:
            relay.wake()

    def stop_relay(self, timeout: float = 10.0) -> None:
        """Close this process's relay, if any (see :meth:`Relay.close`)."""
        watching, self._watching = self._watching, []
        gauges.unwatch_all(watching)
        relay = self._relay
        if relay is not None:
            relay.close(timeout)

    # ---- figures and operations -----------------------------------------------------------------
    def stats(self) -> OutboxStats:
        """Unsent rows, the oldest unsent row's age and dead rows (one query), with this
        process's relay figures."""
        (backlog,) = self._backlogs()
        relay = self._relay
        return OutboxStats(
            group=self.group,
            unsent=backlog.unsent,
            oldest_unsent_age=backlog.oldest_unsent_age(),
            dead=backlog.dead,
            relay=relay.stats() if relay is not None else None,
        )

    def rows(
        self, *, state: str | None = None, sharding_key: str | None = None, limit: int = 100
    ) -> list[store.OutboxRowView]:
        """Unsent and dead rows (``state="DEAD"`` for dead ones only), a key's in send order."""
        return store.rows(
            self.session_factory, self.group, state=state, sharding_key=sharding_key, limit=limit
        )

    def retry_dead(
        self, *, sharding_key: str | None = None, ids: Sequence[int] | None = None
    ) -> list[int]:
        """Make dead rows (all, a key's, or ``ids``) pending again; returns their ids."""
        return self._on_dead(store.retry_dead, sharding_key, ids)

    def discard_dead(
        self, *, sharding_key: str | None = None, ids: Sequence[int] | None = None
    ) -> list[int]:
        """Delete dead rows (all, a key's, or ``ids``) unsent; returns their ids."""
        return self._on_dead(store.discard_dead, sharding_key, ids)

    def _on_dead(
        self,
        change: Callable[..., list[int]],
        sharding_key: str | None,
        ids: Sequence[int] | None,
    ) -> list[int]:
        """``change`` (:func:`store.retry_dead` or :func:`store.discard_dead`) on this outbox's
        dead rows, then wake this process's relay when a row changed: retried rows are due now,
        and a discarded row's key lets its later rows go, so neither waits for the next poll."""
        found = change(self.session_factory, self.group, sharding_key=sharding_key, ids=ids)
        if found:
            self.wake()
        return found

    def __repr__(self) -> str:
        where = "relay in process" if self.relay_in_process else "relay elsewhere"
        return f"<Outbox group={self.group!r} {where}>"
