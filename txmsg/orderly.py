"""Orderly listeners: bounded retries in place, then the sharding key is parked, not the queue.

A RocketMQ orderly consumer hands a queue's messages one at a time, in order, and retries a
failing one forever: every later message of the queue waits behind it, whatever its key.  The
handler built here (``@message_listener(..., orderly=True)``; :meth:`ConsumerSpec.safe_handler
<txmsg.consumer.ConsumerSpec.safe_handler>`) bounds that, per message:

1. its sharding key is parked for this group -> the message is parked behind the key (in the
   service's database, in queue order) and acknowledged.  Which keys are parked is kept in memory
   (:class:`~txmsg.sqla.parking.ParkedKeyCache`), read again when that snapshot is older than
   ``refresh_interval`` (0.5 s) or a queue comes to this process (its first message in that
   time), so a key parked by the consumer that had the queue before is seen;
2. else the listener runs; an exception is retried in this thread after ``orderly_retry_delay``
   seconds, up to ``max_orderly_retries`` failures in total; then the key and the message are
   parked (one transaction), an ERROR is logged with the command that replays them, the
   application's ``on_parked`` hooks get a :class:`ParkedEvent`, and the message is acknowledged
   so the queue moves on to other keys;
3. when the database cannot be read or written (down, tables missing), nothing is acknowledged:
   the handler answers False and the backend hands the same message again after a moment, so
   nothing is lost and the order holds.

Messages sent without a sharding key all share the key ``""``.  Parked messages are listed,
replayed and discarded with :mod:`txmsg.sqla.parking` or ``txmsg parked list|retry|discard``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect

from txmsg.aio.callables import is_async
from txmsg.aio.sqla.idempotent import AsyncIdempotentConsumer
from txmsg.errors import ConfigError, ListenerDefinitionError
from txmsg.message import Message
from txmsg.otel import gauges, names
from txmsg.otel import hooks as otel_hooks
from txmsg.sqla import parking
from txmsg.sqla.engine import SessionFactory, bound_engine, is_in_memory_sqlite
from txmsg.sqla.idempotent import IdempotentConsumer
from txmsg.sqla.journal import InflightJournal, Ticket
from txmsg.sqla.models import OrderlyInflight, ParkedKey, ParkedMessage

if TYPE_CHECKING:
    from txmsg.aio.loop import LoopBridge
    from txmsg.consumer import ConsumerSpec

log = logging.getLogger("txmsg.orderly")

REFRESH_INTERVAL = 0.5
"""Seconds the in-memory parked keys (and the journal's keys with rows) are trusted; a queue not
seen for that long is taken as new to this process and reads them again at once."""


PARK_BEHIND_LINGER = 0.02
"""Seconds a message of a parked key waits for others before the batch goes into the parking
table (with the in-flight journal: see :class:`_ParkBehind`)."""
PARK_BEHIND_BATCH = 256
"""Messages of parked keys that are written at once without waiting out the linger."""
PARK_BEHIND_MAX_PENDING = 4096
"""Messages of parked keys held for the table at most; past it the queue is handed the message
again later (the database is not keeping up, or is down)."""


@dataclass(frozen=True)
class ParkedEvent:
    """What an ``on_parked`` hook receives when an orderly listener parks a key."""

    group: str
    topic: str
    sharding_key: str
    message_id: str | None
    error: str
    """The listener's last exception, as ``"Type: message"``."""
    attempts: int
    parked_at: datetime


ParkedHook = Callable[[ParkedEvent], Any]
"""An alert hook: ``app.on_parked`` registers them; exceptions in them are logged, never raised.
An ``async def`` hook runs on the app's event loop (the consumer's thread waits for it)."""


def replay_command(group: str, key: str) -> str:
    """The shell command that replays ``key`` of ``group`` (for logs and docs)."""
    quoted = "''" if key == "" else (key if key.replace("-", "").isalnum() else repr(key))
    return f"txmsg parked retry --app YOUR_MODULE:app --group {group} --key {quoted}"


def orderly_handler(
    spec: ConsumerSpec,
    *,
    on_parked: Sequence[ParkedHook] = (),
    journal: bool = False,
    bridge: LoopBridge | None = None,
) -> OrderlyHandler:
    """The backend handler of an orderly listener (see the module docstring).

    ``journal``: write each message to the in-flight journal before the listener runs
    (:mod:`txmsg.sqla.journal`), for clients that may commit a queue's offset past a message
    still in its callback (``Capabilities.orderly_crash_safe`` False).  ``bridge``: the app's
    event loop, where an ``async def`` listener or hook runs.
    """
    session_factory = spec.session_factory
    if session_factory is None:  # build_consumer_spec refuses this; a hand-made spec may not
        raise ListenerDefinitionError(
            f"orderly listener {spec.name} has no session_factory to park keys in; declare it "
            "with @message_listener(orderly=True, session_factory=...)"
        )
    inflight = InflightJournal(session_factory, spec.group) if journal else None
    handler = OrderlyHandler(
        spec,
        session_factory,
        tuple(on_parked),
        inflight,
        bridge,
        park_behind_linger=PARK_BEHIND_LINGER if journal else None,
    )
    handler.start()
    return handler


class _Freshness:
    """When the handler's snapshots (parked keys, keys with journal rows) must be read again:
    older than ``interval``, or the message's queue was not seen for ``interval`` (it came to
    this process from another consumer, which may have parked or journaled its keys)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int | None], float] = {}
        self._at: float | None = None

    def needed(self, message: Message) -> tuple[bool, bool]:
        """(read the snapshots again?, did the message's queue just come to this process?)"""
        now = time.monotonic()
        queue = (message.topic, message.queue_id)
        with self._lock:
            last = self._seen.get(queue)
            self._seen[queue] = now
            came = last is None or now - last > self.interval
            if came or self._at is None:
                return True, came
            if now - self._at >= self.interval:
                self._at = now  # this thread reads them; the others go on with the old ones
                return True, False
        return False, False

    def refreshed(self, at: float) -> None:
        with self._lock:
            if self._at is None or at > self._at:
                self._at = at

    def failed(self, message: Message) -> None:
        with self._lock:
            self._at = None
            self._seen.pop((message.topic, message.queue_id), None)


class OrderlyHandler:
    """``handler(message)``: True = consumed or parked, False = hand the message again later;
    never raises.  :meth:`close` stops the journal's sweeper (after the consumer stopped)."""

    def __init__(
        self,
        spec: ConsumerSpec,
        session_factory: SessionFactory,
        hooks: tuple[ParkedHook, ...],
        journal: InflightJournal | None,
        bridge: LoopBridge | None = None,
        *,
        refresh_interval: float = REFRESH_INTERVAL,
        park_behind_linger: float | None = None,
    ) -> None:
        """``park_behind_linger``: with the journal, acknowledge a message of a parked key once
        the journal holds it and write such messages into the parking table in batches, after
        waiting that many seconds for more (:class:`_ParkBehind`); None: one transaction per
        message before it is acknowledged."""
        from txmsg.consumer import bridged  # noqa: PLC0415 - txmsg.consumer imports this module

        self.spec = spec
        self.session_factory = session_factory
        self.hooks = tuple(bridged(hook, bridge, _hook_name(hook)) for hook in hooks)
        self.journal = journal
        self.bridge = bridge
        self._call = spec.sync_handler(bridge)  # an async def listener: on the bridge's loop
        self._watching: list[int] = []
        self.parked = parking.ParkedKeyCache(session_factory, spec.group)
        self._fresh = _Freshness(refresh_interval)
        self._behind = (
            _ParkBehind(self, park_behind_linger)
            if journal is not None and park_behind_linger is not None
            else None
        )

    def start(self) -> None:
        """Check the tables are there, then start the journal's sweeper: it finishes what dead
        consumers of the group left, even when no message of their keys comes any more.

        Raises:
            ConfigError: a txmsg table this listener needs is missing (a database created before
                the table existed): every message would wait for it, so say it at start.
                Or the journal's database is an in-memory SQLite one (see the message).
        """
        needed = [ParkedKey.__tablename__, ParkedMessage.__tablename__]
        if self.journal is not None:
            needed.append(OrderlyInflight.__tablename__)
        missing = _missing_tables(self.session_factory, needed)
        if missing:
            raise ConfigError(
                f"orderly listener {self.spec.name} (group {self.spec.group}): table(s) "
                f"{', '.join(missing)} missing in its database; create them with "
                "txmsg.sqla.create_tables(engine), or add txmsg.sqla.models.metadata to your "
                "Alembic target_metadata and migrate"
            )
        if self.journal is not None:
            engine = bound_engine(self.session_factory)
            if engine is not None and is_in_memory_sqlite(engine):
                raise ConfigError(
                    f"orderly listener {self.spec.name} (group {self.spec.group}): its database "
                    "is an in-memory SQLite database, whose one connection the in-flight "
                    "journal's sweeper thread and the consumer's threads would share (and whose "
                    "journal dies with the process it protects against); give the listener a "
                    "SQLite file (sqlite:///orders.db) or a PostgreSQL URL"
                )
            self.journal.start(self._handle)
        factory, group = self.session_factory, self.spec.group
        self._watching = gauges.watch_parked_keys(
            group, lambda: parking.parked_key_count(factory, group)
        )

    def close(self, timeout: float = 10.0) -> None:
        """Write what waits to be parked behind its key, then stop the journal (what could not
        be written stays in the journal for the group's next consumer)."""
        gauges.unwatch_all(self._watching)
        if self._behind is not None:
            self._behind.close(timeout)
        if self.journal is not None:
            self.journal.close(timeout)

    def _refresh(self, message: Message) -> bool:
        """Read the parked keys and the journal's keys again when due (see :class:`_Freshness`);
        True when the message's queue just came to this process.  Messages without a queue (a
        FIFO message group that any consumer may get next) are not served from the snapshot at
        all: see :meth:`_is_parked`."""
        if message.queue_id is None:
            return False
        due, came = self._fresh.needed(message)
        if not due:
            return False
        at = time.monotonic()
        try:
            self.parked.refresh()
            if self.journal is not None:
                self.journal.refresh()
        except BaseException:
            self._fresh.failed(message)
            raise
        self._fresh.refreshed(at)
        return came

    def _is_parked(self, message: Message, key: str) -> bool:
        if message.queue_id is None:
            # No queue held by one consumer at a time (rocketmq5 FIFO): the key's next message
            # may go to another process right after this one parked it, so ask the database.
            return parking.is_parked(self.session_factory, self.spec.group, key)
        return key in self.parked

    def __call__(self, message: Message) -> bool:
        journal = self.journal
        group = self.spec.group
        guard: int | None = None
        if journal is not None:
            try:
                guard = journal.guard(message)  # before any database work: hazard #10
            except Exception as exc:  # noqa: BLE001 - logged with its traceback; handed again
                key = parking.sharding_key_of(message)
                _database_failed(group, message, key, "write it to the in-flight spool", exc)
                return False
        try:
            came = self._refresh(message)
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; False = handed again
            if journal is not None:
                journal.unguard(guard)
            key = parking.sharding_key_of(message)
            _database_failed(group, message, key, "read the parked and journaled keys", exc)
            return False
        if journal is None:
            return self._handle(message, None)
        try:
            entry = journal.admit(message, queue_came=came, guard=guard)
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; False = handed again
            key = parking.sharding_key_of(message)
            _database_failed(group, message, key, "write it to the in-flight journal", exc)
            return False
        ticket = entry.ticket
        if ticket is None:
            log.info(
                "group=%s key=%r msgId=%s: another consumer is finishing this message or an "
                "earlier one of its key; handing it again later",
                group,
                parking.sharding_key_of(message),
                message.message_id,
            )
            return False
        for leftover in entry.before:
            # A consumer died in this key's callback; its message comes first (hazard #10).
            try:
                claimed = journal.claim(leftover)
            except Exception as exc:  # noqa: BLE001 - logged with its traceback
                key = parking.sharding_key_of(message)
                _database_failed(group, message, key, "claim a dead consumer's message", exc)
                claimed = False
            if not claimed or not self._handle(leftover.message, journal.leftover_ticket(leftover)):
                journal.release(ticket)
                return False
        return self._handle(message, ticket)

    def _handle(self, message: Message, ticket: Ticket | None, *, acked: bool = False) -> bool:
        """Park behind a parked key, or run the listener with bounded retries and park.

        ``acked``: the message was acknowledged already, held by the journal for the batch of
        :class:`_ParkBehind`, which calls this when it found the key released: on a database
        failure it keeps the message (and its journal record) and tries again, so False here
        does not hand anything back."""
        key = parking.sharding_key_of(message)
        behind = self._behind_parked_key(message, ticket, key, acked)
        if behind is not None:
            return behind
        tried = self._attempts(message, ticket, key)
        if isinstance(tried, bool):
            return True if tried else self._again(ticket, acked)
        error, attempts = tried
        return self._park(message, ticket, key, error, attempts, acked)

    def _behind_parked_key(
        self, message: Message, ticket: Ticket | None, key: str, acked: bool
    ) -> bool | None:
        """When ``key`` is parked: the message parked behind it (True), or handed again
        (False); None when the key is not parked and the listener is to run."""
        group = self.spec.group
        behind = self._behind if ticket is not None and not acked else None
        try:
            parked = self._is_parked(message, key)
            if behind is not None and ticket is not None:
                held = behind.offer(message, ticket, key, parked=parked)
                if held is True:
                    otel_hooks.add_event(names.EVENT_PARKED_BEHIND, {names.SHARDING_KEY: key})
                    return True
                if held is False:
                    log.warning(
                        "group=%s key=%r msgId=%s: the messages of parked keys waiting for the "
                        "database (at most %d) include this key's, and no more can wait (or "
                        "the consumer is closing); handing this one again later",
                        group,
                        key,
                        message.message_id,
                        PARK_BEHIND_MAX_PENDING,
                    )
                    return self._again(ticket, acked)
            if parked:
                if parking.park_behind(self.session_factory, group, message):
                    log.warning(
                        "group=%s topic=%s key=%r msgId=%s: key is parked; message parked "
                        "behind it (%s)",
                        group,
                        message.topic,
                        key,
                        message.message_id,
                        replay_command(group, key),
                    )
                    otel_hooks.add_event(names.EVENT_PARKED_BEHIND, {names.SHARDING_KEY: key})
                    if self.journal is not None and ticket is not None:
                        self.journal.done(ticket)
                    return True
                self.parked.discard(key)  # released meanwhile (a replay): handle it here
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; False = handed again
            _database_failed(group, message, key, "check whether the key is parked", exc)
            return self._again(ticket, acked)
        return None

    def _attempts(
        self, message: Message, ticket: Ticket | None, key: str
    ) -> bool | tuple[str, int]:
        """The listener, up to ``max_orderly_retries`` times: True when an attempt succeeded,
        False to hand the message again (not its fault: the journal's database, the shutdown),
        else the last error and the attempts made (the key is to be parked)."""
        group, retries = self.spec.group, self.spec.max_orderly_retries
        attempts = 0
        while True:
            attempts += 1
            try:
                self._run(self.spec.handler, message, ticket)
            except _JournalFailed as failed:
                _database_failed(group, message, key, "delete its in-flight row", failed.error)
                return False
            except Exception as exc:
                if self._interrupted(exc):
                    log.warning(
                        "group=%s key=%r msgId=%s: interrupted by the shutdown (%s: %s); handing "
                        "the message again later",
                        group,
                        key,
                        message.message_id,
                        type(exc).__name__,
                        exc,
                    )
                    return False
                error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "group=%s topic=%s key=%r msgId=%s: attempt %d/%d failed: %s",
                    group,
                    message.topic,
                    key,
                    message.message_id,
                    attempts,
                    retries,
                    error,
                    exc_info=attempts >= retries,
                )
                otel_hooks.record_exception(exc, failed=False)  # the outcome decides the status
                if attempts >= retries:
                    return error, attempts
                otel_hooks.add_event(names.EVENT_RETRY, {names.ATTEMPT: attempts})
                time.sleep(self.spec.orderly_retry_delay)
            except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt...: not the message's fault
                log.error(
                    "group=%s key=%r msgId=%s: interrupted (%s); handing the message again later",
                    group,
                    key,
                    message.message_id,
                    type(exc).__name__,
                )
                return False
            else:
                return True

    def _park(
        self,
        message: Message,
        ticket: Ticket | None,
        key: str,
        error: str,
        attempts: int,
        acked: bool,
    ) -> bool:
        """Park ``key`` with its failed message, then log it and call the ``on_parked`` hooks;
        False (handed again) when the database cannot take it."""
        group = self.spec.group
        try:
            parked_at = parking.park(
                self.session_factory, group, message, error=error, attempts=attempts
            )
            self.parked.add(key)
            if self.journal is not None and ticket is not None:
                self.journal.done(ticket)
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; False = handed again
            _database_failed(group, message, key, "park the key", exc)
            return self._again(ticket, acked)
        log.error(
            "group=%s topic=%s key=%r msgId=%s: failed %d times (%s); key PARKED: this key's "
            "later messages are parked behind it, other keys keep flowing. Fix the cause, then "
            "run: %s",
            group,
            message.topic,
            key,
            message.message_id,
            attempts,
            error,
            replay_command(group, key),
        )
        otel_hooks.add_event(
            names.EVENT_PARKED,
            {names.SHARDING_KEY: key, names.ATTEMPT: attempts},
            failed=f"sharding key parked after {attempts} failed attempts",
        )
        event = ParkedEvent(
            group=group,
            topic=message.topic,
            sharding_key=key,
            message_id=message.message_id,
            error=error,
            attempts=attempts,
            parked_at=parked_at,
        )
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:
                log.exception("group=%s key=%r: on_parked hook %r raised", group, key, hook)
        return True

    def _interrupted(self, exc: Exception) -> bool:
        """Whether an ``async def`` listener's attempt ended because the app is closing: the
        close cancelled its coroutine (its drain timed out), or the loop refuses new ones.  Not
        the message's fault, so no retry (it would meet the closed loop) and no parking."""
        if isinstance(exc, concurrent.futures.CancelledError):
            return True
        return self.bridge is not None and is_async(self.spec.handler) and self.bridge.refusing

    def _run(
        self, handler: Callable[[Message], object], message: Message, ticket: Ticket | None
    ) -> None:
        """The listener once; then the journal's record goes (with the effects, when
        idempotent and the message has a row in the table)."""
        journal = self.journal
        if journal is None or ticket is None:
            self._call(message)
            return
        remove = partial(journal.remove, ticket=ticket)
        if isinstance(handler, IdempotentConsumer):
            applied = handler.apply(message, in_same_transaction=remove)
        elif isinstance(handler, AsyncIdempotentConsumer) and self.bridge is not None:
            apply = partial(handler.apply, in_same_transaction=remove)
            applied = self.bridge.run(apply, message, name=self.spec.name)
        else:
            self._call(message)
            applied = False
        try:
            journal.done(ticket, removed=applied)
        except Exception as exc:
            raise _JournalFailed(exc) from exc

    def _again(self, ticket: Ticket | None, acked: bool = False) -> bool:
        if self.journal is not None and ticket is not None and not acked:
            self.journal.release(ticket)
        return False


class _ParkBehind:
    """Messages of parked keys, acknowledged once the in-flight journal holds them and written
    into the parking table by one thread, many per transaction.

    Why: a committed write per message of a parked key before its queue can move on would put
    the queue holding a poisoned key - and every other key of that queue - behind the others
    (docs/guide/ordered.md#measured).  The journal's record (the spool: survives the death of
    the process, not of the machine; see docs/guide/ordered.md) covers the message from its
    acknowledgement until its row is in the table, ``linger`` seconds later or less; then
    :meth:`InflightJournal.done
    <txmsg.sqla.journal.InflightJournal.done>` ends the record.  Killed in between, the group's
    next consumer finds the record and parks the message behind its key, in the key's order
    (or hands it to the listener, if the key was released meanwhile).

    Order: while a key has messages waiting here or being written, its later messages wait
    here too, even when the in-memory parked keys say otherwise (a replay released the key:
    the writer finds no key row and hands the waiting messages to the listener, in order,
    before the later ones).
    """

    def __init__(self, handler: OrderlyHandler, linger: float) -> None:
        self.handler = handler
        self.linger = linger
        self.retry_after = 1.0
        """Seconds before a batch the database refused is tried again."""
        self._cond = threading.Condition()
        self._pending: dict[str, list[tuple[Message, Ticket]]] = {}
        self._count = 0
        self._busy: frozenset[str] = frozenset()
        """Keys whose messages the writer is handling now."""
        self._thread: threading.Thread | None = None
        self._closed = False
        self.batches = 0
        """Transactions written (for tests and the benchmark)."""

    def offer(self, message: Message, ticket: Ticket, key: str, *, parked: bool) -> bool | None:
        """Hold ``message`` (True: acknowledge it), refuse it (False: too many wait; hand it
        again) or leave it to the caller (None: nothing of its key waits here, and it is not
        parked or its record is a table row, which the key's next message would find and wait
        for: such a message is parked behind its key at once, as without the batch)."""
        journal = self.handler.journal
        with self._cond:
            waiting = key in self._pending or key in self._busy
            if not (waiting or (parked and ticket.row_id is None)):
                return None
            if self._closed or self._count >= PARK_BEHIND_MAX_PENDING:
                return False if waiting else None
            if journal is not None:
                journal.hold(ticket)
            self._pending.setdefault(key, []).append((message, ticket))
            self._count += 1
            if self._thread is None:
                group = self.handler.spec.group
                self._thread = threading.Thread(
                    target=self._run, name=f"txmsg-park-behind-{group}", daemon=True
                )
                self._thread.start()
            if self._count == 1 or self._count >= PARK_BEHIND_BATCH:
                # the writer waits for a first message, then for the linger or a full batch:
                # waking it for every message would only hand it the GIL to wait again
                self._cond.notify_all()
            return True

    def waiting(self) -> int:
        with self._cond:
            return self._count + len(self._busy)

    def close(self, timeout: float = 10.0) -> None:
        """Write what waits (one try), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                self._cond.wait_for(
                    lambda: self._closed or self._count >= PARK_BEHIND_BATCH, timeout=self.linger
                )
                batch, self._pending, self._count = self._pending, {}, 0
                self._busy = frozenset(batch)
                closed = self._closed
            left: dict[str, list[tuple[Message, Ticket]]] = {}
            try:
                left = self._write(batch)
            except Exception:  # logged; the batch waits for the next try
                log.exception(
                    "group=%s: could not park %d messages behind their parked keys; they stay "
                    "in the in-flight journal, trying again in %g s",
                    self.handler.spec.group,
                    sum(map(len, batch.values())),
                    self.retry_after,
                )
                left = batch
            with self._cond:
                for key, entries in left.items():
                    later = self._pending.get(key, [])
                    self._pending[key] = entries + later
                    self._count += len(entries)
                self._busy = frozenset()
                if left and closed:
                    return  # the journal keeps them for the group's next consumer
                if left:
                    self._cond.wait_for(lambda: self._closed, timeout=self.retry_after)

    def _write(
        self, batch: dict[str, list[tuple[Message, Ticket]]]
    ) -> dict[str, list[tuple[Message, Ticket]]]:
        """One transaction for the batch; then the journal records end, and the messages of
        keys found released go to the listener (in order).  Returns what is left to try
        again."""
        handler = self.handler
        group, journal = handler.spec.group, handler.journal
        entries = [entry for key_entries in batch.values() for entry in key_entries]
        parked = parking.park_behind_many(
            handler.session_factory, group, [message for message, _ in entries]
        )
        self.batches += 1
        released: dict[str, list[tuple[Message, Ticket]]] = {}
        for (message, ticket), done in zip(entries, parked, strict=True):
            key = parking.sharding_key_of(message)
            if not done:
                released.setdefault(key, []).append((message, ticket))
                continue
            log.warning(
                "group=%s topic=%s key=%r msgId=%s: key is parked; message parked behind it (%s)",
                group,
                message.topic,
                key,
                message.message_id,
                replay_command(group, key),
            )
            if journal is not None:
                try:
                    journal.done(ticket)
                except Exception:  # its table row stays: the sweeper finds it parked later
                    log.warning(
                        "group=%s msgId=%s: parked, but its in-flight row is not deleted yet",
                        group,
                        message.message_id,
                        exc_info=True,
                    )
        left: dict[str, list[tuple[Message, Ticket]]] = {}
        for key, key_entries in released.items():
            handler.parked.discard(key)  # released by a replay: the listener's turn
            for index, (message, ticket) in enumerate(key_entries):
                if not handler._handle(message, ticket, acked=True):
                    left[key] = key_entries[index:]
                    break
        return left


def _hook_name(hook: Callable[..., Any]) -> str:
    module = getattr(hook, "__module__", "?")
    return f"on_parked hook {module}.{getattr(hook, '__qualname__', repr(hook))}"


def _missing_tables(session_factory: SessionFactory, names: list[str]) -> list[str]:
    """Which of ``names`` the database lacks; none when it cannot be asked (a database that is
    down at start is the handler's business: it waits for it, message by message)."""
    engine = bound_engine(session_factory)
    if engine is None:
        return []
    try:
        inspector = inspect(engine)
        return [name for name in names if not inspector.has_table(name)]
    except Exception:  # down or unreachable: not a definition problem
        log.warning("could not check the orderly listener's tables", exc_info=True)
        return []


class _JournalFailed(Exception):
    """The listener succeeded but its journal row could not be deleted (database down)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _database_failed(group: str, message: Message, key: str, what: str, exc: Exception) -> None:
    log.error(
        "group=%s topic=%s key=%r msgId=%s: could not %s (%s: %s); the message is handed again "
        "later (nothing is lost; the queue waits until the database answers)",
        group,
        message.topic,
        key,
        message.message_id,
        what,
        type(exc).__name__,
        exc,
        exc_info=True,
    )
    otel_hooks.record_exception(exc)
