"""The backend shuts a client factory down only between librocketmq's timers (hazard: aborting
the process when the shutdown meets the route refresh 3 s after start)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import txmsg_rocketmq
from txmsg_rocketmq.timers import (
    CONSUMER_TIMER_PHASES,
    WINDOW_AFTER,
    delay_until_quiet,
    when_quiet,
)


@pytest.mark.parametrize(
    ("elapsed", "wait"),
    [
        (0.0, WINDOW_AFTER),  # the first timer fires right after start
        (1.5, 0.0),
        (2.8, 3.0 + WINDOW_AFTER - 2.8),  # close to the 3 s route refresh: wait it out
        (3.4, 3.0 + WINDOW_AFTER - 3.4),
        (10.0, 0.0),
        (29.9, 30.0 + WINDOW_AFTER - 29.9),  # the 30 s period
        (30.2, WINDOW_AFTER - 0.2),
        (33.1, 3.0 + WINDOW_AFTER - 3.1),
    ],
)
def test_delay_until_quiet(elapsed: float, wait: float) -> None:
    assert delay_until_quiet(100.0, 100.0 + elapsed) == pytest.approx(wait)


@pytest.mark.parametrize(
    ("elapsed", "lasts", "wait"),
    [
        (2.0, 0.5, 0.0),  # ends before the 3 s window begins
        (2.0, 0.8, 3.0 + WINDOW_AFTER - 2.0),  # would reach it: after it instead
        (1.0, 1.0, 0.0),
        (29.0, 1.2, 30.0 + WINDOW_AFTER - 29.0),  # across the period's end
        (3.0 + WINDOW_AFTER + 0.1, 100.0, 0.0),  # counted as 1.5 s (MAX_LASTS): the long stretch
        (0.4, 100.0, WINDOW_AFTER - 0.4),  # and so does the short one, from its beginning
    ],
)
def test_a_call_that_lasts_must_not_reach_the_next_window(
    elapsed: float, lasts: float, wait: float
) -> None:
    delay = delay_until_quiet(100.0, 100.0 + elapsed, lasts=lasts)
    assert delay == pytest.approx(wait)


@pytest.mark.parametrize(
    ("elapsed", "wait"),
    [
        (1.5, 0.0),
        (9.8, 10.0 + WINDOW_AFTER - 9.8),  # a push consumer's factory rebalances every 10 s
        (10.4, WINDOW_AFTER - 0.4),
        (15.0, 0.0),
        (19.9, 20.0 + WINDOW_AFTER - 19.9),
        (40.2, WINDOW_AFTER - 0.2),
    ],
)
def test_a_consumers_factory_also_waits_out_its_rebalances(elapsed: float, wait: float) -> None:
    assert delay_until_quiet(100.0, 100.0 + elapsed, CONSUMER_TIMER_PHASES) == pytest.approx(wait)


def test_product_clients_use_the_guard() -> None:
    """Every product path that can end a factory waits for a quiet moment first."""
    root = Path(txmsg_rocketmq.__file__).parent
    for module in ("pool.py", "consumer.py", "sender.py", "doctor.py"):
        assert "when_quiet(" in (root / module).read_text(), module
    assert "CONSUMER_TIMER_PHASES" in (root / "consumer.py").read_text()


class _SlowLock:
    """A lock whose acquisition takes ``delay`` seconds the first time: the moment a caller
    found quiet before taking it has passed when it gets it."""

    def __init__(self, delay: float) -> None:
        self.lock = threading.Lock()
        self.delay = delay

    def __enter__(self) -> object:
        if self.delay:
            time.sleep(self.delay)
            self.delay = 0.0
        return self.lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(*exc)


def test_when_quiet_checks_the_moment_again_under_the_lock() -> None:
    """Found quiet 2.6 s after the start, but the lock came only after the 3 s timer's window had
    begun: the call waits the window out (and runs with the lock held), it does not go ahead."""
    started = time.monotonic() - 2.6
    lock = _SlowLock(0.3)
    seen: list[tuple[float, bool]] = []

    def action() -> str:
        seen.append((time.monotonic() - started, lock.lock.locked()))
        return "ended"

    assert when_quiet(started, lock, action) == "ended"
    ((elapsed, held),) = seen
    assert held
    assert elapsed >= 3.0 + WINDOW_AFTER
    assert delay_until_quiet(started, started + elapsed) == 0.0


def test_when_quiet_runs_at_once_when_quiet() -> None:
    lock = threading.Lock()
    assert when_quiet(None, lock, lambda: lock.locked()) is True
    assert when_quiet(time.monotonic() - 10.0, lock, lambda: lock.locked()) is True
