"""Shut a librocketmq client factory down only between its timers.

librocketmq 2.1.0 runs a client factory's periodic work (route refresh, heartbeat, offline-broker
clean-up) on timers that fire about 0.01 s and 3 s after the factory starts and then every 30 s.
Shutting the factory down while one of them runs can abort the whole process ("Fatal Python
error: Aborted" inside ``shutdown``; seen with raw clients in the test helpers and with a txmsg
app closed about 3 s after start, docs/librocketmq-hazards.md).  The factory goes away with the
last client registered on an instance name, so every place that shuts such a client down first
waits, at most :data:`WINDOW_BEFORE` + :data:`WINDOW_AFTER` seconds, until no timer is near.
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


def delay_until_quiet(
    started: float, now: float, phases: tuple[float, ...] = TIMER_PHASES
) -> float:
    """Seconds to wait at monotonic ``now`` so that a factory started at ``started`` is not
    within a timer window of ``phases`` (0.0 when it is quiet already)."""
    phase = (now - started) % PERIOD
    for instant in phases:
        if instant - WINDOW_BEFORE <= phase <= instant + WINDOW_AFTER:
            return instant + WINDOW_AFTER - phase
    return 0.0


def wait_until_quiet(started: float | None, phases: tuple[float, ...] = TIMER_PHASES) -> None:
    """Sleep until the factory started at monotonic ``started`` has no timer near (None: no-op)."""
    if started is not None:
        delay = delay_until_quiet(started, time.monotonic(), phases)
        if delay > 0:
            time.sleep(delay)


def when_quiet(
    started: float | None,
    lock: AbstractContextManager[object],
    action: Callable[[], T],
    phases: tuple[float, ...] = TIMER_PHASES,
) -> T:
    """Run ``action`` (the call that ends the factory started at ``started``) holding ``lock``,
    at a moment no timer is near.

    Why not :func:`wait_until_quiet` and then the lock: what comes between (waiting for the lock,
    a slow shutdown of another client first) can carry the call into the next timer window.  A CI
    run under heavy load aborted that way: a transaction producer's shutdown took long enough
    after the wait that its keeper's shutdown, which ends the factory, met the 3 s timer.  So the
    moment is checked again with the lock held, and the wait (outside the lock) repeated if it
    has passed."""
    while True:
        wait_until_quiet(started, phases)
        with lock:
            if started is None or delay_until_quiet(started, time.monotonic(), phases) == 0.0:
                return action()
