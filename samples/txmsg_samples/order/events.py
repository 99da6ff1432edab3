"""The event the order service publishes and every other service consumes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from txmsg.message import Message

TOPIC = "order-paid"
"""Topic of OrderPaid events (a TRANSACTION topic on brokers that enforce topic types)."""
TAG = "paid"


@dataclass(frozen=True)
class OrderPaid:
    """An order was paid: everything the consumers need, so none of them calls back."""

    order_id: str
    user_id: str
    amount_cents: int
    skus: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OrderPaid:
        return cls(
            order_id=str(data["order_id"]),
            user_id=str(data["user_id"]),
            amount_cents=int(data["amount_cents"]),
            skus=[str(s) for s in data.get("skus", [])],
        )

    @classmethod
    def from_message(cls, message: Message) -> OrderPaid:
        """Parse a consumed message; a malformed body raises ValueError (the broker retries it
        and finally parks it in the DLQ, where an operator can look at it)."""
        try:
            return cls.from_dict(message.json())
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an OrderPaid event: {message.body[:200]!r}") from exc
