"""Payload conversion: what ``send_in_transaction(topic, payload)`` puts in the message body.

bytes go as they are; str as UTF-8; dict, list, dataclass instances and pydantic models as JSON
(UTF-8).  Anything else needs a converter: ``register_converter(Money, encode, decode)``.
:func:`from_body` is the inverse for listeners and consumers (``from_body(message.body, Order)``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from txmsg.errors import InvalidMessageError, ListenerDefinitionError

T = TypeVar("T")

Encoder = Callable[[Any], bytes]
Decoder = Callable[[bytes], Any]

_lock = threading.Lock()
_encoders: dict[type, Encoder] = {}
_decoders: dict[type, Decoder] = {}


def register_converter(
    type_: type[T], encode: Callable[[T], bytes], decode: Callable[[bytes], T] | None = None
) -> None:
    """Teach txmsg to turn ``type_`` (and its subclasses) into bytes, and optionally back.

    A registered converter wins over the built-in rules, so it can also change how e.g. a
    dataclass is encoded.
    """
    if not isinstance(type_, type):
        raise ListenerDefinitionError(
            f"register_converter needs a type as first argument, got {type_!r}"
        )
    with _lock:
        _encoders[type_] = cast(Encoder, encode)
        if decode is not None:
            _decoders[type_] = decode


def unregister_converter(type_: type) -> None:
    """Forget a converter (tests)."""
    with _lock:
        _encoders.pop(type_, None)
        _decoders.pop(type_, None)


def _lookup(table: dict[type, Any], type_: type) -> Any:
    with _lock:
        for base in type_.__mro__:
            found = table.get(base)
            if found is not None:
                return found
    return None


def _is_pydantic(value: Any) -> bool:
    return callable(getattr(value, "model_dump_json", None)) and hasattr(
        type(value), "model_fields"
    )


def _json(value: Any) -> bytes:
    return json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), default=_json_default
    ).encode()


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if _is_pydantic(value):
        return value.model_dump(mode="json")
    raise InvalidMessageError(
        f"{type(value).__name__} is not JSON serialisable; pass bytes/str or "
        f"register_converter({type(value).__name__}, encode, decode)"
    )


def to_body(payload: Any) -> bytes:
    """Convert a payload to a message body (see the module docstring for the rules)."""
    encoder = _lookup(_encoders, type(payload))
    if encoder is not None:
        body = encoder(payload)
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidMessageError(
                f"the converter registered for {type(payload).__name__} returned "
                f"{type(body).__name__}; it must return bytes"
            )
        return bytes(body)
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if isinstance(payload, dict | list | tuple):
        return _json(payload)
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        return _json(dataclasses.asdict(payload))
    if _is_pydantic(payload):
        return cast(str, payload.model_dump_json()).encode("utf-8")
    if payload is None:
        raise InvalidMessageError("payload is None; send b'' for an empty body")
    raise InvalidMessageError(
        f"cannot convert a {type(payload).__name__} payload to a message body; pass bytes, str, "
        f"dict, list, a dataclass or a pydantic model, or call "
        f"txmsg.register_converter({type(payload).__name__}, encode, decode)"
    )


def from_body(body: bytes, type_: type[T]) -> T:
    """Decode a message body into ``type_`` (the inverse of :func:`to_body`)."""
    decoder = _lookup(_decoders, type_)
    if decoder is not None:
        return cast(T, decoder(body))
    if type_ is bytes:
        return cast(T, bytes(body))
    if type_ is str:
        return cast(T, body.decode("utf-8"))
    factory: Any = type_
    if type_ in (dict, list, tuple):
        return cast(T, factory(json.loads(body)))
    if dataclasses.is_dataclass(type_):
        return cast(T, factory(**json.loads(body)))
    validate = getattr(type_, "model_validate_json", None)
    if callable(validate):
        return cast(T, validate(body))
    raise InvalidMessageError(
        f"cannot decode a body into {type_.__name__}; call "
        f"txmsg.register_converter({type_.__name__}, encode, decode)"
    )
