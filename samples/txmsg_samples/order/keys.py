"""Injection keys: the order producer, and one session factory per service database (each
service owns its own)."""

from __future__ import annotations

from typing import Annotated

from sqlalchemy.orm import Session, sessionmaker

from txmsg import ProducerGroup, TransactionalProducer

ORDER_GROUP = "order-tx"
"""Producer group of the order service's transactional messages."""

OrderProducer = Annotated[TransactionalProducer, ProducerGroup(ORDER_GROUP)]
"""The producer of ``order-tx`` (bound by ``txmsg.TxMsgModule``)."""

OrderTopic = Annotated[str, "order-topic"]
"""The topic ``OrderService.pay`` publishes to (``events.TOPIC`` unless the wiring says otherwise:
the demo uses its own topic on a shared cluster)."""

OrdersDb = Annotated[sessionmaker[Session], "orders-db"]
PointsDb = Annotated[sessionmaker[Session], "points-db"]
LogisticsDb = Annotated[sessionmaker[Session], "logistics-db"]
CartDb = Annotated[sessionmaker[Session], "cart-db"]
