"""The backend shuts a client factory down only between librocketmq's timers (hazard: aborting
the process when the shutdown meets the route refresh 3 s after start)."""

from __future__ import annotations

from pathlib import Path

import pytest
import txmsg_rocketmq
from txmsg_rocketmq.timers import WINDOW_AFTER, delay_until_quiet


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


def test_product_clients_use_the_guard() -> None:
    """Every product path that can end a factory waits for a quiet moment first."""
    root = Path(txmsg_rocketmq.__file__).parent
    for module in ("pool.py", "consumer.py"):
        assert "wait_until_quiet(" in (root / module).read_text(), module
