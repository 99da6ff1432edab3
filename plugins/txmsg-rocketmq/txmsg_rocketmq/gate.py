"""In-flight accounting that makes shutting a native client down safe.

Why: librocketmq's ``TransactionMQProducerImpl::shutdown`` first deletes the client factory and
only then stops the check thread; a check callback still running (or a send still in flight)
then returns into freed memory and the process segfaults (observed with the raw client).  So
every entry from Python into a client (send) and from the client into Python (callback) passes
this gate, and ``close`` waits until nothing is inside before calling ``Shutdown*``.

States: open -> closing (no new sends; callbacks still served so check_local answers honestly)
-> shut (the native shutdown is about to run).  Producer instances keep serving callbacks even
then, because a keeper client holds their factory alive until the check thread is joined (see
pool.py); push consumers answer RECONSUME_LATER at once (the broker redelivers).
"""

from __future__ import annotations

import threading
import time


class Gate:
    """Counts sends and callbacks inside one native client."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._sends = 0
        self._callbacks = 0
        self._closing = False
        self._shut = False
        self.callbacks_total = 0
        self.callbacks_refused = 0

    # ---- sends (Python -> client) -------------------------------------------------------
    def enter_send(self) -> bool:
        """Register a send; False when closing (the caller raises ProducerClosedError)."""
        with self._cond:
            if self._closing:
                return False
            self._sends += 1
            return True

    def exit_send(self) -> None:
        with self._cond:
            self._sends -= 1
            self._cond.notify_all()

    # ---- callbacks (client -> Python) ---------------------------------------------------
    def enter_callback(self, *, refuse_after_shut: bool = True) -> bool:
        """Register a callback; False (not registered) once the native shutdown has begun,
        unless ``refuse_after_shut`` is off (the client's reply path stays valid then)."""
        with self._cond:
            self.callbacks_total += 1
            if self._shut and refuse_after_shut:
                self.callbacks_refused += 1
                return False
            self._callbacks += 1
            return True

    def exit_callback(self) -> None:
        with self._cond:
            self._callbacks -= 1
            self._cond.notify_all()

    # ---- closing --------------------------------------------------------------------------
    def in_flight(self) -> tuple[int, int]:
        """(sends, callbacks) currently inside."""
        with self._cond:
            return self._sends, self._callbacks

    def begin_close(self) -> None:
        with self._cond:
            self._closing = True

    def drain_and_shut(self, deadline: float) -> bool:
        """Wait until nothing is inside (or ``deadline``, a monotonic time), then mark shut.

        Returns True when it is safe to shut the native client down.  On timeout the gate
        stays open for callbacks (they keep answering) and False tells the caller to leave
        the client running rather than crash the process.
        """
        with self._cond:
            self._closing = True
            if not self._empty_by(deadline, sends=True):
                return False
            self._shut = True
            return True

    def refuse_and_drain(self, deadline: float) -> bool:
        """Refuse new callbacks at once, then wait until none is inside (or ``deadline``).

        For a push consumer replaced while it runs (a restart): unlike :meth:`drain_and_shut`,
        which keeps serving callbacks until nothing is inside, a busy consumer would never drain
        that way.  False on timeout, with the gate open again."""
        with self._cond:
            self._shut = True
            if not self._empty_by(deadline, sends=False):
                self._shut = False
                return False
            return True

    def _empty_by(self, deadline: float, *, sends: bool) -> bool:
        """Wait (holding the condition) until no callback (and, with ``sends``, no send) is
        inside, or ``deadline``; whether it emptied."""
        while self._callbacks or (sends and self._sends):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cond.wait(remaining)
        return True
