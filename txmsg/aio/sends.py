"""The send pool of an app and its awaitable producers (``app.async_producer(group)``).

One :class:`AwaitableSends` per :class:`txmsg.TxMsg`: the pool's threads start with the first
awaitable producer, and the app's close lets the sends in flight on them finish
(:meth:`AwaitableSends.finish`) before it closes the producers they send with.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from txmsg.aio.loop import LoopBridge
from txmsg.errors import ListenerDefinitionError
from txmsg.running import quietly

if TYPE_CHECKING:
    from txmsg.aio.producer import AsyncProducer
    from txmsg.producer import Producer

log = logging.getLogger("txmsg.app")


class AwaitableSends:
    """The pool of ``threads`` threads the awaitable sends wait on, and one
    :class:`~txmsg.aio.producer.AsyncProducer` per group (an
    :class:`~txmsg.aio.producer.AsyncTransactionalProducer` for a listener group)."""

    def __init__(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ListenerDefinitionError(
                f"async_send_threads must be an int >= 1, got {threads!r}"
            )
        self._threads = threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._producers: dict[str, AsyncProducer] = {}

    def of(self, producer: Producer, bridge: LoopBridge | None) -> AsyncProducer:
        """The one awaitable producer of ``producer``'s group, of its kind; ``bridge`` is the
        app's loop."""
        from txmsg.aio.producer import (  # noqa: PLC0415 - asyncio users only
            AsyncProducer,
            AsyncTransactionalProducer,
        )
        from txmsg.producer import TransactionalProducer  # noqa: PLC0415 - no import cycle

        with self._lock:
            found = self._producers.get(producer.group)
            if found is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self._threads, thread_name_prefix="txmsg-async-send"
                    )
                if isinstance(producer, TransactionalProducer):
                    found = AsyncTransactionalProducer(producer, self._pool, bridge=bridge)
                else:
                    found = AsyncProducer(producer, self._pool, bridge=bridge)
                self._producers[producer.group] = found
            return found

    def finish(self, bridge: LoopBridge | None, timeout: float) -> None:
        """Shut the pool down (if it started), waiting up to ``timeout`` for the awaited sends
        in flight.

        A send still running then is waiting for its ``async def execute_local`` on a loop (the
        app's ``bridge``, or the loop that awaited the send; rocketmq backend): its coroutine is
        cancelled (the send answers UNKNOW, the check-back decides) and the send ends.  Waiting
        on, or closing its producer under it, would not do: the first held ``aclose(timeout)``
        forever when ``execute_local`` never returned, and the bridge's own drain, which
        cancels, comes after the producers.  The sends are then waited for without a bound, so
        no producer closes under a send (a plain ``def execute_local`` that never returns
        cannot be cancelled)."""
        with self._lock:
            pool, self._pool = self._pool, None
            callers = [p.caller_bridge for p in self._producers.values()]
        if pool is None:
            return
        bridges = [b for b in [bridge, *callers] if b is not None]
        finishing = threading.Thread(
            target=quietly,
            args=("finish the awaited sends", pool.shutdown, True),
            name="txmsg-close-sends",
            daemon=True,
        )
        finishing.start()
        finishing.join(timeout)
        if not finishing.is_alive():
            return
        cancelled = sum(each.cancel_pending() for each in bridges)
        log.warning(
            "awaited sends still running after the close timeout (%.1fs): their execute_local "
            "has not returned. %d listener coroutine(s) cancelled (their transactions answer "
            "UNKNOW; the check-back decides); waiting for the sends to end. Give "
            "close()/aclose() a longer timeout, or make execute_local return sooner",
            timeout,
            cancelled,
        )
        finishing.join()
