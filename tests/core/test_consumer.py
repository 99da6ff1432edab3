"""@message_listener records consumers; their handlers never raise into a backend."""

from __future__ import annotations

import logging

import pytest

from txmsg import ListenerDefinitionError, ListenerRegistry, Message, message_listener


def test_consumer_is_recorded(registry: ListenerRegistry) -> None:
    @message_listener(topic="orders", group="points", tags="paid", concurrency=2, registry=registry)
    def add_points(message: Message) -> None: ...

    spec = registry.consumers["points"]
    assert (spec.topic, spec.tags, spec.concurrency, spec.fn) == ("orders", "paid", 2, add_points)


def test_safe_handler_maps_exceptions_to_redelivery(
    registry: ListenerRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[bytes] = []

    @message_listener(topic="orders", group="points", registry=registry)
    def handle(message: Message) -> None:
        if message.body == b"bad":
            raise ValueError("cannot parse")
        seen.append(message.body)

    consume = registry.consumers["points"].safe_handler()
    assert consume(Message(topic="orders", body=b"ok")) is True
    with caplog.at_level(logging.ERROR, logger="txmsg.consumer"):
        assert consume(Message(topic="orders", body=b"bad", properties={"UNIQ_KEY": "K9"})) is False
    assert seen == [b"ok"] and "group=points" in caplog.text and "K9" in caplog.text


def test_wrong_arity_and_async_are_rejected(registry: ListenerRegistry) -> None:
    with pytest.raises(ListenerDefinitionError, match=r"calls it as .*\(message\)"):
        message_listener(topic="t", group="g", registry=registry)(lambda: None)

    async def consume(message: Message) -> None: ...

    with pytest.raises(ListenerDefinitionError, match="async def"):
        message_listener(topic="t", group="g", registry=registry)(consume)


def test_idempotent_needs_a_session_factory_and_two_parameters(registry: ListenerRegistry) -> None:
    with pytest.raises(ListenerDefinitionError, match="session_factory"):
        message_listener(topic="t", group="g", idempotent=True, registry=registry)(
            lambda message, session: None
        )
    with pytest.raises(ListenerDefinitionError, match=r"\(message, session\)"):
        message_listener(
            topic="t", group="g", idempotent=True, session_factory=object, registry=registry
        )(lambda message: None)


def test_one_function_per_consumer_group(registry: ListenerRegistry) -> None:
    message_listener(topic="a", group="g", registry=registry)(lambda m: None)
    with pytest.raises(ListenerDefinitionError, match="consumer group 'g' is already used"):
        message_listener(topic="b", group="g", registry=registry)(lambda m: None)


@pytest.mark.parametrize(("kw", "match"), [({"concurrency": 0}, "concurrency"), ({"max_reconsume": -1}, "max_reconsume"), ({"topic": "a b"}, "topic")])
def test_bad_options(registry: ListenerRegistry, kw: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"topic": "t", "group": "g", "registry": registry} | kw
    with pytest.raises(ListenerDefinitionError, match=match):
        message_listener(**args)(lambda m: None)  # type: ignore[arg-type]
