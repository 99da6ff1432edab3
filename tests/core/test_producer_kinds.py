"""Two producer types: ``Producer`` sends plain messages, ``TransactionalProducer`` adds the
transactional sends.  The type says what a group can do, so a type checker sees a
``send_in_transaction`` on a plain group before it runs; ``app.transactional_producer(group)``
returns the transactional type, and ``app.producer(group)`` keeps returning every group's
producer (a listener group's is a ``TransactionalProducer``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import txmsg
from txmsg import (
    LocalTransactionState,
    Message,
    Producer,
    TransactionalProducer,
    TxMsg,
    TxMsgConfig,
    UnknownGroupError,
)

from .test_app import PlainToo, Recorder

S = LocalTransactionState


@pytest.fixture
def app() -> Iterator[TxMsg]:
    application = TxMsg(TxMsgConfig(), backend=PlainToo())
    application.add_transactional_listener(Recorder(), group="order-tx", topics=["orders"])
    application.add_producer(group="notify")
    with application:
        yield application


def test_a_listener_group_has_a_transactional_producer(app: TxMsg) -> None:
    producer = app.transactional_producer("order-tx")
    assert isinstance(producer, TransactionalProducer)
    assert producer is app.producer("order-tx")  # the one producer of the group
    assert producer.transactional
    assert producer.send_in_transaction("orders", b"x").local_state is S.COMMIT
    assert producer.send("events", b"plain too").send_status == "SEND_OK"


def test_a_plain_group_has_a_plain_producer(app: TxMsg) -> None:
    producer = app.producer("notify")
    assert type(producer) is Producer
    assert not isinstance(producer, TransactionalProducer)
    assert not producer.transactional
    assert "send_in_transaction" not in dir(producer)  # the type has none: mypy flags the call
    with pytest.raises(UnknownGroupError, match=r"plain producer group.*app\.producer\('notify'\)"):
        app.transactional_producer("notify")


def test_the_default_transactional_producer_is_the_only_listener_group(app: TxMsg) -> None:
    with pytest.raises(UnknownGroupError, match="several producer groups"):
        app.producer()  # two groups, none configured
    assert app.transactional_producer() is app.producer("order-tx")  # one of them sends in txs


def test_transactional_producer_is_a_producer_and_exported() -> None:
    assert issubclass(TransactionalProducer, Producer)
    assert TransactionalProducer is not Producer
    assert txmsg.TransactionalProducer is TransactionalProducer
    assert "send_in_transaction" in vars(TransactionalProducer)
    assert "send_in_transaction" not in vars(Producer)


def test_the_awaitable_producers_have_the_same_two_types(app: TxMsg) -> None:
    """Issue 37 item 4: no mode switched at run time; a plain group's awaitable producer has no
    ``send_in_transaction``, and the lookup of a transactional one says why."""
    assert issubclass(txmsg.AsyncTransactionalProducer, txmsg.AsyncProducer)
    assert "send_in_transaction" not in vars(txmsg.AsyncProducer)
    plain = app.async_producer("notify")
    assert type(plain) is txmsg.AsyncProducer
    assert not plain.transactional
    orders = app.async_transactional_producer("order-tx")
    assert orders is app.async_producer("order-tx")
    assert orders.transactional
    with pytest.raises(UnknownGroupError, match=r"plain producer group.*app\.producer\('notify'\)"):
        app.async_transactional_producer("notify")


def test_the_di_keys_of_both_types(app: TxMsg) -> None:
    from typing import Annotated  # noqa: PLC0415

    import injector  # noqa: PLC0415

    from txmsg import ProducerGroup, TxMsgModule, producer_for  # noqa: PLC0415

    inj = injector.Injector([TxMsgModule(app)])
    orders = app.producer("order-tx")
    assert inj.get(producer_for("order-tx")) is orders
    assert inj.get(Annotated[TransactionalProducer, ProducerGroup("order-tx")]) is orders  # type: ignore[arg-type]
    assert inj.get(producer_for("notify")) is app.producer("notify")
    assert inj.get(TransactionalProducer) is orders
    with pytest.raises(UnknownGroupError, match=r"plain producer group.*app\.producer\('notify'\)"):
        inj.get(Annotated[TransactionalProducer, ProducerGroup("notify")])  # type: ignore[arg-type]
    with pytest.raises(UnknownGroupError, match="ghost"):
        injector.Injector([TxMsgModule(app, groups=["ghost"])]).get(
            Annotated[TransactionalProducer, ProducerGroup("ghost")]  # type: ignore[arg-type]
        )


def test_messages_reach_the_listener_of_the_transactional_producer(app: TxMsg) -> None:
    producer = app.transactional_producer("order-tx")
    producer.send_in_transaction("orders", b"hello", arg=7)
    listener = producer.listener
    assert isinstance(listener, Recorder)
    message, arg, _ = listener.executed[-1]
    assert isinstance(message, Message)
    assert (message.body, arg) == (b"hello", 7)
