"""Payload conversion round trips."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from decimal import Decimal

import pytest
from pydantic import BaseModel

from txmsg import Message, from_body, register_converter, to_body
from txmsg.convert import unregister_converter


@dataclasses.dataclass
class Order:
    id: int
    items: list[str]
    note: str | None = None


class Payment(BaseModel):
    order_id: int
    amount: Decimal
    currency: str = "EUR"


class Money:
    def __init__(self, cents: int) -> None:
        self.cents = cents

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and other.cents == self.cents


@pytest.fixture
def money() -> Iterator[None]:
    register_converter(Money, lambda m: str(m.cents).encode(), lambda b: Money(int(b)))
    yield
    unregister_converter(Money)


def test_bytes_and_str_go_as_they_are() -> None:
    assert to_body(b"\x00\xff") == b"\x00\xff"
    assert to_body(bytearray(b"ab")) == b"ab"
    assert to_body("zürich") == "zürich".encode()
    assert from_body(to_body("zürich"), str) == "zürich"
    assert from_body(b"\x00\xff", bytes) == b"\x00\xff"


def test_dict_and_list_become_json() -> None:
    payload = {"id": 7, "tags": ["a", "ü"], "nested": {"ok": True}}
    body = to_body(payload)
    assert json.loads(body) == payload
    assert "ü" in body.decode()
    assert from_body(body, dict) == payload
    assert from_body(to_body([1, 2]), list) == [1, 2]


def test_dataclass_round_trip() -> None:
    order = Order(1, ["book", "pen"])
    assert json.loads(to_body(order)) == {"id": 1, "items": ["book", "pen"], "note": None}
    assert from_body(to_body(order), Order) == order


def test_pydantic_round_trip() -> None:
    payment = Payment(order_id=3, amount=Decimal("12.50"))
    assert from_body(to_body(payment), Payment) == payment


def test_nested_dataclass_in_dict() -> None:
    assert json.loads(to_body({"order": Order(2, [])})) == {
        "order": {"id": 2, "items": [], "note": None}
    }


def test_custom_converter_round_trip(money: None) -> None:
    assert to_body(Money(1250)) == b"1250"
    assert from_body(b"1250", Money) == Money(1250)


def test_custom_converter_applies_to_subclasses(money: None) -> None:
    class Cents(Money):
        pass

    assert to_body(Cents(5)) == b"5"


def test_unconvertible_payload_says_how_to_fix() -> None:
    with pytest.raises(TypeError, match=r"register_converter\(Money, encode, decode\)"):
        to_body(Money(1))
    with pytest.raises(TypeError, match="b''"):
        to_body(None)
    with pytest.raises(TypeError, match="register_converter"):
        from_body(b"1", Money)


def test_converter_must_return_bytes() -> None:
    register_converter(Money, lambda m: m.cents)  # type: ignore[arg-type, return-value]
    try:
        with pytest.raises(TypeError, match="must return bytes"):
            to_body(Money(1))
    finally:
        unregister_converter(Money)


def test_message_decode_helper() -> None:
    message = Message(topic="t", body=to_body(Order(4, ["x"])))
    assert message.decode(Order) == Order(4, ["x"])
    assert message.json()["id"] == 4
    assert Message(topic="t", body="ü".encode()).text() == "ü"
