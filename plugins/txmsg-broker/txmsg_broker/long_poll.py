"""Held pulls (long polling): a PULL_MESSAGE that finds nothing new waits here for a put.

Why: librocketmq keeps one pull outstanding per queue and expects the broker to hold it until a message
arrives (or the client's ``suspendTimeoutMillis`` passes) instead of answering "nothing" at once, which
would make it spin. A put wakes every pull held on its queue; a closing connection frees its own holds
early; stopping the broker wakes them all so clients get an answer rather than librocketmq's 30 s async
timeout (which does not fail pending requests when the connection drops). Holds need no persistence: a
restart drops the connections and librocketmq simply pulls again.
"""

from __future__ import annotations

import asyncio
import contextlib

from .transport import Connection

QueueKey = tuple[str, int]


class LongPolls:
    """The pulls currently held, per ``(topic, queue_id)``; lives on the broker's event loop."""

    def __init__(self) -> None:
        self._waiters: dict[QueueKey, set[asyncio.Future[None]]] = {}
        #: set by :meth:`release_all`; a woken pull must answer instead of waiting again
        self.stopping = False

    def held(self) -> int:
        """How many pulls are held right now (diagnostics and tests)."""
        return sum(len(waiters) for waiters in self._waiters.values())

    def wake(self, topic: str, queue_id: int) -> None:
        """A message was put into the queue: every pull held on it reads again."""
        waiters = self._waiters.pop((topic, queue_id), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def release_all(self) -> None:
        """Wake every held pull for good (broker stop): each answers with what it has (nothing)."""
        self.stopping = True
        for waiters in list(self._waiters.values()):
            for fut in list(waiters):
                if not fut.done():
                    fut.set_result(None)

    async def wait_for_put(
        self, conn: Connection, topic: str, queue_id: int, timeout_s: float
    ) -> None:
        """Wait for a put into the queue, the timeout, or the client's disconnect (frees the hold early)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        key = (topic, queue_id)
        self._waiters.setdefault(key, set()).add(fut)

        def on_close(_conn: Connection) -> None:
            if not fut.done():
                fut.set_result(None)

        conn.close_callbacks.append(on_close)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                conn.close_callbacks.remove(on_close)
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(key, None)
