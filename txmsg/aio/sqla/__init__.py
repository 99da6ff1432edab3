"""Async SQLAlchemy twins of :mod:`txmsg.sqla`: ``AsyncSession`` and ``async_sessionmaker``.

The same tables, the same rules, awaited: :class:`AsyncRecordBackedListener` (the transaction
record written in the business change's own database transaction answers check-backs),
:class:`AsyncIdempotentConsumer` (``async def`` idempotent listeners), on SQLite through
aiosqlite and PostgreSQL through psycopg's async mode (``pip install 'txmsg[async]'``).

Statements shared with the sync layer run through ``AsyncSession.run_sync``, so the two layers
cannot drift apart: one SQL, two ways of awaiting it.
"""

from txmsg.aio.sqla.engine import (
    AsyncSessionFactory,
    create_async_engine,
    is_async_session_factory,
    make_async_session_factory,
)
from txmsg.aio.sqla.idempotent import AsyncIdempotentConsumer
from txmsg.aio.sqla.listener import AsyncRecordBackedListener, run_on_connection
from txmsg.aio.sqla.outbox import outbox_send

__all__ = [
    "AsyncIdempotentConsumer",
    "AsyncRecordBackedListener",
    "AsyncSessionFactory",
    "create_async_engine",
    "is_async_session_factory",
    "make_async_session_factory",
    "outbox_send",
    "run_on_connection",
]
