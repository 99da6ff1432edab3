"""The relay: sends committed outbox rows with the backend's plain and ordered sends.

One relay thread per outbox and process.  It runs a *cycle* whenever something may be due: woken
by the commit of a session that wrote outbox rows (SQLAlchemy's ``after_commit``, so a message
normally reaches the broker milliseconds after its transaction), by the time wheel when a row's
back-off ends, and at least every ``poll_interval`` seconds for rows other processes left
(a crashed service, another instance, ``txmsg outbox retry``).

A cycle takes up to ``batch_size`` due rows (rows without a sharding key, and the *first* row of
each key), each keyed one with up to :data:`PER_KEY` - 1 next rows of its key
(:func:`txmsg.sqla.outbox.store.due_chains`), sends them with the producer's asynchronous sends
(``send_orderly_async`` with the sharding key for keyed rows): the rows of different keys at once,
a key's rows one after the other, each once the broker acknowledged the one before (at most one
row per key is in flight, so they reach the broker in order; a failed row ends its key's chain);
takes the answers as they come, then deletes the sent rows (SQLite: see below) and records the
failures.

Several relays on PostgreSQL share the rows: a cycle's first rows are taken ``FOR UPDATE SKIP
LOCKED`` and stay locked while they are sent, in the transaction that deletes them, so a row is
sent by one relay at a time.  On SQLite (no row locks; one writer at a time) one relay per outbox
and database sends, holding a lease row renewed every ``lease / 3`` seconds; another stands by
and takes over when the holder closes, dies (a process of this host that no longer exists) or
stops renewing; the rows it sent are deleted by the next writer's transaction
(:mod:`txmsg.sqla.outbox.ledger`).  The cycle is the same for both; what differs is the small
strategy of :mod:`txmsg.sqla.outbox.claims`.

Failures: a row the backend refused for good (:func:`txmsg.sqla.outbox.policy.is_permanent`) is
dead at once; any other failure is retried after the :class:`~txmsg.sqla.outbox.policy.RetryPolicy`
back-off (its key's later rows wait; other keys flow), and dead after the last attempt.  Dead
rows are logged at ERROR and handed to the ``@app.on_outbox_dead`` hooks.  When every send of a
cycle failed (a broker down), the relay also pauses as a whole, 0.5 s doubling up to 30 s, so it
does not hammer a broker that is coming back.  When the database fails, the relay logs it and
tries again, backing off the same way: nothing is lost, the rows wait in the database.

At least once: a relay killed after the broker stored a message and before the row's deletion
committed leaves the row, and it is sent again.  Every copy carries the row's stable key in the
``TXMSG_DEDUP_KEY`` property, on which idempotent consumers de-duplicate.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from sqlalchemy import Engine, inspect
from sqlalchemy.orm import Session

from txmsg.errors import ClosedError, ConfigError, LifecycleError, SendError
from txmsg.message import DEDUP_KEY, SendResult
from txmsg.sending import DelayOptions, OrderedOptions
from txmsg.sqla.engine import is_in_memory_sqlite
from txmsg.sqla.liveness import host_identity, new_owner
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox import store
from txmsg.sqla.outbox.claims import Claims, Marks, Outcome, Row, claims_for
from txmsg.sqla.outbox.models import OutboxKey, OutboxMessage, OutboxRelayLease
from txmsg.sqla.outbox.notify import CommitListener, channel_of
from txmsg.sqla.outbox.policy import (
    FIRST_PAUSE,
    MAX_PAUSE,
    describe,
    doubling,
    is_permanent,
    pause_after_failure,
)
from txmsg.sqla.outbox.wheel import TimeWheel

if TYPE_CHECKING:
    from txmsg.sqla.outbox.outbox import Outbox

log = logging.getLogger("txmsg.outbox")

PER_KEY = 32
"""Rows of one sharding key a cycle sends, one after the other (see :func:`store.due_chains`)."""
LINGER = 0.01
"""Longest pause (seconds) between the end of a cycle that sent rows and the next cycle.  Why:
woken by every commit, a busy relay would run one read and one delete transaction per commit;
on SQLite each delete takes the one write lock the writers need, and a writer that finds it
taken sleeps in SQLite's busy handler (1 ms, then 2, 5, 10 ...), cutting the writers' commit
rate (docs/guide/outbox.md#measured).  At most 100 cycles a second, each carrying what was
committed meanwhile (up to ``batch_size``), costs a message at most this long, and only while
the relay is busy (see :data:`LINGER_FULL`)."""
LINGER_FULL = 16
"""Rows of a cycle from which the relay lingers the whole :data:`LINGER`; a cycle with fewer
lingers that share of it.  Why: a fixed pause after every cycle that sent something would make
a service committing a few hundred messages a second wait most of it per message although its
relay is nearly idle (docs/guide/outbox.md#measured).  Scaled, the pause adapts itself: at a
low rate cycles carry one or two rows and pause well under a millisecond; as the rate grows,
cycles find more rows, pause longer and gather more, so the batching that protects the writers
holds where it is needed."""
PURGE_EVERY = 600.0
"""Seconds between two purges of idle key lock rows."""
KEY_IDLE = timedelta(hours=1)
"""A key lock row without rows is purged after this long unused."""


def linger_after(taken: int) -> float:
    """Seconds the relay pauses after a cycle that took ``taken`` rows (:data:`LINGER_FULL`)."""
    return LINGER * min(1.0, max(0, taken) / LINGER_FULL)


class OutboxSender(Protocol):
    """What the relay needs of a producer: :class:`txmsg.Producer`'s asynchronous sends."""

    def send_async(
        self, topic: str, payload: Any, **options: Unpack[DelayOptions]
    ) -> Future[SendResult]: ...

    def send_orderly_async(
        self, topic: str, payload: Any, **options: Unpack[OrderedOptions]
    ) -> Future[SendResult]: ...


@dataclass(frozen=True)
class OutboxDeadEvent:
    """What an ``@app.on_outbox_dead`` hook receives when a row becomes dead."""

    group: str
    """The outbox (its producer group)."""
    id: int
    message_key: str
    topic: str
    sharding_key: str | None
    attempts: int
    error: str
    """The last send's error, as ``"Type: message"``."""
    permanent: bool
    """True when the backend refused the message for good (dead at the first attempt)."""
    dead_at: datetime


DeadHook = Callable[[OutboxDeadEvent], Any]


@dataclass(frozen=True)
class RelayStats:
    """Figures of one relay since it started."""

    state: str
    """``new``, ``running``, ``standby`` (SQLite: another relay holds the lease), ``closed``."""
    owner: str
    sent: int
    failed: int
    """Failed send attempts (each retried or dead)."""
    dead: int
    cycles: int
    """Cycles run (looks at the outbox, with or without rows to send)."""
    in_back_off: int
    """Rows this relay is waiting to retry (its time wheel)."""


@dataclass(frozen=True)
class _Cycle:
    """What a cycle tells the relay's loop."""

    taken: int = 0
    """Rows the cycle took (0: nothing was due)."""
    more: bool = False
    """Probably more due now (the cycle took all it could)."""
    broker_down: bool | None = None
    """Every send failed, none for good (None: nothing was sent)."""


class Relay:
    """The relay of one outbox in this process (see the module docstring).

    One cycle for every database; what differs between them (row locks, or a lease and a
    ledger of sent rows) is the strategy of :mod:`txmsg.sqla.outbox.claims`, chosen when the
    relay first looks at its database (:attr:`claims`).

    Made by :meth:`txmsg.sqla.outbox.Outbox.start_relay` (the app calls it at ``start()``; the
    ``txmsg outbox relay`` command in a process of its own).
    """

    def __init__(
        self,
        outbox: Outbox,
        sender: OutboxSender,
        *,
        hooks: Sequence[DeadHook] = (),
    ) -> None:
        self.outbox = outbox
        self.sender = sender
        self.hooks = tuple(hooks)
        self.host = host_identity()
        self.owner = new_owner(self.host)
        self.claims: Claims | None = None
        """How this relay claims rows in its database (None until it has looked at it)."""
        self.listener: CommitListener | None = None
        """PostgreSQL, while the relay's thread runs: the connection that wakes it at other
        processes' commits (:mod:`txmsg.sqla.outbox.notify`)."""
        self._engine: Engine | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._wheel = TimeWheel()
        self._thread: threading.Thread | None = None
        self._state = "new"
        self._purged = time.monotonic()
        self._counts = {"sent": 0, "failed": 0, "dead": 0, "cycles": 0}

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Relay:
        """Check the database and start the relay's thread.

        Raises:
            ConfigError: the outbox tables are missing (``txmsg.sqla.create_tables(engine)``),
                or the database is an in-memory SQLite one (its one connection cannot be shared
                by the relay's thread and the writers').
            LifecycleError: the relay was closed.
        """
        if self._state == "closed":
            raise LifecycleError(f"the relay of outbox {self.outbox.group!r} is closed")
        if self._thread is not None:
            return self
        self._database().start()
        if self._engine is not None and self._engine.dialect.name == "postgresql":
            self.listener = CommitListener(
                self._engine, channel_of(self.outbox.group), self.wake, self.outbox.group
            ).start()
        self._state = "running"
        self._thread = threading.Thread(
            target=self._run, name=f"txmsg-outbox-{self.outbox.group}", daemon=True
        )
        self._thread.start()
        log.info("outbox=%s: relay %s started", self.outbox.group, self.owner)
        return self

    def _database(self) -> Claims:
        """The strategy of the outbox's database, after checking it (once)."""
        if self.claims is not None:
            return self.claims
        with self.outbox.session_factory() as session:
            bind = session.get_bind()
            engine: Engine = bind if isinstance(bind, Engine) else bind.engine
            tables = [
                OutboxMessage.__tablename__,
                OutboxKey.__tablename__,
                OutboxRelayLease.__tablename__,
            ]
            inspector = inspect(session.connection())
            missing = [t for t in tables if not inspector.has_table(t)]
        if missing:
            raise ConfigError(
                f"outbox {self.outbox.group!r}: table(s) {', '.join(missing)} missing in its "
                "database; create them with txmsg.sqla.create_tables(engine) (or add "
                "txmsg.sqla.metadata to your Alembic target_metadata and migrate)"
            )
        if engine.dialect.name == "sqlite" and is_in_memory_sqlite(engine):
            raise ConfigError(
                f"outbox {self.outbox.group!r}: its database is an in-memory SQLite one, which "
                "the relay's thread cannot share with your transactions; use a file "
                "(sqlite:///var/app.db) or PostgreSQL"
            )
        self._engine = engine
        self.claims = claims_for(self.outbox, engine, owner=self.owner, host=self.host)
        return self.claims

    def wake(self) -> None:
        """Run a cycle now (called after a commit that wrote rows of this outbox)."""
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the cycle in progress (its sends are answered or time out) and give the
        SQLite lease up so a standby relay takes over at once.  Idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        self._stop.set()
        self._wake.set()
        if self.listener is not None:
            self.listener.close()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "outbox=%s: the relay did not stop within %.0f s (a send still waiting for "
                    "the broker); its rows stay in the outbox and are sent again",
                    self.outbox.group,
                    timeout,
                )
                return
        claims = self.claims
        if claims is not None:
            try:
                claims.tidy(everything=True)
            except Exception:
                log.warning(
                    "outbox=%s: could not delete the rows sent last; the next relay sends them "
                    "again (consumers de-duplicate on their stable key)",
                    self.outbox.group,
                    exc_info=True,
                )
            try:
                claims.release()
            except Exception:  # noqa: BLE001 - the lease runs out on its own
                log.warning("outbox=%s: could not release the relay lease", self.outbox.group)
        log.info("outbox=%s: relay %s closed", self.outbox.group, self.owner)

    @property
    def state(self) -> str:
        """``new``, ``running``, ``standby`` or ``closed``."""
        return self._state

    def sent_not_deleted(self) -> list[str]:
        """SQLite: message keys of the rows this relay sent whose deletion has not committed
        (the outbox's figures do not count them as unsent)."""
        return self.claims.sent_not_deleted() if self.claims is not None else []

    def delete_sent_in(self, session: Session) -> None:
        """SQLite: delete this relay's sent rows in ``session``'s transaction, which has just
        written an outbox row (:meth:`Outbox.send` calls it;
        :meth:`txmsg.sqla.outbox.claims.LeasedRows.delete_sent_in`)."""
        if self.claims is not None:
            self.claims.delete_sent_in(session)

    def stats(self) -> RelayStats:
        """Figures since the relay started."""
        with self._lock:
            counts = dict(self._counts)
            in_back_off = len(self._wheel)
        return RelayStats(
            state=self._state,
            owner=self.owner,
            sent=counts["sent"],
            failed=counts["failed"],
            dead=counts["dead"],
            cycles=counts["cycles"],
            in_back_off=in_back_off,
        )

    def drain(self) -> int:
        """Send what is due now in the calling thread, cycle after cycle, until a cycle finds
        nothing due or sends nothing; returns how many rows were sent.  For ``txmsg outbox
        relay --drain`` (a one-off or cron-style relay) and tests; not while this relay's thread
        runs.

        Rows in back-off (not due yet) and dead rows stay.  On SQLite the relay takes the lease
        first and gives it up at the end.

        Raises:
            LifecycleError: the relay's thread is running, or (SQLite) another relay holds the
                lease.
            ConfigError: as :meth:`start`.
        """
        if self._thread is not None and self._thread.is_alive():
            raise LifecycleError(
                f"outbox {self.outbox.group!r}: the relay's thread is running; drain() is for a "
                "relay without one"
            )
        claims = self._database()
        refused = claims.drain_refused()
        if refused is not None:
            raise LifecycleError(refused)
        before = self.stats().sent
        try:
            while True:
                sent = self.stats().sent
                if not self.cycle() or self.stats().sent == sent:
                    break  # nothing due, or nothing went (the broker refuses: not in a loop)
        finally:
            claims.release()
        return self.stats().sent - before

    # ---- the loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        streak = 0  # cycles in a row whose sends all failed
        claims = self._database()
        while not self._stop.is_set():
            try:
                if not self._ready(claims):
                    self._stop.wait(min(self.outbox.poll_interval, self.outbox.lease / 3))
                    continue
                self._wake.clear()
                cycle = self._cycle(deferred=True)
                claims.tidy()
                failures = 0
                self._purge_idle_keys()
            except Exception as exc:  # noqa: BLE001 - logged by pause_after_failure
                failures += 1
                pause_after_failure(
                    self._stop,
                    failures,
                    self.outbox.group,
                    "relay cycle failed",
                    describe(exc),
                    "the rows stay in the outbox",
                )
                continue
            if cycle.broker_down is not None:
                streak = streak + 1 if cycle.broker_down else 0
            if streak:
                # every send of the cycle failed: give the broker time, whatever wakes us
                self._stop.wait(doubling(streak, FIRST_PAUSE, MAX_PAUSE))
                continue
            if cycle.more:
                continue  # probably more due now
            ended = time.monotonic()
            self._wake.wait(self._timeout(claims))
            if cycle.taken:
                # busy (the last cycle had rows): let the commits of the next moment join this
                # cycle, so the relay's reads and deletes come in batches instead of one pair
                # of transactions per commit - the busier, the longer (LINGER_FULL); idle, a
                # commit is sent at once
                self._stop.wait(max(0.0, linger_after(cycle.taken) - (time.monotonic() - ended)))
            with self._lock:
                self._wheel.due(time.monotonic())

    def _ready(self, claims: Claims) -> bool:
        """Whether this relay may send now; its state follows (``standby`` while it may not)."""
        ready = claims.ready()
        if ready and self._state == "standby":
            self._state = "running"
        elif not ready and self._state != "closed":
            self._state = "standby"
        return ready

    def _timeout(self, claims: Claims) -> float:
        timeout = self.outbox.poll_interval
        with self._lock:
            deadline = self._wheel.next_deadline()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        return claims.wait(timeout)

    def _purge_idle_keys(self) -> None:
        if time.monotonic() - self._purged < PURGE_EVERY:
            return
        self._purged = time.monotonic()
        purged = store.purge_idle_keys(
            self.outbox.session_factory, self.outbox.group, idle_for=KEY_IDLE
        )
        if purged:
            log.debug("outbox=%s: purged %d idle key lock rows", self.outbox.group, purged)

    # ---- one cycle ------------------------------------------------------------------------------
    def cycle(self) -> int:
        """Send what is due now, in the calling thread; returns how many rows it took.

        The relay's thread calls it; so may a test or a one-off command (with the relay's
        thread not running).  On SQLite it does not check the lease: the caller holds it.  The
        rows it sent are deleted when it returns.
        """
        return self._cycle(deferred=False).taken

    def _cycle(self, *, deferred: bool) -> _Cycle:
        """:meth:`cycle`; ``deferred`` (the relay's thread): the database's strategy may
        delete the sent rows later (SQLite's ledger)."""
        claims = self._database()
        with self._lock:
            self._counts["cycles"] += 1
        limit = self.outbox.batch_size
        chains, marks = claims.cycle(limit, self._due, self._send, self._mark, deferred=deferred)
        if marks is None:
            return _Cycle()
        self._after(marks)
        return _Cycle(
            taken=sum(len(chain) for chain in chains),
            more=len(chains) >= limit or any(len(c) >= PER_KEY for c in chains),
            broker_down=(
                marks.failed > 0
                and marks.sent == 0
                and not any(event.permanent for event in marks.dead)
            ),
        )

    def _due(
        self, session: Session, limit: int, lock: bool, sent: list[str] | None
    ) -> list[list[Row]]:
        found = store.due_chains(
            session, self.outbox.group, limit=limit, per_key=PER_KEY, lock=lock, sent=sent
        )
        return [[Row.of(r) for r in chain] for chain in found]

    def _send(self, chains: list[list[Row]]) -> list[Outcome]:
        return send_chains(self.sender, chains, self.outbox.send_timeout)

    def _mark(self, session: Session, outcomes: list[Outcome], delete: bool) -> Marks:
        """Delete the sent rows (unless not ``delete``: the ledger's), record the failures (in
        the caller's transaction)."""
        marks = Marks()
        policy = self.outbox.retry
        now = utcnow()
        if delete:
            sent = [o.row.id for o in outcomes if o.result is not None]
            store.delete_sent(session, sent)
            marks.sent = len(sent)
        for outcome in outcomes:
            if outcome.error is None:
                continue
            row, error = outcome.row, outcome.error
            attempts = row.attempts + 1
            permanent = is_permanent(error)
            text = describe(error)
            marks.failed += 1
            marks.errors.append(text)
            if permanent or policy.exhausted(attempts):
                store.bury(session, row.id, attempts=attempts, error=text, now=now)
                marks.dead.append(
                    OutboxDeadEvent(
                        group=self.outbox.group,
                        id=row.id,
                        message_key=row.message_key,
                        topic=row.topic,
                        sharding_key=row.sharding_key,
                        attempts=attempts,
                        error=store.error_text(text),
                        permanent=permanent,
                        dead_at=now,
                    )
                )
            else:
                delay = policy.delay(attempts)
                store.retry_later(
                    session,
                    row.id,
                    attempts=attempts,
                    next_at=now + timedelta(seconds=delay),
                    error=text,
                )
                marks.retry.append((row.id, delay))
        return marks

    def _after(self, marks: Marks) -> None:
        """Once the marks committed: figures, the wheel, logs, hooks."""
        now = time.monotonic()
        with self._lock:
            self._counts["sent"] += marks.sent
            self._counts["failed"] += marks.failed
            self._counts["dead"] += len(marks.dead)
            for row_id, delay in marks.retry:
                # a tick late: the row's next_attempt_at (wall clock) has surely passed then
                self._wheel.schedule(row_id, now + delay + self._wheel.tick)
        if marks.retry:
            log.warning(
                "outbox=%s: %d send(s) failed, retried after their back-off (first error: %s); "
                "their keys' later rows wait",
                self.outbox.group,
                len(marks.retry),
                marks.errors[0] if marks.errors else "?",
            )
        for event in marks.dead:
            self._dead(event)

    def _dead(self, event: OutboxDeadEvent) -> None:
        key = "" if event.sharding_key is None else f" key={event.sharding_key!r}"
        why = "can never be sent" if event.permanent else f"dead after {event.attempts} attempts"
        log.error(
            "outbox=%s row=%d%s topic=%s message_key=%s: %s (%s)%s. Fix the cause, then "
            "`txmsg outbox retry --app YOUR_MODULE:app --group %s --id %d` (or `txmsg outbox "
            "discard ... --id %d --yes` to drop it)",
            event.group,
            event.id,
            key,
            event.topic,
            event.message_key,
            why,
            event.error,
            "; the key's later rows wait behind it" if event.sharding_key is not None else "",
            event.group,
            event.id,
            event.id,
        )
        for hook in self.hooks:
            try:
                hook(event)
            except Exception:
                log.exception(
                    "outbox=%s: on_outbox_dead hook %r raised (ignored)",
                    event.group,
                    getattr(hook, "__qualname__", hook),
                )


def send_chains(sender: OutboxSender, chains: list[list[Row]], timeout: float) -> list[Outcome]:
    """Send the chains at once - a key's rows one after the other, each once the broker
    acknowledged the one before - and collect the answers.  A failed row ends its chain:
    the rows after it are not sent (they stay as they were, behind it)."""
    outcomes: list[Outcome] = []
    pending: dict[Future[SendResult], tuple[Outcome, deque[Outcome]]] = {}
    # answers arrive here, one at a time: concurrent.futures.wait() over every pending
    # future at each answer cost the relay O(keys) per message, O(keys^2) per cycle
    answered: queue.SimpleQueue[Future[SendResult]] = queue.SimpleQueue()
    for chain in chains:
        rows = deque(Outcome(row) for row in chain)
        outcomes.extend(rows)
        _next(sender, rows, pending, answered)
    deadline = time.monotonic() + timeout
    while pending:
        try:
            future = answered.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            for outcome, rest in pending.values():
                outcome.error = SendError(f"no answer from the broker within {timeout:g} s")
                for later in rest:
                    later.skipped = True
            break
        entry = pending.pop(future, None)
        if entry is None:
            continue
        outcome, rest = entry
        try:
            outcome.result = future.result()
        except ClosedError:
            outcome.skipped = True
        except Exception as exc:  # noqa: BLE001 - recorded on the row
            outcome.error = exc
        if outcome.result is not None:
            _next(sender, rest, pending, answered)
        else:
            for later in rest:
                later.skipped = True
    return outcomes


def _next(
    sender: OutboxSender,
    chain: deque[Outcome],
    pending: dict[Future[SendResult], tuple[Outcome, deque[Outcome]]],
    answered: queue.SimpleQueue[Future[SendResult]],
) -> None:
    """Start the send of the chain's next row (the rest when it cannot even start)."""
    if not chain:
        return
    outcome = chain.popleft()
    row = outcome.row
    properties = {**row.properties, DEDUP_KEY: row.message_key}
    try:
        if row.sharding_key is not None:
            future = sender.send_orderly_async(
                row.topic,
                row.body,
                sharding_key=row.sharding_key,
                keys=row.keys,
                tags=row.tags,
                properties=properties,
            )
        else:
            future = sender.send_async(
                row.topic,
                row.body,
                keys=row.keys,
                tags=row.tags,
                properties=properties,
                delay_level=row.delay_level,
                deliver_at=None if row.deliver_at_ms is None else row.deliver_at_ms / 1000,
            )
    except ClosedError:
        outcome.skipped = True
    except Exception as exc:  # noqa: BLE001 - recorded on the row
        outcome.error = exc
    else:
        pending[future] = (outcome, chain)
        future.add_done_callback(answered.put)
        return
    for later in chain:
        later.skipped = True
