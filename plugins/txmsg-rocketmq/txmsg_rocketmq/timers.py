"""Shut a librocketmq client factory down only between its timers.

librocketmq 2.1.0 runs a client factory's periodic work (route refresh, heartbeat, offline-broker
clean-up) on timers that fire about 0.01 s and 3 s after the factory starts and then every 30 s.
Shutting the factory down while one of them runs can abort the whole process ("Fatal Python
error: Aborted" inside ``shutdown``; seen with raw clients in the test helpers and with a txmsg
app closed about 3 s after start, docs/librocketmq-hazards.md).  The factory goes away with the
last client registered on an instance name, so every place that shuts such a client down first
waits until no timer is near: at most :data:`WINDOW_BEFORE` + :data:`WINDOW_AFTER` seconds, or
up to the end of the 3 s window for a call expected to last (``lasts``) past the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Final, TypeVar

T = TypeVar("T")

TIMER_PHASES: Final = (0.0, 3.0, 30.0)
"""Seconds after the factory's start (modulo the 30 s period) at which its timers fire."""
CONSUMER_TIMER_PHASES: Final = (0.0, 3.0, 10.0, 20.0, 30.0)
"""The same for a factory with a push consumer: its consumer timer thread also rebalances 10 s
after the start and every 10 s (``MQClientFactory::consumer_timerOperation``), with requests to
the broker (consumer ids, offsets, an orderly group's queue locks) that the factory's shutdown
interrupts and joins.  Not in the first list until a close of an orderly consumer, right after
its broker had restarted, aborted under load (soak run of 2026-11-29; not reproduced)."""
PERIOD: Final = 30.0
WINDOW_BEFORE: Final = 0.3
WINDOW_AFTER: Final = 0.6
MAX_LASTS: Final = 1.5
"""The most a call's expected duration (``lasts``) is counted: longer ones fit the long quiet
stretch (3.6 s to 29.7 s after the start) anyway, and a measured duration that long is mostly a
check-back the shutdown waited for, not network time."""


def _windows(phases: tuple[float, ...]) -> list[tuple[float, float]]:
    """The timer windows of two periods, as (begin, end) phases, in order."""
    return sorted(
        (instant + k * PERIOD - WINDOW_BEFORE, instant + k * PERIOD + WINDOW_AFTER)
        for k in (0, 1)
        for instant in phases
    )


def delay_until_quiet(
    started: float, now: float, phases: tuple[float, ...] = TIMER_PHASES, lasts: float = 0.0
) -> float:
    """Seconds to wait at monotonic ``now`` so that a factory started at ``started`` has no timer
    window from then until ``lasts`` seconds later (0.0 when that holds already).

    ``lasts``: how long the call that ends the factory takes before it stops the timers (a
    producer's shutdown first unregisters the client from every broker, one request each): a
    call begun at a quiet moment must not reach the next window either."""
    lasts = min(max(lasts, 0.0), MAX_LASTS)
    phase = (now - started) % PERIOD
    moment = phase
    moved = True
    while moved:
        moved = False
        for begin, end in _windows(phases):
            if begin <= moment + lasts and moment < end:
                moment, moved = end, True
    return moment - phase


def wait_until_quiet(
    started: float | None, phases: tuple[float, ...] = TIMER_PHASES, lasts: float = 0.0
) -> None:
    """Sleep until the factory started at monotonic ``started`` has no timer near (None: no-op)."""
    if started is not None:
        delay = delay_until_quiet(started, time.monotonic(), phases, lasts)
        if delay > 0:
            time.sleep(delay)


def when_quiet(
    started: float | None,
    lock: AbstractContextManager[object],
    action: Callable[[], T],
    phases: tuple[float, ...] = TIMER_PHASES,
    lasts: float = 0.0,
) -> T:
    """Run ``action`` (the call that ends the factory started at ``started``, expected to take
    ``lasts`` seconds) holding ``lock``, at a moment no timer is near.

    Why not :func:`wait_until_quiet` and then the lock: what comes between (waiting for the lock,
    a slow shutdown of another client first) can carry the call into the next timer window.  A CI
    run under heavy load aborted that way: a transaction producer's shutdown took long enough
    after the wait that its keeper's shutdown, which ends the factory, met the 3 s timer.  So the
    moment is checked again with the lock held, and the wait (outside the lock) repeated if it
    has passed."""
    while True:
        wait_until_quiet(started, phases, lasts)
        with lock:
            if (
                started is None
                or delay_until_quiet(started, time.monotonic(), phases, lasts) == 0.0
            ):
                return action()
