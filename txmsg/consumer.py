"""Message listeners: consume a topic with a plain function.

::

    @app.message_listener(topic="orders", group="points-consumer")
    def add_points(message):
        ...                     # return = consumed; raise = redelivered later

With ``idempotent=True`` the function takes ``(message, session)`` and runs in one database
transaction with a de-duplication row (see :mod:`txmsg.sqla.idempotent`), so a redelivered
message is applied once.

With ``orderly=True`` each queue is consumed one message at a time, in order; a failing message is
retried in place a bounded number of times and then its sharding key is *parked* in the service's
database so the queue moves on to other keys (see :mod:`txmsg.orderly`).

The function may be ``async def``: each delivery then runs as a coroutine on the app's event loop
while the client thread that received it waits (:mod:`txmsg.aio.loop`), so ``concurrency`` still
bounds how many run at once.  An ``async def`` idempotent listener takes an ``AsyncSession``
(``session_factory=async_sessionmaker(...)``, :mod:`txmsg.aio.sqla`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from txmsg import defaults
from txmsg.aio.callables import discard_awaitable, is_async, not_awaited_text
from txmsg.errors import LifecycleError, ListenerDefinitionError
from txmsg.message import Message
from txmsg.names import check_name
from txmsg.otel import hooks

if TYPE_CHECKING:
    from txmsg.aio.loop import LoopBridge
    from txmsg.orderly import ParkedEvent

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
    tags: str = defaults.TAGS
    concurrency: int = defaults.CONSUMER_CONCURRENCY
    max_reconsume: int = defaults.MAX_RECONSUME
    idempotent: bool = False
    orderly: bool = False
    """Consume each queue strictly in order; park a failing sharding key (:mod:`txmsg.orderly`)."""
    max_orderly_retries: int = defaults.MAX_ORDERLY_RETRIES
    """Orderly only: failures of one message, in place, before its key is parked."""
    orderly_retry_delay: float = defaults.ORDERLY_RETRY_DELAY
    """Orderly only: seconds between those attempts."""
    session_factory: Callable[[], Any] | None = None
    """The database of ``idempotent=True`` and of parked messages (``orderly=True``)."""

    @property
    def name(self) -> str:
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}"

    def safe_handler(
        self,
        *,
        on_parked: Sequence[Callable[[ParkedEvent], Any]] = (),
        journal: bool = False,
        bridge: LoopBridge | None = None,
        max_reconsume: int | None = None,
    ) -> Callable[[Message], bool]:
        """The handler a backend gets: True = consumed, False = hand it again later; never raises.

        Concurrent listeners: an exception means False (the broker redelivers later, up to
        ``max_reconsume`` times).  Orderly listeners: see :func:`txmsg.orderly.orderly_handler`;
        ``on_parked`` are the alert hooks called when a key is parked; ``journal`` writes each
        message to the in-flight journal first (:mod:`txmsg.sqla.journal`), for backends whose
        ``Capabilities.orderly_crash_safe`` is False.  An orderly handler has a ``close()`` to
        call after the consumer stopped.  ``bridge``: the app's event loop, where an ``async
        def`` listener (or hook) runs.

        Every delivery gets a ``process <topic>`` span and the consumer metrics
        (:func:`txmsg.otel.hooks.processing`); ``max_reconsume`` (default the spec's) tells its
        span when a failure sends the message to the dead-letter queue.

        Raises:
            LifecycleError: an ``async def`` listener or hook and no ``bridge``.
        """
        handler = self._bare_handler(on_parked, journal, bridge)
        return hooks.processing(
            handler,
            group=self.group,
            topic=self.topic,
            max_reconsume=self.max_reconsume if max_reconsume is None else max_reconsume,
            orderly=self.orderly,
        )

    def _bare_handler(
        self,
        on_parked: Sequence[Callable[[ParkedEvent], Any]],
        journal: bool,
        bridge: LoopBridge | None,
    ) -> Callable[[Message], bool]:
        if self.orderly:
            from txmsg.orderly import orderly_handler  # noqa: PLC0415 - needs SQLAlchemy

            return orderly_handler(self, on_parked=on_parked, journal=journal, bridge=bridge)
        handler, group = self.sync_handler(bridge), self.group

        def consume(message: Message) -> bool:
            try:
                handler(message)
            except BaseException as exc:
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
                hooks.record_exception(exc)  # on the `process <topic>` span
                return False
            return True

        return consume

    def sync_handler(self, bridge: LoopBridge | None) -> Callable[[Message], None]:
        """``handler`` as a plain call for a client thread: an ``async def`` one runs on
        ``bridge``'s loop (the thread waits); a coroutine returned by a plain one is an error,
        so the message is handed again rather than acknowledged with its work never done.

        Raises:
            LifecycleError: the handler is ``async def`` and there is no ``bridge``.
        """
        return bridged(self.handler, bridge, self.name)


def bridged(fn: Callable[..., Any], bridge: LoopBridge | None, name: str) -> Callable[..., None]:
    """``fn`` callable from a client thread (see :meth:`ConsumerSpec.sync_handler`)."""
    if is_async(fn):
        if bridge is None:
            raise LifecycleError(
                f"{name} is `async def` but has no event loop to run on; start the app that "
                "declares it (`with app:` or `async with app:`)"
            )
        loop = bridge

        def on_loop(*args: Any) -> None:
            loop.run(fn, *args, name=name)

        return on_loop

    def plain(*args: Any) -> None:
        value = fn(*args)
        if discard_awaitable(value):
            raise ListenerDefinitionError(not_awaited_text(name, value))

    return plain


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


def build_consumer_spec(
    fn: Callable[..., Any],
    *,
    topic: str,
    group: str,
    tags: str = defaults.TAGS,
    concurrency: int | None = None,
    max_reconsume: int | None = None,
    idempotent: bool = False,
    session_factory: Callable[[], Any] | None = None,
    orderly: bool = False,
    max_orderly_retries: int | None = None,
    orderly_retry_delay: float | None = None,
) -> ConsumerSpec:
    """Validate a message listener and return its spec (see
    :meth:`txmsg.ListenerRegistry.message_listener` for the options).

    Raises:
        ListenerDefinitionError, InvalidNameError: saying what to fix.
    """
    concurrency = defaults.CONSUMER_CONCURRENCY if concurrency is None else concurrency
    max_reconsume = defaults.MAX_RECONSUME if max_reconsume is None else max_reconsume
    owner = getattr(fn, "__qualname__", repr(fn))
    if not callable(fn) or isinstance(fn, type):
        raise ListenerDefinitionError(
            f"@message_listener decorates a function fn(message), not {fn!r}"
        )
    if inspect.isasyncgenfunction(fn):
        raise ListenerDefinitionError(
            f"{owner} is an async generator (`async def` with `yield`); a listener is "
            "`def fn(message)` or `async def fn(message)`"
        )
    check_name("topic", topic, owner=owner)
    check_name("consumer_group", group, owner=owner)
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ListenerDefinitionError(
            f"{owner}: concurrency must be an int >= 1, got {concurrency!r}"
        )
    if not isinstance(max_reconsume, int) or max_reconsume < 0:
        raise ListenerDefinitionError(
            f"{owner}: max_reconsume must be an int >= 0, got {max_reconsume!r}"
        )
    max_orderly_retries, orderly_retry_delay = _check_orderly(
        owner, orderly, max_orderly_retries, orderly_retry_delay, session_factory
    )
    if orderly and session_factory is not None:
        _check_orderly_sessions(fn, owner, idempotent, session_factory)
    handler: Callable[[Message], Any]
    if idempotent:
        _check_arity(fn, 2, f"{owner}(message, session) because idempotent=True", owner)
        if session_factory is None:
            raise ListenerDefinitionError(
                f"{owner}: idempotent=True needs session_factory=... (a callable returning "
                "SQLAlchemy sessions on the database the handler writes to)"
            )
        handler = _idempotent(fn, session_factory, group=group, topic=topic, owner=owner)
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
        orderly=orderly,
        max_orderly_retries=max_orderly_retries,
        orderly_retry_delay=orderly_retry_delay,
        session_factory=session_factory,
    )
    return spec


def _idempotent(
    fn: Callable[..., Any],
    session_factory: Callable[[], Any],
    *,
    group: str,
    topic: str,
    owner: str,
) -> Callable[[Message], Any]:
    """The idempotent wrapper of ``fn``: an ``async def`` one needs an ``async_sessionmaker``
    (its effects are written with an ``AsyncSession``), a plain one a ``sessionmaker``."""
    from txmsg.aio.sqla.engine import is_async_session_factory  # noqa: PLC0415 - SQLAlchemy

    if is_async(fn) != is_async_session_factory(session_factory):
        wanted = (
            "session_factory=async_sessionmaker(async_engine) (it writes with an AsyncSession)"
            if is_async(fn)
            else "session_factory=sessionmaker(engine), or make the listener `async def`"
        )
        raise ListenerDefinitionError(
            f"{owner}: an {'`async def`' if is_async(fn) else 'plain'} idempotent listener "
            f"cannot use {'a sync' if is_async(fn) else 'an async'} session factory "
            f"({session_factory!r}); pass {wanted}"
        )
    if is_async(fn):
        from txmsg.aio.sqla.idempotent import AsyncIdempotentConsumer  # noqa: PLC0415

        return AsyncIdempotentConsumer(fn, session_factory, group, topic)
    from txmsg.sqla.idempotent import wrap_idempotent  # noqa: PLC0415 - optional part

    return wrap_idempotent(fn, session_factory=session_factory, group=group, topic=topic)


def _check_orderly_sessions(
    fn: Callable[..., Any], owner: str, idempotent: bool, session_factory: Callable[[], Any]
) -> None:
    """Refuse what an orderly listener cannot do with its ``session_factory``, naming the fix.

    The orderly consumer parks keys and journals messages with sync ``Session`` objects, and an
    idempotent one commits the handler's effects, the dedup row and the journal's removal in one
    such transaction; so its factory is a sync ``sessionmaker`` and, when idempotent, its handler
    a plain ``def`` (an ``async def`` one would need an ``AsyncSession``, and the idempotent rule
    alone would send the user from one refusal to the other)."""
    from txmsg.aio.sqla.engine import is_async_session_factory  # noqa: PLC0415 - SQLAlchemy

    async_factory = is_async_session_factory(session_factory)
    if idempotent and (async_factory or is_async(fn)):
        given = (
            f"an async session factory ({session_factory!r})"
            if async_factory
            else "an `async def` handler"
        )
        raise ListenerDefinitionError(
            f"{owner}: orderly=True with idempotent=True cannot take {given}: the orderly "
            "consumer parks keys with sync Sessions and commits the handler's effects with the "
            "dedup row (and its journal record) in one sync Session transaction. Declare the handler a plain `def (message, session)` with "
            "session_factory=sessionmaker(engine) (txmsg.sqla.make_session_factory("
            "txmsg.sqla.create_engine(url)), on the same database), or keep it `async def`, drop "
            "idempotent=True and de-duplicate inside it with your AsyncSession"
        )
    if async_factory:
        raise ListenerDefinitionError(
            f"{owner}: orderly=True parks keys and journals messages with a sync session "
            f"factory, not an async one ({session_factory!r}); pass session_factory="
            "sessionmaker(engine) (txmsg.sqla.make_session_factory(txmsg.sqla.create_engine("
            "url)), on the same database). The handler may stay `async def`"
        )


def _check_orderly(
    owner: str,
    orderly: bool,
    max_orderly_retries: int | None,
    orderly_retry_delay: float | None,
    session_factory: Callable[[], Any] | None,
) -> tuple[int, float]:
    """The orderly options, validated; defaults filled in."""
    retries = defaults.MAX_ORDERLY_RETRIES if max_orderly_retries is None else max_orderly_retries
    delay = defaults.ORDERLY_RETRY_DELAY if orderly_retry_delay is None else orderly_retry_delay
    if not isinstance(orderly, bool):
        raise ListenerDefinitionError(f"{owner}: orderly must be True or False, got {orderly!r}")
    if not orderly and (max_orderly_retries is not None or orderly_retry_delay is not None):
        raise ListenerDefinitionError(
            f"{owner}: max_orderly_retries/orderly_retry_delay only apply to orderly=True "
            "listeners; add orderly=True or drop them (concurrent listeners use max_reconsume)"
        )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise ListenerDefinitionError(
            f"{owner}: max_orderly_retries must be an int >= 1 (attempts before the key is "
            f"parked), got {retries!r}"
        )
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 60:
        raise ListenerDefinitionError(
            f"{owner}: orderly_retry_delay must be seconds between 0 and 60 (the queue waits "
            f"that long per attempt), got {delay!r}"
        )
    if orderly and session_factory is None:
        raise ListenerDefinitionError(
            f"{owner}: orderly=True needs session_factory=... (a callable returning SQLAlchemy "
            "sessions on the service's database): a key that keeps failing is parked there, "
            "with its later messages, so the queue can move on; create the tables with "
            "txmsg.sqla.create_tables(engine)"
        )
    return retries, float(delay)
