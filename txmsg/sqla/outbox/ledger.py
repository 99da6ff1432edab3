"""Rows a SQLite relay sent and has not deleted yet, deleted by the next writer's transaction.

Why: on SQLite one connection at a time holds the write lock.  A relay that deleted its sent rows
in its own write transactions took that lock several times a second while the service's writers
wanted it almost all the time; whoever found it taken slept in SQLite's busy handler (1, 2, 5,
10 ... 100 ms), the writers losing commits, the relay's next cycle (and so every message behind
it) waiting.  A writer holds the lock anyway from its first write to its commit, so
:meth:`txmsg.sqla.outbox.Outbox.send` deletes the rows this process's relay reported sent in the
same transaction (one ``DELETE`` for all of them): the relay's steady state has no write
transaction at all.  When no writer comes (the relay's own process, a quiet service), the relay
deletes them itself a moment later (:data:`txmsg.sqla.outbox.claims.SELF_DELETE_AFTER`).

Until a deletion commits, the relay's reads leave the rows out by their ``message_key``
(:func:`txmsg.sqla.outbox.store.due_chains`), so nothing is sent twice.  Keys, not ids: SQLite
hands a deleted row's id out again, a ``message_key`` never repeats.

An entry is *free* (nobody is deleting it) or *claimed* by one transaction: the writer's commit
removes it (:meth:`done`), a rollback or a transaction closed without commit frees it again
(:meth:`release`), and a claim left by a transaction that never ended is freed after
:data:`CLAIM_TIMEOUT` seconds (deleting a row twice is harmless).  A closing relay deletes the
free entries; claimed ones are left to their transactions (a rollback after the relay closed
leaves the rows, sent again by the next relay).  A relay killed with entries here sends those rows again after its restart: at
least once, as when it dies between a send and its mark; every copy carries the stable key.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable

CLAIM_TIMEOUT = 30.0
"""Seconds after which a claim whose transaction never ended is freed."""


class SentLedger:
    """The sent, not yet deleted rows of one relay, by ``message_key`` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[str, float] = {}
        self._claims: dict[int, tuple[float, list[str]]] = {}
        self._tokens = itertools.count(1)

    def add(self, keys: Iterable[str]) -> None:
        """The broker stored these rows: they are to be deleted."""
        now = time.monotonic()
        with self._lock:
            for key in keys:
                self._free[key] = now

    def keys(self) -> list[str]:
        """Every row still to be deleted (free or claimed): what the relay's reads leave out."""
        with self._lock:
            out = list(self._free)
            for _, keys in self._claims.values():
                out.extend(keys)
        return out

    def has_free(self) -> bool:
        """Whether a deletion could take something (cheap: called by every ``outbox.send``)."""
        return bool(self._free)

    def oldest_free(self) -> float | None:
        """``time.monotonic()`` when the oldest free entry was added (None: none is free)."""
        with self._lock:
            return min(self._free.values(), default=None)

    def claim(self) -> tuple[int, list[str]] | None:
        """Take every free entry for one deletion: (token, keys), or None when none is free."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            if not self._free:
                return None
            keys = list(self._free)
            self._free.clear()
            token = next(self._tokens)
            self._claims[token] = (now, keys)
            return token, keys

    def done(self, token: int) -> None:
        """The claim's deletion committed: its rows are gone."""
        with self._lock:
            self._claims.pop(token, None)

    def release(self, token: int) -> None:
        """The claim's deletion did not commit: its rows are to be deleted again."""
        with self._lock:
            claim = self._claims.pop(token, None)
            if claim is not None:
                for key in claim[1]:
                    self._free.setdefault(key, claim[0])

    def _expire(self, now: float) -> None:
        stale = [t for t, (at, _) in self._claims.items() if now - at > CLAIM_TIMEOUT]
        for token in stale:
            at, keys = self._claims.pop(token)
            for key in keys:
                self._free.setdefault(key, at)

    def __len__(self) -> int:
        with self._lock:
            return len(self._free) + sum(len(k) for _, k in self._claims.values())
