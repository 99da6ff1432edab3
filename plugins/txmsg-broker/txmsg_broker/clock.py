"""The broker's one clock: every time-driven service reads "now" and waits through it.

Why one object: a test that checks a transaction back, a delay level or a queue lock's expiry should
not have to wait for it in wall time (on a loaded 2-core machine such waits are both slow and the
cause of rare failures).  The check-back loop and its interval, ``transactionTimeOut`` and the
immunity, the 5.x op-record batch, the delay levels (and so the consumers' retry back-off) and the
queue-lock expiry all read :meth:`Clock.now` and wait with :meth:`Clock.sleep` / :meth:`Clock.wait`.

* :class:`RealClock` (the default, ``txmsg broker``): wall time, ``asyncio`` waits; behaviour is the
  same as before the clock existed.
* :class:`ManualClock` (``--manual-clock``, tests): time stands still until :meth:`ManualClock.advance`
  moves it; advance runs every wait that became due, in due order, each at its own due time, and
  returns once the woken work is done (see :meth:`ManualClock.settle`).  It changes only *when*
  things run, never *what* runs.

Births and "now".  A client stamps ``bornTimestamp`` with its own wall clock, which keeps running
while the manual clock stands still; the check service computes ``age = now - born``.  A manual
clock that only starts at wall time would see every message sent a while after the broker started
as born in the future (negative age: Java checks such a message back at once, its clock-skew rule).
So the manual clock is a Lamport clock for births: each stored message raises it to its
``bornTimestamp`` if that is later, but never past the wall clock (:meth:`ManualClock.observe`).  The
age of a message is then the time advanced since it was sent (plus the wall time between it and
later sends), and nothing is older than the test made it; a client whose clock runs ahead of the
machine's is still seen as skewed.  Store timestamps are the clock's, so delay levels count from it.

What stays on the wall clock, also with a manual clock: everything the *client* times (heartbeats,
the channel expiry that follows from them, route refreshes, long-poll suspension, gRPC pop invisible
time), log line timestamps, the disk flush, and the reput dispatch delay of the check pass
(``REPUT_INTERVAL_S``, a thread's scheduling, not a business time).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


def wall_ms() -> int:
    """Wall time in ms, as ``System.currentTimeMillis()``."""
    return int(time.time() * 1000)


class Clock(Protocol):
    """What the broker's time-driven services need from a clock."""

    @property
    def manual(self) -> bool:
        """True for a clock only :meth:`ManualClock.advance` moves."""
        ...

    def now(self) -> int:
        """The broker's "now" in ms since the epoch."""
        ...

    def observe(self, born_ms: int) -> None:
        """A message born at ``born_ms`` (the client's clock) is being stored."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set (True) or ``timeout`` seconds of this clock passed (False)."""
        ...


class RealClock:
    """Wall time; waits are ``asyncio``'s.  The default of every broker."""

    manual = False

    def now(self) -> int:
        return wall_ms()

    def observe(self, born_ms: int) -> None:
        """Nothing to do: wall time needs no raising."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if timeout is None:
            await event.wait()
            return True
        if timeout <= 0:
            return event.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return event.is_set()


#: a hook :meth:`ManualClock.settle` awaits once the clock's tasks are parked (e.g. check-back
#: answers); it returns True when it waited for something (the tasks are then settled again)
SettleHook = Callable[[], Awaitable[bool]]


class ManualClock:
    """Time that moves only when :meth:`advance` says so.  Used on the broker's event loop only."""

    manual = True

    def __init__(self, start_ms: int | None = None, *, settle_timeout: float = 30.0) -> None:
        self._now = wall_ms() if start_ms is None else start_ms
        #: (due ms, sequence, owner task, future): the waits with a time limit, earliest first
        self._timers: list[tuple[int, int, asyncio.Task[object] | None, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        #: tasks waiting in this clock now -> the event they wait for (None: a plain sleep)
        self._parked: dict[asyncio.Task[object], asyncio.Event | None] = {}
        #: every task that ever waited here (settling waits for all of them to wait again)
        self._tasks: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()
        self.settle_hooks: list[SettleHook] = []
        #: wall-clock bound of one settle (a woken service that never parks again is a bug)
        self.settle_timeout = settle_timeout
        self._lock: asyncio.Lock | None = None

    def now(self) -> int:
        return self._now

    def observe(self, born_ms: int) -> None:
        """Raise the clock to a birth, but not past the wall clock (see the module docstring)."""
        if born_ms > self._now:
            self._now = max(self._now, min(born_ms, wall_ms()))

    async def sleep(self, seconds: float) -> None:
        ms = math.ceil(seconds * 1000)
        if ms <= 0:
            await asyncio.sleep(0)
            return
        await self._park(None, self._now + ms)

    async def wait(self, event: asyncio.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        due = None if timeout is None else self._now + math.ceil(timeout * 1000)
        return await self._park(event, due)

    async def _park(self, event: asyncio.Event | None, due: int | None) -> bool:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        timer: asyncio.Future[None] | None = None
        if due is not None:
            timer = loop.create_future()
            heapq.heappush(self._timers, (due, next(self._seq), task, timer))
        if task is not None:
            self._parked[task] = event
            self._tasks.add(task)
        waiter: asyncio.Task[bool] | None = None
        try:
            if event is None:
                assert timer is not None  # noqa: S101 - sleep() always passes a due time
                await timer
                return False
            waiter = loop.create_task(event.wait())
            pending: list[asyncio.Future[Any]] = [waiter] if timer is None else [waiter, timer]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            return event.is_set()
        finally:
            if task is not None:
                self._parked.pop(task, None)
            if timer is not None and not timer.done():
                timer.cancel()  # dropped from the heap when it comes up
            if waiter is not None and not waiter.done():
                waiter.cancel()

    # -- driving it -------------------------------------------------------------------------------
    def _idle(self) -> bool:
        """Every task that uses this clock waits in it (for a time, or for an event not yet set)."""
        for task in list(self._tasks):
            if task.done():
                continue
            if task not in self._parked:
                return False
            event = self._parked[task]
            if event is not None and event.is_set():
                return False
        return True

    async def _quiet(self, deadline: float) -> None:
        """Let the loop run until the clock's tasks are all parked again (or the deadline)."""
        while True:
            for _ in range(5):  # tasks woken by an event or just spawned run within a few rounds
                await asyncio.sleep(0)
            if self._idle() or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.001)  # a woken task awaits something else (a disk write, a peer)

    async def settle(self) -> None:
        """Return once the work woken so far is done: every task of the clock waits in it again and
        every settle hook (check-back answers) has nothing left to wait for."""
        deadline = time.monotonic() + self.settle_timeout
        while True:
            await self._quiet(deadline)
            waited = False
            for hook in self.settle_hooks:
                waited = await hook() or waited
            if not waited or time.monotonic() > deadline:
                return

    def next_due(self) -> int | None:
        """When the earliest live wait is due (ms), None when nothing waits for a time."""
        while self._timers and self._timers[0][3].done():
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    async def _fire_next(self) -> bool:
        """Move to the earliest due wait (never backwards), end it and settle; False if none."""
        if self.next_due() is None:
            return False
        due, _, task, timer = heapq.heappop(self._timers)
        self._now = max(self._now, due)
        if task is not None:
            self._parked.pop(task, None)  # running from now on, for _idle
        timer.set_result(None)
        await self.settle()
        return True

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def advance(self, seconds: float) -> int:
        """Move the clock ``seconds`` forward, running every wait due on the way in due order (each
        sees "now" = its own due time); returns the new now (ms) once all of it has run."""
        if seconds < 0:
            raise ValueError(f"the clock only moves forward, got {seconds} s")
        async with self._guard():
            await self.settle()
            target = self._now + round(seconds * 1000)
            while True:
                due = self.next_due()
                if due is None or due > target:
                    break
                await self._fire_next()
            self._now = max(self._now, target)
            await self.settle()
            return self._now

    async def run_until(self, done: Callable[[], bool], *, max_seconds: float = 3600.0) -> bool:
        """Settle, then keep firing the next due wait until ``done()`` (e.g. a check pass that pauses
        ``SLEEP_WHILE_NO_OP`` finished); time moves only as far as those waits need, at most
        ``max_seconds``.  Returns ``done()``."""
        async with self._guard():
            limit = self._now + round(max_seconds * 1000)
            await self.settle()
            while not done():
                due = self.next_due()
                if due is None or due > limit:
                    break
                await self._fire_next()
            return done()
