"""Orderly listeners: bounded retries in place, then the sharding key is parked, not the queue.

A RocketMQ orderly consumer hands a queue's messages one at a time, in order, and retries a
failing one forever: every later message of the queue waits behind it, whatever its key.  The
handler built here (``@message_listener(..., orderly=True)``; :meth:`ConsumerSpec.safe_handler
<txmsg.consumer.ConsumerSpec.safe_handler>`) bounds that, per message:

1. its sharding key is parked for this group -> the message is parked behind the key (in the
   service's database, in queue order) and acknowledged;
2. else the listener runs; an exception is retried in this thread after ``orderly_retry_delay``
   seconds, up to ``max_orderly_retries`` failures in total; then the key and the message are
   parked (one transaction), an ERROR is logged with the command that replays them, the
   application's ``on_parked`` hooks get a :class:`ParkedEvent`, and the message is acknowledged
   so the queue moves on to other keys;
3. when the database cannot be read or written (down, tables missing), nothing is acknowledged:
   the handler answers False and the backend hands the same message again after a moment, so
   nothing is lost and the order holds.

Messages sent without a sharding key all share the key ``""``.  Parked messages are listed,
replayed and discarded with :mod:`txmsg.sqla.parking` or ``txmsg parked list|replay|discard``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from txmsg.errors import ListenerDefinitionError
from txmsg.message import Message
from txmsg.sqla import parking

if TYPE_CHECKING:
    from txmsg.consumer import ConsumerSpec

log = logging.getLogger("txmsg.orderly")


@dataclass(frozen=True)
class ParkedEvent:
    """What an ``on_parked`` hook receives when an orderly listener parks a key."""

    group: str
    topic: str
    sharding_key: str
    message_id: str | None
    error: str
    """The listener's last exception, as ``"Type: message"``."""
    attempts: int
    parked_at: datetime


ParkedHook = Callable[[ParkedEvent], None]
"""An alert hook: ``app.on_parked`` registers them; exceptions in them are logged, never raised."""


def replay_command(group: str, key: str) -> str:
    """The shell command that replays ``key`` of ``group`` (for logs and docs)."""
    quoted = "''" if key == "" else (key if key.replace("-", "").isalnum() else repr(key))
    return f"txmsg parked replay --app YOUR_MODULE:app --group {group} --key {quoted}"


def orderly_handler(
    spec: ConsumerSpec, *, on_parked: Sequence[ParkedHook] = ()
) -> Callable[[Message], bool]:
    """The backend handler of an orderly listener (see the module docstring): True = consumed
    or parked, False = hand the message again later; never raises."""
    session_factory = spec.session_factory
    if session_factory is None:  # build_consumer_spec refuses this; a hand-made spec may not
        raise ListenerDefinitionError(
            f"orderly listener {spec.name} has no session_factory to park keys in; declare it "
            "with @message_listener(orderly=True, session_factory=...)"
        )
    handler, group = spec.handler, spec.group
    retries, delay = spec.max_orderly_retries, spec.orderly_retry_delay
    hooks = tuple(on_parked)

    def consume(message: Message) -> bool:
        key = parking.sharding_key_of(message)
        try:
            if parking.is_parked(session_factory, group, key) and parking.park_behind(
                session_factory, group, message
            ):
                log.warning(
                    "group=%s topic=%s key=%r msgId=%s: key is parked; message parked behind it "
                    "(%s)",
                    group,
                    message.topic,
                    key,
                    message.message_id,
                    replay_command(group, key),
                )
                return True
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; False = handed again
            _database_failed(group, message, key, "check whether the key is parked", exc)
            return False
        attempts = 0
        while True:
            attempts += 1
            try:
                handler(message)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "group=%s topic=%s key=%r msgId=%s: attempt %d/%d failed: %s",
                    group,
                    message.topic,
                    key,
                    message.message_id,
                    attempts,
                    retries,
                    error,
                    exc_info=attempts >= retries,
                )
                if attempts >= retries:
                    break
                time.sleep(delay)
            except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt...: not the message's fault
                log.error(
                    "group=%s key=%r msgId=%s: interrupted (%s); handing the message again later",
                    group,
                    key,
                    message.message_id,
                    type(exc).__name__,
                )
                return False
            else:
                return True
        try:
            parked_at = parking.park(
                session_factory, group, message, error=error, attempts=attempts
            )
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; False = handed again
            _database_failed(group, message, key, "park the key", exc)
            return False
        log.error(
            "group=%s topic=%s key=%r msgId=%s: failed %d times (%s); key PARKED: this key's "
            "later messages are parked behind it, other keys keep flowing. Fix the cause, then "
            "run: %s",
            group,
            message.topic,
            key,
            message.message_id,
            attempts,
            error,
            replay_command(group, key),
        )
        event = ParkedEvent(
            group=group,
            topic=message.topic,
            sharding_key=key,
            message_id=message.message_id,
            error=error,
            attempts=attempts,
            parked_at=parked_at,
        )
        for hook in hooks:
            try:
                hook(event)
            except Exception:
                log.exception("group=%s key=%r: on_parked hook %r raised", group, key, hook)
        return True

    return consume


def _database_failed(group: str, message: Message, key: str, what: str, exc: Exception) -> None:
    log.error(
        "group=%s topic=%s key=%r msgId=%s: could not %s (%s: %s); the message is handed again "
        "later (nothing is lost; the queue waits until the database answers)",
        group,
        message.topic,
        key,
        message.message_id,
        what,
        type(exc).__name__,
        exc,
        exc_info=True,
    )
