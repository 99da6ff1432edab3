"""A hashed timing wheel: when the relay must wake up next for a row whose back-off ends.

Why a wheel and not a timer per row: during a broker outage every pending row is in back-off at
once (thousands of them); scheduling one is O(1) here (append to the slot of its tick), and the
relay asks only "what is due now" and "when is the next one due" between its cycles, without a
thread or a ``threading.Timer`` per row.  The durable truth is the row's ``next_attempt_at``: the
wheel only wakes the relay (a relay that restarts finds rows in back-off by its poll).

Times are ``time.monotonic()`` seconds.  Not thread-safe by itself: the relay's thread owns it
(the relay guards it with its lock).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from txmsg.errors import ConfigError


@dataclass
class _Entry:
    deadline: float
    item: Hashable


@dataclass
class TimeWheel:
    """``slots`` buckets of ``tick`` seconds each: an entry due in ``d`` seconds goes into the
    bucket ``d / tick`` ahead (modulo ``slots``) and waits ``d // (tick * slots)`` further turns.

    An entry comes out of :meth:`due` at its deadline rounded up to the next tick, never before.
    """

    tick: float = 0.05
    slots: int = 512
    clock: Callable[[], float] = time.monotonic
    """Where "now" comes from when the first entry is scheduled (tests pass their own)."""
    _buckets: list[list[_Entry]] = field(init=False, repr=False)
    _cursor: int | None = field(init=False, default=None)
    """The last tick whose due entries are all out (None before the first use)."""
    _size: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tick) and self.tick > 0):
            raise ConfigError(f"tick must be a positive number of seconds, got {self.tick!r}")
        if self.slots < 1:
            raise ConfigError(f"slots must be >= 1, got {self.slots!r}")
        self._buckets = [[] for _ in range(self.slots)]
        self._cursor = None

    def __len__(self) -> int:
        return self._size

    def _tick_of(self, at: float) -> int:
        return math.ceil(at / self.tick)

    def schedule(self, item: Hashable, at: float) -> None:
        """Have ``item`` come out of :meth:`due` once the clock reaches ``at``."""
        tick = self._tick_of(at)
        if self._cursor is None:
            self._cursor = self._tick_of(self.clock()) - 1
        tick = max(tick, self._cursor + 1)  # a deadline already passed: the next tick
        self._buckets[tick % self.slots].append(_Entry(at, item))
        self._size += 1

    def due(self, now: float) -> list[Hashable]:
        """The items whose deadline is at or before ``now``, in deadline order; removed."""
        target = self._tick_of(now)
        if self._cursor is None or self._size == 0:
            self._cursor = target - 1 if self._cursor is None else max(self._cursor, target - 1)
            return []
        start = self._cursor + 1
        out: list[_Entry] = []
        # the ticks from the cursor up to now, at most one turn: after a long sleep one turn
        # visits every bucket, and each entry is judged by its own deadline
        for tick in range(start, min(target, start + self.slots - 1) + 1):
            index = tick % self.slots
            bucket = self._buckets[index]
            if bucket:
                self._buckets[index] = [e for e in bucket if e.deadline > now]
                out.extend(e for e in bucket if e.deadline <= now)
        # the tick of `now` is visited again next time: its later part has not come yet
        self._cursor = max(self._cursor, target - 1)
        self._size -= len(out)
        out.sort(key=lambda e: e.deadline)
        return [entry.item for entry in out]

    def next_deadline(self) -> float | None:
        """The earliest deadline still in the wheel (None when it is empty)."""
        if self._size == 0:
            return None
        # the nearest bucket with an entry holds the earliest deadline unless every entry is
        # more than a turn away; scanning one turn finds it either way
        best: float | None = None
        cursor = self._cursor or 0
        for offset in range(1, self.slots + 1):
            bucket = self._buckets[(cursor + offset) % self.slots]
            for entry in bucket:
                if best is None or entry.deadline < best:
                    best = entry.deadline
            if best is not None and best <= (cursor + offset) * self.tick:
                return best  # within this tick: nothing later in the scan can be earlier
        return best

    def clear(self) -> None:
        """Forget every entry."""
        for bucket in self._buckets:
            bucket.clear()
        self._size = 0
