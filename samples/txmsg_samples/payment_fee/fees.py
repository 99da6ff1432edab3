"""Fee service: computes each completed payment's merchant fee, exactly once."""

from __future__ import annotations

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.message import Message

GROUP = "fee-service"
RATE_BASIS_POINTS = 60  # 0.60 %
MIN_FEE_CENTS = 5


class FeeBase(DeclarativeBase):
    pass


class Fee(FeeBase):
    __tablename__ = "fees"

    payment_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    merchant_id: Mapped[str] = mapped_column(String(64))
    fee_cents: Mapped[int] = mapped_column(Integer)


def fee_for(amount_cents: int) -> int:
    """0.60 % rounded half up to the cent, at least MIN_FEE_CENTS."""
    if amount_cents < 0:
        raise ValueError("amount_cents must not be negative")
    return max(MIN_FEE_CENTS, (amount_cents * RATE_BASIS_POINTS + 5_000) // 10_000)


def on_payment_completed(message: Message, session: Session) -> None:
    data = message.json()
    session.add(
        Fee(
            payment_id=str(data["payment_id"]),
            merchant_id=str(data["merchant_id"]),
            fee_cents=fee_for(int(data["amount_cents"])),
        )
    )
