"""The one retry of a send librocketmq failed at once (hazard #11: a send while another thread of
the client is still connecting to the broker gets no connection and fails without sending)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from txmsg_rocketmq.connect_race import INSTANT, send_retrying_instant_failure
from txmsg_rocketmq.native import OK

FAILED = 1


def _calls(*results: tuple[int, float]) -> tuple[list[float], Callable[[], int]]:
    """A fake native send answering ``results`` in turn, each after its delay."""
    made: list[float] = []
    answers = iter(results)

    def call() -> int:
        made.append(time.monotonic())
        status, delay = next(answers)
        time.sleep(delay)
        return status

    return made, call


def test_an_instant_failure_is_tried_once_more() -> None:
    made, call = _calls((FAILED, 0.0), (OK, 0.0))
    assert send_retrying_instant_failure(call, what="t") == OK
    assert len(made) == 2
    assert made[1] - made[0] >= 0.04  # after a pause for the connect to finish


def test_only_once() -> None:
    made, call = _calls((FAILED, 0.0), (FAILED, 0.0), (OK, 0.0))
    assert send_retrying_instant_failure(call, what="t") == FAILED
    assert len(made) == 2


@pytest.mark.parametrize("first", [(OK, 0.0), (FAILED, INSTANT + 0.05)])
def test_a_success_or_a_slow_failure_is_not_retried(first: tuple[int, float]) -> None:
    """A failure that took a while may have reached the broker (a lost answer): never sent again."""
    made, call = _calls(first, (OK, 0.0))
    assert send_retrying_instant_failure(call, what="t") == first[0]
    assert len(made) == 1


def test_not_retried_when_the_caller_says_no() -> None:
    """A transactional send whose local transaction already ran is never sent again."""
    made, call = _calls((FAILED, 0.0), (OK, 0.0))
    status = send_retrying_instant_failure(
        call,
        retry_allowed=lambda: False,
        what="t",
    )
    assert status == FAILED
    assert len(made) == 1
