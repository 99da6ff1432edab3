"""The retry glue of the rocketmq5 split send (``CheckingProducer._retry_half``).

A failed first attempt of a threadless half message goes on with the 5.x client's own retry rule
and its own asynchronous send from attempt 2.  Provoking a first attempt that fails and a second
that succeeds against a broker is not reliable, so these tests drive the glue with stand-ins for
the client's three private steps it calls, and check what reaches the caller's future.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from txmsg_rocketmq5.client import CheckingProducer


class Steps:
    """Stand-ins for the client's ``__check_send_retry_condition``, ``__select_send_queue`` and
    ``__send_async`` (the names as they are mangled on ``Producer``)."""

    def __init__(self, *, retry: bool, send: Future[Any] | Exception) -> None:
        self.retry = retry
        self.send = send
        self.attempts: list[int] = []
        self.sent_on: list[str] = []

    def _Producer__check_send_retry_condition(
        self, message: Any, queue: Any, attempt: int, error: Exception
    ) -> Future[Any] | None:
        self.attempts.append(attempt)
        if self.retry:
            return None
        ended: Future[Any] = Future()
        ended.set_exception(error)
        return ended

    def _Producer__select_send_queue(self, message: Any) -> str:
        return "queue-2"

    def _Producer__send_async(self, message: Any, queue: Any, attempt: int) -> Future[Any]:
        self.sent_on.append(f"{queue}@{attempt} on {threading.current_thread().name}")
        if isinstance(self.send, Exception):
            raise self.send
        return self.send


def retry(steps: Steps, failure: Exception) -> Future[Any]:
    result: Future[Any] = Future()
    CheckingProducer._retry_half(steps, "message", "queue-1", failure, result)  # type: ignore[arg-type]
    return result


def test_a_failed_first_attempt_is_sent_again_from_attempt_two_off_the_io_thread() -> None:
    later: Future[Any] = Future()
    steps = Steps(retry=True, send=later)
    result = retry(steps, ConnectionError("reset"))
    later.set_result("receipt")
    assert result.result(timeout=10) == "receipt"
    assert steps.attempts == [2]
    assert steps.sent_on == ["queue-2@2 on txmsg-rocketmq5-retry"]


def test_no_attempt_left_hands_the_first_failure_to_the_caller() -> None:
    failure = ConnectionError("reset")
    steps = Steps(retry=False, send=Future())
    result = retry(steps, failure)
    assert result.exception(timeout=10) is failure
    assert steps.sent_on == []


def test_a_retry_that_cannot_start_hands_its_error_to_the_caller() -> None:
    broken = RuntimeError("no route")
    result = retry(Steps(retry=True, send=broken), ConnectionError("reset"))
    assert result.exception(timeout=10) is broken


def test_a_failed_retry_hands_its_error_to_the_caller() -> None:
    later: Future[Any] = Future()
    result = retry(Steps(retry=True, send=later), ConnectionError("reset"))
    again = TimeoutError("no answer")
    later.set_exception(again)
    assert result.exception(timeout=10) is again
