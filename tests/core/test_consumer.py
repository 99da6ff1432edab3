"""@app.message_listener records consumers; their handlers never raise into a backend."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from txmsg import InvalidNameError, ListenerDefinitionError, ListenerRegistry, Message, TxMsg


def test_consumer_is_recorded(app: TxMsg, registry: ListenerRegistry) -> None:
    @app.message_listener(topic="orders", group="points", tags="paid", concurrency=2)
    def add_points(message: Message) -> None: ...

    spec = registry.consumers["points"]
    assert (spec.topic, spec.tags, spec.concurrency, spec.fn) == ("orders", "paid", 2, add_points)


def test_safe_handler_maps_exceptions_to_redelivery(
    app: TxMsg, registry: ListenerRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[bytes] = []

    @app.message_listener(topic="orders", group="points")
    def handle(message: Message) -> None:
        if message.body == b"bad":
            raise ValueError("cannot parse")
        seen.append(message.body)

    consume = registry.consumers["points"].safe_handler()
    assert consume(Message(topic="orders", body=b"ok")) is True
    with caplog.at_level(logging.ERROR, logger="txmsg.consumer"):
        assert consume(Message(topic="orders", body=b"bad", properties={"UNIQ_KEY": "K9"})) is False
    assert seen == [b"ok"]
    assert "group=points" in caplog.text
    assert "K9" in caplog.text


def test_wrong_arity_and_async_are_rejected(app: TxMsg) -> None:
    with pytest.raises(ListenerDefinitionError, match=r"calls it as .*\(message\)"):
        app.message_listener(topic="t", group="g")(lambda: None)

    async def consume(message: Message) -> None: ...

    app.message_listener(topic="t", group="g")(consume)  # async def: accepted (issue 27)

    async def stream(message: Message) -> Any:
        yield message

    with pytest.raises(ListenerDefinitionError, match="async generator"):
        app.message_listener(topic="t", group="g2")(stream)


def test_idempotent_needs_a_session_factory_and_two_parameters(app: TxMsg) -> None:
    with pytest.raises(ListenerDefinitionError, match="session_factory"):
        app.message_listener(topic="t", group="g", idempotent=True)(lambda message, session: None)
    with pytest.raises(ListenerDefinitionError, match=r"\(message, session\)"):
        app.message_listener(topic="t", group="g", idempotent=True, session_factory=object)(
            lambda message: None
        )


def test_one_function_per_consumer_group(app: TxMsg) -> None:
    app.message_listener(topic="a", group="g")(lambda m: None)
    with pytest.raises(ListenerDefinitionError, match="consumer group 'g' is already used"):
        app.message_listener(topic="b", group="g")(lambda m: None)


@pytest.mark.parametrize(
    ("kw", "match"), [({"concurrency": 0}, "concurrency"), ({"max_reconsume": -1}, "max_reconsume")]
)
def test_bad_options(app: TxMsg, kw: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"topic": "t", "group": "g"} | kw
    with pytest.raises(ListenerDefinitionError, match=match):
        app.message_listener(**args)(lambda m: None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "kind"), [({"topic": "a b"}, "topic"), ({"group": "points/1"}, "consumer_group")]
)
def test_bad_names(app: TxMsg, registry: ListenerRegistry, kw: dict[str, str], kind: str) -> None:
    args = {"topic": "t", "group": "g"} | kw
    with pytest.raises(InvalidNameError, match="is not accepted") as info:
        app.message_listener(**args)(lambda m: None)  # type: ignore[arg-type]
    assert info.value.kind == kind
    assert registry.consumers == {}


def test_options_are_keyword_only(app: TxMsg) -> None:
    with pytest.raises(TypeError):
        app.message_listener("t", "g")  # type: ignore[call-arg]
