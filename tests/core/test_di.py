"""injector wiring: services receive producers by type, or by group."""

from __future__ import annotations

from collections.abc import Iterator
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
    UnknownGroupError,
    producer_for,
)

from .doubles import DoubleBackend


class Clock:
    def now(self) -> str:
        return "12:00"


def declare(app: TxMsg) -> None:
    for group in ("order-tx", "fee-tx"):

        @app.transactional_listener(group=group)
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
def wired() -> Iterator[tuple[TxMsg, injector.Injector]]:
    app = TxMsg(TxMsgConfig(producer={"group": "order-tx"}), backend=DoubleBackend())  # type: ignore[arg-type]
    declare(app)
    inj = injector.Injector([TxMsgModule(app)])
    app.listener_factory = inj.get
    yield app, inj
    app.close()


def test_services_get_the_default_and_group_producers(
    wired: tuple[TxMsg, injector.Injector],
) -> None:
    app, inj = wired
    with app:
        orders = inj.get(OrderService)
        assert orders.producer is app.producer("order-tx")
        assert orders.app is app
        fees = inj.get(FeeService)
        assert fees.fees is app.producer("fee-tx")
        assert fees.orders is app.producer("order-tx")
        assert isinstance(app.producer("fee-tx").listener.clock, Clock)  # listener built by DI
        assert inj.get(TxMsgConfig) is app.config


def test_resolving_before_start_says_so(wired: tuple[TxMsg, injector.Injector]) -> None:
    _app, inj = wired
    with pytest.raises(NotStartedError, match="start"):
        inj.get(OrderService)


def test_unknown_group_binding_fails_at_use() -> None:
    app = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    inj = injector.Injector([TxMsgModule(app, groups=["ghost-tx"])])
    with app, pytest.raises(UnknownGroupError, match="ghost-tx"):
        inj.get(producer_for("ghost-tx"))


def test_async_producers_are_injected(wired: tuple[TxMsg, injector.Injector]) -> None:
    """Issue 27: ``Annotated[AsyncProducer, ProducerGroup(g)]`` and plain ``AsyncProducer`` are
    the app's awaitable producers."""
    from txmsg import AsyncProducer  # noqa: PLC0415
    from txmsg.di import async_producer_for  # noqa: PLC0415

    app, inj = wired
    app.start()
    fees = inj.get(Annotated[AsyncProducer, ProducerGroup("fee-tx")])
    assert fees is app.async_producer("fee-tx")
    assert fees.transactional
    assert inj.get(async_producer_for("fee-tx")) is fees
    assert inj.get(AsyncProducer) is app.async_producer()
    assert app.async_producer().group == "order-tx"


def test_async_transactional_producers_are_injected(wired: tuple[TxMsg, injector.Injector]) -> None:
    """Issue 37 item 4: the awaitable side has the sync side's two types, each with its keys."""
    from txmsg import AsyncTransactionalProducer  # noqa: PLC0415

    app, inj = wired
    app.start()
    fees = inj.get(Annotated[AsyncTransactionalProducer, ProducerGroup("fee-tx")])  # type: ignore[arg-type]
    assert fees is app.async_transactional_producer("fee-tx") is app.async_producer("fee-tx")
    assert inj.get(AsyncTransactionalProducer) is app.async_transactional_producer()
