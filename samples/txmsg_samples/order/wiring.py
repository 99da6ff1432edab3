"""Assemble the order sample: databases, the txmsg app, listeners, consumers and services.

::

    config, settings = txmsg_samples.order.settings.load()     # samples/txmsg_samples/order/txmsg.toml
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
from dataclasses import dataclass
from typing import Any

from injector import Binder, CallableProvider, Injector, Module, provider, singleton
from sqlalchemy import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from txmsg import LocalTransactionState, TxMsg, TxMsgConfig, TxMsgModule
from txmsg.backend import Backend
from txmsg.message import Message
from txmsg.sqla import create_engine, create_tables, make_session_factory, wrap_idempotent
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.events import TOPIC
from txmsg_samples.order.keys import (
    ORDER_GROUP,
    CartDb,
    LogisticsDb,
    OrderProducer,
    OrdersDb,
    OrderTopic,
    PointsDb,
)
from txmsg_samples.order.orders import OrderBase, OrderService, PaymentListener
from txmsg_samples.order.settings import OrderSampleSettings

ConsumerWrapper = Callable[[str, Callable[[Message], Any]], Callable[[Message], Any]]
"""``wrapper(group, idempotent_consumer) -> handler``: lets the demo inject faults."""

CONSUMERS = (
    (points.GROUP, points.on_order_paid, PointsDb),
    (logistics.GROUP, logistics.on_order_paid, LogisticsDb),
    (cart.GROUP, cart.on_order_paid, CartDb),
)


@dataclass(frozen=True)
class SampleNames:
    """The sample's names on the broker.  The defaults are the sample's own; the demo passes
    names of its own so that it never publishes to, or answers check-backs of, an application's
    ``order-paid`` / ``order-tx`` on a shared cluster."""

    topic: str = TOPIC
    producer_group: str = ORDER_GROUP
    consumer_prefix: str = ""
    """Put before each service's consumer group (``points-service`` ...) on the broker; the
    dedup rows in the service's database keep the service's own name."""

    def consumer_group(self, service_group: str) -> str:
        return self.consumer_prefix + service_group


class OrderSampleModule(Module):
    """One engine and session factory per service database, tables created on first use; the
    topic ``OrderService`` publishes to, and its producer when the names are not the default."""

    def __init__(
        self,
        settings: OrderSampleSettings,
        names: SampleNames | None = None,
        app: TxMsg | None = None,
    ) -> None:
        self.settings = settings
        self.names = names or SampleNames()
        self.app = app
        self.engines: list[Engine] = []

    def configure(self, binder: Binder) -> None:
        binder.bind(OrderTopic, to=self.names.topic)
        app, group = self.app, self.names.producer_group
        if app is not None and group != ORDER_GROUP:
            # OrderProducer names ``order-tx``; TxMsgModule binds the other group's own key
            binder.bind(OrderProducer, to=CallableProvider(lambda: app.producer(group)))

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
        names: SampleNames | None = None,
    ) -> None:
        self.settings = settings
        self.names = names = names or SampleNames()
        self.app = TxMsg(config, backend=backend)
        self.module = OrderSampleModule(settings, names, self.app)
        self.injector = Injector(
            [self.module, TxMsgModule(self.app, groups=[names.producer_group])]
        )
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
            group=names.producer_group,
            topics=[names.topic],
            execute_exception_state=LocalTransactionState.ROLLBACK,
        )
        for group, fn, key in CONSUMERS:
            sessions = self.injector.get(key)
            broker_group = names.consumer_group(group)
            if consumer_wrapper is None and broker_group == group:
                self.app.add_message_listener(
                    fn, topic=names.topic, group=group, idempotent=True, session_factory=sessions
                )
            else:  # dedup rows under the service's own name, whatever the broker group is
                consumer = wrap_idempotent(fn, sessions, group, names.topic)
                handler = (
                    consumer if consumer_wrapper is None else consumer_wrapper(group, consumer)
                )
                self.app.add_message_listener(handler, topic=names.topic, group=broker_group)
        self._orders: OrderService | None = None

    def default_listener(self, sessions: sessionmaker[Session]) -> PaymentListener:
        return PaymentListener(
            sessions,
            group=self.names.producer_group,
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
