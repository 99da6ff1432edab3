"""The options of an outbox, declared once: :class:`txmsg.sqla.outbox.Outbox` and
``TxMsg.add_outbox`` take the keyword-only parameters of :func:`build_outbox_options` (through
:func:`txmsg.registry.declares_with`, as the listener decorators take their builders').

Here, not beside ``Outbox``: the app declares ``add_outbox`` with them when it is imported, and
importing the app loads no SQLAlchemy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from txmsg.errors import ConfigError
from txmsg.names import NameRule, check_name

if TYPE_CHECKING:
    from txmsg.sqla.engine import SessionFactory
    from txmsg.sqla.outbox.policy import RetryPolicy

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""A RocketMQ broker's default ``maxMessageSize`` (4 MiB)."""


@dataclass(frozen=True)
class OutboxOptions:
    """An outbox's validated options (the parameters of :func:`build_outbox_options`)."""

    group: str
    session_factory: SessionFactory
    relay: bool
    retry: RetryPolicy | None
    poll_interval: float
    batch_size: int
    max_body_bytes: int
    lease: float
    send_timeout: float
    name_rules: tuple[NameRule, ...]


def build_outbox_options(
    name_rules: tuple[NameRule, ...],
    /,
    *,
    group: str,
    session_factory: SessionFactory,
    relay: bool = True,
    retry: RetryPolicy | None = None,
    poll_interval: float = 1.0,
    batch_size: int = 64,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    lease: float = 15.0,
    send_timeout: float = 30.0,
) -> OutboxOptions:
    """Validate an outbox's options; ``name_rules`` are the topic rules of the app's backend.

    Parameters:
        group: the producer group the relay sends with; also the rows' ``outbox`` column, so
            several outboxes can share a database.
        session_factory: sessions on the database where the business tables and txmsg's tables
            are (``txmsg.sqla.make_session_factory(engine)``); the relay uses it too.
        relay: run the relay in this process (default).  False for processes that only write
            (web workers): run ``txmsg outbox relay --app MODULE:app`` elsewhere.
        retry: back-off and attempts of failed sends (``txmsg.sqla.outbox.RetryPolicy``).
        poll_interval: seconds between the relay's looks for rows its process did not write.
        batch_size: rows a relay cycle sends at once (at most one per sharding key).
        max_body_bytes: larger bodies are refused by ``Outbox.send`` (the broker's limit).
        lease: SQLite only: seconds a relay's lease lasts without renewal.
        send_timeout: seconds a cycle waits for the broker's answers before counting a send as
            failed (the backend's own send timeout answers first, normally).

    Raises:
        InvalidNameError: RocketMQ or the backend refuses ``group``.
        ConfigError: an invalid option.
    """
    check_name("producer_group", group, owner="add_outbox", rules=name_rules)
    if not callable(session_factory):
        raise ConfigError(
            f"outbox {group!r}: session_factory must return SQLAlchemy sessions "
            f"(txmsg.sqla.make_session_factory(engine)), got {session_factory!r}"
        )
    for name, value, low in (
        ("poll_interval", poll_interval, 0.01),
        ("lease", lease, 1.0),
        ("send_timeout", send_timeout, 0.1),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"outbox {group!r}: {name} must be seconds, got {value!r}")
        if not math.isfinite(value) or value < low:
            raise ConfigError(f"outbox {group!r}: {name} must be >= {low} s, got {value!r}")
    for name, count in (("batch_size", batch_size), ("max_body_bytes", max_body_bytes)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"outbox {group!r}: {name} must be an int >= 1, got {count!r}")
    if poll_interval > lease / 3:
        raise ConfigError(
            f"outbox {group!r}: poll_interval ({poll_interval} s) must be at most lease / 3 "
            f"({lease / 3:.1f} s): a SQLite relay renews its lease between polls"
        )
    return OutboxOptions(
        group=group,
        session_factory=session_factory,
        relay=bool(relay),
        retry=retry,
        poll_interval=float(poll_interval),
        batch_size=batch_size,
        max_body_bytes=max_body_bytes,
        lease=float(lease),
        send_timeout=float(send_timeout),
        name_rules=name_rules,
    )
