"""Assemble the order sample: databases, the txmsg app, listeners, consumers and services.

::

    config, settings = samples.order.settings.load()     # samples/order/txmsg.toml
    with OrderSample(config, settings) as sample:         # starts txmsg (producers, consumers)
        sample.orders.pay("order-1")

``injector`` builds everything: :class:`OrderSampleModule` provides one session factory per
service database, ``txmsg.TxMsgModule`` provides the producers, and ``OrderService`` gets both
injected.  The demo passes a fault-injecting listener and consumer wrapper; everything else is
what a real deployment runs (in one process here for convenience: each service only touches its
own database, so they could as well be four processes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from injector import Injector, Module, provider, singleton
from sqlalchemy import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from samples.order import cart, logistics, points
from samples.order.events import TOPIC
from samples.order.keys import CartDb, LogisticsDb, OrdersDb, PointsDb
from samples.order.orders import ORDER_GROUP, OrderBase, OrderService, PaymentListener
from samples.order.settings import OrderSampleSettings
from txmsg import LocalTransactionState, TxMsg, TxMsgConfig, TxMsgModule
from txmsg.backend import Backend
from txmsg.message import Message
from txmsg.sqla import create_engine, create_tables, make_session_factory, wrap_idempotent

ConsumerWrapper = Callable[[str, Callable[[Message], Any]], Callable[[Message], Any]]
"""``wrapper(group, idempotent_consumer) -> handler``: lets the demo inject faults."""

CONSUMERS = (
    (points.GROUP, points.on_order_paid, PointsDb),
    (logistics.GROUP, logistics.on_order_paid, LogisticsDb),
    (cart.GROUP, cart.on_order_paid, CartDb),
)


class OrderSampleModule(Module):
    """One engine and session factory per service database, tables created on first use."""

    def __init__(self, settings: OrderSampleSettings) -> None:
        self.settings = settings
        self.engines: list[Engine] = []

    def _sessions(self, url: str, base: type[DeclarativeBase]) -> sessionmaker[Session]:
        engine = create_engine(url)
        self.engines.append(engine)
        base.metadata.create_all(engine)
        create_tables(engine)  # txmsg's record / dedup tables live next to the business tables
        return make_session_factory(engine)

    @singleton
    @provider
    def orders_db(self) -> OrdersDb:
        return self._sessions(self.settings.orders_db, OrderBase)

    @singleton
    @provider
    def points_db(self) -> PointsDb:
        return self._sessions(self.settings.points_db, points.PointsBase)

    @singleton
    @provider
    def logistics_db(self) -> LogisticsDb:
        return self._sessions(self.settings.logistics_db, logistics.LogisticsBase)

    @singleton
    @provider
    def cart_db(self) -> CartDb:
        return self._sessions(self.settings.cart_db, cart.CartBase)

    def dispose(self) -> None:
        for engine in self.engines:
            engine.dispose()


class OrderSample:
    """The running sample: ``orders`` (OrderService), the four session factories, the app."""

    def __init__(
        self,
        config: TxMsgConfig,
        settings: OrderSampleSettings,
        *,
        listener: PaymentListener | None = None,
        listener_factory: Callable[[sessionmaker[Session]], PaymentListener] | None = None,
        consumer_wrapper: ConsumerWrapper | None = None,
        backend: Backend | str | None = None,
    ) -> None:
        self.settings = settings
        self.app = TxMsg(config, backend=backend)
        self.module = OrderSampleModule(settings)
        self.injector = Injector([self.module, TxMsgModule(self.app, groups=[ORDER_GROUP])])
        self.orders_db = self.injector.get(OrdersDb)
        self.points_db = self.injector.get(PointsDb)
        self.logistics_db = self.injector.get(LogisticsDb)
        self.cart_db = self.injector.get(CartDb)
        if listener is None:
            factory = listener_factory or self.default_listener
            listener = factory(self.orders_db)
        self.listener = listener
        self.app.add_transactional_listener(
            listener,
            group=ORDER_GROUP,
            topics=[TOPIC],
            execute_exception_state=LocalTransactionState.ROLLBACK,
        )
        for group, fn, key in CONSUMERS:
            sessions = self.injector.get(key)
            if consumer_wrapper is None:
                self.app.add_message_listener(
                    fn, topic=TOPIC, group=group, idempotent=True, session_factory=sessions
                )
            else:
                consumer = wrap_idempotent(fn, sessions, group, TOPIC)
                self.app.add_message_listener(
                    consumer_wrapper(group, consumer), topic=TOPIC, group=group
                )
        self._orders: OrderService | None = None

    def default_listener(self, sessions: sessionmaker[Session]) -> PaymentListener:
        return PaymentListener(
            sessions,
            answer_within=self.settings.answer_within,
            grace_period=self.settings.grace_period,
            in_flight_timeout=self.settings.in_flight_timeout,
        )

    @property
    def orders(self) -> OrderService:
        """The order service (built by the injector once the producers exist)."""
        if self._orders is None:
            self._orders = self.injector.get(OrderService)
        return self._orders

    def start(self) -> OrderSample:
        self.app.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop consumers and producers, let late local transactions finish, close databases."""
        self.listener.close()  # late local transactions finish while check-backs can still come
        self.app.close(timeout)
        self.module.dispose()

    def __enter__(self) -> OrderSample:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
