"""Waiting for events on the manual broker clock (issue 36): the helpers the converted tests share.

A test on the manual clock (``@pytest.mark.txmsg_manual_clock``, ``manual_clock=True``) makes
broker time pass with ``broker.advance(seconds)``; what the broker then stores reaches a consumer
in wall time (the client's pull), so "nothing more arrives" is checked in two steps: advance past
the point where it would have been stored, then wait until the consumer has seen everything the
topic holds (:func:`stored`), and assert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from txmsg_broker.codec import GET_MAX_OFFSET, QUERY_CONSUMER_OFFSET, SUCCESS
from txmsg_broker.rawclient import call


def stored(broker_addr: str, topic: str, queues: int = 4) -> int:
    """Messages stored in ``topic`` on the broker at ``broker_addr``: the sum of its queues' max
    offsets (GET_MAX_OFFSET), what its consumers will have received once they caught up."""
    total = 0
    for queue_id in range(queues):
        answer = call(broker_addr, GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        assert answer.code == SUCCESS, answer.remark
        total += int(answer.ext("offset"))
    return total


def consumed(broker_addr: str, group: str, topic: str, queues: int = 4) -> int:
    """The consume offsets ``group`` has committed for ``topic`` on the broker, summed over its
    queues (0 for a queue without one).  librocketmq commits a push consumer's offsets every 5 s
    and at its shutdown: read it after the consumer stopped, or wait for it."""
    total = 0
    for queue_id in range(queues):
        answer = call(
            broker_addr,
            QUERY_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": topic, "queueId": queue_id},
        )
        if answer.code == SUCCESS:
            total += int(answer.ext("offset"))
    return total


def advance_until(
    broker: Any,
    done: Callable[[], object],
    *,
    step: float = 0.5,
    max_seconds: float = 60.0,
    message: str | Callable[[], str] = "",
) -> float:
    """Advance ``broker``'s manual clock ``step`` seconds at a time until ``done()`` holds; returns
    the broker seconds it took.  The manual-clock form of ``wait_until``: each advance has run (and
    had answered) everything that fell due, so the condition is read at every step, and the bound is
    broker time (a step costs milliseconds of wall time), generous by intent."""
    moved = 0.0
    while not done():
        if moved >= max_seconds:
            what = message() if callable(message) else message
            raise AssertionError(
                f"{what or 'the condition'} did not hold within {max_seconds:g} s of broker time"
            )
        broker.advance(step)
        moved += step
    return moved
