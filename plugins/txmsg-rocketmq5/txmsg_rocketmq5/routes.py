"""Topic routes fetched on a thread whose event loop is the 5.x client's I/O loop.

Why: the client fetches a route it has not cached in the *caller's* thread
(``ClientRouteManager.update_topic_route``: it starts the query on its I/O loop, attaches a
done-callback, then waits).  When the proxy has answered before the callback is attached - the
caller was descheduled for a moment, common on a busy machine - ``concurrent.futures`` runs the
callback at once, in the caller's thread.  For a route on endpoints the client has not met yet
that callback opens the telemetry stream (``Telemetry`` on the channel's async stub), and gRPC asks
the *thread's* event loop for it:

* a worker thread (``asyncio.to_thread``, txmsg's send pool) has no loop: "There is no current
  event loop in thread ...", the route is dropped and the send fails with "failed to fetch topic
  route" - the message was not sent;
* so has a thread whose ``asyncio.run()`` has returned (it sets the thread's loop to None);
* a thread running a loop of its own would bind the stream to that loop, not the client's.

Every route fetch of a client therefore runs on a small pool of threads of this module, each fetch
with the client's I/O loop set as the thread's event loop (without running it: the I/O thread runs
it), as the client's own channel creation does for the thread that creates a channel.  A route is
fetched once per topic and client (then refreshed by the client's scheduler), so the hop costs
nothing per send.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("txmsg.rocketmq5")

ROUTE_THREADS = 4
"""At most this many routes are fetched at once (each waits up to the request timeout)."""

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None  # made at the first fetch, shared by every client
_on_route_thread = threading.local()


def _route_thread_started() -> None:
    _on_route_thread.yes = True


def _fetch_with_loop(
    io_loop: asyncio.AbstractEventLoop, fetch: Callable[[str], Any], topic: str
) -> Any:
    # set per fetch, not once per thread: the loop is kept by the event loop policy, and a new
    # policy (asyncio.set_event_loop_policy, uvloop.install(), a test resetting asyncio) starts
    # with no loop in any thread
    asyncio.set_event_loop(io_loop)
    return fetch(topic)


def _route_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                max_workers=ROUTE_THREADS,
                thread_name_prefix="txmsg-rocketmq5-routes",
                initializer=_route_thread_started,
            )
        return _pool


def on_route_thread(
    io_loop: asyncio.AbstractEventLoop, fetch: Callable[[str], Any]
) -> Callable[[str], Any]:
    """``fetch(topic)`` run on a route thread with ``io_loop`` set (at once if already on one)."""

    def fetched_there(topic: str) -> Any:
        if getattr(_on_route_thread, "yes", False):
            return fetch(topic)
        return _route_pool().submit(_fetch_with_loop, io_loop, fetch, topic).result()

    return fetched_there


def fetch_routes_on_their_thread(client: Any) -> None:
    """Make every route fetch of the 5.x ``client`` (at startup and on a cache miss) run on a
    route thread.  Call it before ``client.startup()``, which fetches the routes of the topics
    the client was created with."""
    manager: Any = getattr(client, "_Client__route_manager", None)
    fetch = getattr(manager, "update_topic_route", None)
    io_loop = client._rpc_channel_io_loop() if hasattr(client, "_rpc_channel_io_loop") else None
    if fetch is None or io_loop is None:
        log.warning(
            "the 5.x client has no route manager or I/O loop where txmsg expects them (a client "
            "other than rocketmq-python-client 5.1.2?): routes are fetched in the caller's "
            "thread, and a send from a thread without an event loop may fail with 'failed to "
            "fetch topic route'; install the version txmsg-rocketmq5 pins"
        )
        return
    manager.update_topic_route = on_route_thread(io_loop, fetch)
