"""``@message_listener``: consume a topic with a plain function.

::

    @message_listener(topic="orders", group="points-consumer")
    def add_points(message):
        ...                     # return = consumed; raise = redelivered later

With ``idempotent=True`` the function takes ``(message, session)`` and runs in one database
transaction with a de-duplication row (see :mod:`txmsg.sqla.idempotent`), so a redelivered
message is applied once.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from txmsg.errors import ListenerDefinitionError
from txmsg.listener import validate_name
from txmsg.message import Message
from txmsg.registry import ListenerRegistry, default_registry

log = logging.getLogger("txmsg.consumer")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ConsumerSpec:
    """A declared consumer: ``handler(message)`` is what runs for each message (already wrapped
    for idempotency when asked); ``fn`` is the user's function."""

    topic: str
    group: str
    fn: Callable[..., Any]
    handler: Callable[[Message], Any]
    tags: str = "*"
    concurrency: int = 4
    max_reconsume: int = 16
    idempotent: bool = False

    @property
    def name(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}"

    def safe_handler(self) -> Callable[[Message], bool]:
        """The handler a backend gets: True = consumed, False = redeliver; never raises."""
        handler, group = self.handler, self.group

        def consume(message: Message) -> bool:
            try:
                handler(message)
            except BaseException as exc:  # noqa: BLE001 - never into a backend
                log.error(
                    "group=%s topic=%s key=%s reconsume=%d: consumer raised %s: %s; "
                    "redelivering later",
                    group,
                    message.topic,
                    message.transaction_key,
                    message.reconsume_times,
                    type(exc).__name__,
                    exc,
                    exc_info=True,
                )
                return False
            return True

        return consume


def _check_arity(fn: Callable[..., Any], n: int, wanted: str, owner: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*([None] * n))
    except TypeError:
        raise ListenerDefinitionError(
            f"{owner}{sig} has the wrong parameters; txmsg calls it as {wanted}"
        ) from None


def message_listener(
    topic: str,
    group: str,
    tags: str = "*",
    concurrency: int = 4,
    max_reconsume: int = 16,
    idempotent: bool = False,
    session_factory: Callable[[], Any] | None = None,
    registry: ListenerRegistry | None = None,
) -> Callable[[F], F]:
    """Function decorator: consume ``topic`` as consumer ``group``.

    Parameters:
        topic, group: what to consume and as which consumer group (one function per group).
        tags: RocketMQ tag expression (``"*"``, ``"a || b"``).
        concurrency: consumer threads.
        max_reconsume: redeliveries before RocketMQ moves the message to the DLQ.
        idempotent: ``fn(message, session)`` runs in one DB transaction with a dedup row.
        session_factory: SQLAlchemy sessions for ``idempotent=True``.
        registry: where to record it; ``default_registry`` by default.

    Returns the function unchanged.
    """

    def decorate(fn: F) -> F:
        owner = getattr(fn, "__qualname__", repr(fn))
        if not callable(fn) or isinstance(fn, type):
            raise ListenerDefinitionError(
                f"@message_listener decorates a function fn(message), not {fn!r}"
            )
        if inspect.iscoroutinefunction(fn):
            raise ListenerDefinitionError(
                f"{owner} is `async def`; consumers run on the client's threads: use a plain def"
            )
        validate_name("topic", topic, owner)
        validate_name("group", group, owner)
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ListenerDefinitionError(f"{owner}: concurrency must be an int >= 1, got {concurrency!r}")
        if not isinstance(max_reconsume, int) or max_reconsume < 0:
            raise ListenerDefinitionError(
                f"{owner}: max_reconsume must be an int >= 0, got {max_reconsume!r}"
            )
        handler: Callable[[Message], Any]
        if idempotent:
            _check_arity(fn, 2, f"{owner}(message, session) because idempotent=True", owner)
            if session_factory is None:
                raise ListenerDefinitionError(
                    f"{owner}: idempotent=True needs session_factory=... (a callable returning "
                    "SQLAlchemy sessions on the database the handler writes to)"
                )
            from txmsg.sqla.idempotent import wrap_idempotent  # noqa: PLC0415 - optional part

            handler = wrap_idempotent(fn, session_factory=session_factory, group=group, topic=topic)
        else:
            _check_arity(fn, 1, f"{owner}(message)", owner)
            handler = fn
        spec = ConsumerSpec(
            topic=topic,
            group=group,
            fn=fn,
            handler=handler,
            tags=tags,
            concurrency=concurrency,
            max_reconsume=max_reconsume,
            idempotent=idempotent,
        )
        (registry if registry is not None else default_registry).add_consumer(spec)
        return fn

    return decorate
