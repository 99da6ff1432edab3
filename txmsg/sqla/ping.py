"""Ping a pooled connection before use only when it sat idle: stale-connection safety without a
round trip per transaction.

SQLAlchemy's ``pool_pre_ping`` pings at *every* checkout.  On a busy service that is one round
trip per transaction for connections that were in use a millisecond ago, and on asyncpg three
(SQLAlchemy's asyncpg ping opens a transaction, runs ``;`` and rolls back), each awaited on the
event loop: a third of what an awaited ``execute_local`` insert cost the loop
(``benchmarks.async_send`` with asyncpg).  A connection goes stale while *idle* (the server
restarted, a firewall dropped the idle socket), so pinging the ones idle for at least
``after`` seconds keeps the protection where it matters.  One that dies while busy fails the
statement that finds it, as it would with ``pool_pre_ping`` too, and SQLAlchemy then invalidates
the pool, so the next checkouts connect afresh.

The hooks are the pool's documented ``checkin``/``checkout`` events; a failed ping raises
:class:`sqlalchemy.exc.InvalidatePoolError`, which makes the pool drop its connections and hand
out a new one (as ``pool_pre_ping`` does).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import InvalidatePoolError

PING_AFTER_IDLE = 1.0
"""Seconds a pooled connection may sit idle before it is pinged again at checkout."""

_IDLE_SINCE = "txmsg_idle_since"


def install_idle_ping(engine: Engine, after: float) -> None:
    """Ping ``engine``'s pooled connections at checkout when idle ``after`` seconds or longer
    (the sync core of an ``AsyncEngine`` too: the ping is awaited inside its greenlet)."""
    dialect = engine.dialect

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since < after:
            return  # just connected, or in use moments ago
        try:
            alive = dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if not dialect.is_disconnect(error, dbapi_connection, None):
                raise
            raise InvalidatePoolError(f"pre-ping after {after:g}s idle failed: {error}") from error
        if not alive:
            raise InvalidatePoolError(f"pre-ping after {after:g}s idle failed")
