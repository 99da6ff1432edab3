"""injector wiring: services receive producers by type, or by group."""

from __future__ import annotations

from typing import Annotated

import injector
import pytest

from txmsg import (
    LocalTransactionState,
    Message,
    NotStartedError,
    ProducerGroup,
    TransactionalProducer,
    TxMsg,
    TxMsgConfig,
    TxMsgModule,
    producer_for,
    transactional_listener,
)
from txmsg.errors import ListenerDefinitionError

from .doubles import DoubleBackend


class Clock:
    def now(self) -> str:
        return "12:00"


def declare(registry: object) -> None:
    for group in ("order-tx", "fee-tx"):

        @transactional_listener(group=group, registry=registry)  # type: ignore[arg-type]
        class Listener:
            @injector.inject
            def __init__(self, clock: Clock) -> None:
                self.clock = clock

            def execute_local(self, message: Message, arg: object) -> LocalTransactionState:
                return LocalTransactionState.COMMIT

            def check_local(self, message: Message) -> LocalTransactionState:
                return LocalTransactionState.COMMIT


class OrderService:
    @injector.inject
    def __init__(self, producer: TransactionalProducer, app: TxMsg) -> None:
        self.producer = producer
        self.app = app


OrderProducer = Annotated[TransactionalProducer, ProducerGroup("order-tx")]


class FeeService:
    @injector.inject
    def __init__(
        self,
        fees: Annotated[TransactionalProducer, ProducerGroup("fee-tx")],
        orders: OrderProducer,
    ) -> None:
        self.fees = fees
        self.orders = orders


@pytest.fixture
def wired(registry: object) -> tuple[TxMsg, injector.Injector]:
    declare(registry)
    app = TxMsg(TxMsgConfig(producer={"group": "order-tx"}), registry=registry, backend=DoubleBackend())  # type: ignore[arg-type]
    inj = injector.Injector([TxMsgModule(app)])
    app.listener_factory = inj.get
    return app, inj


def test_services_get_the_default_and_group_producers(wired: tuple[TxMsg, injector.Injector]) -> None:
    app, inj = wired
    with app:
        orders = inj.get(OrderService)
        assert orders.producer is app.producer("order-tx") and orders.app is app
        fees = inj.get(FeeService)
        assert fees.fees is app.producer("fee-tx") and fees.orders is app.producer("order-tx")
        assert isinstance(app.producer("fee-tx").listener.clock, Clock)  # listener built by DI
        assert inj.get(TxMsgConfig) is app.config


def test_resolving_before_start_says_so(wired: tuple[TxMsg, injector.Injector]) -> None:
    app, inj = wired
    with pytest.raises(NotStartedError, match="start"):
        inj.get(OrderService)


def test_unknown_group_binding_fails_at_use(registry: object) -> None:
    app = TxMsg(TxMsgConfig(), registry=registry, backend=DoubleBackend())  # type: ignore[arg-type]
    inj = injector.Injector([TxMsgModule(app, groups=["ghost-tx"])])
    with app, pytest.raises(ListenerDefinitionError, match="ghost-tx"):
        inj.get(producer_for("ghost-tx"))
