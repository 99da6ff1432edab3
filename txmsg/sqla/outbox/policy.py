"""How the outbox relay retries: back-off per attempt, when a row is dead, which errors are final.

Why these defaults: a relay retries what the broker refused for a while (a broker restarting, a
topic being created, a network fault) without burying the broker under retries, and gives up
only after about an hour, so a broker outage of minutes leaves no dead rows; what can never be
sent (an invalid name, an oversize body, a topic of the wrong type: errors the backend raises as
:class:`~txmsg.InvalidMessageError` / :class:`~txmsg.InvalidNameError`, nothing sent) is dead at
the first attempt, since retrying it would only hold back its key's later rows for nothing.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

from txmsg.errors import ConfigError, InvalidMessageError, InvalidNameError

log = logging.getLogger("txmsg.outbox")

FIRST_PAUSE = 0.5
"""Pause (seconds) of the relay's loop and of its commit listener after a first failure (a cycle
whose sends all failed or whose database work failed; the listening connection not opened); it
doubles with each failure in a row (:func:`doubling`)."""
MAX_PAUSE = 30.0
"""Longest such pause (seconds)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Back-off of failed sends: attempt ``n`` (1-based) failed -> wait
    ``min(first_delay * 2 ** (n - 1), max_delay)`` seconds; after ``max_attempts`` failures the
    row is dead.  The defaults (16 attempts, 1 s doubling up to 10 min) span about 67 minutes.
    """

    max_attempts: int = 16
    first_delay: float = 1.0
    max_delay: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1 (1 = no retry), got {self.max_attempts}")
        for name in ("first_delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.max_delay < self.first_delay:
            raise ConfigError(
                f"max_delay ({self.max_delay}) must be >= first_delay ({self.first_delay})"
            )

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed send (1-based)."""
        return doubling(attempts, self.first_delay, self.max_delay)

    def exhausted(self, attempts: int) -> bool:
        """True when ``attempts`` failures make the row dead."""
        return attempts >= self.max_attempts

    @property
    def window(self) -> float:
        """Seconds from the first failure to the row's death, if every attempt fails at once."""
        return sum(self.delay(n) for n in range(1, self.max_attempts))


def doubling(attempts: int, first: float, most: float) -> float:
    """Seconds to wait after the ``attempts``-th failure in a row (1-based; 0 before any):
    ``first``, doubling each time, never above ``most``.  One rule for a row's retries and for
    the relay's and the commit listener's pauses after a failed cycle or connection."""
    if attempts < 1:
        return 0.0
    exponent = min(attempts - 1, 64)  # 2 ** 64 s is past any bound, and a float still
    return float(min(first * 2**exponent, most))


def pause_after_failure(
    stop: threading.Event, failures: int, outbox: str, failed: str, error: object, meanwhile: str
) -> None:
    """What the relay's loop and its commit listener do after their ``failures``-th failure in a
    row: warn (with the traceback at the first failure only: a long outage logs one), then wait
    ``doubling`` from :data:`FIRST_PAUSE` to :data:`MAX_PAUSE`, or until ``stop`` is set.  Call it
    in the ``except`` block.  ``failed`` says what failed, ``error`` why, ``meanwhile`` what
    still works."""
    pause = doubling(failures, FIRST_PAUSE, MAX_PAUSE)
    log.warning(
        "outbox=%s: %s (%s); %s, trying again in %.1f s",
        outbox,
        failed,
        error,
        meanwhile,
        pause,
        exc_info=failures == 1,
    )
    stop.wait(pause)


def is_permanent(error: BaseException) -> bool:
    """Whether a send that raised ``error`` can never succeed as it is: the backend refused the
    message itself (invalid name, oversize body, a topic of the wrong type) before sending it."""
    return isinstance(error, InvalidMessageError | InvalidNameError)


def describe(error: BaseException) -> str:
    """``"Type: message"`` as stored in ``last_error`` and logged."""
    return f"{type(error).__name__}: {error}"
