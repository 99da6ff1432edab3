"""The after-sales events, as both services see them.

Every event of an order carries ``seq``: 1, 2, 3 ... in the order the after-sales service
committed them (one counter per order).  The consumer applies ``seq == applied + 1``, skips
``seq <= applied`` (already applied: a resend) and refuses a gap (an earlier event of the order is
missing: consumed out of order).  Ordered sends keep the gap from happening; the counter makes it
visible if it ever does, instead of paying a refund nobody decided on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

TOPIC = "aftersales-events"
"""Ordered topic of the after-sales service (a FIFO topic on RocketMQ 5)."""
PRODUCER_GROUP = "aftersales-service"
"""The after-sales service's outbox (``app.add_outbox``): the producer group its relay sends with."""

LIABILITY_DECIDED = "LiabilityDecided"
REFUND_PAID = "RefundPaid"
CASE_CLOSED = "CaseClosed"
KINDS = (LIABILITY_DECIDED, REFUND_PAID, CASE_CLOSED)
"""Event kinds, in the order one case produces them; also the message tag."""

Party = Literal["merchant", "platform"]
"""Who pays the refund: the merchant (deducted from its settlement account) or the platform."""


@dataclass(frozen=True)
class AfterSalesEvent:
    """One event of an after-sales case; the message body is its JSON form."""

    event_id: str
    """Unique per event (also the message key): what an operator searches for."""
    kind: str
    order_id: str
    case_id: str
    seq: int
    merchant_id: str
    liable: Party | None = None
    """Set on LiabilityDecided."""
    refund_cents: int = 0
    payment_ref: str | None = None
    """The payment gateway's reference of the refund (RefundPaid)."""

    def body(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_body(cls, body: bytes) -> AfterSalesEvent:
        """Parse a message body; a body that is not an after-sales event raises ValueError
        (a poison message: it parks its order until an operator discards or fixes it)."""
        try:
            data: dict[str, Any] = json.loads(body)
            event = cls(**data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not an after-sales event: {exc}") from exc
        if event.kind not in KINDS:
            raise ValueError(f"unknown after-sales event kind {event.kind!r}")
        if event.seq < 1:
            raise ValueError(f"event {event.event_id}: seq must be >= 1, not {event.seq}")
        return event
