"""The transactional outbox from ``AsyncSession`` code.

:meth:`txmsg.sqla.outbox.Outbox.send` writes a row in the caller's database transaction; in an
asyncio service that transaction belongs to an ``AsyncSession``.  :func:`outbox_send` runs the
very same write on the ``AsyncSession``'s sync core (``AsyncSession.run_sync``), so the row
commits or rolls back with the business change exactly as in sync code, and the relay (which
reads the table through the outbox's own sync ``session_factory``) sends it after the commit.
"""

from __future__ import annotations

from typing import Any, Unpack

from sqlalchemy.ext.asyncio import AsyncSession

from txmsg.sending import RowOptions
from txmsg.sqla.outbox import Outbox, OutboxReceipt


async def outbox_send(
    outbox: Outbox, session: AsyncSession, topic: str, payload: Any, **options: Unpack[RowOptions]
) -> OutboxReceipt:
    """``outbox.send(session, topic, payload, **options)`` in ``session``'s transaction: the
    same options and errors (``keys``, ``tags``, ``properties``, ``sharding_key``,
    ``delay_level``, ``deliver_at``)."""
    return await session.run_sync(
        lambda sync_session: outbox.send(sync_session, topic, payload, **options)
    )
