"""The retry glue of the rocketmq5 split send (``CheckingProducer._retry_half``).

A failed first attempt of a threadless half message goes on with the 5.x client's own retry rule
and its own synchronous send from attempt 2 (which retries further by itself), on a thread of
its own, never on the client's I/O thread.  Provoking a first attempt that fails and a second
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
    ``__send`` (the names as they are mangled on ``Producer``)."""

    def __init__(self, *, retry: bool, send: Any) -> None:
        self.retry = retry
        self.send = send  # the receipt, or the exception the send raises
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

    def _Producer__send(self, message: Any, queue: Any, attempt: int) -> Any:
        self.sent_on.append(f"{queue}@{attempt} on {threading.current_thread().name}")
        if isinstance(self.send, Exception):
            raise self.send
        return self.send


def retry(steps: Steps, failure: Exception) -> Future[Any]:
    result: Future[Any] = Future()
    CheckingProducer._retry_half(steps, "message", "queue-1", failure, result)  # type: ignore[arg-type]
    return result


def test_a_failed_first_attempt_is_sent_again_from_attempt_two_off_the_io_thread() -> None:
    steps = Steps(retry=True, send="receipt")
    result = retry(steps, ConnectionError("reset"))
    assert result.result(timeout=10) == "receipt"
    assert steps.attempts == [2]
    assert steps.sent_on == ["queue-2@2 on txmsg-rocketmq5-retry"]


def test_no_attempt_left_hands_the_first_failure_to_the_caller() -> None:
    failure = ConnectionError("reset")
    steps = Steps(retry=False, send="receipt")
    result = retry(steps, failure)
    assert result.exception(timeout=10) is failure
    assert steps.sent_on == []


def test_a_failed_retry_hands_its_error_to_the_caller() -> None:
    again = TimeoutError("no answer")
    result = retry(Steps(retry=True, send=again), ConnectionError("reset"))
    assert result.exception(timeout=10) is again
