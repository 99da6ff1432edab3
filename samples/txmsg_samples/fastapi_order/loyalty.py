"""The loyalty service: an ``async def`` idempotent listener granting points for paid orders.

Its points and the dedup row commit in one ``AsyncSession`` transaction, so a message delivered
twice grants points once.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from txmsg import Message, TxMsg, TxMsgConfig
from txmsg_samples.fastapi_order.models import Points
from txmsg_samples.fastapi_order.orders import TOPIC

GROUP = "fastapi-loyalty"


def points_for(amount_cents: int) -> int:
    """One point per whole currency unit."""
    return amount_cents // 100


def build(config: TxMsgConfig, sessions: async_sessionmaker[AsyncSession]) -> TxMsg:
    """The loyalty service's TxMsg app (not started)."""
    app = TxMsg(config)

    @app.message_listener(topic=TOPIC, group=GROUP, idempotent=True, session_factory=sessions)
    async def grant_points(message: Message, session: AsyncSession) -> None:
        paid = message.json()
        session.add(
            Points(order_id=str(paid["order_id"]), points=points_for(int(paid["amount_cents"])))
        )

    return app
