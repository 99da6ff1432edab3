"""The rescue's pieces without a broker: the options, the hook's declaration, what a rescued
message carries, and which discards a group owns."""

from __future__ import annotations

from typing import Any

import pytest

from txmsg import ListenerDefinitionError, LocalTransactionState, Message, TxMsg, TxMsgConfig
from txmsg.listener import build_spec
from txmsg.message import DEDUP_KEY, RESCUED_FROM, UNIQ_KEY
from txmsg.rescue import (
    RESCUED_PROPERTY,
    ROUND_PROPERTY,
    Rescuer,
    half_message,
    rescue_group,
    rescued_message,
    rounds_spent,
)


class Listener:
    def execute_local(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


def discarded(**props: str) -> Message:
    """A discarded half message as the rescue consumer reads it."""
    base = {
        UNIQ_KEY: "K1",
        "REAL_TOPIC": "orders",
        "REAL_QID": "3",
        "PGROUP": "order-tx",
        "TRAN_MSG": "true",
        "TRANSACTION_CHECK_TIMES": "15",
        "KEYS": "order-1",
        "TAGS": "paid",
        "tenant": "acme",
    }
    return Message(
        topic="TRANS_CHECK_MAX_TIME_TOPIC",
        body=b'{"order": 1}',
        tags="paid",
        keys="order-1",
        properties={**base, **props},
        message_id="OFFSET-ID",
    )


def test_the_options_are_declared_on_the_listener_and_checked() -> None:
    spec = build_spec(Listener, group="order-tx")
    assert spec.rescue_discarded is True
    assert spec.rescue_attempts == 16
    off = build_spec(Listener, group="order-tx", rescue_discarded=False, rescue_attempts=3)
    assert (off.rescue_discarded, off.rescue_attempts) == (False, 3)
    with pytest.raises(ListenerDefinitionError, match="rescue_discarded must be True or False"):
        build_spec(Listener, group="order-tx", rescue_discarded="no")  # type: ignore[arg-type]
    with pytest.raises(ListenerDefinitionError, match="rescue_attempts must be an int >= 1"):
        build_spec(Listener, group="order-tx", rescue_attempts=0)
    with pytest.raises(ListenerDefinitionError, match="rescue_attempts"):
        build_spec(Listener, group="order-tx", rescue_attempts=True)
    app = TxMsg(TxMsgConfig())
    app.transactional_listener(group="order-tx", rescue_discarded=False)(Listener)
    listener = app.registry.listener("order-tx")
    assert listener is not None
    assert listener.rescue_discarded is False


def test_the_hook_is_a_plain_function_declared_before_start() -> None:
    app = TxMsg(TxMsgConfig())
    seen: list[Any] = []
    hook = seen.append
    assert app.on_transaction_discarded(hook) is hook
    assert app.transaction_discarded_hooks == (hook,)

    async def paging(event: Any) -> None:
        return None

    with pytest.raises(ListenerDefinitionError, match="not async def"):
        app.on_transaction_discarded(paging)
    with pytest.raises(ListenerDefinitionError):
        app.on_transaction_discarded("page me")  # type: ignore[type-var]


def test_the_half_message_is_what_a_check_back_shows() -> None:
    half = half_message(discarded())
    assert half is not None
    assert half.topic == "orders"
    assert half.transaction_key == "K1"
    assert half.message_id == "K1"
    # a copy the broker redelivered through its delay queue has lost its real topic
    assert half_message(discarded(REAL_TOPIC="%RETRY%order-tx-txmsg-rescue")) is None
    assert half_message(discarded(REAL_TOPIC="")) is None


def test_a_rescued_message_keeps_the_users_and_drops_the_brokers() -> None:
    half = half_message(discarded())
    assert half is not None
    out = rescued_message(half, 1)
    assert (out.topic, out.body, out.tags, out.keys) == (
        "orders",
        b'{"order": 1}',
        "paid",
        "order-1",
    )
    assert out.properties == {
        "tenant": "acme",
        DEDUP_KEY: "K1",
        RESCUED_PROPERTY: "K1",
        ROUND_PROPERTY: "1",
    }
    # a dedup key of its own (an outbox relay's, a sender's) is the one consumers know it by
    kept = half_message(discarded(**{DEDUP_KEY: "row-7"}))
    assert kept is not None
    assert rescued_message(kept, 2).properties[DEDUP_KEY] == "row-7"


def test_rounds_and_the_original_key_survive_the_next_round() -> None:
    again = discarded(**{UNIQ_KEY: "K2", RESCUED_FROM: "K1", ROUND_PROPERTY: "3"})
    assert rounds_spent(again) == 3
    assert rounds_spent(discarded()) == 0
    assert rounds_spent(discarded(**{ROUND_PROPERTY: "x"})) == 0
    half = half_message(again)
    assert half is not None
    assert half.transaction_key == "K1"  # check_local and the records see the original
    assert rescued_message(half, 4).properties[RESCUED_PROPERTY] == "K1"


class _Producer:
    group = "order-tx"


def test_a_group_owns_its_discards_and_by_topic_where_the_proxy_names_them_so() -> None:
    remoting = Rescuer(_Producer(), attempts=1, store=_Store())  # type: ignore[arg-type]
    assert remoting.owns("order-tx")
    assert not remoting.owns("orders")
    assert not remoting.owns(None)
    grpc = Rescuer(_Producer(), attempts=1, store=_Store(), topic_groups=("orders",))  # type: ignore[arg-type]
    assert grpc.owns("orders")
    assert grpc.owns("tenant-ns%orders")
    assert not grpc.owns("refunds")
    assert rescue_group("order-tx") == "order-tx-txmsg-rescue"


class _Store:
    def add(self, event: Any) -> bool:
        return False
