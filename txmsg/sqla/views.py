"""Detached views of stored rows: what the operator commands and their APIs hand out.

Why one helper: every table an operator looks at (records, discarded half messages, parked
messages, outbox rows) is shown as a frozen dataclass copied from its ORM row, detached from the
session. Most of a view's fields are the row's columns under the same name; ``view_of`` copies
those, so a view function names only what it renames or builds, and a column added to both stays
in step without a line to write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Protocol, TypeVar

from txmsg.message import Message

V = TypeVar("V")


class StoredBody(Protocol):
    """The columns every stored message has (ORM object or Core row)."""

    @property
    def topic(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def tags(self) -> str | None: ...
    @property
    def keys(self) -> str | None: ...
    @property
    def properties(self) -> Mapping[str, str] | None: ...


def view_of(cls: type[V], row: object, /, **given: Any) -> V:
    """``cls`` (a dataclass) with ``given``, each other field read from ``row``'s attribute of
    the same name."""
    copied = {f.name: getattr(row, f.name) for f in fields(cls) if f.name not in given}  # type: ignore[arg-type]
    return cls(**copied, **given)


def message_of(row: StoredBody, /, **given: Any) -> Message:
    """The message a row stores: its topic, body, tags, keys and properties, with ``given``."""
    return Message(
        topic=row.topic,
        body=bytes(row.body),
        tags=row.tags,
        keys=row.keys,
        properties=dict(row.properties or {}),
        **given,
    )
