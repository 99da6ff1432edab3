"""Wire the payment -> fee sample into a txmsg application.

Small on purpose: one database holds payments, fees and the txmsg tables (in production the fee
service would have its own; nothing here depends on sharing it).
"""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from txmsg import TxMsg, TxMsgConfig
from txmsg_samples.payment_fee import fees
from txmsg_samples.payment_fee.payments import GROUP, TOPIC, PaymentListener, PaymentService


def build(config: TxMsgConfig, sessions: sessionmaker[Session]) -> tuple[TxMsg, PaymentListener]:
    """The app (not started) with the payment listener and the idempotent fee consumer."""
    app = TxMsg(config)
    listener = PaymentListener(sessions)
    app.add_transactional_listener(listener, group=GROUP, topics=[TOPIC])
    app.add_message_listener(
        fees.on_payment_completed,
        topic=TOPIC,
        group=fees.GROUP,
        idempotent=True,
        session_factory=sessions,
    )
    return app, listener


def payment_service(app: TxMsg, sessions: sessionmaker[Session]) -> PaymentService:
    """The service, with the started app's producer of ``payment-tx``."""
    return PaymentService(app.transactional_producer(GROUP), sessions)
